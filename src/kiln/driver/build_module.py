"""``kiln.build``: graph IR module → GraphExecutorFactoryModule (TVM's ``relay.build``).

The pipeline: the graph passes of :data:`GRAPH_PASSES` (BindParams ... FuseOps, in that order),
then per fused function: compute → schedule → lower → loop passes → MakePackedAPI → the target
kind's code generator (:mod:`kiln.codegen.registry`); external functions go to their BYOC
codegens; then the executor's artifact (:func:`choose_executor`): graph JSON with its memory
plan, VM bytecode, or AOT C. Identical fused functions compile to one kernel. The target is the
current one (``with target:``) while the graph is optimized and kernels are lowered, so passes
and schedules can read it.

BYOC partitions after the folding passes (an external backend sees convolutions with batch norm
already folded in) and before AlterOpLayout (offloaded convolutions keep the NCHW/OIHW layout
every library takes); docs/decisions/006-byoc.md.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from kiln import progress
from kiln.backend.graph_codegen import graph_json
from kiln.backend.te_compiler import lower_primitive
from kiln.codegen.registry import get_codegen
from kiln.errors import CompileError
from kiln.relay.graph import (
    CALL_NODES,
    Call,
    Constant,
    Expr,
    Function,
    IfCall,
    IRModule,
    LoopCall,
    PrimitiveCall,
    post_order,
    rewrite,
    same_call,
    structural_key,
    with_args,
)
from kiln.relay.transform import bind_params, fold_constant, simplify_inference
from kiln.relay.transform.alter_op_layout import alter_op_layout
from kiln.relay.transform.eliminate_common_subexpr import eliminate_common_subexpr
from kiln.relay.transform.fake_quantization_to_integer import fake_quantization_to_integer
from kiln.relay.transform.fold_scale_axis import fold_scale_axis
from kiln.relay.transform.fuse_attention import fuse_attention
from kiln.relay.transform.fuse_ops import fuse_ops
from kiln.relay.transform.kv_append import kv_append
from kiln.relay.transform.promote_float16 import promote_float16
from kiln.relay.transform.quantize_weights import quantize_weights as quantize_dense_weights
from kiln.relay.transform.sink_reshape import sink_reshape
from kiln.relay.transform.split_concat import split_concat
from kiln.relay.transform.split_groups import split_groups
from kiln.runtime import GraphExecutorFactoryModule
from kiln.target import Target, default_target
from kiln.tir import loop as L

log = logging.getLogger("kiln")

#: ``build``'s ``int8_products`` modes (docs/decisions/049)
INT8_PRODUCTS = ("exact", "saturate")


@dataclass(frozen=True)
class PassOptions:
    """What the graph passes of one build depend on (the arguments of :func:`optimize`)."""

    params: Mapping[str, np.ndarray] | None
    byoc: tuple[str, ...]
    mod_name: str
    quantize_weights: str | None
    vm: bool
    int8_products: str = "exact"


@dataclass(frozen=True)
class GraphPass:
    """One step of the graph pipeline: ``run(func, options) -> func`` when ``enabled``."""

    name: str
    run: Callable[[Function, PassOptions], Function]
    enabled: Callable[[PassOptions], bool] = lambda options: True


def _partition(func: Function, o: PassOptions) -> Function:
    from kiln.byoc import partition_for

    return partition_for(func, o.byoc, o.mod_name)


#: The graph-level pipeline, in order (TVM's relay.build pass sequence). FoldConstant runs
#: again after FoldScaleAxis (the scales it folds are constants); the partitioning for external
#: compilers comes after the folding passes; KVAppend only in VM builds, before fusion; the
#: branches and loop bodies of run-time Ifs and Loops go through this same list last.
GRAPH_PASSES: tuple[GraphPass, ...] = (
    GraphPass("BindParams", lambda f, o: bind_params(f, o.params), lambda o: bool(o.params)),
    GraphPass("PromoteFloat16", lambda f, o: promote_float16(f)),
    GraphPass("SimplifyInference", lambda f, o: simplify_inference(f)),
    GraphPass("FakeQuantizationToInteger", lambda f, o: fake_quantization_to_integer(f)),
    GraphPass("FoldConstant", lambda f, o: fold_constant(f)),
    GraphPass("FoldScaleAxis", lambda f, o: fold_scale_axis(f)),
    GraphPass("FoldConstant", lambda f, o: fold_constant(f)),
    GraphPass("EliminateCommonSubexpr", lambda f, o: eliminate_common_subexpr(f)),
    GraphPass("QuantizeWeights", lambda f, o: quantize_dense_weights(f, o.quantize_weights),
              lambda o: bool(o.quantize_weights)),
    GraphPass("PartitionGraph", _partition, lambda o: bool(o.byoc)),
    GraphPass("SplitConcat", lambda f, o: split_concat(f)),
    GraphPass("SplitGroups", lambda f, o: split_groups(f)),
    GraphPass("AlterOpLayout", lambda f, o: alter_op_layout(f, o.int8_products)),
    GraphPass("SinkReshape", lambda f, o: sink_reshape(f)),
    GraphPass("EliminateCommonSubexpr", lambda f, o: eliminate_common_subexpr(f)),
    GraphPass("FuseAttention", lambda f, o: fuse_attention(f)),
    GraphPass("KVAppend", lambda f, o: kv_append(f), lambda o: o.vm),
    GraphPass("FuseOps", lambda f, o: fuse_ops(f)),
    GraphPass("OptimizeBranches", lambda f, o: optimize_branches(f, o.mod_name, o.int8_products)),
)


def optimize(func: Function, params: Mapping[str, np.ndarray] | None,
             byoc: Sequence[str] = (), mod_name: str = "default",
             quantize_weights: str | None = None, vm: bool = False,
             int8_products: str = "exact") -> Function:
    """``func`` through :data:`GRAPH_PASSES`, up to and including FuseOps: with ``byoc``, the
    partitioning for those external compilers; with ``quantize_weights``, QuantizeWeights in
    that mode; with ``vm`` (a VM build), KVAppend (key/value caches that grow in place);
    ``int8_products`` goes to AlterOpLayout (``build``'s)."""
    options = PassOptions(params, tuple(byoc), mod_name, quantize_weights, vm, int8_products)
    for graph_pass in GRAPH_PASSES:
        if graph_pass.enabled(options):
            func = graph_pass.run(func, options)
    return func


def optimize_branches(func: Function, mod_name: str = "default",
                      int8_products: str = "exact") -> Function:
    """``func`` with the branches of its run-time Ifs (and its loops' steps and bodies)
    optimized and fused like ``main``, under ``main``'s ``int8_products``: the constants they
    capture (weights bound by BindParams) move into the branches first, so folding and layout
    passes see them."""
    memo: dict[int, Expr] = {}
    for node in post_order(func.outputs):
        if isinstance(node, IfCall):
            cond, *captures = [memo[a.uid] for a in node.args]
            then_body, kept = _optimized_body(node.then_body, captures, mod_name, int8_products)
            else_body, _ = _optimized_body(node.else_body, captures, mod_name, int8_products)
            memo[node.uid] = IfCall(cond, then_body, else_body, kept)
        elif isinstance(node, LoopCall):
            memo[node.uid] = _optimized_loop(node, [memo[a.uid] for a in node.args], mod_name,
                                             int8_products)
        elif isinstance(node, CALL_NODES):
            memo[node.uid] = with_args(node, [memo[a.uid] for a in node.args])
        else:
            memo[node.uid] = node
    return Function(func.params, [memo[o.uid] for o in func.outputs], func.output_names,
                    dict(func.attrs))


def _optimized_loop(node: LoopCall, args: list[Expr], mod_name: str,
                    int8_products: str) -> LoopCall:
    """``node`` over ``args`` with its step and body optimized (constant captures inlined)."""
    n = 2 + node.num_carried
    # iteration, condition, carried values: the body's own parameters, never constants
    body, kept = _optimized_body(node.body, [*node.body.params[:n], *args[n:]], mod_name,
                                 int8_products)
    step = optimize(node.step, None, (), mod_name, int8_products=int8_products)
    return LoopCall(args[0], args[1], args[2:n], kept[n:], step, body, node.count)


def _optimized_body(body: Function, args: list[Expr], mod_name: str, int8_products: str
                    ) -> tuple[Function, list[Expr]]:
    """``body`` (a branch or a loop body called with ``args``) optimized and fused, its
    parameters whose argument is a Constant replaced by that constant; returns it and the
    arguments it still takes."""
    constants = {p.uid: a for p, a in zip(body.params, args) if isinstance(a, Constant)}
    params = [p for p in body.params if p.uid not in constants]
    inlined = rewrite(body, same_call, leaves=constants, params=params)
    return (optimize(inlined, None, (), mod_name, int8_products=int8_products),
            [a for a in args if not isinstance(a, Constant)])


def primitive_calls(func: Function) -> list[PrimitiveCall]:
    """Every fused kernel call of ``func``, the branches of its Ifs included."""
    out: list[PrimitiveCall] = []
    for node in post_order(func.outputs):
        if isinstance(node, PrimitiveCall):
            out.append(node)
        elif isinstance(node, IfCall):
            out += primitive_calls(node.then_body) + primitive_calls(node.else_body)
        elif isinstance(node, LoopCall):
            out += primitive_calls(node.step) + primitive_calls(node.body)
    return out


def build(mod: IRModule | Function, target: str | Target | None = None,
          params: dict[str, np.ndarray] | None = None,
          mod_name: str = "default", byoc: Sequence[str] = (), runtime: str | None = None,
          executor: str | None = None, system_lib_prefix: str = "",
          quantize_weights: str | None = None, tuning_records=None,
          int8_products: str = "exact"):
    """Compile ``mod["main"]`` for ``target``.

    Parameters
    ----------
    mod : the model (``kiln.frontend.from_onnx``'s first result) or a graph Function.
    target : ``"c"`` (C source, compiled by the system C compiler at export time;
        ``"c -mcpu=native"`` compiles it with ``-march=native``) or
        ``"llvm [-mtriple=...] [-mcpu=...] [-mattr=...]"`` (objects compiled in-process by
        LLVM, see :class:`kiln.target.Target`) or ``"jit"`` (every kernel as C source kept in
        the artifact and compiled on first call where the model runs, by
        ``$KILN_DEVICE_CC``: :class:`kiln.runtime.SourceDeviceModule`);
        ``"llvm -mcpu=portable"`` builds one library for every x86-64 CPU (kernels per
        x86-64 level, chosen at load time: :mod:`kiln.codegen.llvm.multi_level`). Default:
        ``Target.current()``, else :func:`kiln.target.default_target` — the fastest target for
        this host, ``"llvm -mcpu=native"`` when llvmlite is installed, as ``kiln compile``
        (docs/decisions/023-default-target-and-multi-level.md).
    params : weights by name (``from_onnx``'s second result); bound as constants.
    mod_name : name of the factory function that creates executors (TVM: "default"); also
        the model name in external symbols (``kiln_<mod_name>_<compiler>_main_<i>``).
    byoc : list of str, optional
        External compilers to offload to, in priority order (``kiln.byoc``; built in:
        ``"cblas"``, ``"kiln_json"``). What they do not take stays on Kiln's codegen. Their
        modules are imported by the kernel library, behind a const loader
        (``kiln.runtime.ConstLoaderModule``) only when one of them declares constants.
    runtime : str, optional
        ``"crt"``: also build the system library (a function registry and
        ``<system_lib_prefix>TVMSystemLibEntryPoint``, :mod:`kiln.codegen.system_lib`), so the
        model runs with Kiln's C runtime (``kiln.crt``) without Python or ``dlopen``; default
        (None): for the Python runtime only.
    executor : str, optional
        ``"vm"``: the VM executable (``kiln.runtime.VMExecutable``: bytecode over the kernels,
        any shape the inputs' symbolic dims allow; run with ``kiln.vm.VirtualMachine``) — the
        default when the model has symbolic dims; ``"graph"`` — the default for static
        models; or ``"aot"``: the whole graph as one C function
        ``kiln_<mod_name>_run`` with a static memory plan and linked params
        (:mod:`kiln.backend.aot_codegen`); its kernels' symbols are prefixed ``kiln_<mod_name>_``.
    system_lib_prefix : str
        With ``runtime="crt"``: a prefix for the kernels' symbols and the entry point, so
        several models can be linked into one program (the library then runs only with the
        C runtime: Python looks kernels up by their unprefixed names).
    quantize_weights : str, optional
        Weight-only quantization of dense layers (ONNX MatMul / Gemm with constant weights of
        at least 64 × 64): ``"int8"`` (symmetric, per output channel) or ``"q4"`` (GGUF Q4_1
        blocks of 32; weights whose K is not a multiple of 32 stay float32). The weights are
        stored quantized in the artifact and dequantized inside the kernels
        (:mod:`kiln.relay.transform.quantize_weights`, docs/decisions/018). Default: float32.
    tuning_records : path or kiln.driver.apply_history.ApplyHistoryBest, optional
        Records of ``kiln tune`` (JSON lines): each kernel with a record measured for this
        exact target string on a CPU with this machine's fingerprint gets the fastest
        record's schedule, the others their default one; the summary (how many kernels
        were tuned, why the others fell back) is logged, and is the ``ApplyHistoryBest``'s
        ``summary()`` when one is given (docs/decisions/024-tuner.md). Not applied to a
        multi-level target.
    int8_products : str
        How the integer convolutions and dense ops (QDQ groups, QLinearConv, QLinearMatMul,
        ConvInteger, MatMulInteger) sum their u8 × s8 products on x86 CPUs with AVX2 and no
        VNNI: ``"exact"`` (default; ``vpmaddubsw`` only where the weights prove that no
        int16 pair sum saturates, exact ``vpmaddwd`` pairs elsewhere) or ``"saturate"``
        (``vpmaddubsw`` everywhere: pair sums saturated to int16 — the arithmetic of
        onnxruntime MLAS's AVX2 U8S8 kernels, faster, not exact; docs/int8.md). Other
        targets are exact either way (docs/decisions/049).

    Returns
    -------
    GraphExecutorFactoryModule or VMExecutable or kiln.crt.aot_factory.AotExecutorFactory
        The graph executor's factory (``export_library(path)``, ``lib[mod_name](kiln.cpu())``;
        ``kiln.crt.project.graph_project`` with ``runtime="crt"``), or the AOT factory
        (``emit_c_project(dir)``, ``export_library("model.a")``).

    Raises
    ------
    CompileError
        If an op cannot be lowered, the target is not supported, an unknown
        ``quantize_weights`` or ``int8_products`` mode, a BYOC compiler is not
        registered or its codegen fails, an unknown runtime or executor, or (``runtime="crt"``,
        ``executor="aot"``) a module that cannot be linked statically (one needing constants
        or not DSO-exportable: the message lists them).
    ToolchainError
        A BYOC codegen's library is missing (cblas: OpenBLAS).
    KilnError
        ``tuning_records`` cannot be read or holds a line that is not a record.
    """
    if int8_products not in INT8_PRODUCTS:
        raise CompileError(f"unknown int8_products {int8_products!r}: expected one of "
                           f"{INT8_PRODUCTS}")
    tuning = _tuning(tuning_records)
    if target is None:
        target = Target.current() or default_target()
    tgt = Target(target)
    func = mod["main"] if isinstance(mod, IRModule) else mod
    executor = choose_executor(func, executor, runtime)
    prefix = deploy_prefix(runtime, executor, system_lib_prefix, mod_name)
    if isinstance(byoc, str):
        byoc = [byoc]
    with tgt:
        with progress.stage("Optimizing graph"):
            fused = optimize(func, params, byoc, mod_name, quantize_weights,
                             vm=executor == "vm", int8_products=int8_products)
        calls = primitive_calls(fused)
        if tuning is not None:
            tuning.bind(str(tgt))
            if tgt.levels:
                tuning.skip(f"a multi-level target, {tgt}")
        if not tgt.levels:
            kernels, kernel_names = _lower_kernels(calls, tuning=tuning)
            if tuning is not None:
                log.info("%s", tuning.summary())
    # A multi-level target: one graph (its widest level's layouts), each level's schedules.
    per_level: dict[str, list[L.PrimFunc]] = {}
    for level in tgt.levels:
        with tgt.level(level):
            per_level[level], kernel_names = _lower_kernels(calls, f" for {level}")
    if per_level:
        kernels = per_level[tgt.levels[-1]]
    symbols = {k.name: prefix + k.name for k in kernels}
    # named as the graph calls them; every level's, for the C runtime's workspace size
    graph_kernels = [k for ks in per_level.values() for k in ks] or kernels
    if prefix:
        kernels = [L.PrimFunc(prefix + k.name, k.params, k.body, k.attrs) for k in kernels]
    if tgt.kind == "llvm" and tgt.levels:
        from kiln.codegen.llvm.multi_level import build_multi_level

        if prefix:
            per_level = {level: [L.PrimFunc(prefix + k.name, k.params, k.body, k.attrs)
                                 for k in ks] for level, ks in per_level.items()}
        with progress.stage(f"Generating code with LLVM for {', '.join(tgt.levels)}"):
            lib = build_multi_level(per_level, tgt)
    else:
        codegen = get_codegen(tgt.kind)
        with progress.stage(codegen.stage):
            lib = codegen.build(kernels, tgt)
    if byoc:
        from kiln.byoc import build_external
        from kiln.runtime import create_metadata_module

        with progress.stage("Running external codegens"):
            ext_modules, ext_consts = build_external(fused)
            lib = create_metadata_module(ext_consts, lib, ext_modules)
    if executor == "vm":
        with progress.stage("Compiling VM bytecode"):
            return vm_executable(fused, kernels, kernel_names, lib)
    with progress.stage("Planning memory"):
        graph, consts, plan = graph_json(fused, kernel_names)
    log.debug("graph: %d kernels for %d fused calls, storage pool %d bytes",
              len(kernels), len(calls), plan.total_bytes)
    if runtime == "crt" or executor == "aot":
        return _deployable(graph, lib, consts, mod_name, tgt, graph_kernels, symbols,
                           prefix, executor)
    return GraphExecutorFactoryModule(graph, lib, consts, mod_name)


RUNTIMES = (None, "crt")
EXECUTORS = ("graph", "aot", "vm")


def symbolic_params(func: Function) -> list[str]:
    """The parameters of ``func`` with symbolic dims, as ``"x[batch, 3, 224, 224]"``."""
    return [f"{p.name}[{', '.join(map(str, p.checked_type.shape))}]" for p in func.params
            if not p.checked_type.is_static]


def choose_executor(func: Function, executor: str | None, runtime: str | None = None) -> str:
    """The executor of a build — the one choice ``kiln.build`` and ``kiln compile`` share.

    ``executor``, or the default: ``"vm"`` when an input has symbolic dims, the graph has a
    run-time If or Loop, or an op the VM runs itself (a data-dependent output shape: NonZero,
    Unique...; docs/decisions/016-data-dependent-shapes.md), else ``"graph"``. With
    ``runtime="crt"`` (the C runtime, ``--system-lib``) the default is ``"graph"``: the C
    runtime has no VM.

    Raises
    ------
    CompileError
        An unknown executor; the graph or AOT executor, or the C runtime, for a model with
        symbolic dims (the message lists the inputs and how to fix them), a run-time If or
        Loop, or data-dependent shapes (the message names the ops).
    """
    symbolic = sorted(symbolic_params(func))
    nodes = list(post_order(func.outputs))
    control_flow = any(isinstance(n, (IfCall, LoopCall)) for n in nodes)
    runtime_ops = sorted({n.op.name for n in nodes if isinstance(n, Call) and n.op.runtime})
    return executor_for(executor, runtime, symbolic, runtime_ops, control_flow)


def executor_for(executor: str | None, runtime: str | None = None,
                 symbolic: Sequence[str] = (), runtime_ops: Sequence[str] = (),
                 control_flow: bool = False) -> str:
    """The rules of :func:`choose_executor` over what a model needs: the inputs with symbolic
    dims (``"x[batch, 3]"``), the ops the VM runs itself, whether it has a run-time If or Loop.
    ``kiln compile`` asks them early, from the ONNX inputs alone, when an executor or the C
    runtime is requested (the same errors, before the import).
    """
    if executor not in (None, *EXECUTORS):
        raise CompileError(f"unknown executor {executor!r}: expected one of {EXECUTORS}")
    needs_vm = bool(symbolic or control_flow or runtime_ops)
    if executor is None and runtime != "crt":
        return "vm" if needs_vm else "graph"
    if executor == "vm" and runtime == "crt":
        raise CompileError("the C runtime (runtime='crt', --system-lib) has no VM executor; "
                           "use the Python or native runtime, or static shapes with the graph "
                           "executor")
    if executor == "vm":
        return executor
    what = (f"the {executor} executor" if executor else
            "the C runtime (runtime='crt', --system-lib)")
    if symbolic:
        raise CompileError(f"{what} needs static shapes, but these inputs have symbolic dims: "
                           f"{', '.join(symbolic)}; fix them (--input-shape NAME:SHAPE or "
                           "--dim NAME=N; shape= in from_onnx) or compile for the VM "
                           "(executor 'vm', the default)")
    if runtime_ops:
        raise CompileError(f"{what} cannot run ops whose output shape depends on data "
                           f"({', '.join(runtime_ops)}): their shapes are known only at run "
                           "time; compile for the VM (executor 'vm', the default)")
    if control_flow:
        raise CompileError(f"{what} cannot run an If or Loop decided by data; compile for the "
                           "VM (executor 'vm', the default)")
    return executor or "graph"


def vm_executable(fused: Function, kernels, kernel_names: dict[int, str], lib):
    """The VM executable of a fused function over its compiled kernel library."""
    from kiln.backend.vm_codegen import compile_vm
    from kiln.runtime.vm.executable import VMExecutable

    prog = compile_vm(fused, kernel_names, {k.name: list(k.attrs.get("symbol_args", []))
                                            for k in kernels})
    symbols = [(s.name, s.lo, s.hi, s.divisor) for s in prog.symbols]
    return VMExecutable(symbols, prog.functions, prog.constants, prog.code, lib=lib,
                        sources=prog.sources)


def deploy_prefix(runtime: str | None, executor: str, system_lib_prefix: str,
                  mod_name: str) -> str:
    """The symbol prefix of the kernels: ``kiln_<mod_name>_`` for AOT (TVM: ``tvmgen_<name>_``),
    ``system_lib_prefix`` for the C runtime's graph executor.

    Raises
    ------
    CompileError
        An unknown runtime or executor, or a prefix without ``runtime="crt"``.
    """
    if runtime not in RUNTIMES:
        raise CompileError(f"unknown runtime {runtime!r}: expected 'crt' or None (Python)")
    if executor not in EXECUTORS:
        raise CompileError(f"unknown executor {executor!r}: expected one of {EXECUTORS}")
    if system_lib_prefix and runtime != "crt":
        raise CompileError("system_lib_prefix needs runtime='crt' (the system library)")
    if executor == "aot":
        from kiln.backend.aot_codegen import c_identifier

        return f"kiln_{c_identifier(mod_name)}_"
    return system_lib_prefix


def _deployable(graph, lib, consts, mod_name, tgt, kernels, symbols, prefix, executor):
    """The C runtime's system library (registry imported by ``lib``) or the AOT factory."""
    from kiln.backend.kernel_workspace import workspace_bytes
    from kiln.codegen.system_lib import create_system_lib_module, system_lib_functions

    if executor == "aot":
        from kiln.backend.aot_codegen import aot_codegen
        from kiln.crt.aot_factory import AotExecutorFactory

        system_lib_functions(lib)  # the same rule: everything must link statically
        with progress.stage("Generating the AOT executor"):
            sources = aot_codegen(graph, consts, kernels, symbols, mod_name)
        return AotExecutorFactory(lib, sources, mod_name)
    reg = create_system_lib_module(lib, tgt, symbols, prefix)
    reg.workspace_bytes = max((workspace_bytes(k) for k in kernels), default=0)
    return GraphExecutorFactoryModule(graph, lib, consts, mod_name)


def _tuning(records):
    """An ApplyHistoryBest for ``build``'s ``tuning_records`` (None: no records)."""
    if records is None:
        return None
    from kiln.driver.apply_history import ApplyHistoryBest

    return records if isinstance(records, ApplyHistoryBest) else ApplyHistoryBest(records)


def _lower_kernels(calls: list[PrimitiveCall], what: str = "", tuning=None):
    names: dict[int, str] = {}
    by_key: dict[str, str] = {}
    kernels = []
    used: set[str] = set()
    with progress.task(f"Lowering kernels{what}", total=len(calls)) as advance:
        for call in calls:
            key = structural_key(call.body)
            if key not in by_key:
                name = _unique(call.name, used)
                try:
                    kernels.append(lower_primitive(call, name) if tuning is None
                                   else tuning.lower(call, name))
                except CompileError:
                    raise
                except Exception as err:  # a bug, but name the kernel the user can report
                    raise CompileError(f"lowering {name} failed: {err}") from err
                by_key[key] = name
            names[call.uid] = by_key[key]
            advance()
    return kernels, names


def _unique(name: str, used: set[str]) -> str:
    cand, k = name, 0
    while cand in used:
        k += 1
        cand = f"{name}_{k}"
    used.add(cand)
    return cand
