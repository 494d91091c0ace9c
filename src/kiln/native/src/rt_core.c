/*
 * The core of libkiln_runtime: the error buffer, reference-counted modules and functions, the
 * global function registry and the array functions of the C API. Follows TVM's
 * src/runtime/c_runtime_api.cc (TVMGetLastError, TVMFuncCall, TVMModGetFunction, TVMModImport,
 * TVMFuncRegisterGlobal, TVMArrayAlloc...) and src/runtime/module.cc (GetFunction: own
 * functions first, then the imports depth-first).
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "rt_internal.h"

#define KILN_ERROR_SIZE 4096
#define KILN_ALIGN 64
#define KILN_MAX_NDIM 32

static __thread char kiln_error[KILN_ERROR_SIZE];
static __thread char* kiln_ret_str;

KILN_EXPORT const char* TVMGetLastError(void) { return kiln_error; }

KILN_EXPORT void TVMAPISetLastError(const char* msg) {
  snprintf(kiln_error, sizeof(kiln_error), "%s", msg ? msg : "");
}

int kiln_fail(const char* fmt, ...) {
  char msg[KILN_ERROR_SIZE]; /* the arguments may include TVMGetLastError()'s buffer */
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(msg, sizeof(msg), fmt, ap);
  va_end(ap);
  memcpy(kiln_error, msg, sizeof(msg));
  return -1;
}

void* kiln_calloc(size_t count, size_t size) {
  void* p = (count && size) ? calloc(count, size) : calloc(1, 1);
  if (p == NULL) kiln_fail("out of memory (%zu x %zu bytes)", count, size);
  return p;
}

void* kiln_aligned_alloc(size_t nbytes) {
  void* p = NULL;
  if (posix_memalign(&p, KILN_ALIGN, nbytes ? nbytes : KILN_ALIGN) != 0) {
    kiln_fail("out of memory (%zu bytes)", nbytes);
    return NULL;
  }
  return p;
}

int kiln_is_compact(const DLTensor* t) {
  int64_t step = 1;
  int d;
  if (t->strides == NULL) return 1;
  for (d = t->ndim - 1; d >= 0; --d) {
    if (t->shape[d] != 1 && t->strides[d] != step) return 0;
    step *= t->shape[d];
  }
  return 1;
}

char* kiln_strndup(const char* s, size_t n) {
  char* d = (char*)kiln_calloc(n + 1, 1);
  if (d != NULL) memcpy(d, s, n);
  return d;
}

const char* kiln_return_string(const char* s, size_t n) {
  free(kiln_ret_str);
  kiln_ret_str = kiln_strndup(s, n);
  return kiln_ret_str;
}

void kiln_take_lib_error(const char* (*lib_error)(void), const char* what) {
  char msg[KILN_ERROR_SIZE];
  const char* lib_msg = lib_error ? lib_error() : NULL;
  /* A library's TVMAPISetLastError may resolve to this runtime's (symbol interposition): then
     the message is in kiln_error already and the library's own buffer is empty. */
  snprintf(msg, sizeof(msg), "%s", (lib_msg && *lib_msg) ? lib_msg : kiln_error);
  kiln_fail("%s failed: %s", what, *msg ? msg : "(no message)");
}

/* -- modules */
KilnModule* kiln_module_new(size_t size, const char* type_key) {
  KilnModule* m = (KilnModule*)kiln_calloc(1, size);
  if (m == NULL) return NULL;
  m->refs = 1;
  m->type_key = type_key;
  return m;
}

void kiln_module_retain(KilnModule* m) { __atomic_add_fetch(&m->refs, 1, __ATOMIC_RELAXED); }

