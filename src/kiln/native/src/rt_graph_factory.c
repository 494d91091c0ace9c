/*
 * The graph executor factory module (type_key GraphExecutorFactory): TVM's
 * src/runtime/graph_executor/graph_executor_factory.cc; Kiln's
 * kiln/runtime/graph_executor/factory.py, whose function names this file serves.
 *
 * Bytes (docs/formats.md §6):
 *     string graph_json | u64 n | vec<string> names | n x NDArray | string module_name
 * Functions: <module_name>(device) -> executor module (rt_graph.c), get_graph_json, get_lib,
 * get_graph_params (the params as the params blob load_params reads, kTVMBytes: the C ABI has
 * no map of names to tensors).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "crt/kiln_crt_json.h"
#include "rt_graph.h"

#define KILN_PARAMS_MAGIC 0xF7E58D4F05049CB7ULL

/* -- the factory's functions */
static int kiln_fac_create(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                           int* ret_code) {
  KilnModule* g;
  int dev_type = kDLCPU;
  if (n >= 1 && codes[0] == kDLDeviceArg) dev_type = args[0].v_device.device_type;
  else if (n >= 1 && codes[0] == kTVMArgInt) dev_type = (int)args[0].v_int64;
  if (dev_type != kDLCPU)
    return kiln_fail("the native runtime runs graphs on the CPU only (device type %d)", dev_type);
  if (kiln_ge_create((KilnFactory*)self, &g) != 0) return -1;
  kiln_module_add_import(g, self); /* keeps the factory and its library alive */
  ret->v_handle = g;
  *ret_code = kTVMModuleHandle;
  return 0;
}

static int kiln_fac_graph_json(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                               int* ret_code) {
  KilnFactory* f = (KilnFactory*)self;
  (void)args, (void)codes, (void)n;
  ret->v_str = kiln_return_string(f->graph_json, f->graph_len);
  *ret_code = kTVMStr;
  return ret->v_str ? 0 : -1;
}

static int kiln_fac_graph_params(KilnModule* self, TVMValue* args, int* codes, int n,
                                 TVMValue* ret, int* ret_code) {
  KilnFactory* f = (KilnFactory*)self;
  (void)args, (void)codes, (void)n;
  f->params_bytes.data = (const char*)f->params;
  f->params_bytes.size = f->params_len;
  ret->v_handle = &f->params_bytes;
  *ret_code = kTVMBytes;
  return 0;
}

static int kiln_fac_get_lib(KilnModule* self, TVMValue* args, int* codes, int n, TVMValue* ret,
                            int* ret_code) {
  (void)args, (void)codes, (void)n;
  return kiln_return_library(self, ret, ret_code, "GraphExecutorFactory");
}

static int kiln_fac_get_own(KilnModule* self, const char* name, KilnFunc** out) {
  KilnFactory* f = (KilnFactory*)self;
  *out = NULL;
  if (strcmp(name, f->module_name) == 0) *out = kiln_func_method(self, f->module_name, kiln_fac_create);
  else if (strcmp(name, "get_graph_json") == 0)
    *out = kiln_func_method(self, "get_graph_json", kiln_fac_graph_json);
  else if (strcmp(name, "get_lib") == 0) *out = kiln_func_method(self, "get_lib", kiln_fac_get_lib);
  else if (strcmp(name, "get_graph_params") == 0)
    *out = kiln_func_method(self, "get_graph_params", kiln_fac_graph_params);
  else return 0;
  return *out ? 0 : -1;
}

static void kiln_fac_hint(KilnModule* self, char* buf, size_t size) {
  /* usually asked for "vm_load_executable" by a program written for VM libraries */
  snprintf(buf, size, "this is a graph executor library (static shapes): create an executor "
           "with %s(device) (see examples/deploy_c; `kiln compile --executor vm` builds a VM "
           "library)", ((KilnFactory*)self)->module_name);
}

