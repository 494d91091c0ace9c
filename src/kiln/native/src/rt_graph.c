/*
 * The graph executor module of libkiln_runtime: TVM's src/runtime/graph_executor/
 * graph_executor.cc; Kiln's kiln/runtime/graph_executor/executor.py, whose function names this file
 * serves. The executor itself (graph JSON, storage plan, prebuilt calls, params) is the C
 * runtime's (crt/kiln_crt_graph_executor.c), created here over a lookup in the factory's
 * imports (the factory: rt_graph_factory.c).
 *
 * Functions: set_input(key, tensor), set_input_zero_copy(key, tensor), get_input(key),
 * set_output_zero_copy(index, tensor or NULL), get_output(index[, out]), run(),
 * get_num_inputs(), get_num_outputs(), get_input_index(name), load_params(bytes); Kiln native
 * extra: get_input_name(index). A key is an input's name or its index: the graph's inputs
 * first, then its params (as in the Python runtime). Not here: the debug executor's per-node
 * timing (debug_create; the CRT executor runs its op list as one call).
 */
#include <stdlib.h>
#include <string.h>

#include "crt/kiln_crt_graph.h"
#include "rt_graph.h"

#define KILN_ALIGN 64
#define KILN_MAX_ARENA ((size_t)1 << 40)


typedef struct {
  KilnModule base;
  KilnGraphExecutor* ge;
  void* arena_mem;
  KilnFunc** funcs; /* the kernels' functions (kept alive) */
  int num_funcs, cap_funcs;
  const char* (*lib_error)(void);
  int* order; /* key index -> executor input index: the inputs, then the params */
  int num_inputs, num_args;
  DLTensor* entries;
  int num_entries;
  void** own_data; /* each entry's own storage (zero-copy bindings re-point entries) */
  void** out_data;  /* set_output_zero_copy: each output's bound memory, or NULL */
  uint8_t* out_in_place; /* 1: the entry is re-pointed there; 0: copied after each run */
} KilnGraphExec;

/* -- the executor's functions */
static int kiln_arg_tensor(TVMValue* args, int* codes, int num_args, int i, DLTensor** out,
                           const char* fn) {
  if (i >= num_args || (codes[i] != kTVMDLTensorHandle && codes[i] != kTVMNDArrayHandle) ||
      args[i].v_handle == NULL)
    return kiln_fail("%s: argument %d must be a tensor", fn, i);
  *out = (DLTensor*)args[i].v_handle;
  return 0;
}

/* The executor input index of a key (name or index), or -1 with the error set. */
static int kiln_key(KilnGraphExec* g, TVMValue* args, int* codes, int num_args, const char* fn) {
  int i;
  if (num_args < 1) return kiln_fail("%s: needs an input name or index", fn);
  if (codes[0] == kTVMArgInt) {
    if (args[0].v_int64 < 0 || args[0].v_int64 >= g->num_args)
      return kiln_fail("%s: input index %lld out of range (%d inputs and params)", fn,
                       (long long)args[0].v_int64, g->num_args);
    return g->order[args[0].v_int64];
  }
  if (codes[0] != kTVMStr || args[0].v_str == NULL)
    return kiln_fail("%s: the key must be a name or an index", fn);
  if ((i = KilnGraphExecutor_GetInputIndex(g->ge, args[0].v_str)) < 0)
    return kiln_fail("%s: the graph has no input named '%s'", fn, args[0].v_str);
  return i;
}

static int kiln_check_like(const DLTensor* want, const DLTensor* got, const char* fn) {
  int d;
  if (got->dtype.code != want->dtype.code || got->dtype.bits != want->dtype.bits ||
      got->dtype.lanes != want->dtype.lanes || got->ndim != want->ndim)
    return kiln_fail("%s: dtype or rank differs from the graph's (code %d bits %d ndim %d, "
                     "want code %d bits %d ndim %d)", fn, got->dtype.code, got->dtype.bits,
                     got->ndim, want->dtype.code, want->dtype.bits, want->ndim);
  for (d = 0; d < want->ndim; ++d)
    if (got->shape[d] != want->shape[d])
      return kiln_fail("%s: dimension %d is %lld, the graph's is %lld", fn, d,
                       (long long)got->shape[d], (long long)want->shape[d]);
  if (!kiln_is_compact(got)) return kiln_fail("%s: the tensor is not C-contiguous", fn);
  return 0;
}

