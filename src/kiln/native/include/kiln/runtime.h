/*
 * libkiln_runtime: load a library exported by Kiln (model.so) from C, without Python, and run
 * it. TVM's C API names and conventions (include/tvm/runtime/c_runtime_api.h): every function
 * returns 0 on success, or -1 with the message in TVMGetLastError() (thread-local).
 *
 * Handles: TVMModuleHandle and TVMFunctionHandle are reference-counted; what a call returns
 * (TVMModLoadFromFile, TVMModGetFunction, a function returning a module, TVMFuncGetGlobal) is
 * the caller's to free with TVMModFree / TVMFuncFree. A function keeps its module alive.
 *
 * Values returned by TVMFuncCall: kTVMModuleHandle (owned: TVMModFree it), kTVMStr (valid until
 * the next call on this thread), kTVMDLTensorHandle (borrowed: valid while the module that
 * returned it lives and until its next call that changes it), kTVMArgInt, kTVMNullptr.
 *
 * Kiln's file formats: docs/formats.md; this runtime's design:
 * docs/decisions/022-native-runtime.md.
 */
#ifndef KILN_RUNTIME_H_
#define KILN_RUNTIME_H_

#include <kiln/c_runtime_api.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef void* TVMModuleHandle;
typedef void* TVMFunctionHandle;
typedef DLTensor* TVMArrayHandle;

/* kTVMBytes arguments point at one of these (TVM's TVMByteArray). */
typedef struct {
  const char* data;
  size_t size;
} TVMByteArray;

/* A function implemented in C by the application (TVMFuncCreateFromCFunc's, with the kernel
   ABI's return convention instead of TVM's TVMRetValueHandle): set *ret / *ret_code to return
   a value; return 0, or -1 after TVMAPISetLastError. */
typedef TVMBackendPackedCFunc TVMPackedCFunc;
typedef void (*TVMPackedCFuncFinalizer)(void* resource_handle);

/* -- errors */
const char* TVMGetLastError(void);
void TVMAPISetLastError(const char* msg);

/* -- modules (src/runtime/c_runtime_api.cc, library_module.cc) */
/* Load an exported shared library and rebuild its module tree; *out is the root (module 0 of
   the blob: usually the GraphExecutorFactory). `format` is ignored (read from the content). */
int TVMModLoadFromFile(const char* file_name, const char* format, TVMModuleHandle* out);
/* *out = the function `func_name` of `mod` (and its imports when query_imports), or NULL when
   there is none (not an error, as in TVM: it returns 0); TVMGetLastError() then says why, and
   for a VM library asked for "default" (a graph library asked for "vm_load_executable") how
   to run the library instead. */
int TVMModGetFunction(TVMModuleHandle mod, const char* func_name, int query_imports,
                      TVMFunctionHandle* out);
/* `mod` imports `dep` (takes a reference). Refuses a cycle. */
int TVMModImport(TVMModuleHandle mod, TVMModuleHandle dep);
int TVMModFree(TVMModuleHandle mod);
/* The module's type_key ("library", "GraphExecutorFactory", "GraphExecutor", ...). */
const char* KilnModTypeKey(TVMModuleHandle mod);

/* -- functions */
int TVMFuncCall(TVMFunctionHandle func, TVMValue* args, int* type_codes, int num_args,
                TVMValue* ret_val, int* ret_type_code);
int TVMFuncFree(TVMFunctionHandle func);
int TVMFuncCreateFromCFunc(TVMPackedCFunc func, void* resource_handle,
                           TVMPackedCFuncFinalizer fin, TVMFunctionHandle* out);
/* Global registry (takes a reference); refuses an existing name unless `override`. */
int TVMFuncRegisterGlobal(const char* name, TVMFunctionHandle f, int override);
/* *out = the global function `name` (a new reference), or NULL when there is none. */
int TVMFuncGetGlobal(const char* name, TVMFunctionHandle* out);

/* -- arrays (CPU, 64-byte aligned, C-contiguous) */
int TVMArrayAlloc(const int64_t* shape, int ndim, int dtype_code, int dtype_bits,
                  int dtype_lanes, int device_type, int device_id, TVMArrayHandle* out);
int TVMArrayFree(TVMArrayHandle handle);
int TVMArrayCopyFromBytes(TVMArrayHandle handle, void* data, size_t nbytes);
int TVMArrayCopyToBytes(TVMArrayHandle handle, void* data, size_t nbytes);

/* -- Kiln extras */
/* Load a blob payload (the bytes after __tvm_dev_mblob's u64 length) with `lib` as _lib (may
   be NULL): the loader's parsing without dlopen, for tests and fuzzing. */
int KilnModLoadFromBlob(const void* payload, size_t nbytes, TVMModuleHandle lib,
                        TVMModuleHandle* out);
/* Bytes of a tensor's data. */
size_t KilnArrayNumBytes(const DLTensor* t);

/* -- the VM (decision 014 / 022): exe = TVMModLoadFromFile(...) (type_key relax.VMExecutable);
   vm = exe["vm_load_executable"](); vm["vm_initialization"](1, 0, 2) (kDLCPU, 0, pooled);
   vm["main"](tensors...). A VM function returns copies of its results, owned by the VM and
   valid until its next call: one tensor as kTVMDLTensorHandle, a tuple as kTVMObjectHandle
   (a KilnTuple), an integer as kTVMArgInt. Also get_function_arity(name),
   get_function_param_name(name, i), get_function_param_dtype(name, i) (kTVMDataType),
   get_function_param_shape(name, i) (kTVMStr: dims joined by commas, each a size or its
   symbol's name, "1,seq,384"; inputs that share a symbol share its value). */
/* Items of a KilnTuple (-1 for NULL). */
int KilnTupleSize(void* tuple);
/* Item `index` (a tensor, a nested tuple or an integer, with its type code). */
int KilnTupleGetItem(void* tuple, int index, TVMValue* out, int* type_code);

#ifdef __cplusplus
}
#endif
#endif /* KILN_RUNTIME_H_ */
