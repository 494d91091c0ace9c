/*
 * The VM executable module (type_key relax.VMExecutable, also relax.Executable): decision 014's
 * byte format read with the checks of kiln/runtime/vm/executable_format.py (every offset, length and count
 * against the bytes present before allocating), then the cross-references of vm_executable.py
 * (function ranges, register and heap counts, signature symbols, duplicate names) and the
 * instruction decoding of vm_bytecode.py (every register, constant, function and heap index in
 * range, jumps onto instructions of the function). TVM: src/runtime/relax_vm/executable.cc
 * (LoadFromBinary, the section readers) and include/tvm/runtime/relax_vm/bytecode.h.
 *
 * Functions: vm_load_executable() -> a VM module (rt_vm.c); native extra: get_lib() -> the
 * kernel library (its first import), as the graph executor factory's.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_vm.h"

#define KILN_ALIGN 64

/* indexed by section id / opcode (rt_vocabulary.h) */
static const char* const kiln_vm_section_names[] = KILN_SEC_NAMES_INIT;
static const char* const kiln_vm_section_what[] = KILN_SEC_WHAT_INIT;
static const char* const kiln_vm_op_names[] = KILN_OP_NAMES_INIT;

static const struct {
  const char* name;
  uint8_t code, bits;
} kiln_vm_dtypes[] = {
    {"float16", kDLFloat, 16}, {"float32", kDLFloat, 32}, {"float64", kDLFloat, 64},
    {"int8", kDLInt, 8},       {"int16", kDLInt, 16},     {"int32", kDLInt, 32},
    {"int64", kDLInt, 64},     {"uint8", kDLUInt, 8},     {"uint16", kDLUInt, 16},
    {"uint32", kDLUInt, 32},   {"uint64", kDLUInt, 64},   {"bool", 6, 8},
};

int kiln_vm_dtype_from_name(const char* name, DLDataType* out) {
  size_t i;
  for (i = 0; i < sizeof(kiln_vm_dtypes) / sizeof(kiln_vm_dtypes[0]); ++i)
    if (strcmp(kiln_vm_dtypes[i].name, name) == 0) {
      out->code = kiln_vm_dtypes[i].code;
      out->bits = kiln_vm_dtypes[i].bits;
      out->lanes = 1;
      return 0;
    }
  return kiln_fail("dtype '%s' is not supported by the Kiln runtime", name);
}

const char* kiln_vm_dtype_name(DLDataType t) {
  size_t i;
  for (i = 0; i < sizeof(kiln_vm_dtypes) / sizeof(kiln_vm_dtypes[0]); ++i)
    if (kiln_vm_dtypes[i].code == t.code && kiln_vm_dtypes[i].bits == t.bits && t.lanes == 1)
      return kiln_vm_dtypes[i].name;
  return "an unsupported dtype";
}

static int kiln_read_i64(KilnStream* s, int64_t* out, const char* field) {
  uint64_t v;
  if (kiln_read_u64(s, &v, field) != 0) return -1;
  *out = (int64_t)v;
  return 0;
}

static int kiln_read_string(KilnStream* s, char** out, const char* field) {
  const uint8_t* p;
  size_t n;
  if (kiln_read_bytes(s, &p, &n, field) != 0) return -1;
  if (memchr(p, 0, n) != NULL) return kiln_fail("%s: corrupt %s: a NUL byte", s->what, field);
  return (*out = kiln_strndup((const char*)p, n)) ? 0 : -1;
}

static int kiln_done(KilnStream* s) {
  return s->left ? kiln_fail("%s: %zu unexpected trailing bytes", s->what, s->left) : 0;
}

/* -- sections */
static int kiln_vm_symbols(KilnVMExec* e, KilnStream* s) {
  uint64_t n, i;
  if (kiln_read_count(s, 32, &n, "symbol count") != 0) return -1;
  if ((e->symbols = (KilnVMSymbol*)kiln_calloc(n, sizeof(KilnVMSymbol))) == NULL) return -1;
  for (i = 0; i < n; ++i) {
    KilnVMSymbol* y = &e->symbols[i];
    e->num_symbols = i + 1;
    if (kiln_read_string(s, &y->name, "symbol name") != 0 ||
        kiln_read_i64(s, &y->lo, "symbol lo") != 0 || kiln_read_i64(s, &y->hi, "symbol hi") != 0 ||
        kiln_read_i64(s, &y->divisor, "symbol divisor") != 0)
      return -1;
    if (y->lo < 0 || y->hi < -1 || (y->hi != -1 && y->hi < y->lo) || y->divisor < 1)
      return kiln_fail("%s: corrupt symbol '%s': lo %lld, hi %lld, divisor %lld", s->what,
                       y->name, (long long)y->lo, (long long)y->hi, (long long)y->divisor);
  }
  return kiln_done(s);
}