static int kiln_eid(KilnGraphExec* g, int input) {
  return (int)(KilnGraphExecutor_GetInput(g->ge, input) - g->entries);
}

static int kiln_overlaps(const char* a, size_t an, const char* b, size_t bn) {
  return an && bn && a < b + bn && b < a + an;
}

/* Another entry sharing entry `eid`'s planned storage, or -1. */
static int kiln_shared_with(KilnGraphExec* g, int eid) {
  int e;
  for (e = 0; e < g->num_entries; ++e)
    if (e != eid && g->own_data[e] != NULL && g->own_data[e] == g->own_data[eid]) return e;
  return -1;
}

/* A zero-copy output other than `skip` whose memory overlaps [data, data + n), or -1. */
static int kiln_overlapping_output(KilnGraphExec* g, const char* data, size_t n, int skip) {
  int k;
  for (k = 0; k < KilnGraphExecutor_NumOutputs(g->ge); ++k)
    if (k != skip && g->out_data[k] &&
        kiln_overlaps(data, n, (const char*)g->out_data[k],
                      KilnArrayNumBytes(KilnGraphExecutor_GetOutput(g->ge, k))))
      return k;
  return -1;
}

static int kiln_ge_set_input(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                             int* ret_code) {
  KilnGraphExec* g = (KilnGraphExec*)self;
  DLTensor *x, *src = NULL;
  int in = kiln_key(g, args, codes, n, "set_input");
  (void)ret;
  (void)ret_code;
  if (in < 0 || kiln_arg_tensor(args, codes, n, 1, &src, "set_input") != 0) return -1;
  x = KilnGraphExecutor_GetInput(g->ge, in);
  if (kiln_check_like(x, src, "set_input") != 0) return -1;
  x->data = g->own_data[kiln_eid(g, in)]; /* ends a zero-copy binding */
  if (KilnArrayNumBytes(x))
    memcpy(x->data, (const char*)src->data + src->byte_offset, KilnArrayNumBytes(x));
  return 0;
}

static int kiln_ge_set_input_zero_copy(KilnModule* self, TVMValue* args, int* codes, int n,
                                       TVMValue* ret, int* ret_code) {
  KilnGraphExec* g = (KilnGraphExec*)self;
  DLTensor *x, *src = NULL;
  int in = kiln_key(g, args, codes, n, "set_input_zero_copy"), eid, e;
  char* data;
  (void)ret;
  (void)ret_code;
  if (in < 0 || kiln_arg_tensor(args, codes, n, 1, &src, "set_input_zero_copy") != 0) return -1;
  x = KilnGraphExecutor_GetInput(g->ge, in);
  if (kiln_check_like(x, src, "set_input_zero_copy") != 0) return -1;
  data = (char*)src->data + src->byte_offset;
  if (((uintptr_t)data & (KILN_ALIGN - 1)) != 0)
    return kiln_fail("set_input_zero_copy: needs %d-byte aligned memory, got %p", KILN_ALIGN,
                     (void*)data);
  eid = kiln_eid(g, in);
  if ((e = kiln_shared_with(g, eid)) >= 0)
    return kiln_fail("set_input_zero_copy: the input's storage is shared with entry %d; use "
                     "set_input", e);
  if ((e = kiln_overlapping_output(g, data, KilnArrayNumBytes(x), -1)) >= 0)
    return kiln_fail("set_input_zero_copy: its memory overlaps the zero-copy output %d; kernels "
                     "would read data they are overwriting", e);
  x->data = data;
  return 0;
}

