/*
 * Kiln backend support, compiled into every exported library so an artifact needs no runtime
 * library: the packed-function error buffer, the workspace allocator and thread setup.
 * Follows TVM's src/runtime/c_runtime_api.cc (TVMAPISetLastError) and
 * include/tvm/runtime/c_backend_api.h (TVMBackendAllocWorkspace); see the shared reference,
 * runtime-formats.md, section 3.
 */
#include <kiln/c_runtime_api.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#define KILN_EXPORT __attribute__((visibility("default")))
#define KILN_WORKSPACE_ALIGN 64
#define KILN_ERROR_SIZE 2048

/* Thread-local, like TVM's: a kernel failing on one thread never clobbers another's message. */
static __thread char kiln_last_error[KILN_ERROR_SIZE];

KILN_EXPORT void TVMAPISetLastError(const char* msg) {
  if (msg == NULL) {
    kiln_last_error[0] = '\0';
    return;
  }
  strncpy(kiln_last_error, msg, KILN_ERROR_SIZE - 1);
  kiln_last_error[KILN_ERROR_SIZE - 1] = '\0';
}

KILN_EXPORT const char* TVMGetLastError(void) { return kiln_last_error; }

KILN_EXPORT void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                                           int dtype_code_hint, int dtype_bits_hint) {
  (void)device_id;
  (void)dtype_code_hint;
  (void)dtype_bits_hint;
  if (device_type != kDLCPU) {
    TVMAPISetLastError("TVMBackendAllocWorkspace: only CPU workspaces are supported");
    return NULL;
  }
  /* aligned_alloc needs a size that is a multiple of the alignment (C11 7.22.3.1). */
  uint64_t size = (nbytes + KILN_WORKSPACE_ALIGN - 1) & ~(uint64_t)(KILN_WORKSPACE_ALIGN - 1);
  if (size == 0) size = KILN_WORKSPACE_ALIGN;
  void* ptr = aligned_alloc(KILN_WORKSPACE_ALIGN, (size_t)size);
  if (ptr == NULL) TVMAPISetLastError("TVMBackendAllocWorkspace: out of memory");
  return ptr;
}

KILN_EXPORT int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type;
  (void)device_id;
  free(ptr);
  return 0;
}

/* KILN_NUM_THREADS caps the OpenMP team of this library's kernels (like TVM_NUM_THREADS). */
__attribute__((constructor)) static void kiln_init_threads(void) {
#ifdef _OPENMP
  const char* env = getenv("KILN_NUM_THREADS");
  if (env != NULL && *env != '\0') {
    char* end = NULL;
    long n = strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n < 65536) omp_set_num_threads((int)n);
  }
#endif
}
