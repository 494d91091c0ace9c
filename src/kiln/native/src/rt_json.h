/*
 * The kiln_json (BYOC JSON runtime) module in C: the graph's nodes as the loader checks them
 * (rt_json.c) and the kernels that run them (rt_json_kernels.c). The Python runtime is the spec:
 * kiln/runtime/contrib/json/json_runtime.py (format, checks, calling convention) and json_kernels.py (the
 * kernels' semantics, numpy's).
 */
#ifndef KILN_RT_JSON_H_
#define KILN_RT_JSON_H_

#include <stdint.h>

#include "crt/kiln_crt_json.h"
#include "rt_internal.h"

#define KILN_JSON_MAX_NDIM 32
#define KILN_JSON_MAX_ATTRS 16

/* One node output's type: shape, element count and dtype. */
typedef struct {
  int32_t ndim;
  int64_t shape[KILN_JSON_MAX_NDIM];
  int64_t size;
  DLDataType dtype;
} KilnJsonTensor;

typedef struct KilnJsonKernel KilnJsonKernel;

typedef struct {
  int op; /* KILN_JSON_OP_* */
  char* name;
  int num_outputs;
  KilnJsonTensor type; /* output 0's (the only one a kernel writes) */
  int num_inputs;
  int* inputs; /* node ids (output 0 of each) */
  const KilnJsonTensor** in_types;
  const KilnJsonKernel* kernel;
  int64_t p[KILN_JSON_MAX_ATTRS]; /* the kernel's attrs, read at load */
  float f[2];
  int const_index; /* const nodes: index into the constant names */
  int num_release;
  int* release; /* kernel nodes whose values die after this node */
} KilnJsonNode;

/* The attrs object of a node while it is read (json text, tokens, the object's token). */
typedef struct {
  const char* js;
  const KilnJsonToken* toks;
  int obj;
  const char* where; /* "kiln_json module 'sym': node 3 (nn.conv2d)" */
} KilnJsonAttrs;

struct KilnJsonKernel {
  const char* name;
  int min_inputs, max_inputs;
  /* Reads the attrs into node->p / node->f and checks the input and output types (so the
     kernel never reads or writes outside its buffers); 0, or -1 with the error set. */
  int (*prepare)(KilnJsonNode* node, const KilnJsonAttrs* a);
  /* 0, or -1 with the error set (out of memory for scratch space) */
  int (*run)(const KilnJsonNode* node, const float* const* ins, float* out);
};

enum { KILN_JSON_OP_INPUT, KILN_JSON_OP_CONST, KILN_JSON_OP_KERNEL };

/* The built-in kernel of that name, or NULL (rt_json_kernels.c). */
const KilnJsonKernel* kiln_json_kernel(const char* name, size_t len);

#endif /* KILN_RT_JSON_H_ */
