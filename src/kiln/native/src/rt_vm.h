/*
 * The VM of libkiln_runtime: the executable (type_key relax.VMExecutable, decision 014's byte
 * format, rt_vm_exec.c), the builtins (rt_vm_builtins.c) and the VM module with its
 * interpreter (rt_vm.c). TVM's src/runtime/relax_vm/executable.cc, vm.cc and builtin.cc; Kiln's
 * kiln/runtime/vm/executable_format.py, vm_bytecode.py, vm_executable.py, vm.py and vm_builtins.py, whose
 * checks and messages these files mirror (the executable is untrusted input: decision 004).
 */
#ifndef KILN_RT_VM_H_
#define KILN_RT_VM_H_

#include <stddef.h>
#include <stdint.h>

#include "rt_internal.h"
/* opcodes, argument kinds, format numbers, type key, limits, builtin prefix: generated from the
   Python tables (make vocabulary), not typed here */
#include "rt_vocabulary.h"

#define KILN_VM_MAX_NDIM 32

typedef struct {
  char* name;
  int64_t lo, hi, divisor; /* hi -1: unbounded */
} KilnVMSymbol;

typedef struct {
  char* name;
  DLDataType dtype;
  int ndim;
  int64_t* dims; /* >= 0: the dim; < 0: symbol -1 - d */
} KilnVMSig;

typedef struct {
  int64_t value;
  int kind;
} KilnVMArg;

typedef struct {
  int op;
  int64_t pc;       /* word index of its first word */
  int64_t dst;      /* Call: destination (-1: none); Ret / If: the register read */
  int64_t func_idx; /* Call */
  int nargs;
  KilnVMArg* args; /* into the function's argument array */
  int64_t target;  /* Goto / If: the instruction index jumped to */
} KilnVMInstr;

typedef struct {
  int kind;
  char* name;
  int64_t start, end, num_regs, heap_size;
  KilnVMSig* params;
  size_t num_params;
  KilnVMSig* outputs;
  size_t num_outputs;
  KilnVMInstr* instrs; /* VM functions: decoded */
  size_t num_instrs;
  KilnVMArg* arg_words;
} KilnVMFunction;

typedef struct {
  int tag;
  DLTensor tensor; /* NDARRAY: owned, 64-byte aligned data */
  int64_t shape[KILN_VM_MAX_NDIM];
  int64_t* ints; /* INT_ARRAY */
  size_t num_ints;
  char* str; /* STRING */
  int64_t value; /* INT */
} KilnVMConst;

typedef struct {
  KilnModule base;
  KilnVMSymbol* symbols;
  size_t num_symbols;
  KilnVMFunction* funcs;
  size_t num_funcs;
  KilnVMConst* consts;
  size_t num_consts;
} KilnVMExec;

/* DLPack dtype of a name ("float32", "int64", "bool"...): 0, or -1 with the error set. */
int kiln_vm_dtype_from_name(const char* name, DLDataType* out);
/* Its name, or "an unsupported dtype". */
const char* kiln_vm_dtype_name(DLDataType t);

/* -- values held in registers */
enum { KV_NONE = 0, KV_INT, KV_TENSOR, KV_STORAGE, KV_TUPLE, KV_LIST };
typedef struct KilnVMList KilnVMList;
typedef struct KilnVMStorage KilnVMStorage;
typedef struct KilnVMTuple KilnVMTuple;
typedef struct KilnVMKVBuf KilnVMKVBuf;
typedef struct {
  int kind;
  union {
    int64_t i;
    DLTensor* t;
    KilnVMStorage* s;
    KilnVMTuple* tup;
    KilnVMList* list;
  } u;
} KilnVMValue;

struct KilnVMTuple {
  int n;
  KilnVMValue* items;
};

/* A scan output's accumulator (list_new): copies of its elements. It, its items and its
   arrays are blocks of the VM's per-call list (freed when the call ends). */
struct KilnVMList {
  size_t n, cap;
  DLTensor** items;
};

struct KilnVMStorage {
  int64_t fidx, level, sid;
  uint8_t* data; /* 64-byte aligned */
  int64_t nbytes;
};