static int kiln_vm_sigs(KilnStream* s, KilnVMSig** out, size_t* num, const char* fname,
                        const char* what) {
  uint64_t n, i, d, ndim;
  char* dtype = NULL;
  if (kiln_read_count(s, 24, &n, what) != 0) return -1;
  if ((*out = (KilnVMSig*)kiln_calloc(n, sizeof(KilnVMSig))) == NULL) return -1;
  for (i = 0; i < n; ++i) {
    KilnVMSig* g = &(*out)[i];
    *num = i + 1;
    if (kiln_read_string(s, &g->name, what) != 0 || kiln_read_string(s, &dtype, what) != 0)
      return -1;
    if (kiln_vm_dtype_from_name(dtype, &g->dtype) != 0) {
      kiln_fail("%s: function '%s' %s '%s': dtype '%s' is not supported", s->what, fname, what,
                g->name, dtype);
      free(dtype);
      return -1;
    }
    free(dtype);
    dtype = NULL;
    if (kiln_read_count(s, 8, &ndim, what) != 0) return -1;
    if (ndim > KILN_VM_MAX_NDIM)
      return kiln_fail("%s: function '%s' %s '%s': rank %llu (at most %d)", s->what, fname, what,
                       g->name, (unsigned long long)ndim, KILN_VM_MAX_NDIM);
    g->ndim = (int)ndim;
    if ((g->dims = (int64_t*)kiln_calloc(ndim, sizeof(int64_t))) == NULL) return -1;
    for (d = 0; d < ndim; ++d)
      if (kiln_read_i64(s, &g->dims[d], what) != 0) return -1;
  }
  return 0;
}

static int kiln_vm_functions(KilnVMExec* e, KilnStream* s) {
  uint64_t n, i;
  if (kiln_read_count(s, 60, &n, "function count") != 0) return -1;
  if ((e->funcs = (KilnVMFunction*)kiln_calloc(n, sizeof(KilnVMFunction))) == NULL) return -1;
  for (i = 0; i < n; ++i) {
    KilnVMFunction* f = &e->funcs[i];
    uint32_t kind;
    e->num_funcs = i + 1;
    if (kiln_read_u32(s, &kind, "function kind") != 0 ||
        kiln_read_string(s, &f->name, "function name") != 0)
      return -1;
    f->kind = (int)(int32_t)kind;
    if (f->kind != KILN_VM_KIND_PACKED && f->kind != KILN_VM_KIND_VM)
      return kiln_fail("%s: function '%s': unknown kind %d", s->what, f->name, f->kind);
    if (kiln_read_i64(s, &f->start, "function start") != 0 ||
        kiln_read_i64(s, &f->end, "function end") != 0 ||
        kiln_read_i64(s, &f->num_regs, "function num_regs") != 0 ||
        kiln_read_i64(s, &f->heap_size, "function heap_size") != 0 ||
        kiln_vm_sigs(s, &f->params, &f->num_params, f->name, "param") != 0 ||
        kiln_vm_sigs(s, &f->outputs, &f->num_outputs, f->name, "output") != 0)
      return -1;
  }
  return kiln_done(s);
}

