/*
 * The VM module (type_key relax.VirtualMachine) of libkiln_runtime: TVM's Relax VirtualMachine
 * (src/runtime/relax_vm/vm.cc: vm_initialization, InvokeBytecode, RunLoop, RunInstrCall) with
 * the names and behaviour of kiln/runtime/vm/virtual_machine.py (storage and result copies: rt_vm_memory.c). exe["vm_load_executable"]() creates it;
 * vm_initialization(device_type, device_id, alloc_type, ...) resolves the function table once
 * (kernels through the executable's imports; builtins prepared per call site, rt_vm_builtins.c)
 * and every VM function is then a function of this module, called by name with DLTensor
 * arguments.
 *
 * Results (the C ABI has no tuple of Python's): a function returns copies of its result
 * tensors, owned by the VM and valid until its next call (storage is reused by the next call,
 * as in vm.py's _copy_out): a tensor as kTVMDLTensorHandle, several as kTVMObjectHandle to a
 * KilnTuple read with KilnTupleSize / KilnTupleGetItem, an integer as kTVMArgInt.
 *
 * Run-time loops (backward jumps): a call site keeps one view and one tuple, which equal
 * vm.py's fresh objects only while each site runs once per call; in a function with a loop,
 * each execution's view or tuple is moved into a block freed when the call ends.
 *
 * Calls between VM functions (vm.py's _invoke): a new frame, at most 128 nested calls, storage
 * per (function, nesting level), the callee's result copied into blocks of the call; sites of
 * a callee give fresh objects as in a loop.
 *
 * Not in the native VM (errors at vm_initialization naming them): functions passed as values,
 * the builtins listed in rt_vm_builtins.c. No replay of recorded
 * calls (vm_replay.py): the interpreter's per-call cost is a few microseconds in C.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "rt_vm.h"

#define KILN_ALIGN 64

typedef struct {
  KilnVM* vm;
  int64_t fidx;
} KilnVMEntry;

/* -- the interpreter (vm.VirtualMachine._exec) */
static int kiln_vm_truth(const KilnVMValue* v, int* out) {
  if (v->kind == KV_TENSOR) return kiln_vm_read_bool_value(v->u.t, out);
  *out = v->kind == KV_INT ? v->u.i != 0 : v->kind != KV_NONE;
  return 0;
}

static int kiln_vm_kernel(KilnVMSite* s, const char* name) {
  TVMValue rv;
  int rc, i;
  for (i = 0; i < s->ins->nargs; ++i) {
    const KilnVMValue* v = &s->vals[i];
    if (v->kind == KV_TENSOR) {
      s->kargs[i].v_handle = v->u.t;
      s->kcodes[i] = kTVMDLTensorHandle;
    } else if (v->kind == KV_INT) {
      s->kargs[i].v_int64 = v->u.i;
      s->kcodes[i] = kTVMArgInt;
    } else {
      return kiln_fail("VM: kernel '%s' argument %d is not a tensor or an integer", name, i);
    }
  }
  return kiln_func_call(s->kernel, s->kargs, s->kcodes, s->ins->nargs, &rv, &rc);
}

static int kiln_vm_call(KilnVM* vm, int64_t fidx, const KilnVMValue* args, int n,
                        KilnVMValue* out);

