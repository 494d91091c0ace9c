/*
 * Data-dependent builtins of decision 016 in C: nonzero, topk, compress, range,
 * constant_of_shape, reshape_to, expand, tile, slice. The twins of
 * kiln/runtime/vm/dynamic_builtins.py over kiln/runtime/dynamic_ops.py (the numpy definitions,
 * checked against onnx.reference and onnxruntime): the same arguments (tensors, then the
 * immediates), results and error messages. Each result is a new 64-byte aligned tensor, a
 * block of the call (kiln_vm_call_tensor); the bytecode then binds its late dims with
 * bind_shape. The other builtins of that decision (unique, non_max_suppression) still fail
 * at vm_initialization.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_vm.h"

static int kiln_dyn_tensors(const char* name, KilnVMValue* args, int n) {
  int i;
  for (i = 0; i < n; ++i)
    if (args[i].kind != KV_TENSOR)
      return kiln_fail("vm.builtin.%s: argument %d is %s, not a tensor", name, i,
                       kiln_vm_kind_name(&args[i]));
  return 0;
}

static size_t kiln_dyn_elem(const DLTensor* t) {
  return (t->dtype.bits * t->dtype.lanes + 7u) / 8u;
}

static int kiln_dyn_result(DLTensor* y, KilnVMValue* out) {
  out->kind = KV_TENSOR;
  out->u.t = y;
  return 0;
}

/* numpy's truth of element i (NaN is true; a float16's -0 is false) */
static int kiln_dyn_true(const DLTensor* t, int64_t i) {
  if (t->dtype.bits == 16 && (t->dtype.code == kDLFloat || t->dtype.code == kDLBfloat))
    return (((const uint16_t*)((const char*)t->data + t->byte_offset))[i] & 0x7fff) != 0;
  return kiln_vm_element(t, i) != 0;
}

/* nonzero(x): int64 [rank, n] */
static int kiln_nonzero(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  const DLTensor* x;
  DLTensor* y;
  int64_t n = 0, size, i, k = 0, shape[2];
  int d;
  (void)s;
  if (kiln_dyn_tensors("nonzero", args, 1) != 0) return -1;
  x = args[0].u.t;
  size = kiln_vm_numel(x);
  for (i = 0; i < size; ++i) n += kiln_dyn_true(x, i);
  shape[0] = x->ndim, shape[1] = n;
  if ((y = kiln_vm_call_tensor(fr->vm, (DLDataType){kDLInt, 64, 1}, 2, shape)) == NULL) return -1;
  for (i = 0; i < size && x->ndim; ++i) {
    int64_t rest = i;
    if (!kiln_dyn_true(x, i)) continue;
    for (d = x->ndim - 1; d >= 0; --d) {
      ((int64_t*)y->data)[d * n + k] = rest % x->shape[d];
      rest /= x->shape[d];
    }
    ++k;
  }
  return kiln_dyn_result(y, out);
}

/* compress(x, condition, IMM axis): axis -1 flattens x */
static int kiln_compress(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  const DLTensor *x, *c;
  DLTensor* y;
  int64_t axis = s->ins->args[2].value, extent, outer = 1, inner, cn, count = 0, i, o, j = 0;
  int64_t shape[KILN_VM_MAX_NDIM];
  int d, ndim;
  size_t esz;
  if (kiln_dyn_tensors("compress", args, 2) != 0) return -1;
  x = args[0].u.t, c = args[1].u.t;
  esz = kiln_dyn_elem(x);
  if (axis >= x->ndim) return kiln_fail("vm.builtin.compress: axis %lld out of range for rank %d",
                                        (long long)axis, x->ndim);
  extent = axis < 0 ? kiln_vm_numel(x) : x->shape[axis];
  cn = kiln_vm_numel(c);
  if (cn > extent)
    return kiln_fail("ShapeError: Compress: a condition of %lld entries for an axis of %lld",
                     (long long)cn, (long long)extent);
  for (i = 0; i < cn; ++i) count += kiln_dyn_true(c, i);
  ndim = axis < 0 ? 1 : x->ndim;
  inner = (int64_t)esz;
  for (d = 0; d < ndim; ++d) {
    shape[d] = axis < 0 || d == axis ? count : x->shape[d];
    if (axis >= 0 && d < axis) outer *= x->shape[d];
    if (axis >= 0 && d > axis) inner *= x->shape[d];
  }
  if ((y = kiln_vm_call_tensor(fr->vm, x->dtype, ndim, shape)) == NULL) return -1;
  for (o = 0; o < outer && inner; ++o)
    for (i = 0; i < cn; ++i)
      if (kiln_dyn_true(c, i))
        memcpy((char*)y->data + (j++) * inner,
               (const char*)x->data + x->byte_offset + (o * extent + i) * inner, (size_t)inner);
  return kiln_dyn_result(y, out);
}