/* Whether input `in` is bound to memory of its caller (set_input_zero_copy). */
static int kiln_input_bound(KilnGraphExec* g, int in) {
  return KilnGraphExecutor_GetInput(g->ge, in)->data != g->own_data[kiln_eid(g, in)];
}

/* set_output_zero_copy(index, tensor): the kernel writing output `index` writes into the
   tensor; or, when no kernel writes it alone (an input or param that is an output, storage
   shared with another entry, the same entry bound in place by another index), it is copied
   there after each run. NULL (or no tensor) ends the binding. As graph_executor.py. */
static int kiln_ge_set_output_zero_copy(KilnModule* self, TVMValue* args, int* codes, int n,
                                        TVMValue* ret, int* ret_code) {
  static const char fn[] = "set_output_zero_copy";
  KilnGraphExec* g = (KilnGraphExec*)self;
  int nout = KilnGraphExecutor_NumOutputs(g->ge), idx, eid, k, in_place;
  const DLTensor* y;
  DLTensor* dst = NULL;
  char* data;
  size_t nbytes;
  (void)ret, (void)ret_code;
  if (n < 1 || codes[0] != kTVMArgInt || args[0].v_int64 < 0 || args[0].v_int64 >= nout)
    return kiln_fail("%s: needs an output index below %d", fn, nout);
  idx = (int)args[0].v_int64;
  y = KilnGraphExecutor_GetOutput(g->ge, idx);
  eid = (int)(y - g->entries);
  nbytes = KilnArrayNumBytes(y);
  if (n < 2 || codes[1] == kTVMNullptr || args[1].v_handle == NULL) {
    dst = NULL;
  } else if (kiln_arg_tensor(args, codes, n, 1, &dst, fn) != 0 ||
             kiln_check_like(y, dst, fn) != 0) {
    return -1;
  }
  data = dst ? (char*)dst->data + dst->byte_offset : NULL;
  if (data && ((uintptr_t)data & (KILN_ALIGN - 1)) != 0)
    return kiln_fail("%s: needs %d-byte aligned memory, got %p", fn, KILN_ALIGN, (void*)data);
  if (data && (k = kiln_overlapping_output(g, data, nbytes, idx)) >= 0)
    return kiln_fail("%s: its memory overlaps the zero-copy output %d; kernels would read data "
                     "they are overwriting", fn, k);
  for (k = 0; data && k < KilnGraphExecutor_NumInputs(g->ge); ++k) {
    const DLTensor* x = KilnGraphExecutor_GetInput(g->ge, k);
    if (kiln_input_bound(g, k) && kiln_overlaps(data, nbytes, (const char*)x->data,
                                                KilnArrayNumBytes(x)))
      return kiln_fail("%s: its memory overlaps the zero-copy input '%s'; kernels would read "
                       "data they are overwriting", fn, KilnGraphExecutor_GetInputName(g->ge, k));
  }
  if (g->out_data[idx] && g->out_in_place[idx]) g->entries[eid].data = g->own_data[eid];
  g->out_data[idx] = data;
  g->out_in_place[idx] = 0;
  if (data == NULL) return 0;
  in_place = kiln_shared_with(g, eid) < 0;
  for (k = 0; in_place && k < KilnGraphExecutor_NumInputs(g->ge); ++k)
    in_place = kiln_eid(g, k) != eid; /* an input or param: no kernel writes it */
  for (k = 0; in_place && k < nout; ++k)
    in_place = k == idx || !g->out_in_place[k] ||
               KilnGraphExecutor_GetOutput(g->ge, k) != y;
  if (in_place) g->entries[eid].data = data;
  g->out_in_place[idx] = (uint8_t)in_place;
  return 0;
}

