/*
 * The VM's memory (rt_vm.c's module): the storage arena (kiln/runtime/vm/storage.py's Arena:
 * one 64-byte aligned buffer per (function, storage id), kept across calls and grown only when
 * a call needs more; TVM's src/runtime/relax_vm/builtin.cc alloc_storage over a pooled
 * allocator) and the copies of a call's result that the caller receives (vm.py's _copy_out),
 * with the KilnTuple accessors of the C API.
 */
#include <stdlib.h>
#include <string.h>

#include "rt_vm.h"

#define KILN_ALIGN 64

/* -- storage (vm_storage.Arena.alloc) */
int kiln_vm_push(void*** arr, size_t* n, size_t* cap, void* item) {
  if (*n == *cap) {
    size_t c = *cap ? 2 * *cap : 8;
    void** grown = (void**)realloc(*arr, c * sizeof(void*));
    if (grown == NULL) return kiln_fail("out of memory");
    *arr = grown;
    *cap = c;
  }
  (*arr)[(*n)++] = item;
  return 0;
}

int kiln_vm_storage(KilnVM* vm, KilnVMSite* site, const KilnVMFrame* fr, int64_t sid,
                    int64_t nbytes, KilnVMStorage** out) {
  KilnVMStorage* st = NULL;
  int64_t fidx = fr->fidx, level = fr->level;
  void* buf;
  size_t i;
  if (site->storage_idx >= 0 && level == 0) {
    st = vm->storages[site->storage_idx];
  } else {
    for (i = 0; i < vm->num_storages && st == NULL; ++i)
      if (vm->storages[i]->fidx == fidx && vm->storages[i]->sid == sid &&
          vm->storages[i]->level == level) {
        st = vm->storages[i];
        if (level == 0) site->storage_idx = (int64_t)i;
      }
    if (st == NULL) {
      if ((st = (KilnVMStorage*)kiln_calloc(1, sizeof(*st))) == NULL) return -1;
      st->fidx = fidx;
      st->level = level;
      st->sid = sid;
      if (kiln_vm_push((void***)&vm->storages, &vm->num_storages, &vm->cap_storages, st) != 0) {
        free(st);
        return -1;
      }
      if (level == 0) site->storage_idx = (int64_t)vm->num_storages - 1;
    }
  }
  *out = st;
  if (nbytes <= st->nbytes && st->data != NULL) return 0;
  if (nbytes < 0 || nbytes > vm->mem_limit)
    return kiln_fail("ShapeError: vm.builtin.alloc_storage: storage %lld would need %lld bytes "
                     "(the limit is %lld); are the input shapes right?", (long long)sid,
                     (long long)nbytes, (long long)vm->mem_limit);
  nbytes = (nbytes + KILN_ALIGN - 1) / KILN_ALIGN * KILN_ALIGN;
  if (posix_memalign(&buf, KILN_ALIGN, nbytes ? (size_t)nbytes : KILN_ALIGN) != 0)
    return kiln_fail("vm.builtin.alloc_storage: cannot allocate %lld bytes for storage %lld",
                     (long long)nbytes, (long long)sid);
  /* views of the old buffer made earlier in this call stay valid until the call ends */
  if (st->data != NULL &&
      kiln_vm_push(&vm->retired, &vm->num_retired, &vm->cap_retired, st->data) != 0) {
    free(buf);
    return -1;
  }
  st->data = (uint8_t*)buf;
  st->nbytes = nbytes;
  return 0;
}

/* -- results (vm._copy_out) */
void kiln_vm_free_value(KilnVMValue* v) {
  int i;
  if (v->kind == KV_TUPLE) {
    for (i = 0; i < v->u.tup->n; ++i) kiln_vm_free_value(&v->u.tup->items[i]);
    free(v->u.tup->items);
    free(v->u.tup);
  }
  v->kind = KV_NONE;
}

/* Same dtype and shape (dims from `from` on). */
int kiln_vm_same_dims(const DLTensor* a, const DLTensor* b, int from) {
  int i;
  if (a->ndim != b->ndim || a->dtype.code != b->dtype.code || a->dtype.bits != b->dtype.bits ||
      a->dtype.lanes != b->dtype.lanes)
    return 0;
  for (i = from; i < a->ndim; ++i)
    if (a->shape[i] != b->shape[i]) return 0;
  return 1;
}

int kiln_vm_same_type(const DLTensor* a, const DLTensor* b) { return kiln_vm_same_dims(a, b, 0); }

