/*
 * The backend callbacks that generated kernels call (docs/formats.md §3.5; TVM's
 * include/tvm/runtime/c_backend_api.h and src/runtime/crt/common/crt_backend_api.c), for
 * programs without Python: the error string, workspaces from a caller-given stack, a serial
 * parallel launch (the arena: kiln_crt_arena.c). Used by the graph executor and by AOT code.
 * No allocation, no threads, no stdio.
 */
#include "kiln_crt.h"

#include <string.h>

#define KILN_CRT_ERROR_SIZE 512

static char kiln_crt_last_error[KILN_CRT_ERROR_SIZE];

void TVMAPISetLastError(const char* msg) {
  size_t n = 0;
  if (msg != NULL) {
    while (msg[n] != '\0' && n < KILN_CRT_ERROR_SIZE - 1) ++n;
    memcpy(kiln_crt_last_error, msg, n);
  }
  kiln_crt_last_error[n] = '\0';
}

const char* TVMGetLastError(void) { return kiln_crt_last_error; }

static size_t kiln_align_up(size_t n) {
  return (n + KILN_CRT_ALIGN - 1) & ~(size_t)(KILN_CRT_ALIGN - 1);
}

/* -- workspace stack: [header | data] blocks; the header keeps the previous top */
static uint8_t* kiln_ws_base = NULL;
static size_t kiln_ws_size = 0;
static size_t kiln_ws_top = 0;
static size_t kiln_ws_peak = 0;

void KilnWorkspace_Init(void* base, size_t size) {
  uintptr_t start = (uintptr_t)base;
  uintptr_t aligned = (start + KILN_CRT_ALIGN - 1) & ~(uintptr_t)(KILN_CRT_ALIGN - 1);
  size_t skip = (size_t)(aligned - start);
  kiln_ws_base = (uint8_t*)aligned;
  kiln_ws_size = size > skip ? size - skip : 0;
  kiln_ws_top = 0;
  kiln_ws_peak = 0;
}

size_t KilnWorkspace_Peak(void) { return kiln_ws_peak; }

void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                               int dtype_code_hint, int dtype_bits_hint) {
  (void)device_id;
  (void)dtype_code_hint;
  (void)dtype_bits_hint;
  if (device_type != kDLCPU) {
    TVMAPISetLastError("TVMBackendAllocWorkspace: only CPU workspaces are supported");
    return NULL;
  }
  size_t need = kiln_align_up((size_t)nbytes) + KILN_CRT_ALIGN;
  if ((uint64_t)(size_t)nbytes != nbytes || need < nbytes ||
      kiln_ws_size - kiln_ws_top < need) {
    TVMAPISetLastError("TVMBackendAllocWorkspace: the workspace is too small");
    return NULL;
  }
  uint8_t* block = kiln_ws_base + kiln_ws_top;
  memcpy(block, &kiln_ws_top, sizeof(kiln_ws_top));
  kiln_ws_top += need;
  if (kiln_ws_top > kiln_ws_peak) kiln_ws_peak = kiln_ws_top;
  return block + KILN_CRT_ALIGN;
}

int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type;
  (void)device_id;
  uint8_t* block = (uint8_t*)ptr - KILN_CRT_ALIGN;
  size_t prev;
  if (ptr == NULL || (uint8_t*)ptr < kiln_ws_base + KILN_CRT_ALIGN ||
      (uint8_t*)ptr > kiln_ws_base + kiln_ws_top) {
    TVMAPISetLastError("TVMBackendFreeWorkspace: not a workspace pointer");
    return -1;
  }
  memcpy(&prev, block, sizeof(prev));
  if (kiln_ws_base + prev != block) {
    TVMAPISetLastError("TVMBackendFreeWorkspace: workspaces must be freed in reverse order");
    return -1;
  }
  kiln_ws_top = prev;
  return 0;
}

/* Serial: the lambda splits the work by penv->num_task, here 1 (TVM's CRT does the same). */
int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
  TVMParallelGroupEnv env;
  (void)num_task;
  env.sync_handle = NULL;
  env.num_task = 1;
  return flambda(0, &env, cdata);
}

int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  (void)penv;
  return 0;
}