static int kiln_vm_constants(KilnVMExec* e, KilnStream* s) {
  uint64_t n, i, k;
  if (kiln_read_count(s, 4, &n, "constant count") != 0) return -1;
  if ((e->consts = (KilnVMConst*)kiln_calloc(n, sizeof(KilnVMConst))) == NULL) return -1;
  for (i = 0; i < n; ++i) {
    KilnVMConst* c = &e->consts[i];
    uint32_t tag;
    e->num_consts = i + 1;
    if (kiln_read_u32(s, &tag, "constant tag") != 0) return -1;
    c->tag = (int)tag;
    if (tag == KILN_TAG_NDARRAY) {
      KilnArrayView a;
      if (kiln_read_ndarray(s, &a, "constant") != 0) return -1;
      memcpy(c->shape, a.shape, sizeof(int64_t) * (size_t)a.ndim);
      c->tensor.shape = c->shape;
      c->tensor.ndim = a.ndim;
      c->tensor.dtype = a.dtype;
      c->tensor.device.device_type = kDLCPU;
      if (posix_memalign(&c->tensor.data, KILN_ALIGN, a.nbytes ? a.nbytes : KILN_ALIGN) != 0) {
        c->tensor.data = NULL;
        return kiln_fail("out of memory (%llu bytes of constant %llu)",
                         (unsigned long long)a.nbytes, (unsigned long long)i);
      }
      if (a.nbytes) memcpy(c->tensor.data, a.data, a.nbytes);
    } else if (tag == KILN_TAG_INT_ARRAY) {
      if (kiln_read_count(s, 8, &c->num_ints, "constant length") != 0) return -1;
      if ((c->ints = (int64_t*)kiln_calloc(c->num_ints, sizeof(int64_t))) == NULL) return -1;
      for (k = 0; k < c->num_ints; ++k)
        if (kiln_read_i64(s, &c->ints[k], "constant values") != 0) return -1;
    } else if (tag == KILN_TAG_STRING) {
      if (kiln_read_string(s, &c->str, "constant") != 0) return -1;
    } else if (tag == KILN_TAG_INT) {
      if (kiln_read_i64(s, &c->value, "constant") != 0) return -1;
    } else {
      return kiln_fail("%s: constant %llu: unknown tag %u", s->what, (unsigned long long)i, tag);
    }
  }
  return kiln_done(s);
}

/* -- checks (vm_executable._check_function, vm_bytecode.decode_function) */
static int kiln_vm_check_function(const KilnVMExec* e, const KilnVMFunction* f, size_t n_code) {
  size_t k;
  int d, which;
  for (which = 0; which < 2; ++which) {
    const KilnVMSig* sigs = which ? f->outputs : f->params;
    size_t n = which ? f->num_outputs : f->num_params;
    for (k = 0; k < n; ++k)
      for (d = 0; d < sigs[k].ndim; ++d)
        if (sigs[k].dims[d] < 0 && (uint64_t)(-1 - sigs[k].dims[d]) >= e->num_symbols)
          return kiln_fail("VM executable: function '%s': '%s' refers to symbol %lld, but there "
                           "are %zu", f->name, sigs[k].name, (long long)(-1 - sigs[k].dims[d]),
                           e->num_symbols);
  }
  if (f->kind == KILN_VM_KIND_PACKED) return 0;
  if (!(0 <= f->start && f->start < f->end && (uint64_t)f->end <= n_code))
    return kiln_fail("VM executable: function '%s': code range [%lld, %lld) is not inside the "
                     "%zu code words", f->name, (long long)f->start, (long long)f->end, n_code);
  if (!((int64_t)f->num_params <= f->num_regs && f->num_regs <= KILN_VM_MAX_REGS))
    return kiln_fail("VM executable: function '%s': %lld registers (needs %zu for its params, "
                     "at most %d)", f->name, (long long)f->num_regs, f->num_params,
                     KILN_VM_MAX_REGS);
  if (!((int64_t)e->num_symbols <= f->heap_size && f->heap_size <= KILN_VM_MAX_HEAP))
    return kiln_fail("VM executable: function '%s': heap of %lld slots (needs at least the %zu "
                     "symbols, at most %d)", f->name, (long long)f->heap_size, e->num_symbols,
                     KILN_VM_MAX_HEAP);
  return 0;
}

#define KILN_BAD(pc, ...) \
  (kiln_fail("VM executable: function '%s', instruction at word %lld: %s", f->name, \
             (long long)(pc), (snprintf(msg, sizeof(msg), __VA_ARGS__), msg)))

static int kiln_vm_check_arg(const KilnVMExec* e, const KilnVMFunction* f, int64_t pc, int i,
                             KilnVMArg a) {
  char msg[256];
  const char* what;
  int64_t n;
  switch (a.kind) {
    case KILN_ARG_IMM: return 0;
    case KILN_ARG_REG: what = "register", n = f->num_regs; break;
    case KILN_ARG_CONST: what = "constant", n = (int64_t)e->num_consts; break;
    case KILN_ARG_FUNC: what = "function", n = (int64_t)e->num_funcs; break;
    case KILN_ARG_HEAP: what = "heap slot", n = f->heap_size; break;
    default: return KILN_BAD(pc, "argument %d has unknown kind %d", i, a.kind);
  }
  if (a.value < 0 || a.value >= n)
    return KILN_BAD(pc, "argument %d: %s %lld out of range (0..%lld)", i, what,
                    (long long)a.value, (long long)n - 1);
  return 0;
}

