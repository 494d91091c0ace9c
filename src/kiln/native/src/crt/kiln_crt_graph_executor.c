/*
 * The graph executor of the C runtime (TVM's src/runtime/crt/graph_executor/graph_executor.c):
 * reads the graph JSON (docs/formats.md §4), plans storage as the JSON says (a pool per
 * storage id, of the largest entry using it), prepares every kernel call once (SetupOpExecs) and
 * runs them in order; params come from a params blob (§5). Everything lives in the
 * caller's arena. Kernels are found through a lookup callback (KilnGraphExecutor_CreateWithLookup),
 * so the CRT (system-library registry, kiln_crt_registry.c) and the native runtime (dlopen'ed
 * libraries, kiln/native/src/rt_graph.c) share this one executor.
 */
#include <string.h>

#include "kiln_crt_graph.h"
#include "kiln_crt_json.h"

#define KILN_MAX_NDIM 8
#define KILN_PARAMS_MAGIC 0xF7E58D4F05049CB7ULL
#define KILN_NDARRAY_MAGIC 0xDD5E40F096B4A13FULL

typedef struct {
  TVMBackendPackedCFunc func;
  void* resource;
  TVMValue* args;
  int* type_codes;
  int num_args;
} KilnOpExec;

struct KilnGraphExecutor {
  KilnArena* arena;
  int num_nodes;
  int32_t* node_row_ptr; /* num_nodes + 1 */
  int num_entries;
  DLTensor* entries;
  int num_ops;
  KilnOpExec* ops;
  int num_inputs;
  int32_t* input_nids;
  char** input_names;
  int num_outputs;
  int32_t* output_eids;
};

static int kiln_fail(const char* msg) {
  TVMAPISetLastError(msg);
  return -1;
}

size_t KilnTensor_NumBytes(const DLTensor* t) {
  size_t n = (size_t)((t->dtype.bits * t->dtype.lanes + 7) / 8);
  int i;
  for (i = 0; i < t->ndim; ++i) n *= (size_t)t->shape[i];
  return n;
}

static void* kiln_alloc(KilnArena* arena, size_t count, size_t size) {
  if (size != 0 && count > (size_t)-1 / size) return NULL;
  return KilnArena_Alloc(arena, count * size);
}

/* "float32" → {kDLFloat, 32, 1}; also int*, uint*, bool. */
static int kiln_parse_dtype(const char* js, const KilnJsonToken* t, int tok, DLDataType* out) {
  static const struct { const char* prefix; uint8_t code; } kinds[] = {
      {"float", kDLFloat}, {"uint", kDLUInt}, {"int", kDLInt}};
  const char* s = js + t[tok].start;
  int len = t[tok].end - t[tok].start;
  size_t k;
  if (t[tok].type != KILN_JSON_STRING) return -1;
  out->lanes = 1;
  if (len == 4 && memcmp(s, "bool", 4) == 0) {
    out->code = 6;
    out->bits = 8;
    return 0;
  }
  for (k = 0; k < sizeof(kinds) / sizeof(kinds[0]); ++k) {
    int plen = (int)strlen(kinds[k].prefix);
    int bits = 0, i;
    if (len <= plen || memcmp(s, kinds[k].prefix, (size_t)plen) != 0) continue;
    for (i = plen; i < len; ++i) {
      if (s[i] < '0' || s[i] > '9') return -1;
      bits = bits * 10 + (s[i] - '0');
      if (bits > 64) return -1;
    }
    if (bits != 8 && bits != 16 && bits != 32 && bits != 64) return -1;
    out->code = kinds[k].code;
    out->bits = (uint8_t)bits;
    return 0;
  }
  return -1;
}

/* The list of a ["list_<kind>", [...]] attribute of the graph. */
static int kiln_graph_attr(const char* js, const KilnJsonToken* t, int attrs, const char* key,
                           int size) {
  int list = KilnJson_At(t, KilnJson_Get(js, t, attrs, key), 1);
  if (list < 0 || t[list].type != KILN_JSON_ARRAY || t[list].size != size) return -1;
  return list;
}

static char* kiln_copy_string(KilnArena* arena, const char* js, const KilnJsonToken* t) {
  size_t n = (size_t)(t->end - t->start);
  char* s = (char*)KilnArena_Alloc(arena, n + 1);
  if (s == NULL) return NULL;
  memcpy(s, js + t->start, n);
  s[n] = '\0';
  return s;
}

