"""What an exported library's code needs from the CPU: the ``__kiln_target_info`` record
(docs/formats.md §2.1, docs/decisions/031-cpu-features-check.md).

``export_library`` calls the global function ``codegen.target_info`` (registered here) with the
target strings of the tree's DSO modules and writes the JSON it returns into the library; the
loaders (``kiln.runtime.cpu_features``, the native runtime's ``rt_blob.c``) compare its
``features`` with the CPU's before any of the library's code runs.

How the features are found, per target kind:

- ``llvm`` on x86: **asked of LLVM itself**. llvmlite has no query for the features a CPU name
  implies, so one small module of probe functions is compiled for the target machine (its
  ``-mcpu`` and ``-mattr``, ``native`` resolved) and each function's assembly tells whether LLVM
  selected the feature's instructions (a ``<16 x float>`` add becomes ``vaddps %zmm`` only with
  AVX-512F, ``llvm.fma.f32`` a ``vfmadd`` only with FMA...). Features with no generic-IR pattern
  (VNNI, AMX) come from the target's own description: ``-mattr`` (which lists the host's features
  for ``-mcpu=native``) and :meth:`kiln.target.Target.int8_dot` (the VNNI instructions Kiln's
  codegen emits). A multi-level target (``-mcpu=portable``) records its lowest level: the
  kernels of the higher levels are only chosen on CPUs that have them.
- ``llvm`` on aarch64 and RISC-V: the ``+`` features of ``-mattr`` (RISC-V's RV64GC base
  included), and ``dotprod`` when the codegen emits it.
- ``c`` with ``-mcpu`` (``-march``) on this host's architecture: the feature macros the system C
  compiler defines for those flags (``__AVX512F__``...).
- anything else (``c`` without ``-mcpu``, ``jit``, BYOC source): the compiler's baseline, no
  feature recorded.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Sequence
from functools import lru_cache

from kiln.errors import KilnError
from kiln.runtime.cpu_features import KNOWN_FEATURES, TARGET_INFO_VERSION
from kiln.runtime.registry import register_func
from kiln.target import Target, host_cpu, triple_arch

_WIDE = "#0"
#: x86 feature → (probe function body over %a/%b/%c, regex its assembly matches with the feature)
_X86_PROBES: dict[str, tuple[str, str]] = {
    "sse4.2": ("<2 x i1> (<2 x i64> %a, <2 x i64> %b)", "icmp sgt <2 x i64> %a, %b",
               r"pcmpgtq"),
    "popcnt": ("i64 (i64 %a)", "call i64 @llvm.ctpop.i64(i64 %a)", r"\bpopcnt"),
    "avx": ("<8 x float> (<8 x float> %a, <8 x float> %b)", "fadd <8 x float> %a, %b",
            r"vaddps\s.*%ymm"),
    "avx2": ("<8 x i32> (<8 x i32> %a, <8 x i32> %b)", "add <8 x i32> %a, %b",
             r"vpaddd\s.*%ymm"),
    "fma": ("float (float %a, float %b, float %c)",
            "call float @llvm.fma.f32(float %a, float %b, float %c)", r"vfmadd"),
    "f16c": ("<4 x float> (<4 x half> %a)", "fpext <4 x half> %a to <4 x float>",
             r"vcvtph2ps"),
    "bmi2": ("i64 (i64 %a, i64 %b)", "shl i64 %a, %b", r"shlx"),
    "avx512f": ("<16 x float> (<16 x float> %a, <16 x float> %b) #0",
                "fadd <16 x float> %a, %b", r"vaddps\s.*%zmm"),
    "avx512bw": ("<64 x i8> (<64 x i8> %a, <64 x i8> %b) #0", "add <64 x i8> %a, %b",
                 r"vpaddb\s.*%zmm"),
    "avx512cd": ("<16 x i32> (<16 x i32> %a) #0",
                 "call <16 x i32> @llvm.ctlz.v16i32(<16 x i32> %a, i1 false)", r"vplzcntd"),
    "avx512dq": ("<8 x i64> (<8 x i64> %a, <8 x i64> %b) #0", "mul <8 x i64> %a, %b",
                 r"vpmullq"),
    "avx512vl": ("<2 x i64> (<2 x i64> %a)",
                 "call <2 x i64> @llvm.abs.v2i64(<2 x i64> %a, i1 false)",
                 r"vpabsq\s.*%xmm0, %xmm0"),
    "avx512bf16": ("<16 x bfloat> (<16 x float> %a) #0",
                   "fptrunc <16 x float> %a to <16 x bfloat>", r"vcvtneps2bf16"),
    "avx512fp16": ("<32 x half> (<32 x half> %a, <32 x half> %b) #0",
                   "fadd <32 x half> %a, %b", r"vaddph"),
    "avx512vpopcntdq": ("<16 x i32> (<16 x i32> %a) #0",
                        "call <16 x i32> @llvm.ctpop.v16i32(<16 x i32> %a)", r"vpopcntd"),
    "avx512bitalg": ("<64 x i8> (<64 x i8> %a) #0",
                     "call <64 x i8> @llvm.ctpop.v64i8(<64 x i8> %a)", r"vpopcntb"),
}
#: x86 features with no generic-IR probe, read from ``-mattr`` (the host's list for native).
#: AMX is never required: Kiln's AMX kernels ask the CPU and the OS at run time and fall back
#: to their VNNI / AVX2 loops (support/amx.c, docs/decisions/026-amx.md)
_X86_FROM_MATTR = ("avx512vnni", "avx512vbmi", "avx512vbmi2", "avx512ifma", "avxvnni")
#: features whose code is dispatched at run time, never required of the loading CPU
_RUN_TIME_DISPATCHED = frozenset({"amx-tile", "amx-int8", "amx-bf16"})
#: gcc/clang macros of the x86 features (``-dM -E``)
_MACRO = re.compile(r"#define __([A-Z0-9_]+)__ 1")


def _probe_module(triple: str) -> str:
    lines = [f'target triple = "{triple}"']
    for i, (sig, body, _) in enumerate(_X86_PROBES.values()):
        ret, rest = sig.split(" (", 1)
        lines.append(f"define {ret} @kiln_probe_{i}({rest} {{\n  %r = {body}\n  ret {ret} %r\n}}")
    lines.append(f'attributes {_WIDE} = {{ "min-legal-vector-width"="512" '
                 '"prefer-vector-width"="512" }')
    return "\n".join(lines) + "\n"


@lru_cache(maxsize=64)
def _llvm_x86_probed(spec: str) -> tuple[str, ...]:
    """The :data:`_X86_PROBES` features LLVM selects instructions of for ``spec``."""
    from kiln.codegen.llvm.machine import llvm_binding, target_machine

    target = Target(spec)
    llvm = llvm_binding()
    mod = llvm.parse_assembly(_probe_module(target.triple), context=llvm.create_context())
    asm = target_machine(target).emit_assembly(mod)
    parts = re.split(r"\nkiln_probe_(\d+):", asm)
    names = list(_X86_PROBES)
    found = set()
    for i in range(1, len(parts), 2):
        name = names[int(parts[i])]
        if re.search(_X86_PROBES[name][2], parts[i + 1].split(".Lfunc_end", 1)[0]):
            found.add(name)
    return tuple(n for n in names if n in found)


def _mattr_on(target: Target) -> dict[str, bool]:
    """Each feature's last ``+``/``-`` in :attr:`Target.mattr`."""
    return {f[1:]: f[0] == "+" for f in target.mattr}