static int kiln_vm_decode(const KilnVMExec* e, KilnVMFunction* f, const int64_t* code) {
  char msg[256];
  int64_t pc = f->start, end = f->end, nargs_total = 0, k;
  size_t n = 0, i, lo, hi;
  /* at most one instruction per two words, arguments at most one per word */
  size_t cap = (size_t)(end - f->start) / 2 + 1;
  if ((f->instrs = (KilnVMInstr*)kiln_calloc(cap, sizeof(KilnVMInstr))) == NULL ||
      (f->arg_words = (KilnVMArg*)kiln_calloc((size_t)(end - f->start), sizeof(KilnVMArg))) == NULL)
    return -1;
  while (pc < end) {
    KilnVMInstr* ins = &f->instrs[n];
    int64_t op = code[pc];
    ins->pc = pc;
    ins->dst = -1;
    ins->target = -1;
    if (op == KILN_OP_CALL) {
      int64_t nargs;
      if (pc + 4 > end) return KILN_BAD(pc, "call instruction truncated");
      ins->dst = code[pc + 1];
      ins->func_idx = code[pc + 2];
      nargs = code[pc + 3];
      if (ins->dst < -1 || ins->dst >= f->num_regs)
        return KILN_BAD(pc, "destination register %lld out of range", (long long)ins->dst);
      if (ins->func_idx < 0 || (uint64_t)ins->func_idx >= e->num_funcs)
        return KILN_BAD(pc, "function index %lld out of range", (long long)ins->func_idx);
      if (nargs < 0 || nargs > end - pc - 4)
        return KILN_BAD(pc, "call with %lld arguments runs past the function's end",
                        (long long)nargs);
      ins->nargs = (int)nargs;
      ins->args = f->arg_words + nargs_total;
      for (k = 0; k < nargs; ++k) {
        uint64_t u = (uint64_t)code[pc + 4 + k];
        int64_t v = (int64_t)(u & ((1ULL << KILN_ARG_VALUE_BITS) - 1));
        if (v & (1LL << (KILN_ARG_VALUE_BITS - 1))) v -= (1LL << KILN_ARG_VALUE_BITS);
        ins->args[k].kind = (int)(u >> KILN_ARG_VALUE_BITS);
        ins->args[k].value = v;
        if (kiln_vm_check_arg(e, f, pc, (int)k, ins->args[k]) != 0) return -1;
      }
      nargs_total += nargs;
      pc += 4 + nargs;
    } else if (op == KILN_OP_RET || op == KILN_OP_GOTO) {
      if (pc + 2 > end) return KILN_BAD(pc, "%s instruction truncated", kiln_vm_op_names[op]);
      if (op == KILN_OP_RET && (code[pc + 1] < 0 || code[pc + 1] >= f->num_regs))
        return KILN_BAD(pc, "ret of register %lld out of range", (long long)code[pc + 1]);
      if (op == KILN_OP_RET) ins->dst = code[pc + 1];
      else ins->target = code[pc + 1]; /* a word offset, resolved below */
      pc += 2;
    } else if (op == KILN_OP_IF) {
      if (pc + 3 > end) return KILN_BAD(pc, "if instruction truncated");
      if (code[pc + 1] < 0 || code[pc + 1] >= f->num_regs)
        return KILN_BAD(pc, "if on register %lld out of range", (long long)code[pc + 1]);
      ins->dst = code[pc + 1];
      ins->target = code[pc + 2];
      pc += 3;
    } else {
      return KILN_BAD(pc, "unknown opcode %lld", (long long)op);
    }
    ins->op = (int)op;
    ++n;
  }
  f->num_instrs = n;
  /* jump targets: word offsets -> instruction indices (binary search over the sorted pcs) */
  for (i = 0; i < n; ++i) {
    KilnVMInstr* ins = &f->instrs[i];
    int64_t word;
    if (ins->op != KILN_OP_GOTO && ins->op != KILN_OP_IF) continue;
    if (__builtin_add_overflow(ins->pc, ins->target, &word)) word = -1;
    lo = 0, hi = n;
    while (lo < hi) {
      size_t mid = (lo + hi) / 2;
      if (f->instrs[mid].pc < word) lo = mid + 1;
      else hi = mid;
    }
    if (lo >= n || f->instrs[lo].pc != word)
      return KILN_BAD(ins->pc, "jump to word %lld, which is not an instruction of the function "
                      "(words %lld..%lld)", (long long)word, (long long)f->start,
                      (long long)f->end - 1);
    if (lo == i && ins->op == KILN_OP_GOTO)
      return KILN_BAD(ins->pc, "goto jumps to itself (an endless loop)");
    ins->target = (int64_t)lo;
  }
  return 0;
}