int kiln_vm_copy_out(KilnVM* vm, const KilnVMValue* v, KilnVMValue* out, int depth) {
  int i;
  out->kind = KV_NONE;
  if (depth > 64) return kiln_fail("VM: the result nests tuples deeper than 64");
  if (v->kind == KV_INT || v->kind == KV_NONE) {
    *out = *v;
  } else if (v->kind == KV_TENSOR) {
    const DLTensor* t = v->u.t;
    DLTensor** slot;
    int kv = vm->num_kv ? kiln_vm_kv_result(vm, t, out) : 0;
    if (kv != 0) return kv < 0 ? -1 : 0;
    if (vm->num_out == vm->cap_out) {
      size_t c = vm->cap_out ? 2 * vm->cap_out : 8;
      DLTensor** grown = (DLTensor**)realloc(vm->out_tensors, c * sizeof(DLTensor*));
      if (grown == NULL) return kiln_fail("out of memory");
      memset(grown + vm->cap_out, 0, (c - vm->cap_out) * sizeof(DLTensor*));
      vm->out_tensors = grown;
      vm->cap_out = c;
    }
    slot = &vm->out_tensors[vm->num_out];
    if (*slot != NULL && !kiln_vm_same_type(*slot, t)) {
      TVMArrayFree(*slot);
      *slot = NULL;
    }
    if (*slot == NULL && TVMArrayAlloc(t->shape, t->ndim, t->dtype.code, t->dtype.bits,
                                       t->dtype.lanes, kDLCPU, 0, slot) != 0)
      return -1;
    ++vm->num_out;
    if (KilnArrayNumBytes(t))
      memmove((*slot)->data, (const char*)t->data + t->byte_offset, KilnArrayNumBytes(t));
    out->kind = KV_TENSOR;
    out->u.t = *slot;
  } else if (v->kind == KV_TUPLE) {
    KilnVMTuple* tup = (KilnVMTuple*)kiln_calloc(1, sizeof(KilnVMTuple));
    if (tup == NULL) return -1;
    out->kind = KV_TUPLE;
    out->u.tup = tup;
    if ((tup->items = (KilnVMValue*)kiln_calloc((size_t)v->u.tup->n + 1, sizeof(KilnVMValue))) ==
        NULL)
      return -1;
    for (i = 0; i < v->u.tup->n; ++i) {
      tup->n = i + 1;
      if (kiln_vm_copy_out(vm, &v->u.tup->items[i], &tup->items[i], depth + 1) != 0) return -1;
    }
  } else {
    return kiln_fail("VM: a function returned a %s", v->kind == KV_LIST ? "list" : "storage");
  }
  return 0;
}

int kiln_vm_return(const KilnVMValue* v, TVMValue* ret, int* ret_code) {
  switch (v->kind) {
    case KV_INT: ret->v_int64 = v->u.i, *ret_code = kTVMArgInt; break;
    case KV_TENSOR: ret->v_handle = v->u.t, *ret_code = kTVMDLTensorHandle; break;
    case KV_TUPLE: ret->v_handle = v->u.tup, *ret_code = kTVMObjectHandle; break;
    default: ret->v_handle = NULL, *ret_code = kTVMNullptr; break;
  }
  return 0;
}

KILN_EXPORT int KilnTupleSize(void* tuple) { return tuple ? ((KilnVMTuple*)tuple)->n : -1; }

KILN_EXPORT int KilnTupleGetItem(void* tuple, int index, TVMValue* out, int* type_code) {
  KilnVMTuple* t = (KilnVMTuple*)tuple;
  if (t == NULL || out == NULL || type_code == NULL) return kiln_fail("KilnTupleGetItem: null");
  if (index < 0 || index >= t->n)
    return kiln_fail("KilnTupleGetItem: index %d out of range (%d items)", index, t->n);
  return kiln_vm_return(&t->items[index], out, type_code);
}


void* kiln_vm_call_alloc(KilnVM* vm, size_t n) {
  void* p = kiln_aligned_alloc(n);
  if (p == NULL) return NULL;
  memset(p, 0, n ? n : 1);
  if (kiln_vm_push(&vm->retired, &vm->num_retired, &vm->cap_retired, p) != 0) {
    free(p);
    return NULL;
  }
  return p;
}

