/*
 * vm.builtin.kv_append (decision 019): key/value caches that grow in place. The C twin of
 * kiln/runtime/vm/kv_cache.py, with the same arguments, checks, messages and rule:
 *
 * - an append buffer is a 64-byte aligned [capacity, *row] block with `filled` rows in use;
 * - kv_append(past, new) writes `new` behind `past` when `past` is exactly the rows
 *   [0, filled) of a live buffer (found by its address; same dtype and row dims) and the
 *   capacity allows, else it allocates max(2 (P + S), 64) rows and copies past and new;
 * - the result is a view of rows [0, P + S). Rows any view can see are never written again
 *   (views cover [0, filled) only and `filled` only grows), so every result equals the
 *   concatenation, whatever the caller keeps or feeds back.
 *
 * Lifetime (the C ABI has no garbage collector): a call's result returns these views without
 * copying them (kiln_vm_kv_result, called by kiln_vm_copy_out), as vm.py does; a buffer lives
 * until the end of the first call whose result no longer shows it (kiln_vm_kv_prune), i.e. as
 * long as the C VM's other results ("valid until the VM's next call"), so a present fed back
 * into the next call is read in place and appended to without a copy.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_vm.h"

#define KILN_KV_MIN_ROWS 64
#define KILN_KV_MAX_BYTES ((int64_t)1 << 46)

struct KilnVMKVBuf {
  uint8_t* data; /* 64-byte aligned */
  int64_t capacity, filled;
  int ndim; /* of the tensors: one more than a row's */
  int64_t row[KILN_VM_MAX_NDIM];
  DLDataType dtype;
  int64_t row_bytes;
  uint64_t shown; /* the call serial of the last result holding a view of it */
};

/* The live buffer whose rows [0, filled) are exactly `t`, or NULL. */
static KilnVMKVBuf* kiln_kv_find(KilnVM* vm, const DLTensor* t) {
  const uint8_t* data = (const uint8_t*)t->data + t->byte_offset;
  size_t i;
  int d;
  for (i = 0; i < vm->num_kv; ++i) {
    KilnVMKVBuf* b = vm->kv[i];
    int same = b->data == data && t->ndim == b->ndim && t->shape[0] == b->filled &&
               t->dtype.code == b->dtype.code && t->dtype.bits == b->dtype.bits &&
               t->dtype.lanes == b->dtype.lanes;
    for (d = 1; same && d < t->ndim; ++d) same = t->shape[d] == b->row[d - 1];
    if (same) return b;
  }
  return NULL;
}

/* A new buffer with room for `need` rows of `past`'s row shape, holding a copy of past. */
static KilnVMKVBuf* kiln_kv_grown(KilnVM* vm, const DLTensor* past, int64_t need) {
  KilnVMKVBuf* b;
  int64_t row_bytes = (past->dtype.bits * past->dtype.lanes + 7) / 8, cap;
  int d;
  for (d = 1; d < past->ndim; ++d) {
    if (past->shape[d] && row_bytes > KILN_KV_MAX_BYTES / past->shape[d]) row_bytes = -1;
    if (row_bytes < 0) break;
    row_bytes *= past->shape[d];
  }
  cap = need > KILN_KV_MAX_BYTES / 2 ? -1 : 2 * need;
  if (cap >= 0 && cap < KILN_KV_MIN_ROWS) cap = KILN_KV_MIN_ROWS;
  if (row_bytes < 0 || cap < 0 || (row_bytes && cap > KILN_KV_MAX_BYTES / row_bytes) ||
      (vm->mem_limit > 0 && cap * row_bytes > vm->mem_limit)) {
    kiln_fail("vm.builtin.kv_append: a cache of %lld rows of %lld bytes is too large",
              (long long)need, (long long)row_bytes);
    return NULL;
  }
  if ((b = (KilnVMKVBuf*)kiln_calloc(1, sizeof(KilnVMKVBuf))) == NULL) return NULL;
  if ((b->data = (uint8_t*)kiln_aligned_alloc((size_t)(cap * row_bytes) + 64)) == NULL ||
      kiln_vm_push((void***)&vm->kv, &vm->num_kv, &vm->cap_kv, b) != 0) {
    free(b->data);
    free(b);
    kiln_fail("vm.builtin.kv_append: out of memory (%lld rows of %lld bytes)", (long long)cap,
              (long long)row_bytes);
    return NULL;
  }
  b->capacity = cap;
  b->ndim = past->ndim;
  for (d = 1; d < past->ndim; ++d) b->row[d - 1] = past->shape[d];
  b->dtype = past->dtype;
  b->row_bytes = row_bytes;
  if (past->shape[0] && row_bytes)
    memcpy(b->data, (const char*)past->data + past->byte_offset,
           (size_t)(past->shape[0] * row_bytes));
  ++vm->kv_copies;
  return b;
}

