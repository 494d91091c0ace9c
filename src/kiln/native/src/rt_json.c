/*
 * The kiln_json module (type_key "kiln_json"): one external (BYOC) function shipped as a JSON
 * graph plus the names of its constants, run by an interpreter over the kernels of
 * rt_json_kernels.c. TVM's src/runtime/contrib/json/json_runtime.h; Kiln's
 * kiln/runtime/contrib/json/json_runtime.py, whose format, checks, function names and messages this file
 * repeats:
 *
 *     string symbol | string graph_json | vec<string> const_names
 *
 * Functions: get_symbol(), get_num_const_vars() / get_const_var(i) (the C ABI has no list: the
 * native form of get_const_vars()), __init_<symbol>(*constants) (the const loader calls it
 * before first use; the values are copied, as TVM's JSON runtime does), and
 * <symbol>(*inputs, *outputs). Stricter than Python at load, so a kernel never reads or writes
 * outside its buffers: every kernel node's shapes are checked against its op's rule (numpy
 * checks them at run time), kernels take float32 (what the kiln_json codegen emits), and an
 * edge may read output 0 only (the one output a kernel writes).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_json.h"
#include "rt_vm.h"

#define KILN_JSON_TYPE_KEY "kiln_json"

typedef struct {
  KilnModule base;
  char* symbol;
  char* init_name;
  size_t num_consts;
  char** const_names;
  void** const_data; /* the copies __init_ made, by const name */
  int num_nodes, num_args, num_heads;
  KilnJsonNode* nodes;
  int* args;
  int* heads;
  int initialized;
} KilnJsonModule;

static const char* const kiln_json_dtypes[] = {"float32", "float64", "float16", "int64", "int32",
                                               "int16",   "int8",    "uint8",   "bool"};

/* A primitive token holding an integer (not a string: json.loads gives Python a str). */
static int kiln_json_prim_int(const char* js, const KilnJsonToken* toks, int tok, int64_t* out) {
  if (tok < 0 || toks[tok].type != KILN_JSON_PRIMITIVE) return -1;
  return KilnJson_Int(js, toks, tok, out);
}

/* An edge [nid, index, version] of three integers, reading output 0 of a node before `limit`. */
static int kiln_json_edge(const char* js, const KilnJsonToken* toks, int tok, int limit,
                          const KilnJsonNode* nodes, int* nid) {
  int64_t v[3];
  int i;
  if (tok < 0 || toks[tok].type != KILN_JSON_ARRAY || toks[tok].size != 3) return -1;
  for (i = 0; i < 3; ++i)
    if (kiln_json_prim_int(js, toks, KilnJson_At(toks, tok, i), &v[i]) != 0) return -1;
  if (v[0] < 0 || v[0] >= limit || v[1] < 0 || v[1] >= nodes[v[0]].num_outputs) return -1;
  if (v[1] != 0)
    return kiln_fail("reads output %lld of node %lld: a kernel writes only output 0",
                     (long long)v[1], (long long)v[0]);
  *nid = (int)v[0];
  return 0;
}

