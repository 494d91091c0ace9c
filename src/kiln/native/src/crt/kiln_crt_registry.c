/*
 * Function lookup in a system library's TVMFuncRegistry and packed calls (TVM's
 * src/runtime/crt/common/func_registry.c and crt_runtime_api.c). Names blob: docs/formats.md
 * §8. Also the graph executor over a system library: its kernel lookup and its run with
 * the arena's free bytes as the kernels' workspace stack.
 */
#include "kiln_crt.h"

#include <string.h>

uint16_t TVMFuncRegistry_NumFuncs(const TVMFuncRegistry* registry) {
  const unsigned char* p = (const unsigned char*)registry->names;
  return (uint16_t)(p[0] | (p[1] << 8)); /* little-endian, whatever the host */
}

int TVMFuncRegistry_Lookup(const TVMFuncRegistry* registry, const char* name,
                           TVMFunctionHandle* out) {
  uint16_t count = TVMFuncRegistry_NumFuncs(registry);
  const char* p = registry->names + 2;
  uint16_t i;
  *out = NULL;
  for (i = 0; i < count && *p != '\0'; ++i) {
    size_t len = strlen(p);
    if (strcmp(p, name) == 0) {
      *out = &registry->funcs[i];
      return 0;
    }
    p += len + 1;
  }
  return -1;
}

int TVMModGetFunction(const TVMModule* mod, const char* name, TVMFunctionHandle* out) {
  if (mod == NULL || mod->registry == NULL) {
    TVMAPISetLastError("TVMModGetFunction: no module");
    return -1;
  }
  if (TVMFuncRegistry_Lookup(mod->registry, name, out) != 0) {
    static char message[160];
    size_t n = strlen(name);
    const char* head = "TVMModGetFunction: no function named ";
    size_t h = strlen(head);
    if (n > sizeof(message) - h - 1) n = sizeof(message) - h - 1;
    memcpy(message, head, h);
    memcpy(message + h, name, n);
    message[h + n] = '\0';
    TVMAPISetLastError(message);
    return -1;
  }
  return 0;
}

int TVMFuncCall(TVMFunctionHandle func, TVMValue* args, int* type_codes, int num_args,
                TVMValue* ret_val, int* ret_type_code) {
  if (func == NULL || *func == NULL) {
    TVMAPISetLastError("TVMFuncCall: null function");
    return -1;
  }
  *ret_type_code = kTVMNullptr;
  return (*func)(args, type_codes, num_args, ret_val, ret_type_code, NULL);
}

static int kiln_registry_lookup(void* ctx, const char* name, TVMBackendPackedCFunc* func,
                                void** resource) {
  TVMFunctionHandle handle;
  if (TVMModGetFunction((const TVMModule*)ctx, name, &handle) != 0) return -1;
  *func = *handle;
  *resource = NULL;
  return 0;
}

int KilnGraphExecutor_Create(const char* json, size_t json_len, const TVMModule* mod,
                             KilnArena* arena, KilnGraphExecutor** out) {
  return KilnGraphExecutor_CreateWithLookup(json, json_len, kiln_registry_lookup, (void*)mod,
                                            arena, out);
}

int KilnGraphExecutor_Run(KilnGraphExecutor* ge) {
  KilnArena* a = KilnGraphExecutor_Arena(ge);
  KilnWorkspace_Init(a->base + a->used, a->size - a->used);
  return KilnGraphExecutor_RunOps(ge);
}