static int kiln_ge_get_input(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                             int* ret_code) {
  KilnGraphExec* g = (KilnGraphExec*)self;
  int in = kiln_key(g, args, codes, n, "get_input");
  if (in < 0) return -1;
  ret->v_handle = KilnGraphExecutor_GetInput(g->ge, in);
  *ret_code = kTVMDLTensorHandle;
  return 0;
}

static int kiln_ge_get_output(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                              int* ret_code) {
  KilnGraphExec* g = (KilnGraphExec*)self;
  const DLTensor* y;
  DLTensor* out = NULL;
  if (n < 1 || codes[0] != kTVMArgInt) return kiln_fail("get_output: needs an output index");
  if ((y = KilnGraphExecutor_GetOutput(g->ge, (int)args[0].v_int64)) == NULL ||
      args[0].v_int64 < 0 || args[0].v_int64 > INT32_MAX)
    return kiln_fail("get_output: index %lld out of range (%d outputs)",
                     (long long)args[0].v_int64, KilnGraphExecutor_NumOutputs(g->ge));
  if (n < 2) {
    ret->v_handle = (void*)y;
    *ret_code = kTVMDLTensorHandle;
    return 0;
  }
  if (kiln_arg_tensor(args, codes, n, 1, &out, "get_output") != 0 ||
      kiln_check_like(y, out, "get_output") != 0)
    return -1;
  if (KilnArrayNumBytes(y)) memcpy((char*)out->data + out->byte_offset, y->data, KilnArrayNumBytes(y));
  return 0;
}

static int kiln_ge_run(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                       int* ret_code) {
  KilnGraphExec* g = (KilnGraphExec*)self;
  (void)args, (void)codes, (void)n, (void)ret, (void)ret_code;
  TVMAPISetLastError(NULL);
  int k;
  if (KilnGraphExecutor_RunOps(g->ge) != 0) {
    kiln_take_lib_error(g->lib_error, "run: a kernel");
    return -1;
  }
  for (k = 0; k < KilnGraphExecutor_NumOutputs(g->ge); ++k) { /* zero-copy outputs not written
                                                                 in place */
    const DLTensor* y = KilnGraphExecutor_GetOutput(g->ge, k);
    if (g->out_data[k] && !g->out_in_place[k] && KilnArrayNumBytes(y))
      memmove(g->out_data[k], y->data, KilnArrayNumBytes(y));
  }
  return 0;
}

static int kiln_ge_num_inputs(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                              int* ret_code) {
  (void)args, (void)codes, (void)n;
  ret->v_int64 = ((KilnGraphExec*)self)->num_inputs;
  *ret_code = kTVMArgInt;
  return 0;
}

static int kiln_ge_num_outputs(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                               int* ret_code) {
  (void)args, (void)codes, (void)n;
  ret->v_int64 = KilnGraphExecutor_NumOutputs(((KilnGraphExec*)self)->ge);
  *ret_code = kTVMArgInt;
  return 0;
}

static int kiln_ge_input_index(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                               int* ret_code) {
  KilnGraphExec* g = (KilnGraphExec*)self;
  int in, k;
  if (n < 1 || codes[0] != kTVMStr) return kiln_fail("get_input_index: needs a name");
  in = KilnGraphExecutor_GetInputIndex(g->ge, args[0].v_str);
  ret->v_int64 = -1;
  for (k = 0; in >= 0 && k < g->num_args; ++k)
    if (g->order[k] == in) ret->v_int64 = k;
  *ret_code = kTVMArgInt;
  return 0;
}

static int kiln_ge_input_name(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                              int* ret_code) {
  KilnGraphExec* g = (KilnGraphExec*)self;
  const char* name;
  if (n < 1 || codes[0] != kTVMArgInt || args[0].v_int64 < 0 || args[0].v_int64 >= g->num_args)
    return kiln_fail("get_input_name: needs an index below %d", g->num_args);
  name = KilnGraphExecutor_GetInputName(g->ge, g->order[args[0].v_int64]);
  ret->v_str = kiln_return_string(name, strlen(name));
  *ret_code = kTVMStr;
  return ret->v_str ? 0 : -1;
}

