"""The cblas codegen: partitioned functions of GEMM composites → one C source module that calls
OpenBLAS's ``cblas_sgemm`` (TVM: src/relay/backend/contrib/codegen_c/codegen.cc for the C-source
shape of a BYOC codegen, src/runtime/contrib/cblas/cblas.cc for the library calls).

Each external function becomes a packed function named by its ``global_symbol``; its arguments
are the function's inputs then its outputs, as DLTensors (float32, compact, checked). The body
runs the composites in order: ``conv2d`` as im2col + GEMM per image and group (a 1×1, stride-1,
unpadded convolution reads the input directly), ``dense`` as ``x @ w^T``, ``matmul`` /
``batch_matmul`` as one GEMM per batch item (an operand broadcast over the batch is reused),
then an in-place epilogue adds the bias and the residual and applies the activation. Values
between composites live in workspace buffers (``TVMBackendAllocWorkspace``), freed after their
last use. Structurally identical functions (same shapes and composites: weights are arguments)
share one implementation.

The module links with the flags ``pkg-config --libs openblas`` prints (``link_options``); the
generated source declares the CBLAS prototypes itself, so no BLAS include path is needed.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess

from kiln.byoc.gemm_composites import GemmComposite, parse
from kiln.errors import CompileError, ToolchainError
from kiln.native import BYOC_DIR
from kiln.relay.graph import Function, FunctionCall, Var, post_order, structural_key
from kiln.runtime import CSourceModule

#: the support code pasted at the top of every generated source (kiln/native/src/byoc/)
KERNELS_C = BYOC_DIR / "cblas_kernels.c"
PKG = "openblas"
_ACT = {None: "KILN_ACT_NONE", "nn.relu": "KILN_ACT_RELU", "clip": "KILN_ACT_CLIP",
        "hardswish": "KILN_ACT_HARDSWISH"}
_INSTALL_HINT = ("install OpenBLAS and pkg-config (Debian/Ubuntu: `apt-get install "
                 "libopenblas-dev pkg-config`), or set $PKG_CONFIG_PATH to the folder of "
                 "openblas.pc")


def openblas_link_flags() -> list[str]:
    """``pkg-config --libs openblas`` (e.g. ``-L/usr/lib/x86_64-linux-gnu/openblas-pthread/
    -lopenblas``); ``$PKG_CONFIG`` names another pkg-config.

    Raises
    ------
    ToolchainError
        pkg-config is missing, or does not know OpenBLAS.
    """
    tool = shlex.split(os.environ.get("PKG_CONFIG", "") or "pkg-config")
    if shutil.which(tool[0]) is None:
        raise ToolchainError(f"BYOC cblas: {tool[0]} not found to locate OpenBLAS; "
                             f"{_INSTALL_HINT}")
    try:
        proc = subprocess.run([*tool, "--libs", PKG], capture_output=True, text=True,
                              check=False)
    except OSError as err:
        raise ToolchainError(f"BYOC cblas: cannot run {tool[0]}: {err}") from None
    if proc.returncode != 0:
        why = (proc.stderr or proc.stdout).strip().splitlines()
        raise ToolchainError(f"BYOC cblas: OpenBLAS not found by `{shlex.join(tool)} --libs "
                             f"{PKG}` ({why[0] if why else 'no output'}); {_INSTALL_HINT}")
    return shlex.split(proc.stdout)


def cblas_codegen(funcs: list[Function]) -> CSourceModule:
    """One C source module for every cblas function of a model (see the module doc).

    Raises
    ------
    ToolchainError
        OpenBLAS cannot be located (checked first, so a build fails before any C is written).
    CompileError
        A function holds something other than GEMM composites on float32 tensors.
    """
    link = openblas_link_flags()
    parts = [KERNELS_C.read_text()]
    impls: dict[str, str] = {}
    names = []
    for f in funcs:
        symbol = str(f.attrs["global_symbol"])
        key = structural_key(f)
        impl = impls.get(key)
        if impl is None:
            impl = f"kiln_cblas_impl_{len(impls)}"
            impls[key] = impl
            parts.append(_function(f, impl))
        parts.append(
            f"KILN_EXPORT int32_t {symbol}(TVMValue* args, int32_t* type_codes, "
            "int32_t num_args, TVMValue* ret, int32_t* ret_code, void* resource_handle) {\n"
            "  (void)ret; (void)ret_code; (void)resource_handle;\n"
            f'  return {impl}("{symbol}", args, type_codes, num_args);\n}}\n')
        names.append(symbol)
    return CSourceModule("\n".join(parts), names, type_key="c", link_options=link)


class _Emitter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, line: str) -> None:
        self.lines.append("  " + line)


def _function(f: Function, impl: str) -> str:
    out = _Emitter()
    nargs = len(f.params) + len(f.outputs)
    out(f"if (num_args != {nargs}) return kiln_cblas_fail(symbol, \"expects {nargs} "
        "arguments (inputs then outputs)\");")
    ptr: dict[int, str] = {}
    for i, v in enumerate([*f.params, *f.outputs]):
        t = v.checked_type
        if t.dtype != "float32":
            raise CompileError(f"cblas: {f.attrs['global_symbol']} argument {i} is {t.dtype}; "
                               "only float32 is offloaded")
        dims = ", ".join(str(d) for d in t.shape) or "1"
        out(f"static const int64_t shape{i}[] = {{{dims}}};")
        out(f"float* a{i} = (float*)kiln_cblas_arg(args, type_codes, {i}, {t.ndim}, shape{i}, "
            "kDLFloat, 32);")
        out(f"if (a{i} == NULL) return kiln_cblas_fail(symbol, \"argument {i} is not a compact "
            f"float32 tensor of shape ({', '.join(map(str, t.shape))})\");")
        if i < len(f.params):
            ptr[v.uid] = f"a{i}"
    out_index = {o.uid: len(f.params) + k for k, o in enumerate(f.outputs)}
    order = [n for n in post_order(f.outputs) if not isinstance(n, Var)]
    last_use: dict[int, int] = {}
    for k, n in enumerate(order):
        for a in n.args:
            last_use[a.uid] = k
    temps: list[tuple[int, str]] = []
    for k, n in enumerate(order):
        if not isinstance(n, FunctionCall) or "Composite" not in n.body.attrs:
            raise CompileError(f"cblas: {f.attrs['global_symbol']} holds {n!r}; cblas runs "
                               "only its composites (conv2d, dense, matmul + epilogue)")
        comp = parse(n.body.outputs[0])
        if comp is None:
            raise CompileError(f"cblas: cannot read composite {n.body.attrs['Composite']}")
        if n.uid in out_index:
            dst = f"a{out_index[n.uid]}"
        else:
            dst = f"t{n.uid}"
            out(f"float* {dst} = (float*)TVMBackendAllocWorkspace(kDLCPU, 0, "
                f"{n.checked_type.nbytes}ull, 2, 32);")
            out(f"if ({dst} == NULL) return kiln_cblas_fail(symbol, \"out of workspace "
                "memory\");")
            temps.append((n.uid, dst))
        args = {p.uid: ptr[a.uid] for p, a in zip(n.body.params, n.args)}
        _composite(out, comp, args, dst, n.body.attrs["Composite"])
        ptr[n.uid] = dst
        for uid, name in list(temps):
            if uid != n.uid and last_use.get(uid, k) <= k:  # read for the last time
                out(f"TVMBackendFreeWorkspace(kDLCPU, 0, {name});")
                temps.remove((uid, name))
    for _, name in temps:
        out(f"TVMBackendFreeWorkspace(kDLCPU, 0, {name});")
    out("return 0;")
    head = (f"static int32_t {impl}(const char* symbol, TVMValue* args, int32_t* type_codes, "
            "int32_t num_args) {")
    return "\n".join([head, *out.lines, "}"]) + "\n"


def _composite(out: _Emitter, c: GemmComposite, arg: dict[int, str], dst: str,
               name: str) -> None:
    x, w = arg[c.data_arg.uid], arg[c.weight_arg.uid]
    xs, ws, os_ = c.data_arg.checked_type.shape, c.weight_arg.checked_type.shape, c.out_type.shape
    out(f"/* {name}: {xs} x {ws} -> {os_} */")
    if c.kind == "conv2d":
        a = c.anchor.attrs
        (sh, sw), (dh, dw), (pt, pl, _, _) = a["strides"], a["dilation"], a["padding"]
        out(f"if (kiln_cblas_conv2d(symbol, {x}, {w}, {dst}, {xs[0]}, {xs[1]}, {xs[2]}, "
            f"{xs[3]}, {ws[0]}, {ws[2]}, {ws[3]}, {sh}, {sw}, {pt}, {pl}, {dh}, {dw}, "
            f"{os_[2]}, {os_[3]}, {a['groups']}) != 0) return -1;")
    elif c.kind == "dense":
        out(f"kiln_cblas_dense({x}, {w}, {dst}, {xs[0]}, {ws[0]}, {xs[1]});")
    else:
        m, k, n = os_[-2], xs[-1], os_[-1]
        batch = 1
        for d in os_[:-2]:
            batch *= d
        a_step = 0 if _prod(xs[:-2]) == 1 else m * k
        b_step = 0 if _prod(ws[:-2]) == 1 else k * n
        out(f"kiln_cblas_matmul({x}, {w}, {dst}, {batch}, {m}, {n}, {k}, {a_step}, {b_step});")
    act = c.activation
    if c.bias_arg is None and c.residual_arg is None and act is None:
        return
    bias = arg[c.bias_arg.uid] if c.bias_arg is not None else "NULL"
    res = arg[c.residual_arg.uid] if c.residual_arg is not None else "NULL"
    lo, hi = ((float(act.attrs["a_min"]), float(act.attrs["a_max"]))
              if act is not None and act.op.name == "clip" else (0.0, 0.0))
    outer, ch, inner = c.channels()
    out(f"kiln_cblas_epilogue({dst}, {outer}, {ch}, {inner}, {bias}, {res}, "
        f"{_ACT[act.op.name if act is not None else None]}, {_c_float(lo)}, {_c_float(hi)});")


def _prod(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _c_float(v: float) -> str:
    if v == float("inf"):
        return "INFINITY"
    if v == float("-inf"):
        return "-INFINITY"
    return repr(float(v)) + "f"