static int kiln_vm_exec(KilnVMFrame* fr, KilnVMSite* sites, KilnVMValue* result) {
  const KilnVMFunction* f = fr->func;
  const KilnVMExec* e = fr->vm->exe;
  size_t pc = 0, n = f->num_instrs;
  while (pc < n) {
    const KilnVMInstr* ins = &f->instrs[pc];
    KilnVMSite* s = &sites[pc];
    int i, truth;
    ++pc;
    if (ins->op == KILN_OP_CALL) {
      KilnVMValue out;
      out.kind = KV_NONE;
      for (i = 0; i < ins->nargs; ++i) {
        const KilnVMArg a = ins->args[i];
        KilnVMValue* v = &s->vals[i];
        switch (a.kind) {
          case KILN_ARG_REG: *v = fr->regs[a.value]; break;
          case KILN_ARG_HEAP: v->kind = KV_INT, v->u.i = fr->heap[a.value]; break;
          case KILN_ARG_IMM: v->kind = KV_INT, v->u.i = a.value; break;
          case KILN_ARG_CONST:
            if (e->consts[a.value].tag == KILN_TAG_NDARRAY)
              v->kind = KV_TENSOR, v->u.t = &((KilnVMExec*)e)->consts[a.value].tensor;
            else if (e->consts[a.value].tag == KILN_TAG_INT)
              v->kind = KV_INT, v->u.i = e->consts[a.value].value;
            else
              v->kind = KV_NONE; /* read statically by the builtin */
            break;
          default: v->kind = KV_NONE; break;
        }
      }
      if (s->run != NULL) {
        if (s->run(s, fr, s->vals, &out) != 0) return -1;
        if (s->fresh && kiln_vm_detach(fr->vm, s, &out) != 0) return -1;
      } else if (s->vmcall) {
        if (kiln_vm_call(fr->vm, ins->func_idx, s->vals, ins->nargs, &out) != 0) return -1;
      } else if (kiln_vm_kernel(s, e->funcs[ins->func_idx].name) != 0) {
        return -1;
      }
      if (ins->dst >= 0) fr->regs[ins->dst] = out;
    } else if (ins->op == KILN_OP_RET) {
      *result = fr->regs[ins->dst];
      return 0;
    } else if (ins->op == KILN_OP_GOTO) {
      pc = (size_t)ins->target;
    } else {
      if (kiln_vm_truth(&fr->regs[ins->dst], &truth) != 0) return -1;
      if (!truth) pc = (size_t)ins->target;
    }
  }
  return kiln_fail("VM: function '%s' ended without a ret", f->name);
}

/* A call of VM function fidx from the bytecode (vm.py's _invoke + _copy_out): a new frame
   (registers: the arguments, then empty), the result copied into blocks of the call (the
   callee's storage is reused by its next call). At most KILN_VM_MAX_DEPTH nested calls. */
#define KILN_VM_MAX_DEPTH 128
static int kiln_vm_call(KilnVM* vm, int64_t fidx, const KilnVMValue* args, int n,
                        KilnVMValue* out) {
  const KilnVMFunction* f = &vm->exe->funcs[fidx];
  KilnVMFrame fr;
  KilnVMValue result;
  int rc = -1;
  if (vm->depth >= KILN_VM_MAX_DEPTH)
    return kiln_fail("VM: more than %d nested calls (in '%s')", KILN_VM_MAX_DEPTH, f->name);
  if (n > f->num_regs)
    return kiln_fail("VM: function '%s' called with %d arguments, has %lld registers", f->name,
                     n, (long long)f->num_regs);
  memset(&fr, 0, sizeof(fr));
  fr.vm = vm;
  fr.func = f;
  fr.fidx = fidx;
  fr.level = vm->active[fidx];
  fr.regs = (KilnVMValue*)kiln_calloc((size_t)f->num_regs + 1, sizeof(KilnVMValue));
  fr.heap = (int64_t*)kiln_calloc((size_t)f->heap_size + 1, sizeof(int64_t));
  if (fr.regs != NULL && fr.heap != NULL) {
    if (n) memcpy(fr.regs, args, sizeof(KilnVMValue) * (size_t)n);
    ++vm->active[fidx];
    ++vm->depth;
    result.kind = KV_NONE;
    rc = kiln_vm_exec(&fr, vm->sites[fidx], &result);
    --vm->depth;
    --vm->active[fidx];
    if (rc == 0) rc = kiln_vm_clone(vm, &result, out, 0);
  }
  free(fr.regs);
  free(fr.heap);
  return rc;
}

/* -- inputs (vm_inputs.as_input): the caller's tensor in place when it is C-contiguous and
   64-byte aligned, else copied into the parameter's staging buffer (reused by later calls) */