static int kiln_ge_load_params(KilnModule* self, TVMValue* args, int* codes, int n,
                               TVMValue* ret, int* ret_code) {
  KilnGraphExec* g = (KilnGraphExec*)self;
  const TVMByteArray* b;
  int i;
  (void)ret, (void)ret_code;
  if (n < 1 || codes[0] != kTVMBytes || args[0].v_handle == NULL)
    return kiln_fail("load_params: needs the params blob (bytes)");
  b = (const TVMByteArray*)args[0].v_handle;
  for (i = 0; i < g->num_entries; ++i) g->entries[i].data = g->own_data[i];
  for (i = 0; i < KilnGraphExecutor_NumOutputs(g->ge); ++i) /* in-place outputs stay bound */
    if (g->out_in_place[i])
      g->entries[KilnGraphExecutor_GetOutput(g->ge, i) - g->entries].data = g->out_data[i];
  return KilnGraphExecutor_LoadParams(g->ge, b->data, b->size);
}

static const struct {
  const char* name;
  KilnMethod method;
} kiln_ge_methods[] = {
    {"set_input", kiln_ge_set_input},       {"set_input_zero_copy", kiln_ge_set_input_zero_copy},
    {"get_input", kiln_ge_get_input},       {"get_output", kiln_ge_get_output},
    {"run", kiln_ge_run},                   {"get_num_inputs", kiln_ge_num_inputs},
    {"get_num_outputs", kiln_ge_num_outputs}, {"get_input_index", kiln_ge_input_index},
    {"get_input_name", kiln_ge_input_name}, {"load_params", kiln_ge_load_params},
    {"set_output_zero_copy", kiln_ge_set_output_zero_copy},
};

static int kiln_ge_get_own(KilnModule* self, const char* name, KilnFunc** out) {
  size_t i;
  *out = NULL;
  for (i = 0; i < sizeof(kiln_ge_methods) / sizeof(kiln_ge_methods[0]); ++i)
    if (strcmp(kiln_ge_methods[i].name, name) == 0) {
      *out = kiln_func_method(self, kiln_ge_methods[i].name, kiln_ge_methods[i].method);
      return *out ? 0 : -1;
    }
  return 0;
}

static void kiln_ge_drop_funcs(KilnGraphExec* g) {
  int i;
  for (i = 0; i < g->num_funcs; ++i) kiln_func_release(g->funcs[i]);
  g->num_funcs = 0;
}

static void kiln_ge_destroy(KilnModule* self) {
  KilnGraphExec* g = (KilnGraphExec*)self;
  kiln_ge_drop_funcs(g);
  free(g->funcs);
  free(g->arena_mem);
  free(g->order);
  free(g->own_data);
  free(g->out_data);
  free(g->out_in_place);
}

/* -- creation: kernels are looked up in the factory's imports (the library) */
typedef struct {
  KilnFactory* fac;
  KilnGraphExec* g;
} KilnLookupCtx;

static int kiln_ge_lookup(void* ctx, const char* name, TVMBackendPackedCFunc* func,
                          void** resource) {
  KilnLookupCtx* c = (KilnLookupCtx*)ctx;
  KilnGraphExec* g = c->g;
  KilnFunc* f = NULL;
  int i;
  for (i = 0; f == NULL && i < c->fac->base.num_imports; ++i)
    if (kiln_module_get_function(c->fac->base.imports[i], name, 1, &f) != 0) return -1;
  if (f == NULL) return kiln_fail("kernel '%s' of the graph is not in the library", name);
  if (g->num_funcs == g->cap_funcs) {
    int cap = g->cap_funcs ? 2 * g->cap_funcs : 64;
    KilnFunc** grown = (KilnFunc**)realloc(g->funcs, (size_t)cap * sizeof(*grown));
    if (grown == NULL) {
      kiln_func_release(f);
      return kiln_fail("out of memory");
    }
    g->funcs = grown;
    g->cap_funcs = cap;
  }
  g->funcs[g->num_funcs++] = f;
  if (f->cfunc != NULL && f->method == NULL) { /* a kernel: called directly by the run loop */
    *func = f->cfunc;
    *resource = f->resource;
    if (f->lib_error) g->lib_error = f->lib_error;
  } else {
    *func = kiln_func_trampoline;
    *resource = f;
  }
  return 0;
}

