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
from kiln.tir import loop as L
from kiln.tir.transform.make_packed_api import dl_dtype


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


def io_specs(graph: dict, param_names) -> tuple[list[TensorSpec], list[TensorSpec]]:
    """The model's inputs (``arg_nodes`` that are not params, in order) and outputs (``heads``,
    named by ``attrs.output_names``) of a parsed graph JSON, with unique C field names."""
    nodes, row_ptr, attrs = graph["nodes"], graph["node_row_ptr"], graph["attrs"]
    shapes, dtypes = attrs["shape"][1], attrs["dltype"][1]
    used: set[str] = set()
    inputs = []
    for nid in graph["arg_nodes"]:
        name, e = nodes[nid]["name"], row_ptr[nid]
        if name not in param_names:
            inputs.append(TensorSpec(name, c_identifier(name, used), tuple(shapes[e]), dtypes[e]))
    out_names = attrs.get("output_names", ["list_str", []])[1]
    used = set()
    outputs = []
    for i, (nid, k, _) in enumerate(graph["heads"]):
        e = row_ptr[nid] + k
        name = out_names[i] if i < len(out_names) else f"output{i}"
        outputs.append(TensorSpec(name, c_identifier(name, used), tuple(shapes[e]), dtypes[e]))
    return inputs, outputs