/* topk's order: a stable merge sort of positions by their keys (floats as double, NaN
   greatest as in np.lexsort; integers as int64), largest first or smallest first */
typedef struct {
  const double* f;
  const int64_t* i;
  int largest;
} KilnTopkKeys;

static int kiln_topk_before(const KilnTopkKeys* k, int64_t a, int64_t b) {
  if (k->f) {
    double x = k->f[a], y = k->f[b];
    if (isnan(x) || isnan(y)) return k->largest ? isnan(x) && !isnan(y) : !isnan(x) && isnan(y);
    return k->largest ? x > y : x < y;
  }
  return k->largest ? k->i[a] > k->i[b] : k->i[a] < k->i[b];
}

static void kiln_topk_sort(const KilnTopkKeys* k, int64_t* idx, int64_t* tmp, int64_t n) {
  int64_t h = n / 2, a = 0, b = h, o = 0;
  if (n < 2) return;
  kiln_topk_sort(k, idx, tmp, h);
  kiln_topk_sort(k, idx + h, tmp, n - h);
  while (a < h && b < n) tmp[o++] = kiln_topk_before(k, idx[b], idx[a]) ? idx[b++] : idx[a++];
  while (a < h) tmp[o++] = idx[a++];
  while (b < n) tmp[o++] = idx[b++];
  memcpy(idx, tmp, sizeof(int64_t) * (size_t)n);
}

static double kiln_topk_float(const DLTensor* x, int64_t i) {
  const char* p = (const char*)x->data + x->byte_offset;
  return x->dtype.bits == 32 ? (double)((const float*)p)[i] : ((const double*)p)[i];
}