def _llvm_features(target: Target) -> list[str]:
    arch = target.arch
    if target.levels:
        target = target.level(target.levels[0])
    on = _mattr_on(target)
    if arch == "x86_64":
        feats = set(_llvm_x86_probed(str(target)))
        feats |= {f for f in _X86_FROM_MATTR if on.get(f)}
        dot = target.int8_dot()
        if dot == "vnni512" or (dot == "vnni256" and "avx512vl" in feats):
            feats.add("avx512vnni")
        elif dot == "vnni256":
            feats.add("avxvnni")
        if "avx512f" not in feats:  # -mattr=-avx512f turns every AVX-512 extension off
            feats = {f for f in feats if not f.startswith("avx512")}
        if "avx2" not in feats:
            feats -= {"avxvnni"}
    else:
        feats = {f for f, v in on.items() if v}
        if arch == "aarch64" and target.int8_dot() == "dotprod":
            feats.add("dotprod")
    return _ordered(arch, feats)


def _ordered(arch: str, feats: set[str]) -> list[str]:
    known = KNOWN_FEATURES.get(arch, ())
    return [f for f in known if f in feats] + sorted(f for f in feats if f not in known)


@lru_cache(maxsize=16)
def _c_features(options: tuple[str, ...], arch: str) -> tuple[str, ...]:
    """The x86 features the system C compiler enables for ``options`` (its feature macros)."""
    from kiln.errors import ToolchainError
    from kiln.runtime.toolchain.compiler import find_cc

    try:
        out = subprocess.run([*find_cc(), *options, "-dM", "-E", "-x", "c", "/dev/null"],
                             capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError, ToolchainError):
        return ()
    macros = set(_MACRO.findall(out))
    return tuple(f for f in KNOWN_FEATURES.get(arch, ())
                 if re.sub(r"[.-]", "_", f).upper() in macros and f not in _RUN_TIME_DISPATCHED)


def module_target_info(spec: str, compile_options: Sequence[str] = ()) -> dict:
    """The record of one module compiled for ``spec`` (a target string; "" = unknown)."""
    if not spec:
        return {"target": "", "triple": "", "cpu": "", "features": [], "levels": []}
    target = Target(spec)
    info = {"target": str(target), "triple": target.triple, "cpu": "", "features": [],
            "levels": list(target.levels)}
    if target.kind == "llvm":
        info["cpu"] = target.mcpu
        info["features"] = _llvm_features(target)
    elif target.kind == "c":
        cpu = target.options.get("mcpu")
        if isinstance(cpu, str):
            info["cpu"] = cpu
            if cpu == "native":
                try:
                    info["cpu"] = host_cpu()[0]
                except KilnError:  # no llvmlite: the name stays "native"
                    pass
            if target.is_native and target.arch == "x86_64":
                info["features"] = list(_c_features(tuple(compile_options), target.arch))
    return info


def target_info(specs: Sequence[str], options: Sequence[Sequence[str]] = ()) -> str:
    """``__kiln_target_info`` for a library whose DSO modules were compiled for ``specs``:
    the first module with a target names the target, triple and CPU; ``features`` is the union
    over all modules, in :data:`KNOWN_FEATURES` order. Returns the JSON text."""
    opts = list(options) + [()] * (len(specs) - len(options))
    infos = [module_target_info(s, tuple(o)) for s, o in zip(specs, opts)]
    main = next((i for i in infos if i["target"]), None) or module_target_info("")
    feats: set[str] = set()
    for i in infos:
        feats.update(i["features"])
    arch = triple_arch(main["triple"]) if main["triple"] else ""
    record = {"version": TARGET_INFO_VERSION, **main, "features": _ordered(arch, feats)}
    return json.dumps(record, separators=(",", ":"))


register_func("codegen.target_info", target_info, override=True)

__all__ = ["module_target_info", "target_info"]