/* Entries: dtype, shape and storage of each; one pool per storage id. */
static int kiln_setup_entries(KilnGraphExecutor* ge, const char* js, const KilnJsonToken* t,
                              int attrs) {
  int n = ge->num_entries, e, tok_sid, tok_shape, tok_type, s, d;
  int32_t* sid = (int32_t*)kiln_alloc(ge->arena, (size_t)n, sizeof(int32_t));
  size_t* pool_bytes = (size_t*)kiln_alloc(ge->arena, (size_t)n, sizeof(size_t));
  uint8_t** pools = (uint8_t**)kiln_alloc(ge->arena, (size_t)n, sizeof(uint8_t*));
  ge->entries = (DLTensor*)kiln_alloc(ge->arena, (size_t)n, sizeof(DLTensor));
  if (sid == NULL || pool_bytes == NULL || pools == NULL || ge->entries == NULL) return -1;
  tok_sid = kiln_graph_attr(js, t, attrs, "storage_id", n);
  tok_shape = kiln_graph_attr(js, t, attrs, "shape", n);
  tok_type = kiln_graph_attr(js, t, attrs, "dltype", n);
  if (tok_sid < 0 || tok_shape < 0 || tok_type < 0)
    return kiln_fail("graph JSON: attrs storage_id, shape and dltype need one item per entry");
  memset(pool_bytes, 0, (size_t)n * sizeof(size_t));
  tok_sid += 1;
  tok_shape += 1;
  tok_type += 1;
  for (e = 0; e < n; ++e) {
    DLTensor* x = &ge->entries[e];
    int64_t v;
    memset(x, 0, sizeof(*x));
    x->device.device_type = kDLCPU;
    if (KilnJson_Int(js, t, tok_sid, &v) != 0 || v < 0 || v >= n)
      return kiln_fail("graph JSON: bad storage_id");
    sid[e] = (int32_t)v;
    if (kiln_parse_dtype(js, t, tok_type, &x->dtype) != 0)
      return kiln_fail("graph JSON: unsupported dltype");
    if (t[tok_shape].type != KILN_JSON_ARRAY || t[tok_shape].size > KILN_MAX_NDIM)
      return kiln_fail("graph JSON: bad shape");
    x->ndim = t[tok_shape].size;
    x->shape = (int64_t*)kiln_alloc(ge->arena, (size_t)(x->ndim ? x->ndim : 1), sizeof(int64_t));
    if (x->shape == NULL) return -1;
    for (d = 0; d < x->ndim; ++d) {
      if (KilnJson_Int(js, t, tok_shape + 1 + d, &x->shape[d]) != 0 || x->shape[d] < 0)
        return kiln_fail("graph JSON: bad shape");
    }
    if (KilnTensor_NumBytes(x) > pool_bytes[sid[e]]) pool_bytes[sid[e]] = KilnTensor_NumBytes(x);
    tok_sid = t[tok_sid].next;
    tok_shape = t[tok_shape].next;
    tok_type = t[tok_type].next;
  }
  for (s = 0; s < n; ++s) {
    pools[s] = NULL;
    if (pool_bytes[s] > 0 && (pools[s] = (uint8_t*)KilnArena_Alloc(ge->arena, pool_bytes[s])) == NULL)
      return -1;
  }
  for (e = 0; e < n; ++e) ge->entries[e].data = pools[sid[e]];
  return 0;
}

/* An [nid, index, version] entry reference → entry id, or -1. */
static int kiln_entry_id(const KilnGraphExecutor* ge, const char* js, const KilnJsonToken* t,
                         int ref) {
  int64_t nid, index;
  if (KilnJson_Int(js, t, KilnJson_At(t, ref, 0), &nid) != 0 ||
      KilnJson_Int(js, t, KilnJson_At(t, ref, 1), &index) != 0 || nid < 0 ||
      nid >= ge->num_nodes || index < 0 ||
      index >= ge->node_row_ptr[nid + 1] - ge->node_row_ptr[nid])
    return -1;
  return (int)(ge->node_row_ptr[nid] + index);
}