static int kiln_vm_input(KilnVM* vm, const KilnVMFunction* f, size_t i, const TVMValue* arg,
                         int code, KilnVMValue* out) {
  const DLTensor* t = (const DLTensor*)arg->v_handle;
  DLTensor* view = &vm->in_views[i];
  char* data;
  size_t nbytes;
  int d, alias;
  if ((code != kTVMDLTensorHandle && code != kTVMNDArrayHandle) || t == NULL)
    return kiln_fail("VM function '%s': input %zu ('%s') must be a tensor (type code %d)",
                     f->name, i, f->params[i].name, code);
  if (t->device.device_type != kDLCPU)
    return kiln_fail("VM function '%s': input '%s' is not on the CPU", f->name,
                     f->params[i].name);
  if (t->ndim < 0 || t->ndim > KILN_VM_MAX_NDIM || (t->ndim && t->shape == NULL))
    return kiln_fail("VM function '%s': input '%s' has rank %d", f->name, f->params[i].name,
                     t->ndim);
  if (!kiln_is_compact(t))
    return kiln_fail("VM function '%s': input '%s' is not C-contiguous", f->name,
                     f->params[i].name);
  for (d = 0; d < t->ndim; ++d)
    if (t->shape[d] < 0)
      return kiln_fail("VM function '%s': input '%s' has a negative dim", f->name,
                       f->params[i].name);
  *view = *t;
  memcpy(vm->in_shapes[i], t->shape, sizeof(int64_t) * (size_t)t->ndim);
  view->shape = vm->in_shapes[i];
  view->strides = NULL;
  view->byte_offset = 0;
  data = (char*)t->data + t->byte_offset;
  view->data = data;
  /* a result of the last call fed back as an input is copied too: this call's results are
     written over (or replace) those tensors */
  for (d = 0, alias = 0; (size_t)d < vm->cap_out && !alias; ++d) {
    const char* o = vm->out_tensors[d] ? (const char*)vm->out_tensors[d]->data : NULL;
    alias = o != NULL && data >= o && data < o + KilnArrayNumBytes(vm->out_tensors[d]);
  }
  if ((uintptr_t)data % KILN_ALIGN != 0 || alias) {
    nbytes = KilnArrayNumBytes(t);
    if (vm->staging_n[i] < nbytes || vm->staging[i] == NULL) {
      void* buf;
      if (posix_memalign(&buf, KILN_ALIGN, nbytes ? nbytes : KILN_ALIGN) != 0)
        return kiln_fail("VM: out of memory (%zu bytes for input '%s')", nbytes,
                         f->params[i].name);
      free(vm->staging[i]);
      vm->staging[i] = buf;
      vm->staging_n[i] = nbytes;
    }
    if (nbytes) memcpy(vm->staging[i], data, nbytes);
    view->data = vm->staging[i];
  }
  out->kind = KV_TENSOR;
  out->u.t = view;
  return 0;
}

static int kiln_vm_invoke(KilnVM* vm, int64_t fidx, TVMValue* args, int* codes, int n,
                          TVMValue* ret, int* ret_code) {
  const KilnVMFunction* f = &vm->exe->funcs[fidx];
  KilnVMFrame fr;
  KilnVMValue result;
  size_t i;
  int rc = -1;
  if (!vm->initialized)
    return kiln_fail("VM: call vm_initialization(device_type, device_id, alloc_type) before "
                     "running functions");
  if (vm->running) return kiln_fail("VM: a call is already running (one thread at a time)");
  if ((size_t)n != f->num_params) {
    char names[512] = "";
    for (i = 0; i < f->num_params; ++i) {
      strncat(names, i ? ", " : "", sizeof(names) - strlen(names) - 1);
      strncat(names, f->params[i].name, sizeof(names) - strlen(names) - 1);
    }
    return kiln_fail("VM function '%s' takes %zu inputs (%s), got %d", f->name, f->num_params,
                     names, n);
  }
  memset(&fr, 0, sizeof(fr));
  fr.vm = vm;
  fr.func = f;
  fr.fidx = fidx;
  fr.regs = (KilnVMValue*)kiln_calloc((size_t)f->num_regs + 1, sizeof(KilnVMValue));
  fr.heap = (int64_t*)kiln_calloc((size_t)f->heap_size + 1, sizeof(int64_t));
  if (fr.regs == NULL || fr.heap == NULL) goto done;
  for (i = 0; i < f->num_params; ++i)
    if (kiln_vm_input(vm, f, i, &args[i], codes[i], &fr.regs[i]) != 0) goto done;
  vm->running = 1;
  vm->depth = 1;
  memset(vm->active, 0, sizeof(int64_t) * vm->exe->num_funcs);
  vm->active[fidx] = 1;
  result.kind = KV_NONE;
  if (kiln_vm_exec(&fr, vm->sites[fidx], &result) != 0) goto done;
  kiln_vm_free_value(&vm->result);
  kiln_vm_kv_release_views(vm);
  vm->num_out = 0;
  ++vm->serial;
  rc = kiln_vm_copy_out(vm, &result, &vm->result, 0);
  if (rc == 0) rc = kiln_vm_return(&vm->result, ret, ret_code);
  kiln_vm_kv_prune(vm, 0); /* append buffers the result does not show (rt_vm_kv.c) */
done:
  vm->running = 0;
  for (i = 0; i < vm->num_retired; ++i) free(vm->retired[i]);
  vm->num_retired = 0;
  free(fr.regs);
  free(fr.heap);
  return rc;
}