/* attrs "shape" ([[dims], ...]) and "dtype" ([names]): each output's; output 0 kept. */
static int kiln_json_types(const char* js, const KilnJsonToken* toks, int attrs, KilnJsonNode* n) {
  int shapes = KilnJson_Get(js, toks, attrs, "shape"), dtypes = KilnJson_Get(js, toks, attrs,
                                                                               "dtype");
  int i, d, k;
  if (shapes < 0 || dtypes < 0 || toks[shapes].type != KILN_JSON_ARRAY ||
      toks[dtypes].type != KILN_JSON_ARRAY || toks[shapes].size == 0 ||
      toks[shapes].size != toks[dtypes].size)
    return -1;
  for (i = 0; i < toks[shapes].size; ++i) {
    int s = KilnJson_At(toks, shapes, i), t = KilnJson_At(toks, dtypes, i);
    KilnJsonTensor ty;
    if (toks[s].type != KILN_JSON_ARRAY || toks[s].size > KILN_JSON_MAX_NDIM) return -1;
    ty.ndim = toks[s].size;
    ty.size = 1;
    for (d = 0; d < ty.ndim; ++d) {
      if (kiln_json_prim_int(js, toks, KilnJson_At(toks, s, d), &ty.shape[d]) != 0 ||
          ty.shape[d] < 0 || ty.shape[d] >= ((int64_t)1 << 40))
        return -1;
      if (ty.shape[d] && ty.size > (((int64_t)1 << 59) / ty.shape[d]))
        return kiln_fail("an output of more than 2^59 elements");
      ty.size *= ty.shape[d];
    }
    for (k = 0; k < (int)(sizeof(kiln_json_dtypes) / sizeof(kiln_json_dtypes[0])); ++k)
      if (KilnJson_Equals(js, toks, t, kiln_json_dtypes[k])) break;
    if (k == (int)(sizeof(kiln_json_dtypes) / sizeof(kiln_json_dtypes[0]))) return -1;
    if (kiln_vm_dtype_from_name(kiln_json_dtypes[k], &ty.dtype) != 0) return -1;
    if (i == 0) n->type = ty;
  }
  n->num_outputs = toks[shapes].size;
  return 0;
}

static int kiln_json_node(KilnJsonModule* m, const char* js, const KilnJsonToken* toks, int tok,
                          int nid) {
  KilnJsonNode* n = &m->nodes[nid];
  int op = KilnJson_Get(js, toks, tok, "op"), name = KilnJson_Get(js, toks, tok, "name");
  int attrs = KilnJson_Get(js, toks, tok, "attrs"), ins = KilnJson_Get(js, toks, tok, "inputs");
  int i, rc;
  char where[400];
  n->op = op < 0                                     ? -1
          : KilnJson_Equals(js, toks, op, "input")  ? KILN_JSON_OP_INPUT
          : KilnJson_Equals(js, toks, op, "const")  ? KILN_JSON_OP_CONST
          : KilnJson_Equals(js, toks, op, "kernel") ? KILN_JSON_OP_KERNEL
                                                    : -1;
  if (n->op < 0)
    return kiln_fail("node %d: 'op' must be input, const or kernel", nid);
  if (name < 0 || toks[name].type != KILN_JSON_STRING || attrs < 0 ||
      toks[attrs].type != KILN_JSON_OBJECT)
    return kiln_fail("node %d: needs a string 'name' and an 'attrs' object", nid);
  if ((n->name = kiln_strndup(js + toks[name].start, (size_t)(toks[name].end - toks[name].start)))
      == NULL)
    return -1;
  if (kiln_json_types(js, toks, attrs, n) != 0)
    return kiln_fail("node %d (%s): 'shape' and 'dtype' must list each output's shape and a "
                     "supported dtype", nid, n->name);
  if (ins >= 0 && toks[ins].type != KILN_JSON_ARRAY)
    return kiln_fail("node %d (%s): 'inputs' must be a list", nid, n->name);
  n->num_inputs = ins < 0 ? 0 : toks[ins].size;
  if ((n->inputs = (int*)kiln_calloc((size_t)n->num_inputs + 1, sizeof(int))) == NULL ||
      (n->in_types = (const KilnJsonTensor**)kiln_calloc((size_t)n->num_inputs + 1,
                                                       sizeof(KilnJsonTensor*))) == NULL)
    return -1;
  for (i = 0; i < n->num_inputs; ++i) {
    if (kiln_json_edge(js, toks, KilnJson_At(toks, ins, i), nid, m->nodes, &n->inputs[i]) != 0)
      return kiln_fail("node %d (%s): input %d is not an earlier node's output", nid, n->name, i);
    n->in_types[i] = &m->nodes[n->inputs[i]].type;
  }
  if (n->op != KILN_JSON_OP_KERNEL) {
    if (n->num_inputs) return kiln_fail("node %d: an input or const node has no inputs", nid);
    return 0;
  }
  if ((n->kernel = kiln_json_kernel(n->name, strlen(n->name))) == NULL)
    return kiln_fail("node %d: no kiln_json kernel for '%s' (the C runtime has the built-in "
                     "kernels of kiln.runtime.contrib.json.json_kernels)", nid, n->name);
  if (n->num_inputs < n->kernel->min_inputs || n->num_inputs > n->kernel->max_inputs)
    return kiln_fail("node %d (%s): %d inputs", nid, n->name, n->num_inputs);
  for (i = -1; i < n->num_inputs; ++i) {
    const KilnJsonTensor* t = i < 0 ? &n->type : n->in_types[i];
    if (t->dtype.code != kDLFloat || t->dtype.bits != 32)
      return kiln_fail("node %d (%s): the C kiln_json kernels take float32, %s %d is %s", nid,
                       n->name, i < 0 ? "output" : "input", i < 0 ? 0 : i,
                       kiln_vm_dtype_name(t->dtype));
  }
  snprintf(where, sizeof(where), "node %d (%s)", nid, n->name);
  {
    KilnJsonAttrs a = {js, toks, attrs, where};
    rc = n->kernel->prepare(n, &a);
  }
  return rc;
}