void kiln_module_release(KilnModule* m) {
  int i;
  if (m == NULL || __atomic_sub_fetch(&m->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (m->destroy) m->destroy(m);
  for (i = 0; i < m->num_imports; ++i) kiln_module_release(m->imports[i]);
  free(m->imports);
  free(m);
}

int kiln_module_add_import(KilnModule* m, KilnModule* dep) {
  if (m->num_imports == m->cap_imports) {
    int cap = m->cap_imports ? 2 * m->cap_imports : 4;
    KilnModule** grown = (KilnModule**)realloc(m->imports, (size_t)cap * sizeof(*grown));
    if (grown == NULL) return kiln_fail("out of memory");
    m->imports = grown;
    m->cap_imports = cap;
  }
  kiln_module_retain(dep);
  m->imports[m->num_imports++] = dep;
  return 0;
}

/* Depth-first over the imports, as TVM's ModuleNode::GetFunction(name, query_imports). The
   depth is bounded: trees are acyclic (checked where imports are linked). */
static int kiln_lookup(KilnModule* m, const char* name, int query_imports, int depth,
                       KilnFunc** out) {
  int i;
  if (depth > 256) return kiln_fail("module imports nested deeper than 256");
  if (m->get_own && m->get_own(m, name, out) != 0) return -1;
  if (*out != NULL || !query_imports) return 0;
  for (i = 0; i < m->num_imports; ++i) {
    if (kiln_lookup(m->imports[i], name, 1, depth + 1, out) != 0) return -1;
    if (*out != NULL) return 0;
  }
  return 0;
}

int kiln_module_get_function(KilnModule* m, const char* name, int query_imports, KilnFunc** out) {
  *out = NULL;
  return kiln_lookup(m, name, query_imports, 0, out);
}

int kiln_return_library(KilnModule* self, TVMValue* ret, int* ret_code, const char* owner) {
  if (self->num_imports == 0) return kiln_fail("%s has no library imported", owner);
  kiln_module_retain(self->imports[0]);
  ret->v_handle = self->imports[0];
  *ret_code = kTVMModuleHandle;
  return 0;
}

/* -- functions */
KilnFunc* kiln_func_method(KilnModule* owner, const char* name, KilnMethod method) {
  KilnFunc* f = (KilnFunc*)kiln_calloc(1, sizeof(KilnFunc));
  if (f == NULL) return NULL;
  f->refs = 1;
  f->owner = owner;
  f->method = method;
  f->name = name;
  if (owner) kiln_module_retain(owner);
  return f;
}

void kiln_func_release(KilnFunc* f) {
  if (f == NULL || __atomic_sub_fetch(&f->refs, 1, __ATOMIC_ACQ_REL) != 0) return;
  if (f->fin) f->fin(f->resource);
  kiln_module_release(f->owner);
  free(f);
}

int kiln_func_call(KilnFunc* f, TVMValue* args, int* codes, int num_args, TVMValue* ret,
                   int* ret_code) {
  *ret_code = kTVMNullptr;
  ret->v_handle = NULL;
  if (f->method) return f->method(f->owner, args, codes, num_args, ret, ret_code);
  if (f->cfunc(args, codes, num_args, ret, ret_code, f->resource) != 0) {
    kiln_take_lib_error(f->lib_error, f->name ? f->name : "packed function");
    return -1;
  }
  return 0;
}

int kiln_func_trampoline(TVMValue* args, int* codes, int num_args, TVMValue* ret, int* ret_code,
                         void* resource) {
  return kiln_func_call((KilnFunc*)resource, args, codes, num_args, ret, ret_code);
}

/* A miss is no error (TVM's contract: *out = NULL, return 0), but a caller that reports it
   finds why in TVMGetLastError(): a program written for graph libraries asks a VM library for
   "default" (or the reverse), and the module's hint says what to call instead. */
static void kiln_explain_missing(KilnModule* m, const char* name) {
  char hint[512] = "";
  if (m->missing_hint) m->missing_hint(m, hint, sizeof(hint));
  kiln_fail("module '%s' has no function '%s'%s%s", m->type_key, name, hint[0] ? ": " : "",
            hint);
}

/* -- the C API */
KILN_EXPORT int TVMModGetFunction(TVMModuleHandle mod, const char* func_name, int query_imports,
                                  TVMFunctionHandle* out) {
  KilnModule* m = (KilnModule*)mod;
  if (mod == NULL || func_name == NULL || out == NULL)
    return kiln_fail("TVMModGetFunction: null argument");
  if (kiln_module_get_function(m, func_name, query_imports, (KilnFunc**)out) != 0) return -1;
  if (*out == NULL) kiln_explain_missing(m, func_name);
  return 0;
}

static int kiln_reaches(KilnModule* from, KilnModule* target, int depth) {
  int i;
  if (from == target) return 1;
  if (depth > 256) return 1; /* treat as a cycle: refuse */
  for (i = 0; i < from->num_imports; ++i)
    if (kiln_reaches(from->imports[i], target, depth + 1)) return 1;
  return 0;
}

KILN_EXPORT int TVMModImport(TVMModuleHandle mod, TVMModuleHandle dep) {
  if (mod == NULL || dep == NULL) return kiln_fail("TVMModImport: null module");
  if (kiln_reaches((KilnModule*)dep, (KilnModule*)mod, 0))
    return kiln_fail("TVMModImport: importing '%s' into '%s' would make a cycle",
                     ((KilnModule*)dep)->type_key, ((KilnModule*)mod)->type_key);
  return kiln_module_add_import((KilnModule*)mod, (KilnModule*)dep);
}

KILN_EXPORT int TVMModFree(TVMModuleHandle mod) {
  kiln_module_release((KilnModule*)mod);
  return 0;
}

KILN_EXPORT const char* KilnModTypeKey(TVMModuleHandle mod) {
  return mod ? ((KilnModule*)mod)->type_key : NULL;
}

KILN_EXPORT int TVMFuncCall(TVMFunctionHandle func, TVMValue* args, int* type_codes,
                            int num_args, TVMValue* ret_val, int* ret_type_code) {
  if (func == NULL || ret_val == NULL || ret_type_code == NULL || (num_args && !args) ||
      (num_args && !type_codes) || num_args < 0)
    return kiln_fail("TVMFuncCall: null function or arguments");
  return kiln_func_call((KilnFunc*)func, args, type_codes, num_args, ret_val, ret_type_code);
}

KILN_EXPORT int TVMFuncFree(TVMFunctionHandle func) {
  kiln_func_release((KilnFunc*)func);
  return 0;
}

KILN_EXPORT int TVMFuncCreateFromCFunc(TVMPackedCFunc func, void* resource_handle,
                                       TVMPackedCFuncFinalizer fin, TVMFunctionHandle* out) {
  KilnFunc* f;
  if (func == NULL || out == NULL) return kiln_fail("TVMFuncCreateFromCFunc: null argument");
  if ((f = (KilnFunc*)kiln_calloc(1, sizeof(KilnFunc))) == NULL) return -1;
  f->refs = 1;
  f->cfunc = func;
  f->resource = resource_handle;
  f->fin = fin;
  f->name = "C function";
  *out = f;
  return 0;
}

/* -- global registry: a list under a lock */
typedef struct KilnGlobal {
  char* name;
  KilnFunc* func;
  struct KilnGlobal* next;
} KilnGlobal;
static KilnGlobal* kiln_globals;
static pthread_mutex_t kiln_globals_lock = PTHREAD_MUTEX_INITIALIZER;

KILN_EXPORT int TVMFuncRegisterGlobal(const char* name, TVMFunctionHandle f, int override) {
  KilnGlobal* g;
  int rc = 0;
  if (name == NULL || f == NULL) return kiln_fail("TVMFuncRegisterGlobal: null argument");
  pthread_mutex_lock(&kiln_globals_lock);
  for (g = kiln_globals; g != NULL && strcmp(g->name, name) != 0; g = g->next) {
  }
  if (g != NULL && !override) {
    rc = kiln_fail("TVMFuncRegisterGlobal: '%s' is already registered", name);
  } else if (g != NULL) {
    __atomic_add_fetch(&((KilnFunc*)f)->refs, 1, __ATOMIC_RELAXED);
    kiln_func_release(g->func);
    g->func = (KilnFunc*)f;
  } else if ((g = (KilnGlobal*)kiln_calloc(1, sizeof(*g))) == NULL ||
             (g->name = kiln_strndup(name, strlen(name))) == NULL) {
    free(g);
    rc = -1;
  } else {
    __atomic_add_fetch(&((KilnFunc*)f)->refs, 1, __ATOMIC_RELAXED);
    g->func = (KilnFunc*)f;
    g->next = kiln_globals;
    kiln_globals = g;
  }
  pthread_mutex_unlock(&kiln_globals_lock);
  return rc;
}

KILN_EXPORT int TVMFuncGetGlobal(const char* name, TVMFunctionHandle* out) {
  KilnGlobal* g;
  if (name == NULL || out == NULL) return kiln_fail("TVMFuncGetGlobal: null argument");
  *out = NULL;
  pthread_mutex_lock(&kiln_globals_lock);
  for (g = kiln_globals; g != NULL; g = g->next) {
    if (strcmp(g->name, name) == 0) {
      __atomic_add_fetch(&g->func->refs, 1, __ATOMIC_RELAXED);
      *out = g->func;
      break;
    }
  }
  pthread_mutex_unlock(&kiln_globals_lock);
  return 0;
}

/* -- arrays: one block holding the DLTensor and its shape; the data aligned apart */
typedef struct {
  DLTensor t;
  int64_t shape[KILN_MAX_NDIM];
} KilnArray;

KILN_EXPORT size_t KilnArrayNumBytes(const DLTensor* t) {
  size_t n = (size_t)((t->dtype.bits * t->dtype.lanes + 7) / 8);
  int i;
  for (i = 0; i < t->ndim; ++i) n *= (size_t)t->shape[i];
  return n;
}

KILN_EXPORT int TVMArrayAlloc(const int64_t* shape, int ndim, int dtype_code, int dtype_bits,
                              int dtype_lanes, int device_type, int device_id,
                              TVMArrayHandle* out) {
  KilnArray* a;
  size_t nbytes;
  int i;
  if (out == NULL || ndim < 0 || ndim > KILN_MAX_NDIM || (ndim && shape == NULL))
    return kiln_fail("TVMArrayAlloc: bad arguments (ndim %d)", ndim);
  if (device_type != kDLCPU) return kiln_fail("TVMArrayAlloc: only the CPU is supported");
  if (dtype_bits <= 0 || dtype_bits > 64 || dtype_lanes <= 0 || dtype_lanes > 65535)
    return kiln_fail("TVMArrayAlloc: bad dtype");
  nbytes = (size_t)((dtype_bits * dtype_lanes + 7) / 8);
  for (i = 0; i < ndim; ++i) {
    if (shape[i] < 0 || (shape[i] && nbytes > SIZE_MAX / 2 / (size_t)shape[i]))
      return kiln_fail("TVMArrayAlloc: bad or too large shape");
    nbytes *= (size_t)shape[i];
  }
  if ((a = (KilnArray*)kiln_calloc(1, sizeof(KilnArray))) == NULL) return -1;
  if (posix_memalign(&a->t.data, KILN_ALIGN, nbytes ? nbytes : KILN_ALIGN) != 0) {
    free(a);
    return kiln_fail("TVMArrayAlloc: out of memory (%zu bytes)", nbytes);
  }
  memcpy(a->shape, shape, (size_t)ndim * sizeof(int64_t));
  a->t.shape = a->shape;
  a->t.ndim = ndim;
  a->t.dtype.code = (uint8_t)dtype_code;
  a->t.dtype.bits = (uint8_t)dtype_bits;
  a->t.dtype.lanes = (uint16_t)dtype_lanes;
  a->t.device.device_type = device_type;
  a->t.device.device_id = device_id;
  *out = &a->t;
  return 0;
}

KILN_EXPORT int TVMArrayFree(TVMArrayHandle handle) {
  if (handle == NULL) return 0;
  free(handle->data);
  free((KilnArray*)handle); /* t is the first member */
  return 0;
}

KILN_EXPORT int TVMArrayCopyFromBytes(TVMArrayHandle handle, void* data, size_t nbytes) {
  if (handle == NULL || (nbytes && data == NULL)) return kiln_fail("TVMArrayCopyFromBytes: null");
  if (nbytes != KilnArrayNumBytes(handle))
    return kiln_fail("TVMArrayCopyFromBytes: %zu bytes given, the array holds %zu", nbytes,
                     KilnArrayNumBytes(handle));
  if (nbytes) memcpy((char*)handle->data + handle->byte_offset, data, nbytes);
  return 0;
}

KILN_EXPORT int TVMArrayCopyToBytes(TVMArrayHandle handle, void* data, size_t nbytes) {
  if (handle == NULL || (nbytes && data == NULL)) return kiln_fail("TVMArrayCopyToBytes: null");
  if (nbytes != KilnArrayNumBytes(handle))
    return kiln_fail("TVMArrayCopyToBytes: %zu bytes asked, the array holds %zu", nbytes,
                     KilnArrayNumBytes(handle));
  if (nbytes) memcpy(data, (const char*)handle->data + handle->byte_offset, nbytes);
  return 0;
}