/* SetupOpExecs: args = input entries then output entries, each a DLTensor handle. */
static int kiln_setup_ops(KilnGraphExecutor* ge, const char* js, const KilnJsonToken* t, int nodes,
                          KilnGraphLookup lookup, void* lookup_ctx) {
  int nid, node = nodes + 1;
  ge->ops = (KilnOpExec*)kiln_alloc(ge->arena, (size_t)ge->num_nodes, sizeof(KilnOpExec));
  if (ge->ops == NULL) return -1;
  ge->num_ops = 0;
  for (nid = 0; nid < ge->num_nodes; ++nid, node = t[node].next) {
    int op = KilnJson_Get(js, t, node, "op");
    int inputs = KilnJson_Get(js, t, node, "inputs");
    int attrs = KilnJson_Get(js, t, node, "attrs");
    int fname = KilnJson_Get(js, t, attrs, "func_name");
    int num_out = ge->node_row_ptr[nid + 1] - ge->node_row_ptr[nid];
    int num_in, i, ref;
    KilnOpExec* exec;
    char name[256];
    if (op < 0 || KilnJson_Equals(js, t, op, "null")) continue;
    if (!KilnJson_Equals(js, t, op, "tvm_op") || inputs < 0 || t[inputs].type != KILN_JSON_ARRAY ||
        fname < 0 || t[fname].type != KILN_JSON_STRING)
      return kiln_fail("graph JSON: a node is neither null nor a tvm_op with a func_name");
    if (KilnJson_Equals(js, t, fname, "__nop")) continue;
    if ((size_t)(t[fname].end - t[fname].start) >= sizeof(name))
      return kiln_fail("graph JSON: func_name too long");
    memcpy(name, js + t[fname].start, (size_t)(t[fname].end - t[fname].start));
    name[t[fname].end - t[fname].start] = '\0';
    exec = &ge->ops[ge->num_ops++];
    if (lookup(lookup_ctx, name, &exec->func, &exec->resource) != 0) return -1;
    num_in = t[inputs].size;
    exec->num_args = num_in + num_out;
    exec->args = (TVMValue*)kiln_alloc(ge->arena, (size_t)exec->num_args, sizeof(TVMValue));
    exec->type_codes = (int*)kiln_alloc(ge->arena, (size_t)exec->num_args, sizeof(int));
    if (exec->args == NULL || exec->type_codes == NULL) return -1;
    for (i = 0, ref = inputs + 1; i < exec->num_args; ++i) {
      int eid;
      if (i < num_in) {
        eid = kiln_entry_id(ge, js, t, ref);
        ref = t[ref].next;
      } else {
        eid = ge->node_row_ptr[nid] + (i - num_in);
      }
      if (eid < 0) return kiln_fail("graph JSON: bad node input");
      exec->args[i].v_handle = &ge->entries[eid];
      exec->type_codes[i] = kTVMDLTensorHandle;
    }
  }
  return 0;
}

static int kiln_setup_io(KilnGraphExecutor* ge, const char* js, const KilnJsonToken* t, int nodes,
                         int arg_nodes, int heads) {
  int i, tok;
  ge->num_inputs = t[arg_nodes].size;
  ge->input_nids = (int32_t*)kiln_alloc(ge->arena, (size_t)ge->num_inputs + 1, sizeof(int32_t));
  ge->input_names = (char**)kiln_alloc(ge->arena, (size_t)ge->num_inputs + 1, sizeof(char*));
  if (ge->input_nids == NULL || ge->input_names == NULL) return -1;
  for (i = 0, tok = arg_nodes + 1; i < ge->num_inputs; ++i, tok = t[tok].next) {
    int64_t nid;
    int name;
    if (KilnJson_Int(js, t, tok, &nid) != 0 || nid < 0 || nid >= ge->num_nodes)
      return kiln_fail("graph JSON: bad arg_nodes");
    name = KilnJson_Get(js, t, KilnJson_At(t, nodes, (int)nid), "name");
    if (name < 0 || t[name].type != KILN_JSON_STRING)
      return kiln_fail("graph JSON: an input node has no name");
    ge->input_nids[i] = (int32_t)nid;
    if ((ge->input_names[i] = kiln_copy_string(ge->arena, js, &t[name])) == NULL) return -1;
  }
  ge->num_outputs = t[heads].size;
  ge->output_eids = (int32_t*)kiln_alloc(ge->arena, (size_t)ge->num_outputs + 1, sizeof(int32_t));
  if (ge->output_eids == NULL) return -1;
  for (i = 0, tok = heads + 1; i < ge->num_outputs; ++i, tok = t[tok].next) {
    int eid = kiln_entry_id(ge, js, t, tok);
    if (eid < 0) return kiln_fail("graph JSON: bad heads");
    ge->output_eids[i] = eid;
  }
  return 0;
}