/* arg_nodes (input nodes) and heads (node outputs), both optional lists in the JSON */
static int kiln_json_io(KilnJsonModule* m, const char* js, const KilnJsonToken* toks, int root) {
  int args = KilnJson_Get(js, toks, root, "arg_nodes"), heads = KilnJson_Get(js, toks, root,
                                                                            "heads");
  int i;
  int64_t v;
  if (args >= 0 && toks[args].type != KILN_JSON_ARRAY)
    return kiln_fail("'arg_nodes' must list input nodes");
  m->num_args = args < 0 ? 0 : toks[args].size;
  if ((m->args = (int*)kiln_calloc((size_t)m->num_args + 1, sizeof(int))) == NULL) return -1;
  for (i = 0; i < m->num_args; ++i) {
    if (kiln_json_prim_int(js, toks, KilnJson_At(toks, args, i), &v) != 0 || v < 0 ||
        v >= m->num_nodes || m->nodes[v].op != KILN_JSON_OP_INPUT)
      return kiln_fail("'arg_nodes' must list input nodes");
    m->args[i] = (int)v;
  }
  if (heads >= 0 && toks[heads].type != KILN_JSON_ARRAY)
    return kiln_fail("head None is not a node output");
  m->num_heads = heads < 0 ? 0 : toks[heads].size;
  if ((m->heads = (int*)kiln_calloc((size_t)m->num_heads + 1, sizeof(int))) == NULL) return -1;
  for (i = 0; i < m->num_heads; ++i)
    if (kiln_json_edge(js, toks, KilnJson_At(toks, heads, i), m->num_nodes, m->nodes,
                       &m->heads[i]) != 0)
      return kiln_fail("head %d is not a node output", i);
  if (m->num_heads == 0) return kiln_fail("the graph has no outputs ('heads')");
  return 0;
}

/* Each kernel value that is not an output dies after its last reader (whole-model regions). */
static int kiln_json_plan_release(KilnJsonModule* m) {
  int* last = (int*)kiln_calloc((size_t)m->num_nodes + 1, sizeof(int));
  int nid, i;
  if (last == NULL) return -1;
  for (nid = 0; nid < m->num_nodes; ++nid) last[nid] = -1;
  for (nid = 0; nid < m->num_nodes; ++nid)
    for (i = 0; i < m->nodes[nid].num_inputs; ++i) last[m->nodes[nid].inputs[i]] = nid;
  for (i = 0; i < m->num_heads; ++i) last[m->heads[i]] = -1;
  for (nid = 0; nid < m->num_nodes; ++nid) {
    KilnJsonNode* r;
    if (m->nodes[nid].op != KILN_JSON_OP_KERNEL || last[nid] < 0) continue;
    r = &m->nodes[last[nid]];
    if (r->release == NULL &&
        (r->release = (int*)kiln_calloc((size_t)r->num_inputs + 1, sizeof(int))) == NULL)
      break;
    r->release[r->num_release++] = nid; /* distinct readers' inputs: at most num_inputs */
  }
  free(last);
  return nid == m->num_nodes ? 0 : -1;
}

