"""The AOT executor's code generator: the whole graph as one C function (TVM's AOTExecutorCodegen,
src/relay/backend/aot_executor_codegen.cc, with linked params).

Input: the graph JSON that :func:`kiln.backend.graph_codegen.graph_json` wrote (it holds every
entry's shape, dtype and the call order), the params and the kernels. Output, for model
``<m>`` (``mod_name`` made a C identifier)::

    int32_t kiln_<m>_run(struct kiln_<m>_inputs* inputs, struct kiln_<m>_outputs* outputs);

which calls the kernels in graph order through the packed ABI with argument arrays and
``DLTensor``\\ s prepared at compile time (static data, nothing is built at run time but the
input and output data pointers). Memory is planned statically by
:func:`kiln.backend.memory_plan.plan_memory` (the graph executor's planner): activations live
at fixed offsets of one static workspace, followed by the kernels' own workspace stack
(:mod:`kiln.backend.kernel_workspace`); graph inputs and outputs are the caller's buffers;
params are linked into ``.rodata`` from ``kiln_<m>_params.bin`` by an assembler ``.incbin``
(a large C array compiles slowly). The generated code needs only the CRT's backend callbacks
(``kiln_crt_backend.c``): no JSON, no params file, no registry.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field

import numpy as np

from kiln.backend.kernel_workspace import CRT_ALIGN, workspace_bytes
from kiln.backend.memory_plan import plan_memory
from kiln.errors import CompileError
from kiln.ir import loop as L
from kiln.passes.loop.make_packed_api import dl_dtype


@dataclass
class TensorSpec:
    """A model input or output: its name, C field name, shape and dtype."""

    name: str
    c_name: str
    shape: tuple[int, ...]
    dtype: str

    @property
    def nbytes(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) * np.dtype(self.dtype).itemsize


@dataclass
class AotSources:
    """What :func:`aot_codegen` writes for model ``c_name`` (files named ``kiln_<c_name>*``)."""

    c_name: str
    run_c: str  # kiln_<m>.c: tensors, argument arrays, the run function
    header: str  # kiln_<m>.h: I/O names, shapes, dtypes, sizes, the run function
    params_bin: bytes  # the params, each at a 64-byte aligned offset
    params_asm: str  # kiln_<m>_params.S: .incbin of the .bin into .rodata
    activation_bytes: int
    kernel_workspace_bytes: int
    inputs: list[TensorSpec] = field(default_factory=list)
    outputs: list[TensorSpec] = field(default_factory=list)

    @property
    def workspace_bytes(self) -> int:
        """The static workspace: activations + the kernels' workspace stack."""
        return self.activation_bytes + self.kernel_workspace_bytes

    @property
    def params_bytes(self) -> int:
        return len(self.params_bin)

    def files(self) -> dict[str, str | bytes]:
        m = self.c_name
        return {f"kiln_{m}.c": self.run_c, f"kiln_{m}.h": self.header,
                f"kiln_{m}_params.bin": self.params_bin, f"kiln_{m}_params.S": self.params_asm}


def c_identifier(name: str, used: set[str] | None = None) -> str:
    """``name`` made a C identifier (non-word characters → ``_``), unique within ``used``."""
    base = re.sub(r"\W", "_", name) or "x"
    if base[0].isdigit():
        base = "_" + base
    cand, k = base, 0
    while used is not None and cand in used:
        k += 1
        cand = f"{base}_{k}"
    if used is not None:
        used.add(cand)
    return cand


def _round(n: int) -> int:
    return (n + CRT_ALIGN - 1) // CRT_ALIGN * CRT_ALIGN


def _entry_nbytes(shape, dtype: str) -> int:
    return int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize


def io_macros(prefix: str, inputs: list[TensorSpec], outputs: list[TensorSpec]) -> list[str]:
    """``#define``\\ s describing each input and output (name, dtype, ndim, shape, bytes)."""
    lines = [f"#define {prefix}_NUM_INPUTS {len(inputs)}",
             f"#define {prefix}_NUM_OUTPUTS {len(outputs)}"]
    for kind, specs in (("INPUT", inputs), ("OUTPUT", outputs)):
        for i, s in enumerate(specs):
            p = f"{prefix}_{kind}_{i}"
            lines += [f"/* {kind.lower()} {i}: {s.name!r} {s.dtype} {list(s.shape)} */",
                      f"#define {p}_NAME {json.dumps(s.name)}",
                      f'#define {p}_DTYPE "{s.dtype}"',
                      f"#define {p}_NDIM {len(s.shape)}",
                      f"#define {p}_SHAPE {{{', '.join(map(str, s.shape)) or '1'}}}",
                      f"#define {p}_NBYTES {s.nbytes}"]
    return lines


