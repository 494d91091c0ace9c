/*
 * The VM's builtins (vm.builtin.*), prepared once per call site at vm_initialization: the
 * static arguments are checked there (a malformed executable fails before running), and the
 * run function sees only the resolved arguments. TVM's src/runtime/relax_vm/builtin.cc
 * (match_shape, alloc_storage, alloc_tensor, reshape, make_tuple, tuple_getitem...); the checks
 * and messages of kiln/runtime/vm/builtins.py and vm_storage.py.
 *
 * Implemented: match_shape, shape_compute, alloc_storage, alloc_tensor, reshape, copy,
 * tensor_to_heap, shape_to_tensor, read_bool, trap, make_tuple, tuple_get; bind_shape and the
 * list builtins of decision 015 in rt_vm_lists.c; kv_append (decision 019) in rt_vm_kv.c;
 * nonzero, topk, compress, range, constant_of_shape, reshape_to, expand, tile, slice
 * (decision 016) in rt_vm_dynamic.c.
 * The other data-dependent ops of the Python runtime fail at vm_initialization, naming the
 * builtin and the call site.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_vm.h"

#define KILN_ALIGN 64

/* builtins.PYTHON_ONLY_BUILTINS (rt_vocabulary.h, with the reasons in builtins.py) */
static const char* const kiln_python_only[] = KILN_VM_PYTHON_ONLY_BUILTINS_INIT;