static int kiln_json_parse(KilnJsonModule* m, const char* js, size_t len) {
  KilnJsonToken* toks = NULL;
  int ntok, nodes, nid, k, rc = -1;
  size_t c;
  if ((ntok = KilnJson_Parse(js, len, NULL, 0)) < 0)
    return kiln_fail("graph JSON is not valid JSON: %s", TVMGetLastError());
  if ((toks = (KilnJsonToken*)kiln_calloc((size_t)ntok + 1, sizeof(KilnJsonToken))) == NULL)
    return -1;
  if (KilnJson_Parse(js, len, toks, ntok) < 0) {
    kiln_fail("graph JSON is not valid JSON: %s", TVMGetLastError());
    goto done;
  }
  nodes = KilnJson_Get(js, toks, 0, "nodes");
  if (nodes < 0 || toks[nodes].type != KILN_JSON_ARRAY) {
    kiln_fail("graph JSON has no 'nodes' list");
    goto done;
  }
  if ((m->nodes = (KilnJsonNode*)kiln_calloc((size_t)toks[nodes].size + 1,
                                             sizeof(KilnJsonNode))) == NULL)
    goto done;
  for (nid = 0, k = nodes + 1; nid < toks[nodes].size; ++nid, k = toks[k].next) {
    m->num_nodes = nid + 1; /* freed up to here on failure */
    if (kiln_json_node(m, js, toks, k, nid) != 0) goto done;
  }
  if (kiln_json_io(m, js, toks, 0) != 0) goto done;
  for (nid = 0; nid < m->num_nodes; ++nid) {
    KilnJsonNode* n = &m->nodes[nid];
    if (n->op != KILN_JSON_OP_CONST) continue;
    for (c = 0; c < m->num_consts && strcmp(m->const_names[c], n->name) != 0; ++c) {
    }
    if (c == m->num_consts) {
      kiln_fail("const node '%s' is not among its constants", n->name);
      goto done;
    }
    n->const_index = (int)c;
  }
  rc = kiln_json_plan_release(m);
done:
  free(toks);
  return rc;
}

/* "(1, 3, 4) float32" into buf */
static const char* kiln_json_type_str(int ndim, const int64_t* shape, DLDataType dt, char* buf,
                                      size_t size) {
  size_t used = 0;
  int d;
  used += (size_t)snprintf(buf, size, "(");
  for (d = 0; d < ndim && used < size; ++d)
    used += (size_t)snprintf(buf + used, size - used, "%s%lld", d ? ", " : "",
                             (long long)shape[d]);
  if (used < size)
    snprintf(buf + used, size - used, "%s) %s", ndim == 1 ? "," : "", kiln_vm_dtype_name(dt));
  return buf;
}

/* A tensor argument of type `want`, C-contiguous on the CPU; its data. */
static int kiln_json_arg(KilnJsonModule* m, TVMValue v, int code, const KilnJsonTensor* want,
                         const char* what, int k, void** data) {
  char label[300];
  const DLTensor* t = (const DLTensor*)v.v_handle;
  char got_s[200], want_s[200];
  int d, same;
  if (k >= 0) snprintf(label, sizeof(label), "%s %d", what, k);
  else snprintf(label, sizeof(label), "%s", what);
  if ((code != kTVMDLTensorHandle && code != kTVMNDArrayHandle) || t == NULL)
    return kiln_fail("kiln_json %s: %s is not a tensor (type code %d)", m->symbol, label, code);
  same = t->ndim == want->ndim && t->dtype.code == want->dtype.code &&
         t->dtype.bits == want->dtype.bits && t->dtype.lanes == 1 && (t->ndim == 0 || t->shape);
  for (d = 0; same && d < t->ndim; ++d) same = t->shape[d] == want->shape[d];
  if (!same)
    return kiln_fail("kiln_json %s: %s is %s, expected %s", m->symbol, label,
                     t->ndim < 0 || t->ndim > KILN_JSON_MAX_NDIM || (t->ndim && !t->shape)
                         ? "a bad tensor"
                         : kiln_json_type_str(t->ndim, t->shape, t->dtype, got_s, sizeof(got_s)),
                     kiln_json_type_str(want->ndim, want->shape, want->dtype, want_s,
                                        sizeof(want_s)));
  if (t->device.device_type != kDLCPU || !kiln_is_compact(t) || (t->data == NULL && want->size))
    return kiln_fail("kiln_json %s: %s is not contiguous", m->symbol, label);
  *data = (char*)t->data + t->byte_offset;
  return 0;
}

