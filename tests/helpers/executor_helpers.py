"""Hand-written packed-ABI kernels and a graph-JSON builder for the executor tests.

Kernels work on float32 tensors of any shape (element count = product of the shape):
``k_add(a, b, out)``, ``k_mul(a, b, out)``, ``k_neg(a, out)``, ``k_scale(a, out)`` (times
``SCALE``, a macro, so two libraries can define the same symbol differently), ``k_pairsum(a,
out)`` (``out[i] = a[2i] + a[2i+1]``: output half the input), ``k_fail_a`` / ``k_fail_b`` (always
fail, each with its own message).
"""

from __future__ import annotations

import json

import kiln.runtime as rt

KERNELS = r"""
#include <kiln/c_runtime_api.h>
#include <stdio.h>
#define EXPORT __attribute__((visibility("default")))
#ifndef SCALE
#define SCALE 2.0f
#endif

static int64_t numel(const DLTensor* t) {
  int64_t n = 1;
  for (int i = 0; i < t->ndim; ++i) n *= t->shape[i];
  return n;
}

static int check(const char* name, int32_t want, int32_t num_args, const int32_t* codes) {
  char msg[128];
  if (num_args != want) {
    snprintf(msg, sizeof msg, "%s: expected %d arguments, got %d", name, (int)want,
             (int)num_args);
    TVMAPISetLastError(msg);
    return -1;
  }
  for (int i = 0; i < want; ++i)
    if (codes[i] != kTVMDLTensorHandle) {
      snprintf(msg, sizeof msg, "%s: argument %d is not a tensor", name, i);
      TVMAPISetLastError(msg);
      return -1;
    }
  return 0;
}

#define T(i) ((DLTensor*)args[i].v_handle)
#define F(i) ((float*)T(i)->data)
#define SIG(NAME) EXPORT int32_t NAME(TVMValue* args, int32_t* codes, int32_t num_args, \
                                      TVMValue* ret, int32_t* ret_code, void* handle)

#define BINARY(NAME, OP)                                                   \
  SIG(NAME) {                                                              \
    if (check(#NAME, 3, num_args, codes)) return -1;                       \
    int64_t n = numel(T(2));                                               \
    const float *a = F(0), *b = F(1);                                      \
    float* c = F(2);                                                       \
    for (int64_t i = 0; i < n; ++i) c[i] = a[i] OP b[i];                   \
    return 0;                                                              \
  }

BINARY(k_add, +)
BINARY(k_mul, *)

SIG(k_neg) {
  if (check("k_neg", 2, num_args, codes)) return -1;
  int64_t n = numel(T(1));
  for (int64_t i = 0; i < n; ++i) F(1)[i] = -F(0)[i];
  return 0;
}

SIG(k_scale) {
  if (check("k_scale", 2, num_args, codes)) return -1;
  int64_t n = numel(T(1));
  for (int64_t i = 0; i < n; ++i) F(1)[i] = F(0)[i] * SCALE;
  return 0;
}

SIG(k_pairsum) {
  if (check("k_pairsum", 2, num_args, codes)) return -1;
  int64_t n = numel(T(1));
  if (numel(T(0)) != 2 * n) { TVMAPISetLastError("k_pairsum: input must be twice the output");
  return -1; }
  for (int64_t i = 0; i < n; ++i) F(1)[i] = F(0)[2 * i] + F(0)[2 * i + 1];
  return 0;
}

SIG(k_fail_a) { TVMAPISetLastError("k_fail_a: refused (A)"); return -1; }
SIG(k_fail_b) { TVMAPISetLastError("k_fail_b: refused (B)"); return -1; }
"""
FUNCS = ["k_add", "k_mul", "k_neg", "k_scale", "k_pairsum", "k_fail_a", "k_fail_b"]


def kernels(scale: float | None = None) -> rt.CSourceModule:
    """The kernels as a C source module; ``scale`` redefines ``SCALE`` of ``k_scale``."""
    code = KERNELS if scale is None else f"#define SCALE {float(scale)!r}f\n" + KERNELS
    return rt.CSourceModule(code, FUNCS)


def make_graph(inputs: list[str], ops: list[tuple], heads: list[str],
               shapes: dict[str, list[int]], storage: dict[str, int] | None = None,
               output_names: list[str] | None = None) -> str:
    """Graph JSON from a compact description.

    Parameters
    ----------
    inputs : names of the null nodes (inputs and params), in order.
    ops : ``(name, func_name, [input names])`` per ``tvm_op`` node, in execution order.
    heads : graph output node names.
    shapes : node name → shape (all float32); a missing name takes the first input's shape.
    storage : node name → storage id; default: one storage per node.
    output_names : ``attrs.output_names`` (Kiln's extension).
    """
    nodes: list[dict] = [{"op": "null", "name": n, "inputs": []} for n in inputs]
    index = {n: i for i, n in enumerate(inputs)}
    for name, func, args in ops:
        index[name] = len(nodes)
        nodes.append({"op": "tvm_op", "name": name, "inputs": [[index[a], 0, 0] for a in args],
                      "attrs": {"func_name": func, "num_inputs": str(len(args)),
                                "num_outputs": "1", "flatten_data": "0"}})
    names = [n["name"] for n in nodes]
    default = shapes.get(inputs[0], [4])
    storage = storage or {}
    attrs = {"dltype": ["list_str", ["float32"] * len(nodes)],
             "storage_id": ["list_int", [storage.get(n, i) for i, n in enumerate(names)]],
             "shape": ["list_shape", [list(shapes.get(n, default)) for n in names]],
             "device_index": ["list_int", [1] * len(nodes)]}
    if output_names:
        attrs["output_names"] = ["list_str", list(output_names)]
    return json.dumps({"nodes": nodes, "arg_nodes": list(range(len(inputs))),
                       "heads": [[index[h], 0, 0] for h in heads],
                       "node_row_ptr": list(range(len(nodes) + 1)), "attrs": attrs})


def aligned(shape, fill: float | None = None) -> rt.NDArray:
    """A 64-byte-aligned float32 NDArray (zeros, or ``fill``)."""
    out = rt.empty(shape, "float32")
    out._arr[...] = 0.0 if fill is None else fill
    return out