/* -- builtins (rt_vm_builtins.c): prepared once per call site at vm_initialization */
typedef struct KilnVM KilnVM;
typedef struct KilnVMSite KilnVMSite;
typedef struct {
  KilnVM* vm;
  const KilnVMFunction* func;
  int64_t fidx;
  int64_t level; /* calls of this function already running (recursion) */
  KilnVMValue* regs;
  int64_t* heap;
} KilnVMFrame;
typedef int (*KilnVMBuiltinRun)(KilnVMSite* site, KilnVMFrame* fr, KilnVMValue* args,
                                KilnVMValue* out);

struct KilnVMSite {
  const KilnVMInstr* ins;
  const char* where_func; /* the calling function's name */
  KilnVMBuiltinRun run;  /* builtins */
  const char* builtin;   /* its name */
  KilnFunc* kernel;      /* kernels */
  TVMValue* kargs;       /* kernels: the prepared argument array */
  int* kcodes;
  KilnVMValue* vals; /* the resolved arguments */
  /* per-site state of builtins */
  DLTensor view;
  int64_t shape[KILN_VM_MAX_NDIM];
  KilnVMTuple tuple;
  const int64_t* spec; /* match_shape spec / shape program / slot list */
  size_t spec_n;
  int64_t param; /* match_shape: the parameter index */
  DLDataType dtype;
  int64_t storage_idx; /* alloc_storage: index into the VM's storages, -1 before */
  const char* text;    /* trap: the message */
  void* buf;           /* shape_to_tensor: the tensor's data (owned) */
  int fresh; /* in a function with a run-time loop, or called by VM functions: results are
                copied out of the site's view or tuple */
  int vmcall; /* a call of a VM function */
};

/* The VM module (rt_vm.c). */
struct KilnVM {
  KilnModule base;
  KilnVMExec* exe;
  int initialized;
  int running;
  int depth;      /* nested VM calls running */
  int64_t* active; /* per function: its calls running */
  KilnVMSite** sites; /* per function table entry: one per instruction (VM functions) */
  KilnFunc** kernels; /* per function table entry: the kernel (packed, not builtins) */
  KilnVMStorage** storages;
  size_t num_storages, cap_storages;
  void** retired; /* buffers replaced during a call, freed when it ends */
  size_t num_retired, cap_retired;
  int64_t mem_limit;
  /* inputs: per parameter, a view of the caller's tensor and an aligned staging buffer */
  DLTensor* in_views;
  int64_t (*in_shapes)[KILN_VM_MAX_NDIM];
  void** staging;
  size_t* staging_n;
  size_t max_params;
  /* the result of the last call: copies of its tensors, owned by the VM */
  KilnVMValue result;
  DLTensor** out_tensors;
  size_t num_out, cap_out;
  KilnVMTuple* out_tuples;
  size_t num_out_tuples, cap_out_tuples;
  /* kv_append's buffers (rt_vm_kv.c) and the views of them the last result returned */
  KilnVMKVBuf** kv;
  size_t num_kv, cap_kv;
  DLTensor** kv_views;
  size_t num_kv_views, cap_kv_views;
  uint64_t serial; /* calls from the C API so far */
  int64_t kv_copies, kv_appends;
};

/* Prepare builtin `name` at a call site (static checks): 0, or -1 with the error set (an
   unknown or unimplemented builtin is named). */
int kiln_vm_prepare_builtin(KilnVM* vm, const KilnVMExec* exe, const KilnVMFunction* func,
                            const char* name, KilnVMSite* site);
/* rt_vm_lists.c: bind_shape, list_new, list_append, list_stack; 1 when `b` is none of them. */
int kiln_vm_prepare_list_builtin(const KilnVMExec* e, const KilnVMFunction* f, const char* b,
                                 KilnVMSite* s);
/* rt_vm_dynamic.c: nonzero, topk, compress (decision 016); 1 when `b` is none of them. */
int kiln_vm_prepare_dynamic_builtin(const char* b, KilnVMSite* s);
/* Element i of an integer or bool tensor as int64 (a float's truth value). */
int64_t kiln_vm_element(const DLTensor* t, int64_t i);
/* A new tensor whose header, shape and data are one block of the call; NULL with the error
   set (a size over 2^46 bytes). */