static size_t kiln_json_nbytes(const KilnJsonTensor* t) {
  return (size_t)t->size * ((t->dtype.bits + 7u) / 8u);
}

/* __init_<symbol>(*constants): checked against the const nodes, then copied. */
static int kiln_json_init(KilnModule* self, TVMValue* args, int* codes, int num_args,
                          TVMValue* ret, int* ret_code) {
  KilnJsonModule* m = (KilnJsonModule*)self;
  void** data;
  char name[300];
  int nid, rc = 0;
  size_t c;
  if ((size_t)num_args != m->num_consts)
    return kiln_fail("kiln_json %s: %s got %d constants, expects %zu", m->symbol, m->init_name,
                     num_args, m->num_consts);
  if ((data = (void**)kiln_calloc(m->num_consts + 1, sizeof(void*))) == NULL) return -1;
  for (nid = 0; nid < m->num_nodes && rc == 0; ++nid) {
    KilnJsonNode* n = &m->nodes[nid];
    void* src;
    c = (size_t)n->const_index;
    if (n->op != KILN_JSON_OP_CONST) continue;
    snprintf(name, sizeof(name), "constant %s", n->name);
    if (kiln_json_arg(m, args[c], codes[c], &n->type, name, -1, &src) != 0) {
      rc = -1;
    } else if (data[c] == NULL) {
      if ((data[c] = kiln_aligned_alloc(kiln_json_nbytes(&n->type))) == NULL) rc = -1;
      else if (n->type.size) memcpy(data[c], src, kiln_json_nbytes(&n->type));
    }
  }
  if (rc != 0) {
    for (c = 0; c < m->num_consts; ++c) free(data[c]);
    free(data);
    return -1;
  }
  for (c = 0; m->const_data && c < m->num_consts; ++c) free(m->const_data[c]);
  free(m->const_data);
  m->const_data = data;
  m->initialized = 1;
  *ret_code = kTVMArgInt;
  ret->v_int64 = 0;
  return 0;
}