int kiln_ge_create(KilnFactory* fac, KilnModule** out) {
  KilnGraphExec* g = (KilnGraphExec*)kiln_module_new(sizeof(KilnGraphExec), "GraphExecutor");
  KilnLookupCtx ctx = {fac, g};
  size_t size = ((size_t)1 << 20) + 64 * fac->graph_len, i;
  int k, all;
  uint8_t* is_param;
  if (g == NULL) return -1;
  g->base.get_own = kiln_ge_get_own;
  g->base.destroy = kiln_ge_destroy;
  /* The executor's tables and storage need an arena of a size known only once it is parsed:
     grow it until creation fits (KilnArena.needed tells the next size at least). */
  for (;;) {
    KilnArena arena;
    if ((g->arena_mem = malloc(size)) == NULL) {
      kiln_fail("the graph needs more than %zu bytes of storage, which cannot be allocated", size);
      goto fail;
    }
    KilnArena_Init(&arena, g->arena_mem, size);
    if (KilnGraphExecutor_CreateWithLookup(fac->graph_json, fac->graph_len, kiln_ge_lookup, &ctx,
                                           &arena, &g->ge) == 0)
      break;
    kiln_ge_drop_funcs(g);
    free(g->arena_mem);
    g->arena_mem = NULL;
    if (arena.needed == 0) goto fail; /* a real error, not a full arena */
    if (arena.needed > KILN_MAX_ARENA || size > KILN_MAX_ARENA / 2) {
      kiln_fail("the graph needs more than %zu bytes of storage", KILN_MAX_ARENA);
      goto fail;
    }
    size = arena.needed + arena.needed / 2 > 2 * size ? arena.needed + arena.needed / 2 : 2 * size;
  }
  g->entries = KilnGraphExecutor_Entries(g->ge, &g->num_entries);
  if ((g->own_data = (void**)kiln_calloc((size_t)g->num_entries + 1, sizeof(void*))) == NULL)
    goto fail;
  for (k = 0; k < g->num_entries; ++k) g->own_data[k] = g->entries[k].data;
  all = KilnGraphExecutor_NumOutputs(g->ge);
  if ((g->out_data = (void**)kiln_calloc((size_t)all + 1, sizeof(void*))) == NULL ||
      (g->out_in_place = (uint8_t*)kiln_calloc((size_t)all + 1, 1)) == NULL)
    goto fail;
  if (fac->params_len && KilnGraphExecutor_LoadParams(g->ge, fac->params, fac->params_len) != 0)
    goto fail;
  all = KilnGraphExecutor_NumInputs(g->ge);
  is_param = (uint8_t*)kiln_calloc((size_t)all + 1, 1);
  g->order = (int*)kiln_calloc((size_t)all + 1, sizeof(int));
  if (is_param == NULL || g->order == NULL) {
    free(is_param);
    goto fail;
  }
  for (i = 0; i < fac->num_params; ++i) {
    k = KilnGraphExecutor_GetInputIndex(g->ge, fac->param_names[i]);
    if (k >= 0) is_param[k] = 1;
  }
  for (k = 0; k < all; ++k)
    if (!is_param[k]) g->order[g->num_inputs++] = k;
  g->num_args = g->num_inputs;
  for (k = 0; k < all; ++k)
    if (is_param[k]) g->order[g->num_args++] = k;
  free(is_param);
  *out = &g->base;
  return 0;
fail:
  kiln_module_release(&g->base);
  return -1;
}

