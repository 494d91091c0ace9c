/*
 * Kiln backend support, compiled into every exported library so an artifact needs no runtime
 * library: the packed-function error buffer, the workspace allocator, the graph executor's
 * batched call loop, the parallel launch used by LLVM-generated kernels and thread setup.
 * Follows TVM's src/runtime/c_runtime_api.cc (TVMAPISetLastError),
 * include/tvm/runtime/c_backend_api.h (TVMBackendAllocWorkspace, TVMBackendParallelLaunch) and
 * src/runtime/thread_pool.cc; see the shared reference, runtime-formats.md, section 3.
 */
#include <kiln/c_runtime_api.h>
#include <stdint.h>
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
  /* posix_memalign (POSIX.1-2001), not C11's aligned_alloc: the support code is compiled as
   * gnu99, where <stdlib.h> does not declare aligned_alloc (an implicit declaration is an error
   * in GCC 14 and Clang 16). Sizes are rounded up to whole alignment units. */
  void* ptr = NULL;
  if (nbytes <= (uint64_t)SIZE_MAX - KILN_WORKSPACE_ALIGN) {
    size_t size = ((size_t)nbytes + KILN_WORKSPACE_ALIGN - 1) &
                  ~(size_t)(KILN_WORKSPACE_ALIGN - 1);
    if (size == 0) size = KILN_WORKSPACE_ALIGN;
    if (posix_memalign(&ptr, KILN_WORKSPACE_ALIGN, size) != 0) ptr = NULL;
  }
  if (ptr == NULL) TVMAPISetLastError("TVMBackendAllocWorkspace: out of memory");
  return ptr;
}

KILN_EXPORT int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr) {
  (void)device_type;
  (void)device_id;
  free(ptr);
  return 0;
}

/* One prepared packed call of the graph executor (kiln/runtime/call_batch.py mirrors it). */
typedef struct {
  TVMBackendPackedCFunc func;
  TVMValue* args;
  int* type_codes;
  int64_t num_args;
} KilnPackedCall;

/* Run calls[0..count) in order, stopping at the first failure: returns 0, or the failing
 * call's status with *failed set to its index (its message is in its own library's buffer).
 * One call from Python per run instead of one per kernel (~1 us each through ctypes). */
KILN_EXPORT int KilnRunPackedCalls(const KilnPackedCall* calls, int64_t count, int64_t* failed) {
  TVMValue ret;
  int ret_code;
  for (int64_t i = 0; i < count; ++i) {
    int rc = calls[i].func(calls[i].args, calls[i].type_codes, (int)calls[i].num_args, &ret,
                           &ret_code, NULL);
    if (rc != 0) {
      *failed = i;
      return rc;
    }
  }
  return 0;
}

/* Packed function: copy the bytes of tensor args[0] into tensor args[1] (same size). The VM's
 * replay writes a decoder's new key/value rows behind its cache with it, inside a batch of
 * KilnRunPackedCalls (kiln/runtime/vm_replay.py). */
KILN_EXPORT int KilnCopyTensor(TVMValue* args, int* type_codes, int num_args, TVMValue* ret,
                               int* ret_code, void* resource) {
  (void)ret;
  (void)ret_code;
  (void)resource;
  if (num_args != 2 || type_codes[0] != kTVMDLTensorHandle ||
      type_codes[1] != kTVMDLTensorHandle) {
    TVMAPISetLastError("KilnCopyTensor: expects two tensors");
    return -1;
  }
  const DLTensor* src = (const DLTensor*)args[0].v_handle;
  DLTensor* dst = (DLTensor*)args[1].v_handle;
  uint64_t n = (uint64_t)(src->dtype.bits * src->dtype.lanes + 7) / 8;
  for (int i = 0; i < src->ndim; ++i) n *= (uint64_t)src->shape[i];
  if (n) memcpy(dst->data, src->data, n);
  return 0;
}

/* KILN_NUM_THREADS (0: unset), read once at load time. */
static int kiln_num_threads = 0;

/*
 * Run flambda(task_id, penv, cdata) for task_id in [0, num_task) on the persistent OpenMP
 * (libgomp) team; num_task <= 0 means one task per thread. The team is capped by
 * KILN_NUM_THREADS. Called from inside a parallel region it runs one task serially. If a task
 * fails, the first failing task's message becomes the caller's error and -1 is returned.
 */
KILN_EXPORT int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task) {
#ifdef _OPENMP
  int max_task = kiln_num_threads > 0 ? kiln_num_threads : omp_get_max_threads();
  if (num_task <= 0 || num_task > max_task) num_task = max_task;
  if (num_task > 1 && !omp_in_parallel()) {
    int failed = 0;
    char message[KILN_ERROR_SIZE];
#pragma omp parallel num_threads(num_task)
    {
      /* The runtime may give fewer threads than asked: tasks are numbered by the real team. */
      TVMParallelGroupEnv env = {NULL, omp_get_num_threads()};
      if (flambda(omp_get_thread_num(), &env, cdata) != 0) {
#pragma omp critical(kiln_parallel_error)
        {
          if (!failed) {
            failed = 1;
            memcpy(message, kiln_last_error, KILN_ERROR_SIZE);
          }
        }
      }
    }
    if (failed) {
      TVMAPISetLastError(message); /* the error buffer is per thread: copy it to the caller's */
      return -1;
    }
    return 0;
  }
#endif
  TVMParallelGroupEnv env = {NULL, 1};
  return flambda(0, &env, cdata);
}

/* Synchronize the tasks of one launch (an orphaned OpenMP barrier binds to the launch's team). */
KILN_EXPORT int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv) {
  (void)task_id;
  (void)penv;
#ifdef _OPENMP
#pragma omp barrier
#endif
  return 0;
}

/* KILN_NUM_THREADS caps the OpenMP team of this library's kernels (like TVM_NUM_THREADS): the
 * `omp parallel for` of C kernels through the loading thread's ICV, parallel launches of LLVM
 * kernels on any thread through kiln_num_threads. */
__attribute__((constructor)) static void kiln_init_threads(void) {
  const char* env = getenv("KILN_NUM_THREADS");
  if (env != NULL && *env != '\0') {
    char* end = NULL;
    long n = strtol(env, &end, 10);
    if (end != env && *end == '\0' && n > 0 && n < 65536) {
      kiln_num_threads = (int)n;
#ifdef _OPENMP
      omp_set_num_threads((int)n);
#endif
    }
  }
}