static int kiln_kv_append(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  KilnVM* vm = fr->vm;
  const DLTensor *past, *add;
  KilnVMKVBuf* b;
  DLTensor* view;
  int64_t rows, extra;
  size_t head;
  char pt[200], nt[200];
  (void)s;
  if (args[0].kind != KV_TENSOR || args[1].kind != KV_TENSOR)
    return kiln_fail("vm.builtin.kv_append: expects two tensors, got %s and %s",
                     kiln_vm_kind_name(&args[0]), kiln_vm_kind_name(&args[1]));
  past = args[0].u.t, add = args[1].u.t;
  if (past->ndim < 1 || !kiln_vm_same_dims(past, add, 1))
    return kiln_fail("ShapeError: vm.builtin.kv_append: cannot append %s to %s",
                     kiln_vm_type_text(add->dtype, add->ndim, add->shape, nt, sizeof(nt)),
                     kiln_vm_type_text(past->dtype, past->ndim, past->shape, pt, sizeof(pt)));
  rows = past->shape[0], extra = add->shape[0];
  b = KilnArrayNumBytes(past) ? kiln_kv_find(vm, past) : NULL;
  if (b == NULL || rows + extra > b->capacity) {
    if ((b = kiln_kv_grown(vm, past, rows + extra)) == NULL) return -1;
  } else {
    ++vm->kv_appends;
  }
  if (extra && b->row_bytes)
    memcpy(b->data + rows * b->row_bytes, (const char*)add->data + add->byte_offset,
           (size_t)(extra * b->row_bytes));
  b->filled = rows + extra;
  head = (sizeof(DLTensor) + sizeof(int64_t) * (size_t)b->ndim + 63) & ~(size_t)63;
  if ((view = (DLTensor*)kiln_vm_call_alloc(vm, head)) == NULL) return -1;
  *view = *past;
  view->data = b->data;
  view->byte_offset = 0;
  view->strides = NULL;
  view->shape = (int64_t*)(view + 1);
  memcpy(view->shape, past->shape, sizeof(int64_t) * (size_t)b->ndim);
  view->shape[0] = b->filled;
  out->kind = KV_TENSOR;
  out->u.t = view;
  return 0;
}

int kiln_vm_prepare_kv_builtin(KilnVMSite* s) {
  if (kiln_nargs(s, 2, 2) != 0) return -1;
  if (s->ins->args[0].kind != KILN_ARG_REG)
    return kiln_site_fail(s, "argument 0 must be a register");
  s->run = kiln_kv_append;
  return 0;
}

int kiln_vm_kv_result(KilnVM* vm, const DLTensor* t, KilnVMValue* out) {
  const uint8_t* data = (const uint8_t*)t->data + t->byte_offset;
  size_t i, head;
  DLTensor* view;
  for (i = 0; i < vm->num_kv; ++i) {
    KilnVMKVBuf* b = vm->kv[i];
    if (b->data != data || t->ndim != b->ndim || t->shape[0] > b->filled) continue;
    head = (sizeof(DLTensor) + sizeof(int64_t) * (size_t)t->ndim + 63) & ~(size_t)63;
    if ((view = (DLTensor*)kiln_aligned_alloc(head)) == NULL) return -1;
    if (kiln_vm_push((void***)&vm->kv_views, &vm->num_kv_views, &vm->cap_kv_views, view) != 0) {
      free(view);
      return -1;
    }
    *view = *t;
    view->byte_offset = 0;
    view->data = b->data;
    view->shape = (int64_t*)(view + 1);
    memcpy(view->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    b->shown = vm->serial;
    out->kind = KV_TENSOR;
    out->u.t = view;
    return 1;
  }
  return 0;
}

void kiln_vm_kv_release_views(KilnVM* vm) {
  size_t i;
  for (i = 0; i < vm->num_kv_views; ++i) free(vm->kv_views[i]);
  vm->num_kv_views = 0;
}

void kiln_vm_kv_prune(KilnVM* vm, int all) {
  size_t i, kept = 0;
  for (i = 0; i < vm->num_kv; ++i) {
    KilnVMKVBuf* b = vm->kv[i];
    if (!all && b->shown == vm->serial) {
      vm->kv[kept++] = b;
    } else {
      free(b->data);
      free(b);
    }
  }
  vm->num_kv = kept;
  if (all) {
    kiln_vm_kv_release_views(vm);
    free(vm->kv_views);
    free(vm->kv);
  }
}