/* topk(x, k, IMM axis, IMM largest): (values, int64 indices) */
static int kiln_topk(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  const DLTensor *x, *kt;
  DLTensor *vals, *inds;
  int64_t axis = s->ins->args[2].value, k, n, outer = 1, inner = 1, o, in, j;
  int64_t shape[KILN_VM_MAX_NDIM];
  KilnTopkKeys keys = {NULL, NULL, s->ins->args[3].value != 0};
  int64_t *idx, *tmp;
  void* kbuf;
  size_t esz;
  int d, isfloat;
  char got[200];
  KilnVMTuple* tup;
  if (kiln_dyn_tensors("topk", args, 2) != 0) return -1;
  x = args[0].u.t, kt = args[1].u.t;
  esz = kiln_dyn_elem(x);
  isfloat = x->dtype.code == kDLFloat;
  if ((isfloat && x->dtype.bits != 32 && x->dtype.bits != 64) ||
      (!isfloat && x->dtype.code != kDLInt && x->dtype.code != kDLUInt) ||
      (x->dtype.code == kDLUInt && x->dtype.bits == 64) || x->dtype.lanes != 1)
    return kiln_fail("vm.builtin.topk: %s is not supported by the native runtime's VM",
                     kiln_vm_dtype_name(x->dtype));
  if (axis < 0) axis += x->ndim;
  if (axis < 0 || axis >= x->ndim)
    return kiln_fail("vm.builtin.topk: axis %lld out of range for rank %d",
                     (long long)s->ins->args[2].value, x->ndim);
  if (kiln_vm_numel(kt) != 1)
    return kiln_fail("ShapeError: TopK: k must have one element, got shape %s",
                     kiln_vm_type_text(kt->dtype, kt->ndim, kt->shape, got, sizeof(got)) +
                         strlen(kiln_vm_dtype_name(kt->dtype)));
  k = kiln_vm_element(kt, 0), n = x->shape[axis];
  if (k < 0 || k > n)
    return kiln_fail("ShapeError: TopK: k = %lld is outside [0, %lld] (axis %lld of %s)",
                     (long long)k, (long long)n, (long long)axis,
                     kiln_vm_type_text(x->dtype, x->ndim, x->shape, got, sizeof(got)) +
                         strlen(kiln_vm_dtype_name(x->dtype)));
  for (d = 0; d < x->ndim; ++d) {
    shape[d] = d == axis ? k : x->shape[d];
    if (d < axis) outer *= x->shape[d];
    if (d > axis) inner *= x->shape[d];
  }
  if ((vals = kiln_vm_call_tensor(fr->vm, x->dtype, x->ndim, shape)) == NULL ||
      (inds = kiln_vm_call_tensor(fr->vm, (DLDataType){kDLInt, 64, 1}, x->ndim, shape)) == NULL ||
      (tup = (KilnVMTuple*)kiln_vm_call_alloc(fr->vm, sizeof(KilnVMTuple) +
                                                          2 * sizeof(KilnVMValue))) == NULL ||
      (idx = (int64_t*)kiln_vm_call_alloc(fr->vm, 2 * sizeof(int64_t) * (size_t)(n + 1))) == NULL ||
      (kbuf = kiln_vm_call_alloc(fr->vm, 8 * (size_t)(n + 1))) == NULL)
    return -1;
  tmp = idx + n + 1;
  for (o = 0; o < outer; ++o)
    for (in = 0; in < inner; ++in) {
      int64_t base = o * n * inner + in;
      for (j = 0; j < n; ++j) {
        int64_t at = base + j * inner;
        idx[j] = j;
        if (isfloat) ((double*)kbuf)[j] = kiln_topk_float(x, at);
        else ((int64_t*)kbuf)[j] = kiln_vm_element(x, at);
      }
      keys.f = isfloat ? (const double*)kbuf : NULL;
      keys.i = isfloat ? NULL : (const int64_t*)kbuf;
      kiln_topk_sort(&keys, idx, tmp, n);
      for (j = 0; j < k; ++j) {
        int64_t dst = o * k * inner + j * inner + in;
        memcpy((char*)vals->data + dst * (int64_t)esz,
               (const char*)x->data + x->byte_offset + (base + idx[j] * inner) * (int64_t)esz,
               esz);
        ((int64_t*)inds->data)[dst] = idx[j];
      }
    }
  tup->n = 2;
  tup->items = (KilnVMValue*)(tup + 1);
  tup->items[0].kind = tup->items[1].kind = KV_TENSOR;
  tup->items[0].u.t = vals, tup->items[1].u.t = inds;
  out->kind = KV_TUPLE;
  out->u.tup = tup;
  return 0;
}

/* element i as a double (floats: the value; integers and bool: kiln_vm_element) */
static double kiln_dyn_double(const DLTensor* t, int64_t i) {
  if (t->dtype.code == kDLFloat && (t->dtype.bits == 32 || t->dtype.bits == 64))
    return kiln_topk_float(t, i);
  return (double)kiln_vm_element(t, i);
}

/* dynamic_ops._scalar: one element, or a ShapeError naming the op and the argument */
static int kiln_dyn_scalar(const DLTensor* t, const char* op, const char* what) {
  char got[200];
  if (kiln_vm_numel(t) == 1) return 0;
  return kiln_fail("ShapeError: %s: %s must have one element, got shape %s", op, what,
                   kiln_vm_type_text(t->dtype, t->ndim, t->shape, got, sizeof(got)) +
                       strlen(kiln_vm_dtype_name(t->dtype)));
}

/* "[2, -1]" (a Python list of ints) */
static const char* kiln_dyn_list(const int64_t* v, int n, char* buf, size_t size) {
  DLDataType i64 = {kDLInt, 64, 1};
  return kiln_vm_type_text(i64, n, v, buf, size) + strlen(kiln_vm_dtype_name(i64));
}