/* -- the module */
int kiln_vm_create(KilnVMExec* exe, KilnModule** out); /* rt_vm.c */

static int kiln_vm_load_method(KilnModule* self, TVMValue* args, int* codes, int n,
                               TVMValue* ret, int* ret_code) {
  KilnModule* vm;
  (void)args, (void)codes, (void)n;
  if (kiln_vm_create((KilnVMExec*)self, &vm) != 0) return -1;
  ret->v_handle = vm;
  *ret_code = kTVMModuleHandle;
  return 0;
}

static int kiln_vm_get_lib(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                           int* ret_code) {
  (void)args, (void)codes, (void)n;
  return kiln_return_library(self, ret, ret_code, "the VM executable");
}

static int kiln_vm_exec_get_own(KilnModule* self, const char* name, KilnFunc** out) {
  *out = NULL;
  if (strcmp(name, "vm_load_executable") == 0)
    *out = kiln_func_method(self, "vm_load_executable", kiln_vm_load_method);
  else if (strcmp(name, "get_lib") == 0)
    *out = kiln_func_method(self, "get_lib", kiln_vm_get_lib);
  else
    return 0;
  return *out ? 0 : -1;
}

static void kiln_vm_exec_hint(KilnModule* self, char* buf, size_t size) {
  (void)self; /* usually asked for "default" by a program written for graph libraries */
  snprintf(buf, size, "this is a VM library (symbolic shapes): create a VM with "
           "vm_load_executable(), then vm_initialization(kDLCPU, 0, 2), and call its main "
           "(see examples/deploy_vm_c)");
}

static void kiln_vm_free_sigs(KilnVMSig* s, size_t n) {
  size_t i;
  for (i = 0; s && i < n; ++i) {
    free(s[i].name);
    free(s[i].dims);
  }
  free(s);
}

static void kiln_vm_exec_destroy(KilnModule* self) {
  KilnVMExec* e = (KilnVMExec*)self;
  size_t i;
  for (i = 0; e->symbols && i < e->num_symbols; ++i) free(e->symbols[i].name);
  free(e->symbols);
  for (i = 0; e->funcs && i < e->num_funcs; ++i) {
    KilnVMFunction* f = &e->funcs[i];
    free(f->name);
    kiln_vm_free_sigs(f->params, f->num_params);
    kiln_vm_free_sigs(f->outputs, f->num_outputs);
    free(f->instrs);
    free(f->arg_words);
  }
  free(e->funcs);
  for (i = 0; e->consts && i < e->num_consts; ++i) {
    free(e->consts[i].tensor.data);
    free(e->consts[i].ints);
    free(e->consts[i].str);
  }
  free(e->consts);
}