static int kiln_vm_entry(TVMValue* args, int* codes, int n, TVMValue* ret, int* ret_code,
                         void* resource) {
  KilnVMEntry* entry = (KilnVMEntry*)resource;
  return kiln_vm_invoke(entry->vm, entry->fidx, args, codes, n, ret, ret_code);
}

/* -- vm_initialization: resolve the function table, prepare every call site */
static void kiln_vm_free_sites(KilnVM* vm) {
  size_t i, k;
  const KilnVMExec* e = vm->exe;
  for (i = 0; vm->sites && i < e->num_funcs; ++i) {
    for (k = 0; vm->sites[i] && k < e->funcs[i].num_instrs; ++k) {
      free(vm->sites[i][k].kargs);
      free(vm->sites[i][k].kcodes);
      free(vm->sites[i][k].vals);
      free(vm->sites[i][k].tuple.items);
      free(vm->sites[i][k].buf);
    }
    free(vm->sites[i]);
  }
  free(vm->sites);
  vm->sites = NULL;
  for (i = 0; vm->kernels && i < e->num_funcs; ++i) kiln_func_release(vm->kernels[i]);
  free(vm->kernels);
  vm->kernels = NULL;
}

static int kiln_vm_prepare_site(KilnVM* vm, const KilnVMFunction* f, KilnVMSite* s) {
  const KilnVMExec* e = vm->exe;
  const KilnVMInstr* ins = s->ins;
  const KilnVMFunction* callee;
  int i, n = ins->nargs;
  s->where_func = f->name;
  s->storage_idx = -1;
  if (ins->op != KILN_OP_CALL) return 0;
  callee = &e->funcs[ins->func_idx];
  if ((s->vals = (KilnVMValue*)kiln_calloc((size_t)n + 1, sizeof(KilnVMValue))) == NULL)
    return -1;
  for (i = 0; i < n; ++i)
    if (ins->args[i].kind == KILN_ARG_FUNC)
      return kiln_fail("VM: function '%s' instruction at word %lld passes function '%s' as a "
                       "value, which the native runtime's VM does not implement", f->name,
                       (long long)ins->pc, e->funcs[ins->args[i].value].name);
  if (callee->kind == KILN_VM_KIND_VM) {
    s->vmcall = 1;
    return 0;
  }
  if (strncmp(callee->name, KILN_VM_BUILTIN_PREFIX, KILN_VM_BUILTIN_PREFIX_LEN) == 0)
    return kiln_vm_prepare_builtin(vm, e, f, callee->name, s);
  s->kernel = vm->kernels[ins->func_idx];
  for (i = 0; i < n; ++i)
    if (ins->args[i].kind == KILN_ARG_CONST && e->consts[ins->args[i].value].tag != KILN_TAG_NDARRAY &&
        e->consts[ins->args[i].value].tag != KILN_TAG_INT)
      return kiln_fail("VM executable: function '%s' instruction at word %lld: kernel '%s' "
                       "argument %d is a constant that is not a tensor or an integer", f->name,
                       (long long)ins->pc, callee->name, i);
  s->kargs = (TVMValue*)kiln_calloc((size_t)n + 1, sizeof(TVMValue));
  s->kcodes = (int*)kiln_calloc((size_t)n + 1, sizeof(int));
  return s->kargs && s->kcodes ? 0 : -1;
}