class _AotWriter:
    """One model's AOT sources: the static plan first, then each file."""

    def __init__(self, graph_text: str, params: dict[str, np.ndarray],
                 kernels: list[L.PrimFunc], symbols: dict[str, str], mod_name: str):
        g = json.loads(graph_text)
        self.mod_name, self.params = mod_name, params
        self.m = c_identifier(mod_name)
        self.p = f"kiln_{self.m}"
        nodes, row_ptr = g["nodes"], g["node_row_ptr"]
        self.shapes, self.dtypes = g["attrs"]["shape"][1], g["attrs"]["dltype"][1]
        self.args = {row_ptr[nid]: nodes[nid]["name"] for nid in g["arg_nodes"]}
        self.heads = [row_ptr[n] + k for n, k, _ in g["heads"]]
        if len(set(self.heads)) != len(self.heads) or any(h in self.args for h in self.heads):
            raise CompileError(f"AOT executor of {mod_name}: an output is listed twice or is a "
                               "graph input or param; use the graph executor")
        self.calls: list[tuple[str, list[int]]] = []  # (symbol, argument entry ids)
        ops = []
        for nid, node in enumerate(nodes):
            if node["op"] == "null":
                continue
            fname = node["attrs"]["func_name"]
            if fname in ("__nop", "__copy"):
                raise CompileError(f"AOT executor of {mod_name}: node {node['name']} is "
                                   f"{fname}")
            ins = [row_ptr[n] + k for n, k, _ in node["inputs"]]
            outs = list(range(row_ptr[nid], row_ptr[nid + 1]))
            self.calls.append((symbols.get(fname, fname), ins + outs))
            ops.append((ins, outs))
        self.inputs, self.outputs = io_specs(g, params)
        self._plan(ops)
        self.kernel_ws = max((workspace_bytes(k) for k in kernels), default=0)
        self._pack_params()

    def _plan(self, ops) -> None:
        """Storage ids by the graph planner (inputs and params external, outputs pinned);
        offsets in the workspace for every storage that holds an activation."""
        nbytes = [_entry_nbytes(s, d) for s, d in zip(self.shapes, self.dtypes, strict=True)]
        plan = plan_memory(nbytes, set(self.args), ops, set(self.heads))
        self.storage_id = plan.storage_id
        self.offsets: dict[int, int] = {}
        self.activation_bytes = 0
        for e, sid in enumerate(plan.storage_id):
            if e in self.args or e in self.heads or sid in self.offsets:
                continue
            self.offsets[sid] = self.activation_bytes
            self.activation_bytes += _round(plan.storage_bytes[sid])

    def _pack_params(self) -> None:
        """The params blob: each param little-endian at a 64-byte aligned offset."""
        blob, self.param_offset = bytearray(), {}
        for name in self.args.values():
            if name in self.params:
                self.param_offset[name] = len(blob)
                arr = np.asarray(self.params[name])
                blob += np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<")).tobytes()
                blob += bytes(_round(len(blob)) - len(blob))
        self.params_bin = bytes(blob)

    def _data(self, e: int) -> str:
        """The static data pointer of entry ``e`` (0: set by the run function)."""
        p = self.p
        if e in self.args:
            name = self.args[e]
            if name not in self.params:
                return "0"
            return f"(void*)({p}_params + {self.param_offset[name]})"
        if e in self.heads:
            return "0"
        return f"{p}_workspace + {self.offsets[self.storage_id[e]]}"

    def _tensors(self, entries: list[int]) -> list[str]:
        """Shape arrays (one per distinct shape) and the static DLTensor table."""
        p, lines, rows, ids = self.p, [], [], {}
        for e in entries:
            key = tuple(self.shapes[e])
            if key not in ids:
                ids[key] = len(ids)
                lines.append(f"static const int64_t {p}_shape{ids[key]}[{max(1, len(key))}] = "
                             f"{{{', '.join(map(str, key)) or '1'}}};")
            code, bits = dl_dtype(self.dtypes[e])
            rows.append(f"  {{{self._data(e)}, {{kDLCPU, 0}}, {len(key)}, {{{code}, {bits}, 1}}, "
                        f"(int64_t*){p}_shape{ids[key]}, 0, 0}},  /* entry {e} */")
        return [*lines, f"static DLTensor {p}_tensors[{len(entries)}] = {{", *rows, "};"]

    def run_c(self) -> str:
        p, calls = self.p, self.calls
        entries = sorted({e for _, args in calls for e in args} | set(self.heads))
        index = {e: i for i, e in enumerate(entries)}
        lines = [f"// Generated by Kiln's AOT executor codegen for model {self.mod_name!r}.",
                 "#include <kiln/c_runtime_api.h>", f'#include "kiln_{self.m}.h"', "",
                 "void KilnWorkspace_Init(void* base, size_t size);",
                 f"extern const uint8_t {p}_params[];"]
        lines += [f"int32_t {s}(TVMValue*, int32_t*, int32_t, TVMValue*, int32_t*, void*);"
                  for s in dict.fromkeys(s for s, _ in calls)]
        total = self.activation_bytes + self.kernel_ws
        lines.append(f"static uint8_t {p}_workspace[{max(total, 1)}] "
                     f"__attribute__((aligned({CRT_ALIGN})));")
        lines += self._tensors(entries)
        max_args = max((len(a) for _, a in calls), default=1)
        lines.append(f"static int32_t {p}_type_codes[{max_args}] = "
                     f"{{{', '.join(['kTVMDLTensorHandle'] * max_args)}}};")
        for k, (_, args) in enumerate(calls):
            vals = ", ".join(f"{{.v_handle = &{p}_tensors[{index[e]}]}}" for e in args)
            lines.append(f"static TVMValue {p}_args{k}[{len(args)}] = {{{vals}}};")
        lines += ["", (f"int32_t {p}_run(struct {p}_inputs* inputs, struct {p}_outputs* outputs) "
                  "{"), "  TVMValue ret;", "  int32_t ret_code;"]
        entry_of = {n: e for e, n in self.args.items()}
        for s in self.inputs:
            lines.append(f"  {p}_tensors[{index[entry_of[s.name]]}].data = inputs->{s.c_name};")
        for s, e in zip(self.outputs, self.heads, strict=True):
            lines.append(f"  {p}_tensors[{index[e]}].data = outputs->{s.c_name};")
        lines.append(f"  KilnWorkspace_Init({p}_workspace + {self.activation_bytes}, "
                     f"{self.kernel_ws});")
        for k, (sym, args) in enumerate(calls):
            lines.append(f"  if ({sym}({p}_args{k}, {p}_type_codes, {len(args)}, &ret, "
                         "&ret_code, 0) != 0) return -1;")
        return "\n".join([*lines, "  return 0;", "}"]) + "\n"

    def header(self) -> str:
        p, M = self.p, self.p.upper()
        fields_in = [f"  void* {s.c_name};" for s in self.inputs] or ["  void* unused;"]
        return "\n".join([
            f"/* Generated by Kiln: the AOT executor of model {self.mod_name!r}. */",
            f"#ifndef {M}_H_", f"#define {M}_H_", "#include <stdint.h>", "",
            (f"/* static memory: workspace (activations {self.activation_bytes} + kernel "
            f"workspace {self.kernel_ws}) and linked params */"),
            f"#define {M}_WORKSPACE_BYTES {self.activation_bytes + self.kernel_ws}",
            f"#define {M}_PARAMS_BYTES {len(self.params_bin)}",
            *io_macros(M, self.inputs, self.outputs), "",
            f"struct {p}_inputs {{", *fields_in, "};",
            f"struct {p}_outputs {{", *[f"  void* {s.c_name};" for s in self.outputs], "};", "",
            "/* Run the model once. Every pointer is a 64-byte aligned buffer of the size above.",
            "   Returns 0, or -1 with the message in TVMGetLastError(). Not reentrant: the",
            "   workspace is static. */",
            f"int32_t {p}_run(struct {p}_inputs* inputs, struct {p}_outputs* outputs);",
            "const char* TVMGetLastError(void);", "", f"#endif /* {M}_H_ */"]) + "\n"

    def params_asm(self) -> str:
        p = self.p
        return "\n".join([
            "/* Generated by Kiln: the AOT executor's linked params, copied by the assembler. */",
            "\t.section .rodata", f"\t.globl {p}_params", f"\t.type {p}_params, %object",
            f"\t.balign {CRT_ALIGN}", f"{p}_params:", f'\t.incbin "kiln_{self.m}_params.bin"',
            f"\t.size {p}_params, .-{p}_params", '\t.section .note.GNU-stack,"",%progbits']) + "\n"


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
    w = _AotWriter(graph_text, params, kernels, symbols, mod_name)
    return AotSources(w.m, w.run_c(), w.header(), w.params_bin, w.params_asm(),
                      w.activation_bytes, w.kernel_ws, w.inputs, w.outputs)