/* dynamic_ops._ints: a 1-D (or scalar) integer tensor's values (at most KILN_VM_MAX_NDIM) */
static int kiln_dyn_ints(const DLTensor* t, const char* op, const char* what, int64_t* v,
                         int* n) {
  int64_t i, count = kiln_vm_numel(t);
  char got[200];
  if (t->ndim > 1 || (t->dtype.code != kDLInt && t->dtype.code != kDLUInt))
    return kiln_fail("ShapeError: %s: %s must be a 1-D integer tensor, got %s", op, what,
                     kiln_vm_type_text(t->dtype, t->ndim, t->shape, got, sizeof(got)));
  if (count > KILN_VM_MAX_NDIM)
    return kiln_fail("%s: %lld %s are more than the native VM's %d dims", op, (long long)count,
                     what, KILN_VM_MAX_NDIM);
  for (i = 0; i < count; ++i) v[i] = kiln_vm_element(t, i);
  *n = (int)count;
  return 0;
}

/* range(start, limit, delta): max(ceil((limit - start) / delta), 0) values in start's dtype */
static int kiln_range(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  static const char* const what[3] = {"start", "limit", "delta"};
  const DLTensor* t[3];
  DLTensor* y;
  int64_t count, k;
  int i, isfloat;
  (void)s;
  if (kiln_dyn_tensors("range", args, 3) != 0) return -1;
  for (i = 0; i < 3; ++i)
    if (kiln_dyn_scalar(t[i] = args[i].u.t, "Range", what[i]) != 0) return -1;
  isfloat = t[0]->dtype.code == kDLFloat;
  if ((isfloat && t[0]->dtype.bits != 32 && t[0]->dtype.bits != 64) ||
      (!isfloat && t[0]->dtype.code != kDLInt) || t[0]->dtype.lanes != 1)
    return kiln_fail("vm.builtin.range: %s is not supported by the native runtime's VM",
                     kiln_vm_dtype_name(t[0]->dtype));
  if (isfloat) {
    double s0 = kiln_dyn_double(t[0], 0), lim = kiln_dyn_double(t[1], 0);
    double d = kiln_dyn_double(t[2], 0), c;
    if (d == 0) return kiln_fail("ShapeError: Range: delta is 0");
    c = (lim - s0) / d; /* ceil without libm (the runtime links no -lm) */
    if (!(c < 1e15)) c = isnan(c) ? 0 : 1e15; /* too many: kiln_vm_call_tensor refuses */
    count = c > 0 ? (int64_t)c : 0;
    if (c > 0 && (double)count < c) ++count;
    if ((y = kiln_vm_call_tensor(fr->vm, t[0]->dtype, 1, &count)) == NULL) return -1;
    for (k = 0; k < count; ++k) {
      if (t[0]->dtype.bits == 32) ((float*)y->data)[k] = (float)(s0 + (double)k * d);
      else ((double*)y->data)[k] = s0 + (double)k * d;
    }
  } else {
    int64_t s0 = kiln_vm_element(t[0], 0), lim = kiln_vm_element(t[1], 0);
    int64_t d = kiln_vm_element(t[2], 0), span;
    if (d == 0) return kiln_fail("ShapeError: Range: delta is 0");
    if (__builtin_sub_overflow(lim, s0, &span))
      return kiln_fail("vm.builtin.range: int64 overflow in limit - start");
    count = span / d + (span % d != 0 && ((span < 0) == (d < 0)));
    if (count < 0) count = 0;
    if ((y = kiln_vm_call_tensor(fr->vm, t[0]->dtype, 1, &count)) == NULL) return -1;
    for (k = 0; k < count; ++k) {
      int64_t v = s0 + k * d; /* between start and limit: no overflow */
      switch (t[0]->dtype.bits) {
        case 8: ((int8_t*)y->data)[k] = (int8_t)v; break;
        case 16: ((int16_t*)y->data)[k] = (int16_t)v; break;
        case 32: ((int32_t*)y->data)[k] = (int32_t)v; break;
        default: ((int64_t*)y->data)[k] = v; break;
      }
    }
  }
  return kiln_dyn_result(y, out);
}