def aot_codegen(graph_text: str, params: dict[str, np.ndarray], kernels: list[L.PrimFunc],
                symbols: dict[str, str], mod_name: str) -> AotSources:
    """Generate the AOT executor of a built graph (see the module docstring).

    Parameters
    ----------
    graph_text : the graph JSON of the build.
    params : the graph's params (``p0``...), linked into the program.
    kernels : the lowered kernels (for their workspace needs), named as in the graph.
    symbols : kernel name → its C symbol (the names with the model's prefix).
    mod_name : the model name; the C identifier made of it names every symbol.

    Raises
    ------
    CompileError
        A graph output that is a graph input or param, an output listed twice, or an op the
        AOT executor cannot call (``__nop``/``__copy``).
    """
    g = json.loads(graph_text)
    m = c_identifier(mod_name)
    p = f"kiln_{m}"
    nodes, row_ptr, attrs = g["nodes"], g["node_row_ptr"], g["attrs"]
    shapes, dtypes = attrs["shape"][1], attrs["dltype"][1]
    entry_bytes = [_entry_nbytes(s, d) for s, d in zip(shapes, dtypes, strict=True)]
    arg_entries = {row_ptr[nid]: nodes[nid]["name"] for nid in g["arg_nodes"]}
    heads = [row_ptr[n] + k for n, k, _ in g["heads"]]
    if len(set(heads)) != len(heads) or any(h in arg_entries for h in heads):
        raise CompileError(f"AOT executor of {mod_name}: an output is listed twice or is a "
                           "graph input or param; use the graph executor")
    calls = []  # (symbol, arg entry ids)
    ops = []
    for nid, node in enumerate(nodes):
        if node["op"] == "null":
            continue
        fname = node["attrs"]["func_name"]
        if fname in ("__nop", "__copy"):
            raise CompileError(f"AOT executor of {mod_name}: node {node['name']} is {fname}")
        ins = [row_ptr[n] + k for n, k, _ in node["inputs"]]
        outs = list(range(row_ptr[nid], row_ptr[nid + 1]))
        calls.append((symbols.get(fname, fname), ins + outs))
        ops.append((ins, outs))
    plan = plan_memory(entry_bytes, set(arg_entries), ops, set(heads))
    # Activations: every storage that holds an op output other than a graph output.
    offsets: dict[int, int] = {}
    act = 0
    for e, sid in enumerate(plan.storage_id):
        if e in arg_entries or e in heads or sid in offsets:
            continue
        offsets[sid] = act
        act += _round(plan.storage_bytes[sid])
    kernel_ws = max((workspace_bytes(k) for k in kernels), default=0)

    used: set[str] = set()
    param_names = [n for n in arg_entries.values() if n in params]
    inputs = [TensorSpec(n, c_identifier(n, used), tuple(shapes[e]), dtypes[e])
              for e, n in sorted(arg_entries.items()) if n not in params]
    out_names = attrs.get("output_names", ["list_str", []])[1]
    used = set()
    outputs = [TensorSpec(out_names[i] if i < len(out_names) else f"output{i}",
                          c_identifier(out_names[i] if i < len(out_names) else f"output{i}",
                                       used), tuple(shapes[e]), dtypes[e])
               for i, e in enumerate(heads)]
    blob, param_off = bytearray(), {}
    for name in param_names:
        param_off[name] = len(blob)
        arr = np.asarray(params[name])
        blob += np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
        blob += bytes(_round(len(blob)) - len(blob))

    def data_expr(e: int) -> str:
        if e in arg_entries:
            name = arg_entries[e]
            return f"(void*)({p}_params + {param_off[name]})" if name in params else "0"
        if e in heads:
            return "0"
        return f"{p}_workspace + {offsets[plan.storage_id[e]]}"

    used_entries = sorted({e for _, args in calls for e in args} | set(heads))
    index = {e: i for i, e in enumerate(used_entries)}
    shape_ids: dict[tuple, int] = {}
    lines = [f"// Generated by Kiln's AOT executor codegen for model {mod_name!r}.",
             "#include <kiln/c_runtime_api.h>",
             f'#include "kiln_{m}.h"',
             "",
             "void KilnWorkspace_Init(void* base, size_t size);",
             f"extern const uint8_t {p}_params[];"]
    lines += [f"int32_t {s}(TVMValue*, int32_t*, int32_t, TVMValue*, int32_t*, void*);"
              for s in dict.fromkeys(s for s, _ in calls)]
    total = act + kernel_ws
    lines.append(f"static uint8_t {p}_workspace[{max(total, 1)}] "
                 f"__attribute__((aligned({CRT_ALIGN})));")
    for e in used_entries:
        key = tuple(shapes[e])
        if key not in shape_ids:
            shape_ids[key] = len(shape_ids)
            lines.append(f"static const int64_t {p}_shape{shape_ids[key]}[{max(1, len(key))}] = "
                         f"{{{', '.join(map(str, key)) or '1'}}};")
    rows = []
    for e in used_entries:
        code, bits = dl_dtype(dtypes[e])
        rows.append(f"  {{{data_expr(e)}, {{kDLCPU, 0}}, {len(shapes[e])}, {{{code}, {bits}, 1}}, "
                    f"(int64_t*){p}_shape{shape_ids[tuple(shapes[e])]}, 0, 0}},  /* entry {e} */")
    lines += [f"static DLTensor {p}_tensors[{len(used_entries)}] = {{", *rows, "};"]
    max_args = max((len(a) for _, a in calls), default=1)
    lines.append(f"static int32_t {p}_type_codes[{max_args}] = "
                 f"{{{', '.join(['kTVMDLTensorHandle'] * max_args)}}};")
    for k, (_, args) in enumerate(calls):
        vals = ", ".join(f"{{.v_handle = &{p}_tensors[{index[e]}]}}" for e in args)
        lines.append(f"static TVMValue {p}_args{k}[{len(args)}] = {{{vals}}};")
    lines += ["", f"int32_t {p}_run(struct {p}_inputs* inputs, struct {p}_outputs* outputs) {{",
              "  TVMValue ret;", "  int32_t ret_code;"]
    for s in inputs:
        e = next(e for e, n in arg_entries.items() if n == s.name)
        lines.append(f"  {p}_tensors[{index[e]}].data = inputs->{s.c_name};")
    for s, e in zip(outputs, heads, strict=True):
        lines.append(f"  {p}_tensors[{index[e]}].data = outputs->{s.c_name};")
    lines.append(f"  KilnWorkspace_Init({p}_workspace + {act}, {kernel_ws});")
    for k, (sym, args) in enumerate(calls):
        lines.append(f"  if ({sym}({p}_args{k}, {p}_type_codes, {len(args)}, &ret, &ret_code, "
                     "0) != 0) return -1;")
    lines += ["  return 0;", "}"]

    M = p.upper()
    header = [f"/* Generated by Kiln: the AOT executor of model {mod_name!r}. */",
              f"#ifndef {M}_H_", f"#define {M}_H_", "#include <stdint.h>", "",
              (f"/* static memory: workspace (activations {act} + kernel workspace {kernel_ws}) "
              "and linked params */"),
              f"#define {M}_WORKSPACE_BYTES {total}",
              f"#define {M}_PARAMS_BYTES {len(blob)}",
              *io_macros(M, inputs, outputs), "",
              f"struct {p}_inputs {{", *([f"  void* {s.c_name};" for s in inputs] or
                ["  void* unused;"]), "};",
              f"struct {p}_outputs {{", *[f"  void* {s.c_name};" for s in outputs], "};", "",
              "/* Run the model once. Every pointer is a 64-byte aligned buffer of the size above.",
              "   Returns 0, or -1 with the message in TVMGetLastError(). Not reentrant: the",
              "   workspace is static. */",
              f"int32_t {p}_run(struct {p}_inputs* inputs, struct {p}_outputs* outputs);",
              "const char* TVMGetLastError(void);", "", f"#endif /* {M}_H_ */"]
    asm = [("/* Generated by Kiln: the linked params of the AOT executor, copied by the "
           "assembler. */"),
           "\t.section .rodata", f"\t.globl {p}_params", f"\t.type {p}_params, %object",
           f"\t.balign {CRT_ALIGN}", f"{p}_params:", f'\t.incbin "kiln_{m}_params.bin"',
           f"\t.size {p}_params, .-{p}_params", '\t.section .note.GNU-stack,"",%progbits']
    return AotSources(m, "\n".join(lines) + "\n", "\n".join(header) + "\n", bytes(blob),
                      "\n".join(asm) + "\n", act, kernel_ws, inputs, outputs)
