/*
 * The graph executor and the arena it lives in, shared by the C runtime (CRT, system library:
 * kiln_crt.h) and the native runtime (libkiln_runtime, dlopen'ed libraries: kiln/native/).
 * The executor finds its kernels through a lookup callback, so it depends on neither runtime's
 * module system. TVM's src/runtime/crt/graph_executor/graph_executor.c; docs/formats.md
 * sections 4 (graph JSON) and 5 (params blob). C99; functions return 0, or -1 with the message
 * in TVMGetLastError().
 */
#ifndef KILN_CRT_GRAPH_H_
#define KILN_CRT_GRAPH_H_

#include <kiln/c_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* -- arena: a bump allocator over caller memory (KILN_CRT_ALIGN-aligned blocks) */
#define KILN_CRT_ALIGN 64
typedef struct {
  uint8_t* base;
  size_t size;
  size_t used;
  /* after a failed KilnArena_Alloc: the bytes that allocation needed in all (a lower bound of
     the size a retry needs; 0 when no allocation failed) */
  size_t needed;
} KilnArena;

/* Use `size` bytes at `base` (any alignment) for allocations. */
void KilnArena_Init(KilnArena* arena, void* base, size_t size);
/* `nbytes` bytes aligned to KILN_CRT_ALIGN, or NULL (with the error set) when full. */
void* KilnArena_Alloc(KilnArena* arena, size_t nbytes);

/* -- the workspace stack behind the CRT's TVMBackendAllocWorkspace (kiln_crt_backend.c) */
/* Each workspace takes a KILN_CRT_ALIGN header plus its size rounded up to KILN_CRT_ALIGN;
   frees must come in reverse order of allocations (as generated kernels do). */
void KilnWorkspace_Init(void* base, size_t size);
/* The largest number of bytes in use since KilnWorkspace_Init. */
size_t KilnWorkspace_Peak(void);

/* -- graph executor (TVM's GraphExecutor) */
typedef struct KilnGraphExecutor KilnGraphExecutor;

/* Finds the kernel `name`: sets *func (and *resource, passed as the call's resource_handle) and
   returns 0, or returns -1 with the error set. */
typedef int (*KilnGraphLookup)(void* ctx, const char* name, TVMBackendPackedCFunc* func,
                               void** resource);

/* Parse `json` (json_len bytes, need not be NUL-terminated), find every kernel with `lookup`,
   allocate tables and storage from `arena`. */
int KilnGraphExecutor_CreateWithLookup(const char* json, size_t json_len, KilnGraphLookup lookup,
                                       void* lookup_ctx, KilnArena* arena,
                                       KilnGraphExecutor** out);
/* Copy the params in a params blob (docs/formats.md §5) into their storage. */
int KilnGraphExecutor_LoadParams(KilnGraphExecutor* ge, const void* blob, size_t nbytes);
/* Graph inputs here are all arg_nodes, params included, in arg_nodes order. */
int KilnGraphExecutor_NumInputs(const KilnGraphExecutor* ge);
int KilnGraphExecutor_NumOutputs(const KilnGraphExecutor* ge);
/* Index of the arg node `name` among KilnGraphExecutor_GetInput's, or -1. */
int KilnGraphExecutor_GetInputIndex(const KilnGraphExecutor* ge, const char* name);
/* The name of input `index`, or NULL. */
const char* KilnGraphExecutor_GetInputName(const KilnGraphExecutor* ge, int index);
/* The tensor of input `index` (write its data in place) or NULL. */
DLTensor* KilnGraphExecutor_GetInput(KilnGraphExecutor* ge, int index);
/* Copy nbytes of `data` into the input `name` (nbytes must equal its size). */
int KilnGraphExecutor_SetInput(KilnGraphExecutor* ge, const char* name, const void* data,
                               size_t nbytes);
/* Run every kernel once (CRT: the arena's unused bytes are the kernels' workspace). */
int KilnGraphExecutor_Run(KilnGraphExecutor* ge);
/* Run every kernel once; the kernels allocate their workspaces themselves. */
int KilnGraphExecutor_RunOps(KilnGraphExecutor* ge);
/* The tensor of output `index`, or NULL. */
const DLTensor* KilnGraphExecutor_GetOutput(const KilnGraphExecutor* ge, int index);
/* Every entry's tensor (*count of them): ops hold pointers to these structs, so re-pointing an
   entry's data re-points every kernel that reads or writes it (zero-copy binding). */
DLTensor* KilnGraphExecutor_Entries(KilnGraphExecutor* ge, int* count);
/* The arena the executor was created in. */
KilnArena* KilnGraphExecutor_Arena(KilnGraphExecutor* ge);

/* Bytes of a tensor's data (product of the shape times the element size). */
size_t KilnTensor_NumBytes(const DLTensor* t);

#ifdef __cplusplus
}
#endif
#endif /* KILN_CRT_GRAPH_H_ */