/* constant_of_shape(shape, value): a tensor of `shape` filled with value's first element */
static int kiln_constant_of_shape(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args,
                                  KilnVMValue* out) {
  const DLTensor *sh, *v;
  DLTensor* y;
  int64_t dims[KILN_VM_MAX_NDIM], i;
  int n;
  size_t esz;
  char got[200];
  (void)s;
  if (kiln_dyn_tensors("constant_of_shape", args, 2) != 0) return -1;
  sh = args[0].u.t, v = args[1].u.t;
  if (kiln_dyn_ints(sh, "ConstantOfShape", "shape", dims, &n) != 0) return -1;
  for (i = 0; i < n; ++i)
    if (dims[i] < 0)
      return kiln_fail("ShapeError: ConstantOfShape: negative dim in %s",
                       kiln_dyn_list(dims, n, got, sizeof(got)));
  if (kiln_vm_numel(v) < 1)
    return kiln_fail("vm.builtin.constant_of_shape: the value is empty");
  if ((y = kiln_vm_call_tensor(fr->vm, v->dtype, (int)n, dims)) == NULL) return -1;
  esz = kiln_dyn_elem(v);
  for (i = 0; i < kiln_vm_numel(y); ++i)
    memcpy((char*)y->data + (size_t)i * esz, (const char*)v->data + v->byte_offset, esz);
  return kiln_dyn_result(y, out);
}

/* reshape_to(x, shape, IMM allowzero): a copy of x with dynamic_ops.reshape_dims's shape */
static int kiln_reshape_to(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  const DLTensor *x, *sh;
  DLTensor* y;
  int64_t dims[KILN_VM_MAX_NDIM], res[KILN_VM_MAX_NDIM], size, known = 1, prod = 1;
  int neg = 0, at = -1, bad = 0, n, k;
  char a[400], b[400];
  if (kiln_dyn_tensors("reshape_to", args, 2) != 0) return -1;
  x = args[0].u.t, sh = args[1].u.t;
  if (kiln_dyn_ints(sh, "Reshape", "shape", dims, &n) != 0) return -1;
  size = kiln_vm_numel(x);
  for (k = 0; k < n; ++k) {
    res[k] = dims[k] = kiln_vm_element(sh, k);
    if (dims[k] == 0 && !s->ins->args[2].value) {
      if (k >= x->ndim)
        return kiln_fail("ShapeError: Reshape: shape %s copies dim %d of a rank-%d input",
                         kiln_dyn_list(dims, n, a, sizeof(a)), k, x->ndim);
      res[k] = x->shape[k];
    }
    if (res[k] == -1) ++neg, at = k;
    else if (res[k] < -1) bad = 1;
    else if (res[k] && known > ((int64_t)1 << 62) / res[k]) bad = 2;
    else known *= res[k];
  }
  if (neg > 1 || bad == 1)
    return kiln_fail("ShapeError: Reshape: invalid shape %s",
                     kiln_dyn_list(dims, n, a, sizeof(a)));
  if (neg) {
    if (known == 0 || bad || size % known)
      return kiln_fail("ShapeError: Reshape: cannot infer -1 in %s for %lld elements",
                       kiln_dyn_list(dims, n, a, sizeof(a)), (long long)size);
    res[at] = size / known;
  }
  prod = neg ? size : known;
  if (bad || prod != size)
    return kiln_fail("ShapeError: Reshape: shape %s does not hold %lld elements of %s",
                     kiln_dyn_list(res, n, a, sizeof(a)), (long long)size,
                     kiln_dyn_list(x->shape, x->ndim, b, sizeof(b)));
  if ((y = kiln_vm_call_tensor(fr->vm, x->dtype, n, res)) == NULL) return -1;
  if (size) memcpy(y->data, (const char*)x->data + x->byte_offset, (size_t)size * kiln_dyn_elem(x));
  return kiln_dyn_result(y, out);
}

/* y[o] = x[c] for each output coordinate o: c = o modulo x's dims right-aligned (missing
   ones 1; `start` NULL: Expand's broadcast and Tile's repetition), else start + o * step
   (Slice) */