static void kiln_fac_destroy(KilnModule* self) {
  KilnFactory* f = (KilnFactory*)self;
  size_t i;
  for (i = 0; f->param_names && i < f->num_params; ++i) free(f->param_names[i]);
  free(f->param_names);
  free(f->graph_json);
  free(f->params);
  free(f->module_name);
}

static void kiln_put_u64(uint8_t* p, uint64_t v) {
  int i;
  for (i = 0; i < 8; ++i) p[i] = (uint8_t)(v >> (8 * i));
}

int kiln_load_graph_factory(const uint8_t* data, size_t n, KilnModule** out) {
  KilnStream s = {data, n, "GraphExecutorFactory module"};
  KilnFactory* f = (KilnFactory*)kiln_module_new(sizeof(KilnFactory), "GraphExecutorFactory");
  const uint8_t *json, *names_start, *arrays_start, *str;
  size_t json_n, len, i;
  uint64_t count, num_names;
  int ntok;
  *out = NULL;
  if (f == NULL) return -1;
  f->base.get_own = kiln_fac_get_own;
  f->base.destroy = kiln_fac_destroy;
  f->base.missing_hint = kiln_fac_hint;
  if (kiln_read_bytes(&s, &json, &json_n, "graph_json") != 0 ||
      kiln_read_u64(&s, &count, "param count") != 0)
    goto fail;
  names_start = s.p;
  if (kiln_read_count(&s, 8, &num_names, "param names") != 0) goto fail;
  if (num_names != count) {
    kiln_fail("%s: corrupt: %llu params but %llu names", s.what, (unsigned long long)count,
              (unsigned long long)num_names);
    goto fail;
  }
  if ((f->param_names = (char**)kiln_calloc((size_t)count + 1, sizeof(char*))) == NULL) goto fail;
  for (i = 0; i < count; ++i) {
    if (kiln_read_bytes(&s, &str, &len, "param name") != 0 ||
        (f->param_names[i] = kiln_strndup((const char*)str, len)) == NULL)
      goto fail;
    f->num_params = i + 1;
  }
  arrays_start = s.p;
  for (i = 0; i < count; ++i) {
    KilnArrayView a;
    if (kiln_read_ndarray(&s, &a, "param") != 0) goto fail;
  }
  /* the params as a params blob: magic | 0 | names | u64 count | arrays */
  f->params_len = 16 + (size_t)(arrays_start - names_start) + 8 + (size_t)(s.p - arrays_start);
  if ((f->params = (uint8_t*)kiln_calloc(f->params_len, 1)) == NULL) goto fail;
  kiln_put_u64(f->params, KILN_PARAMS_MAGIC);
  memcpy(f->params + 16, names_start, (size_t)(arrays_start - names_start));
  kiln_put_u64(f->params + 16 + (arrays_start - names_start), count);
  memcpy(f->params + 24 + (arrays_start - names_start), arrays_start, (size_t)(s.p - arrays_start));
  if (kiln_read_bytes(&s, &str, &len, "module_name") != 0) goto fail;
  if (s.left) {
    kiln_fail("%s: %zu unexpected trailing bytes", s.what, s.left);
    goto fail;
  }
  if ((f->module_name = kiln_strndup((const char*)str, len)) == NULL ||
      (f->graph_json = kiln_strndup((const char*)json, json_n)) == NULL)
    goto fail;
  f->graph_len = json_n;
  /* fail at load time on malformed JSON text, not at first use */
  if ((ntok = KilnJson_Parse(f->graph_json, f->graph_len, NULL, 0)) < 0) {
    char msg[512];
    memcpy(msg, TVMGetLastError(), sizeof(msg) - 1);
    msg[sizeof(msg) - 1] = '\0';
    kiln_fail("%s: %s", s.what, msg);
    goto fail;
  }
  *out = &f->base;
  return 0;
fail:
  kiln_module_release(&f->base);
  return -1;
}