static int kiln_vm_init(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                        int* ret_code) {
  KilnVM* vm = (KilnVM*)self;
  const KilnVMExec* e = vm->exe;
  KilnModule* exe_mod = (KilnModule*)vm->exe;
  size_t i, k;
  int64_t* called;
  int j, loops;
  (void)ret, (void)ret_code;
  if (vm->running) return kiln_fail("vm_initialization: a call is running");
  if (n == 0 || n % 3)
    return kiln_fail("vm_initialization: expected (device_type, device_id, alloc_type) triples, "
                     "got %d values", n);
  for (j = 0; j < n; ++j)
    if (codes[j] != kTVMArgInt)
      return kiln_fail("vm_initialization: argument %d must be an integer", j);
  for (j = 0; j < n; j += 3) {
    if (args[j].v_int64 != kDLCPU)
      return kiln_fail("vm_initialization: device type %lld is not supported: the Kiln VM runs "
                       "on cpu (device type 1) only", (long long)args[j].v_int64);
    if (args[j + 2].v_int64 != 1 && args[j + 2].v_int64 != 2)
      return kiln_fail("vm_initialization: unknown allocator type %lld (1 naive, 2 pooled)",
                       (long long)args[j + 2].v_int64);
  }
  vm->initialized = 0;
  kiln_vm_free_sites(vm);
  if ((vm->kernels = (KilnFunc**)kiln_calloc(e->num_funcs + 1, sizeof(KilnFunc*))) == NULL ||
      (vm->sites = (KilnVMSite**)kiln_calloc(e->num_funcs + 1, sizeof(KilnVMSite*))) == NULL)
    return -1;
  for (i = 0; i < e->num_funcs; ++i) {
    const KilnVMFunction* f = &e->funcs[i];
    if (f->kind != KILN_VM_KIND_PACKED ||
        strncmp(f->name, KILN_VM_BUILTIN_PREFIX, KILN_VM_BUILTIN_PREFIX_LEN) == 0)
      continue;
    for (k = 0; vm->kernels[i] == NULL && k < (size_t)exe_mod->num_imports; ++k)
      if (kiln_module_get_function(exe_mod->imports[k], f->name, 1, &vm->kernels[i]) != 0)
        return -1;
    if (vm->kernels[i] == NULL)
      return kiln_fail("VM: kernel '%s' (function table entry %zu) not found in the "
                       "executable's library or its imports", f->name, i);
  }
  free(vm->active); /* per function: its calls running; `called`: a VM callee somewhere */
  if ((vm->active = (int64_t*)kiln_calloc(2 * e->num_funcs + 1, sizeof(int64_t))) == NULL)
    return -1;
  called = vm->active + e->num_funcs;
  for (i = 0; i < e->num_funcs; ++i)
    for (k = 0; e->funcs[i].kind == KILN_VM_KIND_VM && k < e->funcs[i].num_instrs; ++k)
      if (e->funcs[i].instrs[k].op == KILN_OP_CALL &&
          e->funcs[e->funcs[i].instrs[k].func_idx].kind == KILN_VM_KIND_VM)
        called[e->funcs[i].instrs[k].func_idx] = 1;
  for (i = 0; i < e->num_funcs; ++i) {
    const KilnVMFunction* f = &e->funcs[i];
    if (f->kind != KILN_VM_KIND_VM) continue;
    if ((vm->sites[i] = (KilnVMSite*)kiln_calloc(f->num_instrs, sizeof(KilnVMSite))) == NULL)
      return -1;
    for (k = 0, loops = called[i]; k < f->num_instrs; ++k) /* a backward jump: a loop */
      loops |= (f->instrs[k].op == KILN_OP_GOTO || f->instrs[k].op == KILN_OP_IF) &&
               f->instrs[k].target <= (int64_t)k;
    for (k = 0; k < f->num_instrs; ++k) {
      vm->sites[i][k].ins = &f->instrs[k];
      vm->sites[i][k].fresh = loops;
      if (kiln_vm_prepare_site(vm, f, &vm->sites[i][k]) != 0) return -1;
    }
  }
  if (vm->max_params) {
    for (i = 0; i < vm->max_params; ++i) free(vm->staging[i]);
    memset(vm->staging, 0, vm->max_params * sizeof(void*));
    memset(vm->staging_n, 0, vm->max_params * sizeof(size_t));
  }
  vm->initialized = 1;
  return 0;
}

/* -- signature queries (TVM's relax VM: get_function_arity, get_function_param_name; Kiln
   native extras: get_function_param_dtype, get_function_param_shape) */