static void kiln_dyn_gather(const DLTensor* x, DLTensor* y, const int64_t* start,
                            const int64_t* step) {
  int64_t coord[KILN_VM_MAX_NDIM] = {0}, in_dims[KILN_VM_MAX_NDIM], total = kiln_vm_numel(y);
  int64_t o, off, stride;
  int d, lead = y->ndim - x->ndim;
  size_t esz = kiln_dyn_elem(x);
  for (d = 0; d < y->ndim; ++d) in_dims[d] = d < lead ? 1 : x->shape[d - lead];
  for (o = 0; o < total; ++o) {
    for (off = 0, stride = 1, d = y->ndim - 1; d >= 0; --d) {
      off += (start ? start[d] + coord[d] * step[d] : coord[d] % in_dims[d]) * stride;
      stride *= in_dims[d];
    }
    memcpy((char*)y->data + (size_t)o * esz,
           (const char*)x->data + x->byte_offset + (size_t)off * esz, esz);
    for (d = y->ndim - 1; d >= 0 && ++coord[d] == y->shape[d]; --d) coord[d] = 0;
  }
}

/* The result: a new tensor of x's dtype and `res` dims gathered from x (kiln_dyn_gather) */
static int kiln_dyn_gathered(KilnVMFrame* fr, const DLTensor* x, int nd, const int64_t* res,
                             const int64_t* start, const int64_t* step, KilnVMValue* out) {
  DLTensor* y = kiln_vm_call_tensor(fr->vm, x->dtype, nd, res);
  if (y == NULL) return -1;
  kiln_dyn_gather(x, y, start, step);
  return kiln_dyn_result(y, out);
}

/* slice(x, starts, ends, axes, steps): dynamic_ops.slice_ (ONNX Slice, opset 10+) */
static int kiln_slice(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  static const char* const what[4] = {"starts", "ends", "axes", "steps"};
  int64_t v[4][KILN_VM_MAX_NDIM], start[KILN_VM_MAX_NDIM], step[KILN_VM_MAX_NDIM];
  int64_t res[KILN_VM_MAX_NDIM];
  int n[4], i, d;
  const DLTensor* x;
  char a[4][400];
  (void)s;
  if (kiln_dyn_tensors("slice", args, 5) != 0) return -1;
  for (i = 0; i < 4; ++i)
    if (kiln_dyn_ints(args[i + 1].u.t, "Slice", what[i], v[i], &n[i]) != 0) return -1;
  if (n[1] != n[0] || n[2] != n[0] || n[3] != n[0]) {
    for (i = 0; i < 4; ++i) kiln_dyn_list(v[i], n[i], a[i], sizeof(a[i]));
    return kiln_fail("ShapeError: Slice: starts %s, ends %s, axes %s and steps %s differ in "
                     "length", a[0], a[1], a[2], a[3]);
  }
  x = args[0].u.t;
  for (d = 0; d < x->ndim; ++d) start[d] = 0, step[d] = 1, res[d] = x->shape[d];
  for (i = 0; i < n[0]; ++i) {
    int64_t ax = v[2][i], b = v[0][i], c = v[1][i], st = v[3][i], dim, diff, mag;
    if (ax < -x->ndim || ax >= x->ndim || st == 0)
      return kiln_fail("ShapeError: Slice: axis %lld or step %lld invalid for rank %d",
                       (long long)ax, (long long)st, x->ndim);
    d = (int)(ax < 0 ? ax + x->ndim : ax);
    dim = x->shape[d];
    b = b < 0 ? b + dim : b;
    c = c < 0 ? c + dim : c;
    if (st > 0) {
      b = b < 0 ? 0 : b > dim ? dim : b;
      c = c < 0 ? 0 : c > dim ? dim : c;
      diff = c - b;
      res[d] = diff > 0 ? (diff - 1) / st + 1 : 0;
    } else {
      b = b < 0 ? 0 : b > dim - 1 ? dim - 1 : b;
      c = c < -1 ? -1 : c > dim - 1 ? dim - 1 : c;
      diff = b - c;
      mag = st == INT64_MIN ? INT64_MAX : -st;
      res[d] = diff > 0 && dim > 0 ? (diff - 1) / mag + 1 : 0;
    }
    start[d] = b, step[d] = st;
  }
  return kiln_dyn_gathered(fr, x, x->ndim, res, start, step, out);
}