DLTensor* kiln_vm_call_tensor(KilnVM* vm, DLDataType dtype, int ndim, const int64_t* shape) {
  size_t head = (sizeof(DLTensor) + sizeof(int64_t) * (size_t)(ndim + 1) + 63) & ~(size_t)63;
  size_t nbytes = ((size_t)dtype.bits * dtype.lanes + 7u) / 8u;
  DLTensor* t;
  char* blk;
  int d;
  for (d = 0; d < ndim; ++d) {
    if (shape[d] < 0 || (shape[d] && nbytes > ((size_t)1 << 46) / (size_t)shape[d])) {
      kiln_fail("VM: a result of %d dims is too large or has a negative dim", ndim);
      return NULL;
    }
    nbytes *= (size_t)shape[d];
  }
  if ((blk = (char*)kiln_vm_call_alloc(vm, head + nbytes)) == NULL) return NULL;
  t = (DLTensor*)blk;
  t->data = blk + head;
  t->device.device_type = kDLCPU;
  t->ndim = ndim;
  t->dtype = dtype;
  t->shape = (int64_t*)(blk + sizeof(DLTensor));
  if (ndim) memcpy(t->shape, shape, sizeof(int64_t) * (size_t)ndim);
  return t;
}

int kiln_vm_detach(KilnVM* vm, KilnVMSite* s, KilnVMValue* out) {
  if (out->kind == KV_TENSOR && out->u.t == &s->view) {
    size_t head = (sizeof(DLTensor) + sizeof(int64_t) * (size_t)s->view.ndim + 63) & ~(size_t)63;
    size_t data = s->buf != NULL && s->view.data == s->buf ? KilnArrayNumBytes(&s->view) : 0;
    char* blk = (char*)kiln_vm_call_alloc(vm, head + data);
    DLTensor* t = (DLTensor*)blk;
    if (blk == NULL) return -1;
    *t = s->view;
    t->shape = (int64_t*)(blk + sizeof(DLTensor));
    memcpy(t->shape, s->view.shape, sizeof(int64_t) * (size_t)s->view.ndim);
    if (data) { /* shape_to_tensor's data is the site's own buffer: copied too */
      t->data = blk + head;
      memcpy(t->data, s->buf, data);
    }
    out->u.t = t;
  } else if (out->kind == KV_TUPLE && out->u.tup == &s->tuple) {
    KilnVMTuple* tup = (KilnVMTuple*)kiln_vm_call_alloc(
        vm, sizeof(KilnVMTuple) + sizeof(KilnVMValue) * (size_t)s->tuple.n);
    if (tup == NULL) return -1;
    tup->n = s->tuple.n;
    tup->items = (KilnVMValue*)(tup + 1);
    memcpy(tup->items, s->tuple.items, sizeof(KilnVMValue) * (size_t)s->tuple.n);
    out->u.tup = tup;
  }
  return 0;
}

int kiln_vm_clone(KilnVM* vm, const KilnVMValue* v, KilnVMValue* out, int depth) {
  int i;
  *out = *v;
  if (depth > 64) return kiln_fail("VM: a value nests tuples deeper than 64");
  if (v->kind == KV_TENSOR) {
    const DLTensor* t = v->u.t;
    size_t head = (sizeof(DLTensor) + sizeof(int64_t) * (size_t)t->ndim + 63) & ~(size_t)63;
    size_t nbytes = KilnArrayNumBytes(t);
    char* blk = (char*)kiln_vm_call_alloc(vm, head + nbytes);
    DLTensor* c = (DLTensor*)blk;
    if (blk == NULL) return -1;
    *c = *t;
    c->shape = (int64_t*)(blk + sizeof(DLTensor));
    memcpy(c->shape, t->shape, sizeof(int64_t) * (size_t)t->ndim);
    c->strides = NULL;
    c->byte_offset = 0;
    c->data = blk + head;
    if (nbytes) memcpy(c->data, (const char*)t->data + t->byte_offset, nbytes);
    out->u.t = c;
  } else if (v->kind == KV_TUPLE) {
    KilnVMTuple* tup = (KilnVMTuple*)kiln_vm_call_alloc(
        vm, sizeof(KilnVMTuple) + sizeof(KilnVMValue) * (size_t)v->u.tup->n);
    if (tup == NULL) return -1;
    tup->n = v->u.tup->n;
    tup->items = (KilnVMValue*)(tup + 1);
    for (i = 0; i < tup->n; ++i)
      if (kiln_vm_clone(vm, &v->u.tup->items[i], &tup->items[i], depth + 1) != 0) return -1;
    out->u.tup = tup;
  }
  return 0;
}