DLTensor* kiln_vm_call_tensor(KilnVM* vm, DLDataType dtype, int ndim, const int64_t* shape);
/* rt_vm_kv.c: kv_append (decision 019). */
int kiln_vm_prepare_kv_builtin(KilnVMSite* s);
/* A result tensor that is a view of an append buffer: 1 with `out` a VM-owned view (not a
   copy; the buffer is kept while a result shows it), 0 when it is not one, -1 on error. */
int kiln_vm_kv_result(KilnVM* vm, const DLTensor* t, KilnVMValue* out);
/* Free the views the last result returned. */
void kiln_vm_kv_release_views(KilnVM* vm);
/* After a call's result is made: free the buffers it does not show (all: every buffer). */
void kiln_vm_kv_prune(KilnVM* vm, int all);
/* "float32[2, 3]", and a register value's kind as the Python VM names its type. */
const char* kiln_vm_type_text(DLDataType dt, int ndim, const int64_t* shape, char* buf, size_t n);
const char* kiln_vm_kind_name(const KilnVMValue* v);
/* Helpers shared by the builtins' files (rt_vm_builtins.c). */
int kiln_site_fail(const KilnVMSite* s, const char* fmt, ...) __attribute__((format(printf, 2, 3)));
int kiln_nargs(const KilnVMSite* s, int lo, int hi);
const char* kiln_str_const(const KilnVMExec* e, const KilnVMSite* s, int i);
int kiln_size_args(const KilnVMSite* s, int first);
int kiln_vm_match_spec(const KilnVMExec* e, const KilnVMFunction* f, KilnVMSite* s);
const char* kiln_symbol_name(const KilnVM* vm, const KilnVMFunction* f, int64_t param, int dim,
                             int64_t slot, char* buf, size_t n);
int kiln_check_bounds(const char* label, int dim, const char* sym, int64_t v,
                      const KilnVMSymbol* b);
/* A block of `n` bytes (64-byte aligned, zeroed) freed when the current call ends. */
void* kiln_vm_call_alloc(KilnVM* vm, size_t n);
/* A site of a looping function: its result moved out of the site's view or tuple into a
   block of the call (each execution of the site then gives a fresh object, as vm.py). */
int kiln_vm_detach(KilnVM* vm, KilnVMSite* s, KilnVMValue* out);
/* A one-element tensor's truth value (read_bool's rule). */
int kiln_vm_read_bool_value(const DLTensor* t, int* out);
/* The storage (fidx, level, sid) with at least nbytes (kept across calls, grown when
   needed; vm_storage.py's key: a function running inside itself gets its own buffers). */
int kiln_vm_storage(KilnVM* vm, KilnVMSite* site, const KilnVMFrame* fr, int64_t sid,
                    int64_t nbytes, KilnVMStorage** out);
/* A copy of a tensor (or of a tuple's tensors) in blocks of the call: a VM callee's result
   (its storage is reused by its next call), a list element. */
int kiln_vm_clone(KilnVM* vm, const KilnVMValue* v, KilnVMValue* out, int depth);

/* -- rt_vm_memory.c */
/* Append item to a growing array of pointers. */
int kiln_vm_push(void*** arr, size_t* n, size_t* cap, void* item);
/* Copy a result into VM-owned tensors and tuples (freed by kiln_vm_free_value). */
/* Whether a and b have the same dtype and shape (rt_vm_memory.c). */
int kiln_vm_same_type(const DLTensor* a, const DLTensor* b);
/* The same from dim `from` on (kv_append: the rows). */
int kiln_vm_same_dims(const DLTensor* a, const DLTensor* b, int from);
/* Elements of a tensor. */
int64_t kiln_vm_numel(const DLTensor* t);
int kiln_vm_copy_out(KilnVM* vm, const KilnVMValue* v, KilnVMValue* out, int depth);
void kiln_vm_free_value(KilnVMValue* v);
/* A value as the C API returns it. */
int kiln_vm_return(const KilnVMValue* v, TVMValue* ret, int* ret_code);

#endif /* KILN_RT_VM_H_ */