/* expand(x, shape): x broadcast with shape (both ways, numpy's rule) */
static int kiln_expand(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  const DLTensor* x;
  int64_t dims[KILN_VM_MAX_NDIM], res[KILN_VM_MAX_NDIM];
  int n, nd, d;
  char a[400], b[400];
  (void)s;
  if (kiln_dyn_tensors("expand", args, 2) != 0 ||
      kiln_dyn_ints(args[1].u.t, "Expand", "shape", dims, &n) != 0)
    return -1;
  x = args[0].u.t;
  nd = n > x->ndim ? n : x->ndim;
  for (d = 0; d < nd; ++d) {
    int64_t p = d - (nd - x->ndim) >= 0 ? x->shape[d - (nd - x->ndim)] : 1;
    int64_t q = d - (nd - n) >= 0 ? dims[d - (nd - n)] : 1;
    if ((p != q && p != 1 && q != 1) || q < 0)
      return kiln_fail("ShapeError: Expand: %s does not broadcast with %s",
                       kiln_dyn_list(x->shape, x->ndim, a, sizeof(a)),
                       kiln_dyn_list(dims, n, b, sizeof(b)));
    res[d] = p == 1 ? q : p;
  }
  return kiln_dyn_gathered(fr, x, nd, res, NULL, NULL, out);
}

/* tile(x, repeats): x repeated repeats[i] times along axis i */
static int kiln_tile(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  const DLTensor* x;
  int64_t reps[KILN_VM_MAX_NDIM], res[KILN_VM_MAX_NDIM];
  int n, d, bad;
  char a[400];
  (void)s;
  if (kiln_dyn_tensors("tile", args, 2) != 0 ||
      kiln_dyn_ints(args[1].u.t, "Tile", "repeats", reps, &n) != 0)
    return -1;
  x = args[0].u.t;
  bad = n != x->ndim;
  for (d = 0; d < n && !bad; ++d) bad = reps[d] < 0;
  if (bad)
    return kiln_fail("ShapeError: Tile: repeats %s for a rank-%d input",
                     kiln_dyn_list(reps, n, a, sizeof(a)), x->ndim);
  for (d = 0; d < n; ++d) {
    if (x->shape[d] && reps[d] > ((int64_t)1 << 46) / x->shape[d])
      return kiln_fail("vm.builtin.tile: the result is too large");
    res[d] = x->shape[d] * reps[d];
  }
  return kiln_dyn_gathered(fr, x, n, res, NULL, NULL, out);
}

/* Static checks (vm_dynamic_ops._tensor_op): the count of arguments, the immediates. */
static int kiln_dyn_prepare(KilnVMSite* s, KilnVMBuiltinRun run, int ntensors, int nimm) {
  int i;
  if (kiln_nargs(s, ntensors + nimm, ntensors + nimm) != 0) return -1;
  for (i = ntensors; i < ntensors + nimm; ++i)
    if (s->ins->args[i].kind != KILN_ARG_IMM)
      return kiln_site_fail(s, "argument %d must be an immediate", i);
  s->run = run;
  return 0;
}

int kiln_vm_prepare_dynamic_builtin(const char* b, KilnVMSite* s) {
  if (strcmp(b, "nonzero") == 0) return kiln_dyn_prepare(s, kiln_nonzero, 1, 0);
  if (strcmp(b, "topk") == 0) return kiln_dyn_prepare(s, kiln_topk, 2, 2);
  if (strcmp(b, "compress") == 0) return kiln_dyn_prepare(s, kiln_compress, 2, 1);
  if (strcmp(b, "reshape_to") == 0) return kiln_dyn_prepare(s, kiln_reshape_to, 2, 1);
  if (strcmp(b, "expand") == 0) return kiln_dyn_prepare(s, kiln_expand, 2, 0);
  if (strcmp(b, "tile") == 0) return kiln_dyn_prepare(s, kiln_tile, 2, 0);
  if (strcmp(b, "slice") == 0) return kiln_dyn_prepare(s, kiln_slice, 5, 0);
  if (strcmp(b, "range") == 0) return kiln_dyn_prepare(s, kiln_range, 3, 0);
  if (strcmp(b, "constant_of_shape") == 0) return kiln_dyn_prepare(s, kiln_constant_of_shape, 2, 0);
  return 1;
}