int kiln_site_fail(const KilnVMSite* s, const char* fmt, ...) {
  char msg[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  return kiln_fail("VM executable: function '%s' instruction at word %lld: %s: %s",
                   s->where_func, (long long)s->ins->pc, s->builtin, msg);
}

int kiln_nargs(const KilnVMSite* s, int lo, int hi) {
  int n = s->ins->nargs;
  if (n < lo || (hi >= 0 && n > hi)) return kiln_site_fail(s, "expects %d..%d arguments, got %d",
                                                          lo, hi, n);
  return 0;
}

static int kiln_imm(const KilnVMSite* s, int i, int64_t* out) {
  if (s->ins->args[i].kind != KILN_ARG_IMM)
    return kiln_site_fail(s, "argument %d must be an immediate", i);
  *out = s->ins->args[i].value;
  return 0;
}

static int kiln_int_array(const KilnVMExec* e, KilnVMSite* s, int i) {
  const KilnVMArg a = s->ins->args[i];
  if (a.kind != KILN_ARG_CONST || e->consts[a.value].tag != KILN_TAG_INT_ARRAY)
    return kiln_site_fail(s, "argument %d must be a constant int64 array", i);
  s->spec = e->consts[a.value].ints;
  s->spec_n = e->consts[a.value].num_ints;
  return 0;
}

const char* kiln_str_const(const KilnVMExec* e, const KilnVMSite* s, int i) {
  const KilnVMArg a = s->ins->args[i];
  if (a.kind != KILN_ARG_CONST || e->consts[a.value].tag != KILN_TAG_STRING) return NULL;
  return e->consts[a.value].str;
}

int kiln_size_args(const KilnVMSite* s, int first) {
  int i;
  for (i = first; i < s->ins->nargs; ++i)
    if (s->ins->args[i].kind != KILN_ARG_IMM && s->ins->args[i].kind != KILN_ARG_HEAP)
      return kiln_site_fail(s, "argument %d must be an immediate or a heap slot", i);
  return 0;
}

static int kiln_slot(const KilnVMSite* s, const KilnVMFunction* f, int64_t v, const char* what) {
  if (v < 0 || v >= f->heap_size)
    return kiln_site_fail(s, "%s: heap slot %lld out of range (0..%lld)", what, (long long)v,
                          (long long)f->heap_size - 1);
  return 0;
}

static int kiln_tensor(const KilnVMValue* v, const char* builtin, int i, DLTensor** out) {
  if (v->kind != KV_TENSOR)
    return kiln_fail("vm.builtin.%s: argument %d is not a tensor", builtin, i);
  *out = v->u.t;
  return 0;
}

int64_t kiln_vm_numel(const DLTensor* t) {
  int64_t n = 1;
  int i;
  for (i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

/* -- match_shape (vm_builtins.match_shape / _parse_spec) */
const char* kiln_symbol_name(const KilnVM* vm, const KilnVMFunction* f, int64_t param,
                             int dim, int64_t slot, char* buf, size_t n) {
  const KilnVMExec* e = vm->exe;
  if ((uint64_t)slot < e->num_symbols) return e->symbols[slot].name;
  if (param >= 0 && (uint64_t)param < f->num_params && dim < f->params[param].ndim &&
      f->params[param].dims[dim] < 0)
    return e->symbols[-1 - f->params[param].dims[dim]].name;
  snprintf(buf, n, "heap[%lld]", (long long)slot);
  return buf;
}

int kiln_check_bounds(const char* label, int dim, const char* sym, int64_t v,
                      const KilnVMSymbol* b) {
  if (b == NULL) return 0;
  if (v < b->lo || (b->hi != -1 && v > b->hi)) {
    char hi[32];
    if (b->hi == -1) snprintf(hi, sizeof(hi), "inf");
    else snprintf(hi, sizeof(hi), "%lld", (long long)b->hi);
    /* the relation it breaks, as vm_builtins.check_bounds names it */
    return kiln_fail("ShapeError: %s dim %d: symbol %s = %lld is outside its bounds [%lld, %s] "
                     "(needs %s %s %lld)", label, dim, sym, (long long)v, (long long)b->lo, hi,
                     sym, v < b->lo ? ">=" : "<=", (long long)(v < b->lo ? b->lo : b->hi));
  }
  if (v % b->divisor)
    return kiln_fail("ShapeError: %s dim %d: symbol %s = %lld is not a multiple of %lld (needs "
                     "%s %% %lld == 0)", label, dim, sym, (long long)v, (long long)b->divisor,
                     sym, (long long)b->divisor);
  return 0;
}

static int kiln_match_shape(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  const KilnVMFunction* f = fr->func;
  const KilnVMExec* e = fr->vm->exe;
  const int64_t* spec = s->spec;
  char label[300], buf[32];
  const DLTensor* t;
  int ndim = (int)spec[2], i;
  (void)out;
  snprintf(label, sizeof(label), "input '%s'",
           (s->param >= 0 && (uint64_t)s->param < f->num_params) ? f->params[s->param].name : "?");
  if (args[0].kind != KV_TENSOR) return kiln_fail("ShapeError: %s: expected a tensor", label);
  t = args[0].u.t;
  if (t->dtype.code != spec[0] || t->dtype.bits != spec[1] || t->dtype.lanes != 1) {
    DLDataType want;
    want.code = (uint8_t)spec[0], want.bits = (uint8_t)spec[1], want.lanes = 1;
    return kiln_fail("ShapeError: %s: expected dtype %s, got %s", label,
                     kiln_vm_dtype_name(want), kiln_vm_dtype_name(t->dtype));
  }
  if (t->ndim != ndim)
    return kiln_fail("ShapeError: %s: expected rank %d, got rank %d", label, ndim, t->ndim);
  for (i = 0; i < ndim; ++i) {
    int64_t kind = spec[3 + 2 * i], value = spec[4 + 2 * i], d = t->shape[i];
    if (kind == 0) {
      if (d != value)
        return kiln_fail("ShapeError: %s dim %d: expected %lld but got %lld", label, i,
                         (long long)value, (long long)d);
    } else if (kind == 1) {
      const char* sym = kiln_symbol_name(fr->vm, f, s->param, i, value, buf, sizeof(buf));
      if (kiln_check_bounds(label, i, sym, d,
                            (uint64_t)value < e->num_symbols ? &e->symbols[value] : NULL) != 0)
        return -1;
      fr->heap[value] = d;
    } else if (fr->heap[value] != d) {
      return kiln_fail("ShapeError: %s dim %d: symbol %s is %lld (from an earlier input) but "
                       "got %lld", label, i,
                       kiln_symbol_name(fr->vm, f, s->param, i, value, buf, sizeof(buf)),
                       (long long)fr->heap[value], (long long)d);
    }
  }
  return 0;
}

static int kiln_prep_match_shape(const KilnVMExec* e, const KilnVMFunction* f, KilnVMSite* s) {
  if (kiln_nargs(s, 3, 3) != 0 || kiln_imm(s, 1, &s->param) != 0 ||
      kiln_vm_match_spec(e, f, s) != 0)
    return -1;
  s->run = kiln_match_shape;
  return 0;
}

/* Argument 2: a match spec (_parse_spec): dtype code, bits, ndim, then (kind, value) a dim. */
int kiln_vm_match_spec(const KilnVMExec* e, const KilnVMFunction* f, KilnVMSite* s) {
  size_t i;
  if (kiln_int_array(e, s, 2) != 0) return -1;
  if (s->spec_n < 3) return kiln_site_fail(s, "the match spec is shorter than its 3-word header");
  if (s->spec[0] < 0 || s->spec[0] >= 256 || s->spec[1] < 0 || s->spec[1] >= 256 ||
      s->spec[2] < 0 || s->spec[2] > KILN_VM_MAX_NDIM || s->spec_n != 3 + 2 * (size_t)s->spec[2])
    return kiln_site_fail(s, "malformed match spec header for %zu words", s->spec_n);
  for (i = 0; i < (size_t)s->spec[2]; ++i) {
    int64_t kind = s->spec[3 + 2 * i], value = s->spec[4 + 2 * i];
    if (kind == 0 && value < 0)
      return kiln_site_fail(s, "dim %zu must equal %lld, a negative size", i, (long long)value);
    if (kind != 0 && kind != 1 && kind != 2)
      return kiln_site_fail(s, "dim %zu: unknown check kind %lld", i, (long long)kind);
    if (kind != 0 && kiln_slot(s, f, value, "dim") != 0) return -1;
  }
  return 0;
}

/* -- shape_compute: [op, dst, a_kind, a, b_kind, b]* (vm_builtins.shape_compute) */
static int64_t kiln_floordiv(int64_t a, int64_t b) {
  int64_t q = a / b;
  return (a % b != 0 && ((a < 0) != (b < 0))) ? q - 1 : q;
}

static int kiln_shape_compute(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args,
                              KilnVMValue* out) {
  int64_t* heap = fr->heap;
  size_t k;
  (void)args, (void)out;
  for (k = 0; k + 6 <= s->spec_n; k += 6) {
    const int64_t* p = s->spec + k;
    int64_t a = p[2] ? p[3] : heap[p[3]], b = p[4] ? p[5] : heap[p[5]], v = 0;
    int bad = 0;
    switch (p[0]) {
      case 0: bad = __builtin_add_overflow(a, b, &v); break;
      case 1: bad = __builtin_sub_overflow(a, b, &v); break;
      case 2: bad = __builtin_mul_overflow(a, b, &v); break;
      case 3:
      case 4:
        if (b == 0)
          return kiln_fail("ShapeError: shape computation %s zero",
                           p[0] == 3 ? "divides by" : "takes a value modulo");
        if (a == INT64_MIN && b == -1) {
          bad = p[0] == 3;
          v = 0;
        } else {
          v = p[0] == 3 ? kiln_floordiv(a, b) : a - kiln_floordiv(a, b) * b;
        }
        break;
      case 5: v = a < b ? a : b; break;
      default: v = a > b ? a : b; break;
    }
    if (bad) return kiln_fail("ShapeError: shape computation overflows int64");
    heap[p[1]] = v;
  }
  return 0;
}

static int kiln_prep_shape_compute(const KilnVMExec* e, const KilnVMFunction* f, KilnVMSite* s) {
  size_t k;
  if (kiln_nargs(s, 1, 1) != 0 || kiln_int_array(e, s, 0) != 0) return -1;
  if (s->spec_n % 6)
    return kiln_site_fail(s, "a shape program has 6 words per step, got %zu words", s->spec_n);
  for (k = 0; k < s->spec_n; k += 6) {
    const int64_t* p = s->spec + k;
    int j;
    if (p[0] < 0 || p[0] > 6) return kiln_site_fail(s, "step %zu: unknown op %lld", k / 6,
                                                    (long long)p[0]);
    if (kiln_slot(s, f, p[1], "destination") != 0) return -1;
    for (j = 2; j <= 4; j += 2) {
      if (p[j] != 0 && p[j] != 1)
        return kiln_site_fail(s, "step %zu: unknown operand kind %lld", k / 6, (long long)p[j]);
      if (p[j] == 0 && kiln_slot(s, f, p[j + 1], "operand") != 0) return -1;
    }
  }
  s->run = kiln_shape_compute;
  return 0;
}

/* -- storage (vm_storage.Arena / Storage.view) */
static int kiln_alloc_storage(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args,
                              KilnVMValue* out) {
  KilnVMStorage* st;
  if (kiln_vm_storage(fr->vm, s, fr, s->param, args[1].u.i, &st) != 0) return -1;
  out->kind = KV_STORAGE;
  out->u.s = st;
  return 0;
}

static int kiln_prep_alloc_storage(const KilnVMExec* e, const KilnVMFunction* f, KilnVMSite* s) {
  (void)e, (void)f;
  if (kiln_nargs(s, 2, 2) != 0 || kiln_imm(s, 0, &s->param) != 0 || kiln_size_args(s, 1) != 0)
    return -1;
  if (s->param < 0 || s->param >= KILN_VM_MAX_STORAGE_ID)
    return kiln_site_fail(s, "storage id %lld out of range (0..%d)", (long long)s->param,
                          KILN_VM_MAX_STORAGE_ID - 1);
  s->storage_idx = -1;
  s->run = kiln_alloc_storage;
  return 0;
}

/* Fill s->view with dims args[first..] (checked: >= 0, the byte size fits int64). */
static int kiln_view_shape(KilnVMSite* s, KilnVMValue* args, int first, DLDataType dtype,
                           const char* builtin, int64_t* nbytes) {
  int ndim = s->ins->nargs - first, i;
  int64_t n = (dtype.bits + 7) / 8;
  if (ndim > KILN_VM_MAX_NDIM)
    return kiln_fail("vm.builtin.%s: rank %d (at most %d)", builtin, ndim, KILN_VM_MAX_NDIM);
  for (i = 0; i < ndim; ++i) {
    int64_t d = args[first + i].u.i;
    if (d < 0 || __builtin_mul_overflow(n, d, &n))
      return kiln_fail("ShapeError: vm.builtin.%s: dim %d is %lld (negative, or the size "
                       "overflows)", builtin, i, (long long)d);
    s->shape[i] = d;
  }
  s->view.ndim = ndim;
  s->view.shape = s->shape;
  s->view.dtype = dtype;
  s->view.strides = NULL;
  s->view.byte_offset = 0;
  s->view.device.device_type = kDLCPU;
  s->view.device.device_id = 0;
  *nbytes = n;
  return 0;
}

static int kiln_alloc_tensor(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args,
                             KilnVMValue* out) {
  KilnVMStorage* st;
  int64_t off = args[1].u.i, nbytes, end;
  (void)fr;
  if (args[0].kind != KV_STORAGE)
    return kiln_fail("vm.builtin.alloc_tensor: argument 0 is not a storage");
  st = args[0].u.s;
  if (kiln_view_shape(s, args, 3, s->dtype, "alloc_tensor", &nbytes) != 0) return -1;
  if (off < 0 || off % KILN_ALIGN)
    return kiln_fail("vm.builtin.alloc_tensor: offset %lld in storage %lld is not a multiple "
                     "of %d", (long long)off, (long long)st->sid, KILN_ALIGN);
  if (__builtin_add_overflow(off, nbytes, &end) || end > st->nbytes)
    return kiln_fail("vm.builtin.alloc_tensor: a tensor of %lld bytes at offset %lld does not "
                     "fit storage %lld of %lld bytes", (long long)nbytes, (long long)off,
                     (long long)st->sid, (long long)st->nbytes);
  s->view.data = st->data + off;
  out->kind = KV_TENSOR;
  out->u.t = &s->view;
  return 0;
}

static int kiln_prep_alloc_tensor(const KilnVMExec* e, const KilnVMFunction* f, KilnVMSite* s) {
  const char* dtype;
  (void)f;
  if (kiln_nargs(s, 3, -1) != 0) return -1;
  if (s->ins->args[1].kind != KILN_ARG_IMM && s->ins->args[1].kind != KILN_ARG_HEAP)
    return kiln_site_fail(s, "argument 1 must be an immediate or a heap slot");
  if ((dtype = kiln_str_const(e, s, 2)) == NULL)
    return kiln_site_fail(s, "argument 2 must be a constant dtype string");
  if (kiln_vm_dtype_from_name(dtype, &s->dtype) != 0)
    return kiln_site_fail(s, "dtype '%s' is not supported", dtype);
  /* argument 2 is the dtype: the dims start at 3 */
  if (kiln_size_args(s, 3) != 0) return -1;
  s->run = kiln_alloc_tensor;
  return 0;
}

/* -- tensor builtins */
static int kiln_reshape(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  DLTensor* t = NULL;
  int64_t nbytes;
  size_t have;
  char* data;
  DLDevice dev;
  (void)fr;
  if (kiln_tensor(&args[0], "reshape", 0, &t) != 0) return -1;
  if (t->strides != NULL)
    return kiln_fail("vm.builtin.reshape: the tensor is not C-contiguous");
  /* read the input first: in a loop it may be this site's own view */
  have = KilnArrayNumBytes(t);
  data = (char*)t->data + t->byte_offset;
  dev = t->device;
  if (kiln_view_shape(s, args, 1, t->dtype, "reshape", &nbytes) != 0) return -1;
  if (nbytes < 0 || (uint64_t)nbytes != have)
    return kiln_fail("ShapeError: vm.builtin.reshape: cannot view a tensor of %zu bytes as "
                     "one of %lld bytes", have, (long long)nbytes);
  s->view.data = data;
  s->view.device = dev;
  out->kind = KV_TENSOR;
  out->u.t = &s->view;
  return 0;
}

static int kiln_copy(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  DLTensor *src = NULL, *dst = NULL;
  (void)s, (void)fr, (void)out;
  if (kiln_tensor(&args[0], "copy", 0, &src) != 0 || kiln_tensor(&args[1], "copy", 1, &dst) != 0)
    return -1;
  if (!kiln_vm_same_type(src, dst))
    return kiln_fail("ShapeError: vm.builtin.copy: the tensors differ in shape or dtype");
  if (KilnArrayNumBytes(src))
    memmove((char*)dst->data + dst->byte_offset, (char*)src->data + src->byte_offset,
            KilnArrayNumBytes(src));
  return 0;
}

int64_t kiln_vm_element(const DLTensor* t, int64_t i) {
  const char* p = (const char*)t->data + t->byte_offset;
  switch (t->dtype.bits) {
    case 8:
      if (t->dtype.code == kDLInt) return ((const int8_t*)p)[i];
      return ((const uint8_t*)p)[i];
    case 16:
      if (t->dtype.code == kDLInt) return ((const int16_t*)p)[i];
      return ((const uint16_t*)p)[i]; /* (float16: its bits; non-zero is still true) */
    case 32:
      if (t->dtype.code == kDLFloat) return ((const float*)p)[i] != 0;
      if (t->dtype.code == kDLInt) return ((const int32_t*)p)[i];
      return ((const uint32_t*)p)[i];
    default:
      if (t->dtype.code == kDLFloat) return ((const double*)p)[i] != 0;
      return ((const int64_t*)p)[i];
  }
}

static int kiln_tensor_to_heap(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args,
                               KilnVMValue* out) {
  const KilnVMExec* e = fr->vm->exe;
  DLTensor* t = NULL;
  size_t i;
  (void)out;
  if (kiln_tensor(&args[0], "tensor_to_heap", 0, &t) != 0) return -1;
  if (t->dtype.code != kDLInt && t->dtype.code != kDLUInt)
    return kiln_fail("ShapeError: vm.builtin.tensor_to_heap: expected an integer tensor");
  if (kiln_vm_numel(t) != (int64_t)s->spec_n)
    return kiln_fail("ShapeError: vm.builtin.tensor_to_heap: %lld values for %zu slots",
                     (long long)kiln_vm_numel(t), s->spec_n);
  for (i = 0; i < s->spec_n; ++i) {
    int64_t v = kiln_vm_element(t, (int64_t)i), slot = s->spec[i];
    if ((uint64_t)slot < e->num_symbols &&
        kiln_check_bounds("data-dependent shape", 0, e->symbols[slot].name, v,
                          &e->symbols[slot]) != 0)
      return -1;
    fr->heap[slot] = v;
  }
  return 0;
}

static int kiln_prep_tensor_to_heap(const KilnVMExec* e, const KilnVMFunction* f, KilnVMSite* s) {
  size_t i;
  if (kiln_nargs(s, 2, 2) != 0 || kiln_int_array(e, s, 1) != 0) return -1;
  for (i = 0; i < s->spec_n; ++i)
    if (kiln_slot(s, f, s->spec[i], "slot list") != 0) return -1;
  s->run = kiln_tensor_to_heap;
  return 0;
}

int kiln_vm_read_bool_value(const DLTensor* t, int* out) {
  if (kiln_vm_numel(t) != 1)
    return kiln_fail("ShapeError: a condition (read_bool / If) is a tensor of %lld values, not "
                     "one", (long long)kiln_vm_numel(t));
  *out = kiln_vm_element(t, 0) != 0;
  return 0;
}

static int kiln_read_bool(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  int truth;
  (void)s, (void)fr;
  out->kind = KV_INT;
  if (args[0].kind != KV_TENSOR) {
    out->u.i = args[0].kind == KV_INT ? args[0].u.i != 0 : args[0].kind != KV_NONE;
    return 0;
  }
  if (kiln_vm_read_bool_value(args[0].u.t, &truth) != 0) return -1;
  out->u.i = truth;
  return 0;
}

static int kiln_trap(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  (void)fr, (void)args, (void)out;
  return kiln_fail("ShapeError: %s", s->text);
}

static int kiln_make_tuple(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  (void)fr;
  memcpy(s->tuple.items, args, sizeof(KilnVMValue) * (size_t)s->tuple.n);
  out->kind = KV_TUPLE;
  out->u.tup = &s->tuple;
  return 0;
}

static int kiln_tuple_get(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  (void)fr;
  if (args[0].kind != KV_TUPLE || s->param >= args[0].u.tup->n)
    return kiln_fail("vm.builtin.tuple_get: item %lld of a value that is not a tuple that long",
                     (long long)s->param);
  *out = args[0].u.tup->items[s->param];
  return 0;
}

/* shape_to_tensor(CONST dtype, CONST shape, values...): shape arithmetic as data (an If on a
   shape); the tensor lives in the site's buffer, sized at vm_initialization */
static int kiln_shape_to_tensor(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args,
                                KilnVMValue* out) {
  int i, n = s->ins->nargs - 2;
  (void)fr;
  for (i = 0; i < n; ++i) {
    int64_t v = args[2 + i].u.i;
    switch (s->dtype.bits) {
      case 8: ((uint8_t*)s->buf)[i] = (uint8_t)v; break;
      case 16: ((uint16_t*)s->buf)[i] = (uint16_t)v; break;
      case 32: ((uint32_t*)s->buf)[i] = (uint32_t)v; break;
      default: ((int64_t*)s->buf)[i] = v; break;
    }
  }
  out->kind = KV_TENSOR;
  out->u.t = &s->view;
  return 0;
}

static int kiln_prep_shape_to_tensor(const KilnVMExec* e, KilnVMSite* s) {
  const char* dtype;
  int64_t count = 1;
  size_t i;
  if (kiln_nargs(s, 2, -1) != 0) return -1;
  if ((dtype = kiln_str_const(e, s, 0)) == NULL || kiln_vm_dtype_from_name(dtype, &s->dtype) != 0 ||
      (s->dtype.code != kDLInt && s->dtype.code != kDLUInt))
    return kiln_site_fail(s, "argument 0 must be a constant integer dtype name");
  if (kiln_int_array(e, s, 1) != 0 || kiln_size_args(s, 2) != 0) return -1;
  if (s->spec_n > KILN_VM_MAX_NDIM) return kiln_site_fail(s, "rank %zu", s->spec_n);
  for (i = 0; i < s->spec_n; ++i) {
    if (s->spec[i] < 0 || __builtin_mul_overflow(count, s->spec[i], &count))
      return kiln_site_fail(s, "bad shape");
    s->shape[i] = s->spec[i];
  }
  if (count != s->ins->nargs - 2)
    return kiln_site_fail(s, "%d values for a shape of %lld elements", s->ins->nargs - 2,
                          (long long)count);
  if (posix_memalign(&s->buf, KILN_ALIGN, (size_t)(count * 8 + KILN_ALIGN)) != 0) {
    s->buf = NULL;
    return kiln_fail("out of memory");
  }
  s->view.data = s->buf;
  s->view.ndim = (int)s->spec_n;
  s->view.shape = s->shape;
  s->view.dtype = s->dtype;
  s->view.device.device_type = kDLCPU;
  s->run = kiln_shape_to_tensor;
  return 0;
}

/* -- the table */
int kiln_vm_prepare_builtin(KilnVM* vm, const KilnVMExec* e, const KilnVMFunction* f,
                            const char* name, KilnVMSite* s) {
  const char* b = name + KILN_VM_BUILTIN_PREFIX_LEN;
  size_t i;
  (void)vm;
  s->builtin = name;
  if (strcmp(b, "match_shape") == 0) return kiln_prep_match_shape(e, f, s);
  if (strcmp(b, "shape_compute") == 0) return kiln_prep_shape_compute(e, f, s);
  if (strcmp(b, "alloc_storage") == 0) return kiln_prep_alloc_storage(e, f, s);
  if (strcmp(b, "alloc_tensor") == 0) return kiln_prep_alloc_tensor(e, f, s);
  if (strcmp(b, "tensor_to_heap") == 0) return kiln_prep_tensor_to_heap(e, f, s);
  if (strcmp(b, "shape_to_tensor") == 0) return kiln_prep_shape_to_tensor(e, s);
  if (strcmp(b, "bind_shape") == 0 || strncmp(b, "list_", 5) == 0) {
    int rc = kiln_vm_prepare_list_builtin(e, f, b, s);
    if (rc != 1) return rc;
  }
  if (strcmp(b, "kv_append") == 0) return kiln_vm_prepare_kv_builtin(s);
  {
    int rc = kiln_vm_prepare_dynamic_builtin(b, s);
    if (rc != 1) return rc;
  }
  if (strcmp(b, "reshape") == 0) {
    if (kiln_nargs(s, 1, -1) != 0 || kiln_size_args(s, 1) != 0) return -1;
    s->run = kiln_reshape;
    return 0;
  }
  if (strcmp(b, "copy") == 0) {
    s->run = kiln_copy;
    return kiln_nargs(s, 2, 2);
  }
  if (strcmp(b, "read_bool") == 0) {
    s->run = kiln_read_bool;
    return kiln_nargs(s, 1, 1);
  }
  if (strcmp(b, "trap") == 0) {
    if (kiln_nargs(s, 1, 1) != 0) return -1;
    if ((s->text = kiln_str_const(e, s, 0)) == NULL)
      return kiln_site_fail(s, "argument 0 must be a constant message");
    s->run = kiln_trap;
    return 0;
  }
  if (strcmp(b, "make_tuple") == 0) {
    s->tuple.n = s->ins->nargs;
    s->tuple.items = (KilnVMValue*)kiln_calloc((size_t)s->ins->nargs + 1, sizeof(KilnVMValue));
    s->run = kiln_make_tuple;
    return s->tuple.items ? 0 : -1;
  }
  if (strcmp(b, "tuple_get") == 0) {
    if (kiln_nargs(s, 2, 2) != 0 || kiln_imm(s, 1, &s->param) != 0) return -1;
    if (s->param < 0) return kiln_site_fail(s, "item %lld", (long long)s->param);
    s->run = kiln_tuple_get;
    return 0;
  }
  for (i = 0; kiln_python_only[i] != NULL; ++i)
    if (strcmp(b, kiln_python_only[i]) == 0)
      return kiln_fail("VM: builtin '%s' (function '%s' instruction at word %lld) is not "
                       "implemented by the native runtime's VM; run this model with the Python "
                       "runtime (kiln.vm.VirtualMachine)", name, f->name, (long long)s->ins->pc);
  return kiln_fail("VM executable: function '%s' instruction at word %lld: unknown builtin '%s'",
                   f->name, (long long)s->ins->pc, name);
}
