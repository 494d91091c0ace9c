/*
 * VM builtins of run-time loops and data-dependent shapes: list_new, list_append, list_stack
 * (a Loop's scan outputs, decision 015) and bind_shape (late symbols bound from a computed
 * value's shape, decision 016). kiln/runtime/vm/list_builtins.py and vm_builtins.bind_shape:
 * the same arguments, checks and messages. Lists, their element copies and the stacked
 * results are blocks of the call (kiln_vm_call_alloc), freed when it ends: memory is
 * O(total elements), as in Python.
 */
#include <stdio.h>
#include <string.h>

#include "rt_vm.h"

const char* kiln_vm_kind_name(const KilnVMValue* v) {
  static const char* const names[] = {"None", "int", "NDArray", "Storage", "tuple", "ScanList"};
  return v->kind >= 0 && v->kind <= KV_LIST ? names[v->kind] : "?";
}

/* "float32[2, 3]" */
const char* kiln_vm_type_text(DLDataType dt, int ndim, const int64_t* shape, char* buf,
                                  size_t n) {
  size_t used = (size_t)snprintf(buf, n, "%s[", kiln_vm_dtype_name(dt));
  int d;
  for (d = 0; d < ndim && used < n; ++d)
    used += (size_t)snprintf(buf + used, n - used, "%s%lld", d ? ", " : "", (long long)shape[d]);
  if (used < n) snprintf(buf + used, n - used, "]");
  return buf;
}

static int kiln_list_arg(const KilnVMValue* v, const char* builtin, KilnVMList** out) {
  if (v->kind != KV_LIST)
    return kiln_fail("vm.builtin.%s: argument 0 is %s, not a list made by vm.builtin.list_new",
                     builtin, kiln_vm_kind_name(v));
  *out = v->u.list;
  return 0;
}

static int kiln_list_new(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  (void)s, (void)args;
  if ((out->u.list = (KilnVMList*)kiln_vm_call_alloc(fr->vm, sizeof(KilnVMList))) == NULL)
    return -1;
  out->kind = KV_LIST;
  return 0;
}

static int kiln_list_append(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args,
                            KilnVMValue* out) {
  KilnVMList* l = NULL;
  KilnVMValue copy;
  DLTensor* c;
  (void)s, (void)out;
  if (kiln_list_arg(&args[0], "list_append", &l) != 0) return -1;
  if (args[1].kind != KV_TENSOR)
    return kiln_fail("vm.builtin.list_append: argument 1 is %s, not a tensor",
                     kiln_vm_kind_name(&args[1]));
  if (l->n == l->cap) { /* the old array stays a block of the call */
    size_t cap = l->cap ? 2 * l->cap : 16;
    DLTensor** items = (DLTensor**)kiln_vm_call_alloc(fr->vm, cap * sizeof(DLTensor*));
    if (items == NULL) return -1;
    if (l->n) memcpy(items, l->items, l->n * sizeof(DLTensor*));
    l->items = items;
    l->cap = cap;
  }
  if (kiln_vm_clone(fr->vm, &args[1], &copy, 0) != 0) return -1;
  c = copy.u.t;
  l->items[l->n++] = c;
  return 0;
}

/* list_stack(list, CONST label, CONST dtype, dims...): [len(list), *dims] */
static int kiln_list_stack(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  const char* label = s->text;
  int nd = s->ins->nargs - 3, d;
  int64_t dims[KILN_VM_MAX_NDIM + 1];
  KilnVMList* l = NULL;
  DLTensor* t;
  size_t i, elem = 1, nbytes;
  char want[200], got[200];
  if (kiln_list_arg(&args[0], "list_stack", &l) != 0) return -1;
  for (d = 0; d < nd; ++d) dims[d] = args[3 + d].u.i;
  for (i = 0; i < l->n; ++i) {
    const DLTensor* e = l->items[i];
    int same = e->ndim == nd && e->dtype.code == s->dtype.code && e->dtype.bits == s->dtype.bits;
    for (d = 0; same && d < nd; ++d) same = e->shape[d] == dims[d];
    if (!same)
      return kiln_fail("ShapeError: %s: iteration %zu gave %s, expected %s (one type for every "
                       "iteration)", label, i,
                       kiln_vm_type_text(e->dtype, e->ndim, e->shape, got, sizeof(got)),
                       kiln_vm_type_text(s->dtype, nd, dims, want, sizeof(want)));
  }
  for (d = 0; d < nd; ++d) {
    if (dims[d] < 0)
      return kiln_fail("ShapeError: %s: negative element dims %s", label,
                       kiln_vm_type_text(s->dtype, nd, dims, want, sizeof(want)) +
                           strlen(kiln_vm_dtype_name(s->dtype)));
    if (dims[d] && elem > ((size_t)1 << 46) / (size_t)dims[d])
      return kiln_fail("ShapeError: %s: element dims too large", label);
    elem *= (size_t)dims[d];
  }
  nbytes = elem * ((s->dtype.bits + 7u) / 8u); /* the elements exist: no overflow past them */
  memmove(dims + 1, dims, sizeof(int64_t) * (size_t)nd);
  dims[0] = (int64_t)l->n;
  if ((t = kiln_vm_call_tensor(fr->vm, s->dtype, nd + 1, dims)) == NULL) return -1;
  for (i = 0; i < l->n && nbytes; ++i)
    memcpy((char*)t->data + i * nbytes, l->items[i]->data, nbytes);
  out->kind = KV_TENSOR;
  out->u.t = t;
  return 0;
}