static int kiln_vm_func_arg(KilnVM* vm, TVMValue* args, int* codes, int n, int want_index,
                            const KilnVMFunction** f, size_t* index, const char* fn) {
  size_t i;
  if (n < 1 + want_index || codes[0] != kTVMStr || args[0].v_str == NULL)
    return kiln_fail("%s: needs a function name%s", fn, want_index ? " and an index" : "");
  *f = NULL;
  for (i = 0; i < vm->exe->num_funcs && *f == NULL; ++i)
    if (vm->exe->funcs[i].kind == KILN_VM_KIND_VM &&
        strcmp(vm->exe->funcs[i].name, args[0].v_str) == 0)
      *f = &vm->exe->funcs[i];
  if (*f == NULL) return kiln_fail("%s: the VM has no function '%s'", fn, args[0].v_str);
  if (!want_index) return 0;
  if (codes[1] != kTVMArgInt || args[1].v_int64 < 0 || (uint64_t)args[1].v_int64 >= (*f)->num_params)
    return kiln_fail("%s: needs a parameter index below %zu", fn, (*f)->num_params);
  *index = (size_t)args[1].v_int64;
  return 0;
}

static int kiln_vm_arity(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                         int* ret_code) {
  const KilnVMFunction* f = NULL;
  if (kiln_vm_func_arg((KilnVM*)self, args, codes, n, 0, &f, NULL, "get_function_arity") != 0)
    return -1;
  ret->v_int64 = (int64_t)f->num_params;
  *ret_code = kTVMArgInt;
  return 0;
}

static int kiln_vm_param_name(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                              int* ret_code) {
  const KilnVMFunction* f = NULL;
  size_t i;
  if (kiln_vm_func_arg((KilnVM*)self, args, codes, n, 1, &f, &i, "get_function_param_name") != 0)
    return -1;
  ret->v_str = kiln_return_string(f->params[i].name, strlen(f->params[i].name));
  *ret_code = kTVMStr;
  return ret->v_str ? 0 : -1;
}

static int kiln_vm_param_dtype(KilnModule* self, TVMValue* args, int* codes, int n,
                               TVMValue* ret, int* ret_code) {
  const KilnVMFunction* f = NULL;
  size_t i;
  if (kiln_vm_func_arg((KilnVM*)self, args, codes, n, 1, &f, &i, "get_function_param_dtype") != 0)
    return -1;
  ret->v_type = f->params[i].dtype;
  *ret_code = kTVMDataType;
  return 0;
}

/* The parameter's shape as text, dims joined by commas: a size, or its symbol's name
   ("1,seq,384"; "" for a scalar): what a caller needs to size inputs that share a symbol. */
static int kiln_vm_param_shape(KilnModule* self, TVMValue* args, int* codes, int n,
                               TVMValue* ret, int* ret_code) {
  KilnVM* vm = (KilnVM*)self;
  const KilnVMFunction* f = NULL;
  const KilnVMSig* sig;
  size_t i, len = 0, cap = 1;
  char* text;
  int d;
  if (kiln_vm_func_arg(vm, args, codes, n, 1, &f, &i, "get_function_param_shape") != 0)
    return -1;
  sig = &f->params[i];
  for (d = 0; d < sig->ndim; ++d) /* a size takes at most 20 digits, a symbol its name */
    cap += 21 + (sig->dims[d] < 0 ? strlen(vm->exe->symbols[-1 - sig->dims[d]].name) : 0);
  if ((text = (char*)malloc(cap)) == NULL) return kiln_fail("get_function_param_shape: out of memory");
  text[0] = '\0';
  for (d = 0; d < sig->ndim; ++d) {
    const char* sep = d ? "," : "";
    if (sig->dims[d] < 0)
      len += (size_t)snprintf(text + len, cap - len, "%s%s", sep,
                              vm->exe->symbols[-1 - sig->dims[d]].name);
    else
      len += (size_t)snprintf(text + len, cap - len, "%s%lld", sep, (long long)sig->dims[d]);
  }
  ret->v_str = kiln_return_string(text, len);
  free(text);
  *ret_code = kTVMStr;
  return ret->v_str ? 0 : -1;
}