int KilnGraphExecutor_CreateWithLookup(const char* json, size_t json_len, KilnGraphLookup lookup,
                                       void* lookup_ctx, KilnArena* arena,
                                       KilnGraphExecutor** out) {
  KilnGraphExecutor* ge;
  KilnJsonToken* t;
  int ntok, nodes, arg_nodes, heads, row_ptr, attrs, i, tok;
  *out = NULL;
  ntok = KilnJson_Parse(json, json_len, NULL, 0);
  if (ntok < 0) return -1;
  t = (KilnJsonToken*)kiln_alloc(arena, (size_t)ntok, sizeof(KilnJsonToken));
  ge = (KilnGraphExecutor*)KilnArena_Alloc(arena, sizeof(KilnGraphExecutor));
  if (t == NULL || ge == NULL || KilnJson_Parse(json, json_len, t, ntok) != ntok) return -1;
  memset(ge, 0, sizeof(*ge));
  ge->arena = arena;
  nodes = KilnJson_Get(json, t, 0, "nodes");
  arg_nodes = KilnJson_Get(json, t, 0, "arg_nodes");
  heads = KilnJson_Get(json, t, 0, "heads");
  row_ptr = KilnJson_Get(json, t, 0, "node_row_ptr");
  attrs = KilnJson_Get(json, t, 0, "attrs");
  if (nodes < 0 || arg_nodes < 0 || heads < 0 || row_ptr < 0 || attrs < 0 ||
      t[nodes].type != KILN_JSON_ARRAY || t[arg_nodes].type != KILN_JSON_ARRAY ||
      t[heads].type != KILN_JSON_ARRAY || t[row_ptr].type != KILN_JSON_ARRAY)
    return kiln_fail("graph JSON: needs nodes, arg_nodes, heads, node_row_ptr and attrs");
  ge->num_nodes = t[nodes].size;
  if (t[row_ptr].size != ge->num_nodes + 1)
    return kiln_fail("graph JSON: node_row_ptr needs one item per node, plus one");
  ge->node_row_ptr = (int32_t*)kiln_alloc(arena, (size_t)ge->num_nodes + 1, sizeof(int32_t));
  if (ge->node_row_ptr == NULL) return -1;
  for (i = 0, tok = row_ptr + 1; i <= ge->num_nodes; ++i, tok = t[tok].next) {
    int64_t v;
    if (KilnJson_Int(json, t, tok, &v) != 0 || v < (i ? ge->node_row_ptr[i - 1] : 0) ||
        v > INT32_MAX)
      return kiln_fail("graph JSON: bad node_row_ptr");
    ge->node_row_ptr[i] = (int32_t)v;
  }
  ge->num_entries = ge->node_row_ptr[ge->num_nodes];
  if (kiln_setup_entries(ge, json, t, attrs) != 0 ||
      kiln_setup_ops(ge, json, t, nodes, lookup, lookup_ctx) != 0 ||
      kiln_setup_io(ge, json, t, nodes, arg_nodes, heads) != 0)
    return -1;
  *out = ge;
  return 0;
}

/* -- params blob */
typedef struct {
  const uint8_t* p;
  size_t left;
} KilnReader;

static int kiln_read(KilnReader* r, void* dst, size_t n) {
  if (r->left < n) return -1;
  if (dst != NULL) memcpy(dst, r->p, n);
  r->p += n;
  r->left -= n;
  return 0;
}

/* Little-endian unsigned integer of n bytes (any host byte order). */
static int kiln_read_le(KilnReader* r, size_t n, uint64_t* out) {
  uint64_t v = 0;
  size_t i;
  if (r->left < n) return -1;
  for (i = 0; i < n; ++i) v |= (uint64_t)r->p[i] << (8 * i);
  r->p += n;
  r->left -= n;
  *out = v;
  return 0;
}