static uint32_t kiln_get_u32(const uint8_t* p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t kiln_get_u64(const uint8_t* p) {
  return (uint64_t)kiln_get_u32(p) | (uint64_t)kiln_get_u32(p + 4) << 32;
}

/* The section table (vm_format._read_sections): sec[id] = (offset, length), checked. */
static int kiln_vm_sections(const uint8_t* data, size_t n, KilnStream sec[KILN_SEC_LAST + 1]) {
  uint32_t version, count, i;
  int id;
  memset(sec, 0, (KILN_SEC_LAST + 1) * sizeof(KilnStream));
  if (n < KILN_VM_HEADER_SIZE)
    return kiln_fail("VM executable: truncated: the header needs %d bytes, %zu left",
                     KILN_VM_HEADER_SIZE, n);
  if (memcmp(data, KILN_VM_MAGIC, KILN_VM_MAGIC_LEN) != 0)
    return kiln_fail("VM executable: not a Kiln VM executable (bad magic)");
  version = kiln_get_u32(data + KILN_VM_MAGIC_LEN);
  count = kiln_get_u32(data + KILN_VM_MAGIC_LEN + 4);
  if (version != KILN_VM_VERSION)
    return kiln_fail("VM executable: format version %u is not supported (this runtime reads "
                     "version %d)", version, KILN_VM_VERSION);
  if ((uint64_t)count * KILN_VM_ENTRY_SIZE > n - KILN_VM_HEADER_SIZE)
    return kiln_fail("VM executable: corrupt section table: %u entries cannot fit in %zu bytes",
                     count, n - KILN_VM_HEADER_SIZE);
  for (i = 0; i < count; ++i) {
    const uint8_t* entry = data + KILN_VM_HEADER_SIZE + KILN_VM_ENTRY_SIZE * (size_t)i;
    uint32_t sid = kiln_get_u32(entry);
    uint64_t off = kiln_get_u64(entry + 4), len = kiln_get_u64(entry + 12);
    int known = sid <= KILN_SEC_LAST && kiln_vm_section_what[sid] != NULL;
    const char* name = known ? kiln_vm_section_names[sid] : "unknown";
    if (off > n || len > n - off)
      return kiln_fail("VM executable: section %s (entry %u): offset %llu + length %llu runs "
                       "past the end (%zu bytes)", name, i, (unsigned long long)off,
                       (unsigned long long)len, n);
    if (!known) continue; /* unknown sections are skipped */
    if (sec[sid].what != NULL) return kiln_fail("VM executable: section %s appears twice", name);
    sec[sid].p = data + off;
    sec[sid].left = (size_t)len;
    sec[sid].what = kiln_vm_section_what[sid];
  }
  for (id = KILN_SEC_FIRST; id <= KILN_SEC_LAST; ++id)
    if (kiln_vm_section_what[id] != NULL && sec[id].what == NULL)
      return kiln_fail("VM executable: required section '%s' is missing",
                       kiln_vm_section_names[id]);
  return 0;
}

int kiln_load_vm_executable(const uint8_t* data, size_t n, KilnModule** out) {
  KilnVMExec* e = (KilnVMExec*)kiln_module_new(sizeof(KilnVMExec), KILN_VM_TYPE_KEY);
  KilnStream sec[KILN_SEC_LAST + 1];
  int64_t* code = NULL;
  uint64_t ncode, k;
  size_t i, j;
  *out = NULL;
  if (e == NULL) return -1;
  e->base.get_own = kiln_vm_exec_get_own;
  e->base.missing_hint = kiln_vm_exec_hint;
  e->base.destroy = kiln_vm_exec_destroy;
  if (kiln_vm_sections(data, n, sec) != 0 || kiln_vm_symbols(e, &sec[KILN_SEC_SYMBOLS]) != 0 ||
      kiln_vm_functions(e, &sec[KILN_SEC_FUNCTIONS]) != 0 ||
      kiln_vm_constants(e, &sec[KILN_SEC_CONSTANTS]) != 0 ||
      kiln_read_count(&sec[KILN_SEC_CODE], 8, &ncode, "code length") != 0 ||
      (code = (int64_t*)kiln_calloc(ncode, sizeof(int64_t))) == NULL)
    goto fail;
  for (k = 0; k < ncode; ++k)
    if (kiln_read_i64(&sec[KILN_SEC_CODE], &code[k], "code words") != 0) goto fail;
  if (kiln_done(&sec[KILN_SEC_CODE]) != 0) goto fail;
  for (i = 0; i < e->num_funcs; ++i) {
    for (j = 0; j < i; ++j)
      if (strcmp(e->funcs[i].name, e->funcs[j].name) == 0) {
        kiln_fail("VM executable: function name '%s' appears twice in the function table",
                  e->funcs[i].name);
        goto fail;
      }
    if (kiln_vm_check_function(e, &e->funcs[i], (size_t)ncode) != 0) goto fail;
    if (e->funcs[i].kind == KILN_VM_KIND_VM && kiln_vm_decode(e, &e->funcs[i], code) != 0)
      goto fail;
  }
  free(code);
  *out = &e->base;
  return 0;
fail:
  free(code);
  kiln_module_release(&e->base);
  return -1;
}
