/*
 * Kiln's C runtime (CRT): run a Kiln model from C without Python, dlopen or a heap.
 *
 * - The system library: generated code defines a TVMFuncRegistry and TVMSystemLibEntryPoint()
 *   (TVM's include/tvm/runtime/crt/func_registry.h; docs/formats.md §8), so functions
 *   are found by name in a statically linked program, without dlsym.
 * - Packed calls: TVMModGetFunction / TVMFuncCall over that registry.
 * - The graph executor: reads the graph JSON and params blob that kiln.build writes
 *   (docs/formats.md §4 and §5) with its own small JSON reader.
 * - The backend callbacks generated kernels need (TVMBackendAllocWorkspace from a workspace
 *   stack, TVMAPISetLastError, a serial TVMBackendParallelLaunch): kiln_crt_backend.c.
 *
 * Memory: nothing here calls malloc. The caller gives one arena (KilnArena) at creation; the
 * executor takes its tables, tensors and storage from it and, at each run, uses the rest of it
 * as the kernels' workspace stack. Single-threaded: one run at a time per process.
 * C99; every function returns 0 on success, or -1 with the message in TVMGetLastError().
 */
#ifndef KILN_CRT_H_
#define KILN_CRT_H_

#include <kiln/c_runtime_api.h>
#include "kiln_crt_graph.h"
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* -- system library (docs/formats.md §8) */
/* names: little-endian u16 count, then each name NUL-terminated, then an extra NUL;
   funcs[i] is the function named by the i-th name. */
typedef struct {
  const char* names;
  const TVMBackendPackedCFunc* funcs;
} TVMFuncRegistry;

typedef struct {
  const TVMFuncRegistry* registry;
} TVMModule;

/* Defined by the generated registry (with a symbol prefix: <prefix>TVMSystemLibEntryPoint). */
const TVMModule* TVMSystemLibEntryPoint(void);

/* A function of a module: a pointer to its registry slot. */
typedef const TVMBackendPackedCFunc* TVMFunctionHandle;

/* Number of functions in the registry. */
uint16_t TVMFuncRegistry_NumFuncs(const TVMFuncRegistry* registry);
/* The function named `name` (*out = NULL and -1 when there is none). */
int TVMFuncRegistry_Lookup(const TVMFuncRegistry* registry, const char* name,
                           TVMFunctionHandle* out);
/* TVM's TVMModGetFunction for a system-library module. */
int TVMModGetFunction(const TVMModule* mod, const char* name, TVMFunctionHandle* out);
/* TVM's TVMFuncCall: call `func` with the packed ABI. */
int TVMFuncCall(TVMFunctionHandle func, TVMValue* args, int* type_codes, int num_args,
                TVMValue* ret_val, int* ret_type_code);

/* -- KilnGraphExecutor_Create over a system library: finds every kernel in `mod` (the rest of
   the graph executor's API, the arena and KilnGraphExecutor_Run are in kiln_crt_graph.h) */
int KilnGraphExecutor_Create(const char* json, size_t json_len, const TVMModule* mod,
                             KilnArena* arena, KilnGraphExecutor** out);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CRT_H_ */