/* <symbol>(*inputs, *outputs): the nodes in order; kernel values die after their last reader. */
static int kiln_json_run(KilnModule* self, TVMValue* args, int* codes, int num_args,
                         TVMValue* ret, int* ret_code) {
  KilnJsonModule* m = (KilnJsonModule*)self;
  void** val;
  uint8_t* owned; /* 1: val[nid] is a buffer of this call */
  const float* ins_stack[16];
  const float** ins;
  int nid, k, i, rc = -1;
  if (!m->initialized)
    return kiln_fail("kiln_json %s: called before %s gave it its constants (load it under a "
                     "const loader)", m->symbol, m->init_name);
  if (num_args != m->num_args + m->num_heads)
    return kiln_fail("kiln_json %s: expects %d inputs and %d outputs, got %d tensors",
                     m->symbol, m->num_args, m->num_heads, num_args);
  val = (void**)kiln_calloc((size_t)m->num_nodes + 1, sizeof(void*));
  owned = (uint8_t*)kiln_calloc((size_t)m->num_nodes + 1, 1);
  if (val == NULL || owned == NULL) goto done;
  for (k = 0; k < m->num_args; ++k) {
    if (kiln_json_arg(m, args[k], codes[k], &m->nodes[m->args[k]].type, "input", k,
                      &val[m->args[k]]) != 0)
      goto done;
    owned[m->args[k]] = 2; /* bound, not owned */
  }
  for (k = 0; k < m->num_heads; ++k) {
    void* out;
    if (kiln_json_arg(m, args[m->num_args + k], codes[m->num_args + k],
                      &m->nodes[m->heads[k]].type, "output", k, &out) != 0)
      goto done;
  }
  for (nid = 0; nid < m->num_nodes; ++nid) {
    KilnJsonNode* n = &m->nodes[nid];
    if (n->op == KILN_JSON_OP_CONST) {
      val[nid] = m->const_data[n->const_index];
    } else if (n->op == KILN_JSON_OP_INPUT) {
      if (owned[nid] != 2) {
        kiln_fail("kiln_json %s: input node %d is not an argument", m->symbol, nid);
        goto done;
      }
    } else {
      for (k = 0; k < m->num_heads && m->heads[k] != nid; ++k) {
      }
      if (k < m->num_heads) {
        val[nid] = (char*)((DLTensor*)args[m->num_args + k].v_handle)->data +
                   ((DLTensor*)args[m->num_args + k].v_handle)->byte_offset;
      } else {
        if ((val[nid] = kiln_aligned_alloc(kiln_json_nbytes(&n->type))) == NULL) goto done;
        owned[nid] = 1;
      }
      ins = n->num_inputs <= 16 ? ins_stack
                                : (const float**)kiln_calloc((size_t)n->num_inputs, sizeof(float*));
      if (ins == NULL) goto done;
      for (i = 0; i < n->num_inputs; ++i) ins[i] = (const float*)val[n->inputs[i]];
      i = n->kernel->run(n, ins, (float*)val[nid]);
      if (ins != ins_stack) free(ins);
      if (i != 0) goto done;
      for (i = 0; i < n->num_release; ++i) {
        free(val[n->release[i]]);
        val[n->release[i]] = NULL;
        owned[n->release[i]] = 0;
      }
    }
  }
  for (k = 0; k < m->num_heads; ++k) { /* outputs that are not kernels' (inputs, constants) */
    const DLTensor* t = (const DLTensor*)args[m->num_args + k].v_handle;
    char* dst = (char*)t->data + t->byte_offset;
    const KilnJsonTensor* ty = &m->nodes[m->heads[k]].type;
    if (val[m->heads[k]] != dst && ty->size) memmove(dst, val[m->heads[k]], kiln_json_nbytes(ty));
  }
  rc = 0;
done:
  for (nid = 0; owned && nid < m->num_nodes; ++nid)
    if (owned[nid] == 1) free(val[nid]);
  free(val);
  free(owned);
  return rc;
}

static int kiln_json_get_symbol(KilnModule* self, TVMValue* args, int* codes, int num_args,
                                TVMValue* ret, int* ret_code) {
  KilnJsonModule* m = (KilnJsonModule*)self;
  ret->v_str = kiln_return_string(m->symbol, strlen(m->symbol));
  *ret_code = kTVMStr;
  return ret->v_str ? 0 : -1;
}

static int kiln_json_num_consts(KilnModule* self, TVMValue* args, int* codes, int num_args,
                                TVMValue* ret, int* ret_code) {
  ret->v_int64 = (int64_t)((KilnJsonModule*)self)->num_consts;
  *ret_code = kTVMArgInt;
  return 0;
}

static int kiln_json_const_var(KilnModule* self, TVMValue* args, int* codes, int num_args,
                               TVMValue* ret, int* ret_code) {
  KilnJsonModule* m = (KilnJsonModule*)self;
  const char* name;
  if (num_args != 1 || codes[0] != kTVMArgInt || args[0].v_int64 < 0 ||
      (uint64_t)args[0].v_int64 >= m->num_consts)
    return kiln_fail("kiln_json %s: get_const_var(i) takes an index below %zu", m->symbol,
                     m->num_consts);
  name = m->const_names[args[0].v_int64];
  ret->v_str = kiln_return_string(name, strlen(name));
  *ret_code = kTVMStr;
  return ret->v_str ? 0 : -1;
}

