/*
 * Internals of libkiln_runtime: the module and function objects behind the C API handles
 * (TVM's ModuleNode / PackedFunc, include/tvm/runtime/module.h and packed_func.h), the stream
 * reader of the blob formats (dmlc-core's serializer.h; docs/formats.md §1), and the
 * module loaders by type_key (runtime.module.loadbinary_<type_key>).
 */
#ifndef KILN_RT_INTERNAL_H_
#define KILN_RT_INTERNAL_H_

#include <kiln/runtime.h>
#include <stddef.h>
#include <stdint.h>

#define KILN_EXPORT __attribute__((visibility("default")))

typedef struct KilnModule KilnModule;
typedef struct KilnFunc KilnFunc;

/* A module's own method: `self` is the module the function was found in. */
typedef int (*KilnMethod)(KilnModule* self, TVMValue* args, int* codes, int num_args,
                          TVMValue* ret, int* ret_code);

struct KilnModule {
  int refs;
  const char* type_key;
  KilnModule** imports;
  int num_imports;
  int cap_imports;
  /* *out = a new function, or NULL when the module has none of that name; -1 on error. */
  int (*get_own)(KilnModule* self, const char* name, KilnFunc** out);
  void (*destroy)(KilnModule* self); /* frees what the module holds, not the struct */
  /* optional: writes into buf what to tell a caller who asked for a function the module lacks
     (the roots of libraries: which executor they are for and how to run it) */
  void (*missing_hint)(KilnModule* self, char* buf, size_t size);
};

struct KilnFunc {
  int refs;
  KilnModule* owner; /* a reference, or NULL */
  /* one of: a C packed function (a kernel, or an application's function) ... */
  TVMBackendPackedCFunc cfunc;
  void* resource;
  TVMPackedCFuncFinalizer fin;
  /* ... a method of `owner` */
  KilnMethod method;
  /* the library's own TVMGetLastError, read after a failed kernel (may be NULL) */
  const char* (*lib_error)(void);
  const char* name;
};

/* -- core (rt_core.c) */
int kiln_fail(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
void* kiln_calloc(size_t count, size_t size); /* sets the error when it fails */
char* kiln_strndup(const char* s, size_t n);
/* 64-byte-aligned memory (free() it); sets the error when it fails. */
void* kiln_aligned_alloc(size_t nbytes);
/* Whether a tensor's strides (NULL, or compact ones) make it C-contiguous. */
int kiln_is_compact(const DLTensor* t);
/* A module struct of `size` bytes (>= sizeof(KilnModule)), zeroed, with one reference. */
KilnModule* kiln_module_new(size_t size, const char* type_key);
void kiln_module_retain(KilnModule* m);
void kiln_module_release(KilnModule* m);
/* Append an import (takes a reference of `dep`); no cycle check. */
int kiln_module_add_import(KilnModule* m, KilnModule* dep);
int kiln_module_get_function(KilnModule* m, const char* name, int query_imports, KilnFunc** out);
/* get_lib: the module's first import (its library), a new reference as kTVMModuleHandle. */
int kiln_return_library(KilnModule* self, TVMValue* ret, int* ret_code, const char* owner);
KilnFunc* kiln_func_method(KilnModule* owner, const char* name, KilnMethod method);
void kiln_func_release(KilnFunc* f);
int kiln_func_call(KilnFunc* f, TVMValue* args, int* codes, int num_args, TVMValue* ret,
                   int* ret_code);
/* Kernel trampoline: resource = KilnFunc* (for the graph executor's prebuilt calls). */
int kiln_func_trampoline(TVMValue* args, int* codes, int num_args, TVMValue* ret, int* ret_code,
                         void* resource);
/* A thread-local string returned as kTVMStr. */
const char* kiln_return_string(const char* s, size_t n);
/* Copy a failed kernel's message from its library's buffer into the runtime's. */
void kiln_take_lib_error(const char* (*lib_error)(void), const char* what);

/* -- stream reader (rt_blob.c) */
typedef struct {
  const uint8_t* p;
  size_t left;
  const char* what; /* names the data in errors */
} KilnStream;

int kiln_read_u64(KilnStream* s, uint64_t* out, const char* field);
int kiln_read_u32(KilnStream* s, uint32_t* out, const char* field);
/* A length-prefixed byte string, borrowed from the stream. */
int kiln_read_bytes(KilnStream* s, const uint8_t** data, size_t* n, const char* field);
/* A count of items of at least `item_size` bytes each, checked against the remaining bytes. */
int kiln_read_count(KilnStream* s, size_t item_size, uint64_t* out, const char* field);
int kiln_skip(KilnStream* s, size_t n, const char* field);

/* One NDArray of the params format (docs/formats.md §5), borrowed from the stream. */
typedef struct {
  DLDataType dtype;
  int32_t ndim;
  int64_t shape[32];
  const uint8_t* data;
  uint64_t nbytes;
} KilnArrayView;
int kiln_read_ndarray(KilnStream* s, KilnArrayView* out, const char* field);
/* A vec<string> of NUL-free, distinct names (malloc'd; the array has count + 1 slots). */
int kiln_read_names(KilnStream* s, char*** out, size_t* count, const char* field);

/* -- loaders by type_key (rt_blob.c: a table of the built-in ones) */
typedef int (*KilnModuleLoader)(const uint8_t* data, size_t n, KilnModule** out);
int kiln_load_graph_factory(const uint8_t* data, size_t n, KilnModule** out);  /* rt_graph.c */
int kiln_load_const_loader(const uint8_t* data, size_t n, KilnModule** out);   /* rt_const_loader.c */
int kiln_load_jit(const uint8_t* data, size_t n, KilnModule** out);            /* rt_jit.c */
int kiln_load_vm_executable(const uint8_t* data, size_t n, KilnModule** out);  /* rt_vm_exec.c */
int kiln_load_json(const uint8_t* data, size_t n, KilnModule** out);           /* rt_json.c */
int kiln_unpack_imports(const uint8_t* payload, size_t n, KilnModule* lib, KilnModule** out);

/* -- library module (rt_library.c) */
/* Refuse a library whose __kiln_target_info lists CPU features this CPU lacks (0, or -1 with
   the error set: "<path> needs avx512fp16; this CPU has ..."); no record: 0. rt_blob.c. */
int kiln_check_target_info(const char* path);
int kiln_library_open(const char* path, KilnModule** out, const uint8_t** blob, size_t* blob_n);

#endif /* KILN_RT_INTERNAL_H_ */
