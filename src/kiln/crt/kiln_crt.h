/*
 * Kiln's C runtime (CRT): run a Kiln model from C without Python, dlopen or a heap.
 *
 * - The system library: generated code defines a TVMFuncRegistry and TVMSystemLibEntryPoint()
 *   (TVM's include/tvm/runtime/crt/func_registry.h; shared reference, section 8), so functions
 *   are found by name in a statically linked program, without dlsym.
 * - Packed calls: TVMModGetFunction / TVMFuncCall over that registry.
 * - The graph executor: reads the graph JSON and params blob that kiln.build writes (shared
 *   reference, sections 4 and 5) with its own small JSON reader.
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
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* -- system library (shared reference, section 8) */
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

/* -- arena: a bump allocator over caller memory (KILN_CRT_ALIGN-aligned blocks) */
#define KILN_CRT_ALIGN 64
typedef struct {
  uint8_t* base;
  size_t size;
  size_t used;
} KilnArena;

/* Use `size` bytes at `base` (any alignment) for allocations. */
void KilnArena_Init(KilnArena* arena, void* base, size_t size);
/* `nbytes` bytes aligned to KILN_CRT_ALIGN, or NULL (with the error set) when full. */
void* KilnArena_Alloc(KilnArena* arena, size_t nbytes);

/* -- the workspace stack behind TVMBackendAllocWorkspace (kiln_crt_backend.c) */
/* Each workspace takes a KILN_CRT_ALIGN header plus its size rounded up to KILN_CRT_ALIGN;
   frees must come in reverse order of allocations (as generated kernels do). */
void KilnWorkspace_Init(void* base, size_t size);
/* The largest number of bytes in use since KilnWorkspace_Init. */
size_t KilnWorkspace_Peak(void);

/* -- graph executor (TVM's GraphExecutor, src/runtime/crt/graph_executor) */
typedef struct KilnGraphExecutor KilnGraphExecutor;

/* Parse `json` (json_len bytes, need not be NUL-terminated), find every kernel in `mod`,
   allocate tables and storage from `arena`. */
int KilnGraphExecutor_Create(const char* json, size_t json_len, const TVMModule* mod,
                             KilnArena* arena, KilnGraphExecutor** out);
/* Copy the params in a params blob (shared reference, section 5) into their storage. */
int KilnGraphExecutor_LoadParams(KilnGraphExecutor* ge, const void* blob, size_t nbytes);
int KilnGraphExecutor_NumInputs(const KilnGraphExecutor* ge);
int KilnGraphExecutor_NumOutputs(const KilnGraphExecutor* ge);
/* Index of the graph input (not param) `name` among KilnGraphExecutor_GetInput's, or -1. */
int KilnGraphExecutor_GetInputIndex(const KilnGraphExecutor* ge, const char* name);
/* The tensor of input `index` (write its data in place) or NULL. */
DLTensor* KilnGraphExecutor_GetInput(KilnGraphExecutor* ge, int index);
/* Copy nbytes of `data` into the input `name` (nbytes must equal its size). */
int KilnGraphExecutor_SetInput(KilnGraphExecutor* ge, const char* name, const void* data,
                               size_t nbytes);
/* Run every kernel once; the arena's unused bytes are the kernels' workspace. */
int KilnGraphExecutor_Run(KilnGraphExecutor* ge);
/* The tensor of output `index`, or NULL. */
const DLTensor* KilnGraphExecutor_GetOutput(const KilnGraphExecutor* ge, int index);

/* Bytes of a tensor's data (product of the shape times the element size). */
size_t KilnTensor_NumBytes(const DLTensor* t);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CRT_H_ */