/* bind_shape(tensor, CONST label, CONST spec): match_shape's spec over a computed value */
static int kiln_bind_shape(KilnVMSite* s, KilnVMFrame* fr, KilnVMValue* args, KilnVMValue* out) {
  const KilnVMExec* e = fr->vm->exe;
  const int64_t* spec = s->spec;
  int ndim = (int)spec[2], i;
  const DLTensor* t = args[0].kind == KV_TENSOR ? args[0].u.t : NULL;
  char want[64], got[200], buf[32];
  DLDataType dt;
  (void)out;
  dt.code = (uint8_t)spec[0], dt.bits = (uint8_t)spec[1], dt.lanes = 1;
  if (t == NULL || t->dtype.code != dt.code || t->dtype.bits != dt.bits || t->ndim != ndim) {
    snprintf(want, sizeof(want), "%s", kiln_vm_dtype_name(dt));
    return kiln_fail("ShapeError: %s: expected a rank-%d %s tensor, got %s", s->text, ndim, want,
                     t ? kiln_vm_type_text(t->dtype, t->ndim, t->shape, got, sizeof(got))
                       : kiln_vm_kind_name(&args[0]));
  }
  for (i = 0; i < ndim; ++i) {
    int64_t kind = spec[3 + 2 * i], value = spec[4 + 2 * i], d = t->shape[i];
    const char* sym = kind ? kiln_symbol_name(fr->vm, fr->func, -1, i, value, buf, sizeof(buf))
                           : "";
    if (kind == 1) {
      if (kiln_check_bounds(s->text, i, sym, d,
                            (uint64_t)value < e->num_symbols ? &e->symbols[value] : NULL) != 0)
        return -1;
      fr->heap[value] = d;
    } else if (kind == 0 && d != value) {
      return kiln_fail("ShapeError: %s dim %d: expected %lld but got %lld", s->text, i,
                       (long long)value, (long long)d);
    } else if (kind == 2 && d != fr->heap[value]) {
      return kiln_fail("ShapeError: %s dim %d: expected %s = %lld but got %lld", s->text, i, sym,
                       (long long)fr->heap[value], (long long)d);
    }
  }
  return 0;
}

int kiln_vm_prepare_list_builtin(const KilnVMExec* e, const KilnVMFunction* f, const char* b,
                                 KilnVMSite* s) {
  const char* dtype;
  if (strcmp(b, "list_new") == 0) {
    s->run = kiln_list_new;
    return kiln_nargs(s, 0, 0);
  }
  if (strcmp(b, "list_append") == 0) {
    s->run = kiln_list_append;
    return kiln_nargs(s, 2, 2);
  }
  if (strcmp(b, "list_stack") == 0) {
    if (kiln_nargs(s, 3, 3 + KILN_VM_MAX_NDIM - 1) != 0) return -1;
    if ((s->text = kiln_str_const(e, s, 1)) == NULL)
      return kiln_site_fail(s, "argument 1 must be a constant label");
    if ((dtype = kiln_str_const(e, s, 2)) == NULL)
      return kiln_site_fail(s, "argument 2 must be a constant dtype string");
    if (kiln_vm_dtype_from_name(dtype, &s->dtype) != 0)
      return kiln_site_fail(s, "%s", TVMGetLastError());
    s->run = kiln_list_stack;
    return kiln_size_args(s, 3);
  }
  if (strcmp(b, "bind_shape") == 0) {
    if (kiln_nargs(s, 3, 3) != 0 || kiln_vm_match_spec(e, f, s) != 0) return -1;
    if ((s->text = kiln_str_const(e, s, 1)) == NULL)
      return kiln_site_fail(s, "argument 1 must be a constant label");
    s->run = kiln_bind_shape;
    return 0;
  }
  return 1;
}