int KilnGraphExecutor_LoadParams(KilnGraphExecutor* ge, const void* blob, size_t nbytes) {
  KilnReader names = {(const uint8_t*)blob, nbytes}, data;
  uint64_t magic, reserved, count, i, len;
  if (kiln_read_le(&names, 8, &magic) != 0 || magic != KILN_PARAMS_MAGIC ||
      kiln_read_le(&names, 8, &reserved) != 0 || kiln_read_le(&names, 8, &count) != 0)
    return kiln_fail("params blob: bad header");
  /* The arrays follow the names: walk both lists together. */
  data = names;
  for (i = 0; i < count; ++i) {
    if (kiln_read_le(&data, 8, &len) != 0 || kiln_read(&data, NULL, (size_t)len) != 0)
      return kiln_fail("params blob: truncated names");
  }
  if (kiln_read_le(&data, 8, &len) != 0 || len != count)
    return kiln_fail("params blob: name and array counts differ");
  for (i = 0; i < count; ++i) {
    uint64_t ndim, code, bits, lanes, size, dim, d;
    char name[256];
    DLTensor* x;
    int index;
    if (kiln_read_le(&names, 8, &len) != 0 || len >= sizeof(name) ||
        kiln_read(&names, name, (size_t)len) != 0)
      return kiln_fail("params blob: bad name");
    name[len] = '\0';
    if (kiln_read_le(&data, 8, &magic) != 0 || magic != KILN_NDARRAY_MAGIC ||
        kiln_read(&data, NULL, 16) != 0 || kiln_read_le(&data, 4, &ndim) != 0 ||
        kiln_read_le(&data, 1, &code) != 0 || kiln_read_le(&data, 1, &bits) != 0 ||
        kiln_read_le(&data, 2, &lanes) != 0)
      return kiln_fail("params blob: bad array header");
    index = KilnGraphExecutor_GetInputIndex(ge, name);
    if (index < 0) return kiln_fail("params blob: a param is not an input of the graph");
    x = &ge->entries[ge->node_row_ptr[ge->input_nids[index]]];
    if (ndim != (uint64_t)x->ndim || code != x->dtype.code || bits != x->dtype.bits ||
        lanes != x->dtype.lanes)
      return kiln_fail("params blob: a param's dtype or rank differs from the graph's");
    for (d = 0; d < ndim; ++d) {
      if (kiln_read_le(&data, 8, &dim) != 0 || (int64_t)dim != x->shape[d])
        return kiln_fail("params blob: a param's shape differs from the graph's");
    }
    if (kiln_read_le(&data, 8, &size) != 0 || size != KilnTensor_NumBytes(x) ||
        kiln_read(&data, x->data, (size_t)size) != 0)
      return kiln_fail("params blob: a param's size differs from the graph's, or truncated");
  }
  return 0;
}

/* -- inputs, run, outputs */
int KilnGraphExecutor_NumInputs(const KilnGraphExecutor* ge) { return ge->num_inputs; }
int KilnGraphExecutor_NumOutputs(const KilnGraphExecutor* ge) { return ge->num_outputs; }

int KilnGraphExecutor_GetInputIndex(const KilnGraphExecutor* ge, const char* name) {
  int i;
  for (i = 0; i < ge->num_inputs; ++i) {
    if (strcmp(ge->input_names[i], name) == 0) return i;
  }
  return -1;
}

DLTensor* KilnGraphExecutor_GetInput(KilnGraphExecutor* ge, int index) {
  if (index < 0 || index >= ge->num_inputs) return NULL;
  return &ge->entries[ge->node_row_ptr[ge->input_nids[index]]];
}

int KilnGraphExecutor_SetInput(KilnGraphExecutor* ge, const char* name, const void* data,
                               size_t nbytes) {
  DLTensor* x = KilnGraphExecutor_GetInput(ge, KilnGraphExecutor_GetInputIndex(ge, name));
  if (x == NULL) return kiln_fail("KilnGraphExecutor_SetInput: no input of that name");
  if (nbytes != KilnTensor_NumBytes(x))
    return kiln_fail("KilnGraphExecutor_SetInput: size differs from the input's");
  memcpy(x->data, data, nbytes);
  return 0;
}

int KilnGraphExecutor_RunOps(KilnGraphExecutor* ge) {
  int i;
  for (i = 0; i < ge->num_ops; ++i) {
    KilnOpExec* op = &ge->ops[i];
    TVMValue ret;
    int ret_code = kTVMNullptr;
    if (op->func(op->args, op->type_codes, op->num_args, &ret, &ret_code, op->resource) != 0)
      return -1;
  }
  return 0;
}

const char* KilnGraphExecutor_GetInputName(const KilnGraphExecutor* ge, int index) {
  if (index < 0 || index >= ge->num_inputs) return NULL;
  return ge->input_names[index];
}

DLTensor* KilnGraphExecutor_Entries(KilnGraphExecutor* ge, int* count) {
  *count = ge->num_entries;
  return ge->entries;
}

KilnArena* KilnGraphExecutor_Arena(KilnGraphExecutor* ge) { return ge->arena; }

const DLTensor* KilnGraphExecutor_GetOutput(const KilnGraphExecutor* ge, int index) {
  if (index < 0 || index >= ge->num_outputs) return NULL;
  return &ge->entries[ge->output_eids[index]];
}
