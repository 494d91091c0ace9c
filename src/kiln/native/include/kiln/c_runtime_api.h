/*
 * Kiln's C ABI: DLPack tensors, the packed-function calling convention and the backend callbacks
 * that generated kernels use. Follows Apache TVM's include/tvm/runtime/c_runtime_api.h,
 * c_backend_api.h and DLPack's dlpack.h (see docs/formats.md §3).
 * Every exported library carries its own implementation of the backend callbacks
 * (kiln/runtime/support/backend.c), so an artifact needs no runtime library.
 */
#ifndef KILN_C_RUNTIME_API_H_
#define KILN_C_RUNTIME_API_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef enum { kDLCPU = 1, kDLCUDA = 2, kDLExtDev = 12 } DLDeviceType;
typedef enum { kDLInt = 0, kDLUInt = 1, kDLFloat = 2, kDLBfloat = 4 } DLDataTypeCode;

typedef struct { int32_t device_type; int32_t device_id; } DLDevice;
typedef struct { uint8_t code; uint8_t bits; uint16_t lanes; } DLDataType;
typedef struct {
  void* data;
  DLDevice device;
  int32_t ndim;
  DLDataType dtype;
  int64_t* shape;
  int64_t* strides;
  uint64_t byte_offset;
} DLTensor;

typedef union {
  int64_t v_int64;
  double v_float64;
  void* v_handle;
  const char* v_str;
  DLDataType v_type;
  DLDevice v_device;
} TVMValue;

typedef enum {
  kTVMArgInt = 0, kTVMArgFloat = 2, kTVMOpaqueHandle = 3, kTVMNullptr = 4, kTVMDataType = 5,
  kDLDeviceArg = 6, kTVMDLTensorHandle = 7, kTVMObjectHandle = 8, kTVMModuleHandle = 9,
  kTVMPackedFuncHandle = 10, kTVMStr = 11, kTVMBytes = 12, kTVMNDArrayHandle = 13
} TVMArgTypeCode;

typedef int (*TVMBackendPackedCFunc)(TVMValue* args, int* type_codes, int num_args,
                                     TVMValue* out_ret_value, int* out_ret_tcode,
                                     void* resource_handle);

/* Parallel launch (TVM's c_backend_api.h): the lambda runs once per task with task_id in
   [0, penv->num_task); it returns 0, or -1 after TVMAPISetLastError. */
typedef struct {
  void* sync_handle;
  int32_t num_task;
} TVMParallelGroupEnv;
typedef int (*FTVMParallelLambda)(int task_id, TVMParallelGroupEnv* penv, void* cdata);

/* Backend callbacks (implemented by the library's own support code). */
void* TVMBackendAllocWorkspace(int device_type, int device_id, uint64_t nbytes,
                               int dtype_code_hint, int dtype_bits_hint);
int TVMBackendFreeWorkspace(int device_type, int device_id, void* ptr);
void TVMAPISetLastError(const char* msg);
int TVMBackendParallelLaunch(FTVMParallelLambda flambda, void* cdata, int num_task);
int TVMBackendParallelBarrier(int task_id, TVMParallelGroupEnv* penv);
const char* TVMGetLastError(void);

#ifdef __cplusplus
}
#endif
#endif /* KILN_C_RUNTIME_API_H_ */