static int kiln_json_get_own(KilnModule* self, const char* name, KilnFunc** out) {
  KilnJsonModule* m = (KilnJsonModule*)self;
  static const struct {
    const char* name;
    KilnMethod method;
  } fixed[] = {{"get_symbol", kiln_json_get_symbol},
               {"get_num_const_vars", kiln_json_num_consts},
               {"get_const_var", kiln_json_const_var}};
  size_t i;
  *out = NULL;
  for (i = 0; i < sizeof(fixed) / sizeof(fixed[0]); ++i)
    if (strcmp(name, fixed[i].name) == 0) *out = kiln_func_method(self, fixed[i].name,
                                                                  fixed[i].method);
  if (strcmp(name, m->init_name) == 0) *out = kiln_func_method(self, m->init_name, kiln_json_init);
  if (strcmp(name, m->symbol) == 0) *out = kiln_func_method(self, m->symbol, kiln_json_run);
  return 0;
}

static void kiln_json_destroy(KilnModule* self) {
  KilnJsonModule* m = (KilnJsonModule*)self;
  size_t c;
  int nid;
  for (nid = 0; m->nodes && nid < m->num_nodes; ++nid) {
    free(m->nodes[nid].name);
    free(m->nodes[nid].inputs);
    free(m->nodes[nid].in_types);
    free(m->nodes[nid].release);
  }
  for (c = 0; c < m->num_consts; ++c) {
    if (m->const_names) free(m->const_names[c]);
    if (m->const_data) free(m->const_data[c]);
  }
  free(m->nodes);
  free(m->args);
  free(m->heads);
  free(m->const_names);
  free(m->const_data);
  free(m->symbol);
  free(m->init_name);
}

int kiln_load_json(const uint8_t* data, size_t n, KilnModule** out) {
  KilnStream s = {data, n, "kiln_json module"};
  KilnJsonModule* m =
      (KilnJsonModule*)kiln_module_new(sizeof(KilnJsonModule), KILN_JSON_TYPE_KEY);
  const uint8_t *sym, *graph;
  size_t sym_n, graph_n;
  *out = NULL;
  if (m == NULL) return -1;
  m->base.get_own = kiln_json_get_own;
  m->base.destroy = kiln_json_destroy;
  if (kiln_read_bytes(&s, &sym, &sym_n, "symbol") != 0 ||
      kiln_read_bytes(&s, &graph, &graph_n, "graph_json") != 0 ||
      kiln_read_names(&s, &m->const_names, &m->num_consts, "const_names") != 0)
    goto fail;
  if (s.left) {
    kiln_fail("%s: %zu unexpected trailing bytes", s.what, s.left);
    goto fail;
  }
  if (memchr(sym, 0, sym_n) != NULL || (m->symbol = kiln_strndup((const char*)sym, sym_n)) == NULL ||
      (m->init_name = (char*)kiln_calloc(sym_n + 8, 1)) == NULL) {
    if (m->symbol == NULL) kiln_fail("%s: a NUL in the symbol", s.what);
    goto fail;
  }
  snprintf(m->init_name, sym_n + 8, "__init_%s", m->symbol);
  if (kiln_json_parse(m, (const char*)graph, graph_n) != 0) {
    kiln_fail("kiln_json module '%s': %s", m->symbol, TVMGetLastError());
    goto fail;
  }
  m->initialized = m->num_consts == 0;
  if (m->initialized &&
      (m->const_data = (void**)kiln_calloc(1, sizeof(void*))) == NULL)
    goto fail;
  *out = &m->base;
  return 0;
fail:
  kiln_module_release(&m->base);
  return -1;
}