static const struct {
  const char* name;
  KilnMethod method;
} kiln_vm_methods[] = {
    {"vm_initialization", kiln_vm_init},
    {"get_function_arity", kiln_vm_arity},
    {"get_function_param_name", kiln_vm_param_name},
    {"get_function_param_dtype", kiln_vm_param_dtype},
    {"get_function_param_shape", kiln_vm_param_shape},
};

static void kiln_vm_entry_free(void* resource) { free(resource); }

static int kiln_vm_get_own(KilnModule* self, const char* name, KilnFunc** out) {
  KilnVM* vm = (KilnVM*)self;
  KilnVMEntry* entry;
  KilnFunc* f;
  size_t i;
  *out = NULL;
  for (i = 0; i < sizeof(kiln_vm_methods) / sizeof(kiln_vm_methods[0]); ++i)
    if (strcmp(kiln_vm_methods[i].name, name) == 0) {
      *out = kiln_func_method(self, kiln_vm_methods[i].name, kiln_vm_methods[i].method);
      return *out ? 0 : -1;
    }
  for (i = 0; i < vm->exe->num_funcs; ++i)
    if (vm->exe->funcs[i].kind == KILN_VM_KIND_VM && strcmp(vm->exe->funcs[i].name, name) == 0)
      break;
  if (i == vm->exe->num_funcs) return 0;
  if ((entry = (KilnVMEntry*)kiln_calloc(1, sizeof(*entry))) == NULL) return -1;
  if ((f = (KilnFunc*)kiln_calloc(1, sizeof(KilnFunc))) == NULL) {
    free(entry);
    return -1;
  }
  entry->vm = vm;
  entry->fidx = (int64_t)i;
  f->refs = 1;
  f->cfunc = kiln_vm_entry;
  f->resource = entry;
  f->fin = kiln_vm_entry_free;
  f->owner = self; /* keeps the VM alive */
  f->name = vm->exe->funcs[i].name;
  kiln_module_retain(self);
  *out = f;
  return 0;
}

static void kiln_vm_destroy(KilnModule* self) {
  KilnVM* vm = (KilnVM*)self;
  size_t i;
  kiln_vm_free_sites(vm);
  free(vm->active);
  for (i = 0; i < vm->num_storages; ++i) {
    free(vm->storages[i]->data);
    free(vm->storages[i]);
  }
  free(vm->storages);
  free(vm->retired);
  for (i = 0; i < vm->max_params; ++i) free(vm->staging[i]);
  free(vm->staging);
  free(vm->staging_n);
  free(vm->in_views);
  free(vm->in_shapes);
  kiln_vm_free_value(&vm->result);
  kiln_vm_kv_prune(vm, 1);
  for (i = 0; i < vm->cap_out; ++i) TVMArrayFree(vm->out_tensors[i]);
  free(vm->out_tensors);
}

int kiln_vm_create(KilnVMExec* exe, KilnModule** out) {
  KilnVM* vm = (KilnVM*)kiln_module_new(sizeof(KilnVM), "relax.VirtualMachine");
  long pages = sysconf(_SC_PHYS_PAGES), page = sysconf(_SC_PAGESIZE);
  size_t i, np = 1;
  *out = NULL;
  if (vm == NULL) return -1;
  vm->base.get_own = kiln_vm_get_own;
  vm->base.destroy = kiln_vm_destroy;
  vm->exe = exe;
  vm->mem_limit = (pages > 0 && page > 0) ? (int64_t)pages * page : ((int64_t)1 << 40);
  for (i = 0; i < exe->num_funcs; ++i)
    if (exe->funcs[i].num_params > np) np = exe->funcs[i].num_params;
  vm->max_params = np;
  vm->in_views = (DLTensor*)kiln_calloc(np, sizeof(DLTensor));
  vm->in_shapes = (int64_t(*)[KILN_VM_MAX_NDIM])kiln_calloc(np, sizeof(*vm->in_shapes));
  vm->staging = (void**)kiln_calloc(np, sizeof(void*));
  vm->staging_n = (size_t*)kiln_calloc(np, sizeof(size_t));
  if (vm->in_views == NULL || vm->in_shapes == NULL || vm->staging == NULL ||
      vm->staging_n == NULL || kiln_module_add_import(&vm->base, &exe->base) != 0) {
    kiln_module_release(&vm->base);
    return -1;
  }
  *out = &vm->base;
  return 0;
}
