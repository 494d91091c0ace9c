"""Targets: a description of the hardware code is generated for (TVM's ``tvm.target.Target``,
python/tvm/target/target.py and src/target/llvm/llvm_instance.cc).

A target string is a kind followed by ``-key=value`` options: ``"c"``,
``"llvm -mtriple=riscv64-unknown-linux-gnu -mcpu=generic-rv64 -mattr=+v"``, ``"jit"``. The
target only describes; codegens and schedules dispatch on it.

The ``jit`` kind is a source-embedded device (the ``my_device`` of TVM's custom-device
examples): every kernel is generated as C source that the artifact carries and the runtime
compiles where the model runs (:mod:`kiln.runtime.jit.device_module`). It takes no options. Its
host (``host="c"`` or ``"llvm"``, default ``"c"``, as TVM's ``Target("my_device",
host="llvm")``) is checked and recorded; with every kernel on the device, Kiln has no host code
to generate — the exported library holds only the blob and the support code, which the system C
compiler builds for either host. Schedules assume 128-bit vectors for it (SSE, NEON, RVV with
VLEN=128): the device is not known at build time.

Options of the ``llvm`` kind (LLVM's names):

- ``-mtriple``: the target triple (default: the host's, from LLVM);
- ``-mcpu``: the CPU name; ``native`` is the host CPU, and also enables the host's features;
  on x86-64 a comma-separated list of psABI microarchitecture levels (``x86-64``,
  ``x86-64-v2``, ``x86-64-v3``, ``x86-64-v4``) or ``portable`` (= ``x86-64-v2,x86-64-v3,
  x86-64-v4``) asks for a multi-level library: every kernel compiled once per level and chosen
  on the CPU when the library is loaded (:mod:`kiln.codegen.llvm.multi_level`,
  docs/decisions/023-default-target-and-multi-level.md);
- ``-mattr``: comma-separated features, ``+avx2,-avx512f`` (applied after the CPU's own);
- ``-mabi``: the ABI name (RISC-V: default ``lp64d`` when the D extension is on);
- ``-opt-level``: 0-3 (default 3).

Schedules read the SIMD width from :meth:`Target.vector_bits` / :meth:`Target.vector_lanes`:
512 bits with AVX-512, 256 with AVX/AVX2, 128 for SSE, NEON and RVV with VLEN=128 (``zvl<N>b``
raises it). The LLVM host queries (``-mcpu=native``, the default triple) import llvmlite lazily;
nothing else here depends on a code generator.

An ``llvm`` target's ``-mcpu`` and ``-mattr`` names are checked when it is constructed, by the
diagnostics of an LLVM target machine for its triple (cached; under a millisecond).

May import: kiln.errors and kiln.target_llvm_names only.
"""

from __future__ import annotations

import platform
import threading
from functools import lru_cache
from typing import Any

from kiln.errors import KilnError
from kiln.target_llvm_names import check_llvm_names, user_features

KINDS = ("c", "llvm", "jit")
#: what may host a ``jit`` target
JIT_HOSTS = ("c", "llvm")
LLVM_OPTIONS = ("mtriple", "mcpu", "mattr", "mabi", "opt-level")

# x86 CPU names (LLVM's) by widest float vector: the rest are SSE-only (128 bits). Sources: LLVM
# llvm/lib/Target/X86/X86.td (ProcessorFeatures) and llvm/lib/TargetParser/X86TargetParser.cpp.
_X86_AVX512 = frozenset((
    "skylake-avx512", "cascadelake", "cooperlake", "cannonlake", "icelake-client",
    "icelake-server", "tigerlake", "rocketlake", "sapphirerapids", "emeraldrapids",
    "graniterapids", "graniterapids-d", "diamondrapids", "znver4", "znver5", "knl", "knm",
    "x86-64-v4",
))
_X86_AVX = frozenset((
    "sandybridge", "corei7-avx", "ivybridge", "core-avx-i", "haswell", "core-avx2", "broadwell",
    "skylake", "alderlake", "raptorlake", "meteorlake", "arrowlake", "arrowlake-s", "lunarlake",
    "pantherlake", "gracemont", "sierraforest", "grandridge", "clearwaterforest", "znver1",
    "znver2", "znver3", "bdver1", "bdver2", "bdver3", "bdver4", "btver2", "x86-64-v3",
))
# x86 CPU names with AVX512-VNNI (``vpdpbusd`` on 512-bit vectors, and with AVX512VL on 256) and
# with AVX-VNNI only (the VEX form, 256 bits); same sources.
_X86_AVX512_VNNI = frozenset((
    "cascadelake", "cooperlake", "icelake-client", "icelake-server", "tigerlake", "rocketlake",
    "sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d", "diamondrapids",
    "znver4", "znver5",
))
#: aarch64 CPUs with FEAT_DotProd (SDOT / UDOT), by LLVM name; i8mm is read from -mattr only
_AARCH64_DOTPROD = frozenset((
    "cortex-a55", "cortex-a65", "cortex-a75", "cortex-a76", "cortex-a76ae", "cortex-a77",
    "cortex-a78", "cortex-a78c", "cortex-x1", "cortex-a510", "cortex-a710", "cortex-x2",
    "neoverse-n1", "neoverse-e1", "neoverse-v1", "neoverse-n2", "neoverse-v2", "apple-m1",
    "apple-m2",
))
#: x86 CPUs with AMX-TILE and AMX-INT8 (Intel SDM, CPUID.(EAX=07H,ECX=0):EDX[24, 25])
_X86_AMX_INT8 = frozenset(("sapphirerapids", "emeraldrapids", "graniterapids", "graniterapids-d",
                           "diamondrapids"))
_X86_AVX_VNNI = frozenset((
    "alderlake", "raptorlake", "meteorlake", "arrowlake", "arrowlake-s", "lunarlake",
    "pantherlake", "gracemont", "sierraforest", "grandridge", "clearwaterforest",
))
# Features Debian/Ubuntu's riscv64 port (the psABI's RV64GC) assumes; clang enables them by
# default for riscv64 Linux triples (clang/lib/Driver/ToolChains/Arch/RISCV.cpp).
_RISCV_LINUX_BASE = ("+m", "+a", "+f", "+d", "+c")

#: x86-64 microarchitecture levels, lowest first (the x86-64 psABI, "Micro-Architecture Levels";
#: LLVM and GCC know them as CPU names): baseline (SSE2), v2 (+SSE4.2, POPCNT), v3 (+AVX2, FMA,
#: BMI2), v4 (+AVX-512 F/BW/CD/DQ/VL)
X86_LEVELS = ("x86-64", "x86-64-v2", "x86-64-v3", "x86-64-v4")
#: what ``-mcpu=portable`` means: the levels of a library that runs on every x86-64-v2 CPU
#: (the baseline of RHEL 9 and other current distributions) at its best level
PORTABLE_LEVELS = ("x86-64-v2", "x86-64-v3", "x86-64-v4")
_LEVEL_BITS = {"x86-64": 128, "x86-64-v2": 128, "x86-64-v3": 256, "x86-64-v4": 512}

_ARCH_ALIASES = {"amd64": "x86_64", "x86-64": "x86_64", "arm64": "aarch64"}


@lru_cache(maxsize=1)
def host_triple() -> str:
    """The host's target triple (LLVM's process triple; ``<machine>-unknown-linux-gnu`` when
    llvmlite is not installed)."""
    try:
        import llvmlite.binding as llvm
    except ImportError:  # the C target works without llvmlite
        machine = _ARCH_ALIASES.get(platform.machine().lower(), platform.machine().lower())
        return f"{machine}-unknown-linux-gnu"
    return llvm.get_process_triple()


@lru_cache(maxsize=1)
def host_cpu() -> tuple[str, tuple[str, ...]]:
    """The host CPU's LLVM name and its feature list (``("+avx2", "-avx512f", ...)``).

    Raises
    ------
    KilnError
        If llvmlite is not installed.
    """
    try:
        import llvmlite.binding as llvm
    except ImportError:
        raise KilnError("-mcpu=native needs llvmlite to detect the host CPU "
                        "(pip install llvmlite)") from None
    try:
        features = llvm.get_host_cpu_features()
    except RuntimeError:  # LLVM cannot read this host's features: the CPU name implies them
        features = {}
    flat = tuple(("+" if on else "-") + name for name, on in sorted(features.items()))
    return llvm.get_host_cpu_name(), flat


def triple_arch(triple: str) -> str:
    """The architecture part of a triple, normalized (``x86_64``, ``aarch64``, ``riscv64``)."""
    arch = triple.split("-", 1)[0].lower()
    return _ARCH_ALIASES.get(arch, arch)


def default_target() -> str:
    """The fastest target for this host, the default of ``kiln compile`` and ``kiln.build``:
    ``"llvm -mcpu=native"`` when llvmlite is installed (in-process LLVM, the host's CPU and
    features), else ``"c -mcpu=native"`` (the system compiler with ``-march=native``) on x86-64
    and aarch64, else ``"c"``. The library runs on CPUs with this host's features; for an
    artifact that runs on any x86-64-v2 CPU at its best speed, use
    ``"llvm -mcpu=portable"`` (docs/decisions/023-default-target-and-multi-level.md)."""
    try:
        import llvmlite.binding  # noqa: F401
    except ImportError:
        arch = triple_arch(host_triple())
        return "c -mcpu=native" if arch in ("x86_64", "aarch64") else "c"
    return "llvm -mcpu=native"


def parse_levels(cpu: str) -> tuple[str, ...]:
    """The x86-64 levels of a multi-level ``-mcpu`` (``"portable"`` or a comma-separated list
    of :data:`X86_LEVELS`), lowest first, without duplicates; () for a single CPU name.

    Raises
    ------
    KilnError
        A list naming something that is not an x86-64 level.
    """
    if cpu == "portable":
        return PORTABLE_LEVELS
    if "," not in cpu:
        return ()
    names = [c.strip() for c in cpu.split(",") if c.strip()]
    bad = [n for n in names if n not in X86_LEVELS]
    if bad:
        raise KilnError(f"-mcpu={cpu}: {bad[0]!r} is not an x86-64 level; a multi-level "
                        f"library takes levels from {', '.join(X86_LEVELS)} (or "
                        "-mcpu=portable)")
    return tuple(level for level in X86_LEVELS if level in names)


class Target:
    """A parsed target.

    Parameters
    ----------
    spec : str or Target
        ``"c"``, ``"llvm [-mtriple=...] [-mcpu=...] [-mattr=...] [-mabi=...]"`` or ``"jit"``.
    host : str or Target, optional
        The target of host-side code (TVM's ``target.host``); CPU targets are their own host;
        ``jit`` takes ``"c"`` (the default) or ``"llvm"``.

    Attributes
    ----------
    kind : str
        ``"c"``, ``"llvm"`` or ``"jit"``.
    options : dict
        The ``-key=value`` options as written (``{"mcpu": "native"}``).
    keys : tuple of str
        Schedule keys (``("cpu",)`` for both kinds).

    Raises
    ------
    KilnError
        Unknown kind, malformed option, an unknown ``llvm`` option or a bad ``-opt-level``,
        an option on ``jit`` or a ``jit`` host other than ``c`` or ``llvm``; CompileError: an
        ``llvm`` ``-mcpu`` or ``-mattr`` name LLVM does not know for the triple.
    """

    __slots__ = ("host", "keys", "kind", "options")
    _local = threading.local()

    def __init__(self, spec: str | Target, host: str | Target | None = None):
        if isinstance(spec, Target):
            kind, options, keys = spec.kind, dict(spec.options), spec.keys
            host = host if host is not None else spec.host
        else:
            kind, options = _parse(spec)
            keys = ("cpu",)
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "keys", keys)
        if kind == "jit" and host is None:
            host = "c"
        object.__setattr__(self, "host", Target(host) if host is not None else None)
        if kind == "jit" and self.host is not None and self.host.kind not in JIT_HOSTS:
            raise KilnError(f"target 'jit': host must be one of {', '.join(JIT_HOSTS)}, got "
                            f"'{self.host}'")
        if self.levels:
            if kind != "llvm":
                raise KilnError(f"target '{self}': a multi-level -mcpu needs the llvm target "
                                f"(llvm -mcpu={options['mcpu']})")
            if self.arch != "x86_64" or self.options.get("mattr"):
                raise KilnError(f"target '{self}': multi-level libraries are for x86_64 "
                                f"(triple {self.triple}) and take no -mattr")
        if kind == "llvm" and not isinstance(spec, Target):
            check_llvm_names(str(self), self.triple, self.options, bool(self.levels))

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Target is immutable")

    # -- identity
    def __str__(self) -> str:
        return " ".join([self.kind] + [f"-{k}={v}" for k, v in self.options.items()])

    def __repr__(self) -> str:
        host = f", host={str(self.host)!r}" if self.host is not None else ""
        return f"Target({str(self)!r}{host})"

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Target) and str(self) == str(other)
                and str(self.host) == str(other.host))

    def __hash__(self) -> int:
        return hash((str(self), str(self.host)))

    # -- the current target (``with target:``)
    def __enter__(self) -> Target:  # noqa: PYI034 (Target is not meant to be subclassed)
        _stack(self._local).append(self)
        return self

    def __exit__(self, *exc: object) -> None:
        _stack(self._local).pop()

    @classmethod
    def current(cls, allow_none: bool = True) -> Target | None:
        """The innermost target entered with ``with target:`` (TVM's ``Target.current``).

        Raises
        ------
        KilnError
            If there is none and ``allow_none`` is False.
        """
        stack = _stack(cls._local)
        if stack:
            return stack[-1]
        if not allow_none:
            raise KilnError("no current target: use `with kiln.target.Target(...):`")
        return None

    # -- LLVM description
    @property
    def triple(self) -> str:
        """``-mtriple``, else the host triple."""
        return str(self.options.get("mtriple") or host_triple())

    @property
    def arch(self) -> str:
        """The triple's architecture: ``x86_64``, ``aarch64``, ``riscv64``..."""
        return triple_arch(self.triple)

    @property
    def is_native(self) -> bool:
        """True when code for this target runs on this host (same architecture)."""
        return self.arch == triple_arch(host_triple())

    @property
    def levels(self) -> tuple[str, ...]:
        """The x86-64 levels of a multi-level target (``-mcpu=portable`` or a list), lowest
        first; () for a single-CPU target (``-mcpu=native`` pins one)."""
        cpu = self.options.get("mcpu")
        return parse_levels(cpu) if isinstance(cpu, str) else ()

    def level(self, name: str) -> Target:
        """This target pinned to one of its :attr:`levels` (``-mcpu=<name>``): the target each
        level's kernels are compiled for.

        Raises
        ------
        KilnError
            If ``name`` is not one of :attr:`levels`.
        """
        if name not in self.levels:
            raise KilnError(f"target '{self}' has no level {name!r} (levels: "
                            f"{', '.join(self.levels) or 'none'})")
        spec = " ".join([self.kind] + [f"-{k}={name if k == 'mcpu' else v}"
                                       for k, v in self.options.items()])
        return Target(spec, host=self.host)

    @property
    def mcpu(self) -> str:
        """The CPU name for LLVM: ``-mcpu`` with ``native`` resolved, the lowest level of a
        multi-level target (what code outside the kernels is built for); else the triple's
        generic CPU (``generic-rv64`` on riscv64, "" = LLVM's default elsewhere)."""
        cpu = str(self.options.get("mcpu") or "")
        if cpu == "native":
            return host_cpu()[0]
        if self.levels:
            return self.levels[0]
        if not cpu and self.arch == "riscv64":
            return "generic-rv64"
        return cpu

    @property
    def mattr(self) -> tuple[str, ...]:
        """Features for LLVM, in order (later wins): the host's with ``-mcpu=native``, the
        RV64GC base on riscv64 Linux triples, then ``-mattr``."""
        feats: list[str] = []
        if self.options.get("mcpu") == "native":
            feats += host_cpu()[1]
        if self.arch == "riscv64" and "linux" in self.triple:
            feats += _RISCV_LINUX_BASE
        return tuple(feats) + user_features(self.options.get("mattr"))

    @property
    def mabi(self) -> str:
        """``-mabi``, else ``lp64d`` on riscv64 with the D extension, else ""."""
        abi = str(self.options.get("mabi") or "")
        if not abi and self.arch == "riscv64" and self.has_feature("d"):
            return "lp64d"
        return abi

    @property
    def opt_level(self) -> int:
        return int(self.options.get("opt-level", 3))

    def has_feature(self, name: str) -> bool:
        """Whether the last ``+name``/``-name`` in :attr:`mattr` enables ``name`` (features the
        CPU name implies are not listed there; see :meth:`vector_bits`)."""
        on = None
        for f in self.mattr:
            if f[1:] == name:
                on = f[0] == "+"
        return bool(on)

    # -- what schedules need
    def vector_bits(self) -> int:
        """Width in bits of the widest SIMD register for floats (0: no SIMD unit).

        x86: 512 with AVX-512F, 256 with AVX, else 128 (SSE2 is in the x86-64 baseline);
        aarch64: 128 (NEON); riscv64: the ``zvl<N>b`` minimum VLEN with V (128 for plain
        ``+v``), 0 without; the ``c`` kind without ``-mcpu``: 128 on x86_64 and aarch64 (the
        system compiler's default baseline), with ``-mcpu`` (``-march``) as for ``llvm``;
        ``jit``: 128 (its device is chosen at run time; SSE, NEON and RVV all have 128 bits);
        a multi-level target: its widest level's (graph layouts are shared by all levels).
        """
        if self.kind == "jit":
            return 128
        if self.levels:  # layouts are decided once, for the widest level
            return _LEVEL_BITS[self.levels[-1]]
        arch = self.arch
        if self.kind == "c" and not self.options.get("mcpu"):
            return 128 if arch in ("x86_64", "aarch64") else 0
        if arch in ("x86_64", "i686", "i386"):
            cpu = self.mcpu
            level = 512 if cpu in _X86_AVX512 else 256 if cpu in _X86_AVX else 128
            for f in self.mattr:
                on, name = f[0] == "+", f[1:]
                if name == "avx512f":
                    level = 512 if on else min(level, 256)
                elif name == "avx":
                    level = max(level, 256) if on else 128
                elif name == "avx2" and on:
                    level = max(level, 256)
            return level
        if arch in ("aarch64", "arm"):
            return 128
        if arch in ("riscv64", "riscv32"):
            if not (self.has_feature("v") or any(self.has_feature(f"zve{w}{t}")
                                                 for w in (32, 64) for t in "xfd")):
                return 0
            vlen = 128 if self.has_feature("v") else 32
            for f in self.mattr:
                name = f[1:]
                if f[0] == "+" and name.startswith("zvl") and name.endswith("b"):
                    vlen = max(vlen, int(name[3:-1]))
            return vlen
        return 0

    def _x86_feature(self, name: str, cpus: frozenset) -> bool:
        """Whether x86 feature ``name`` is on: implied by the CPU name unless ``-name``, or
        ``+name`` in :attr:`mattr` (``native`` lists the host's)."""
        on = self.mcpu in cpus
        for f in self.mattr:
            if f[1:] == name:
                on = f[0] == "+"
        return on

    def int8_dot(self) -> str:
        """How the LLVM codegen emits vectors of the ``dot_u8i8x4`` intrinsic (u8 × s8 quads,
        docs/decisions/021): "vnni512" / "vnni256" (``vpdpbusd``: AVX512-VNNI, or AVX-VNNI
        on 256-bit vectors), "avx512bw" / "avx2" (exact ``vpmaddwd`` pairs), "i8mm" (aarch64
        with ``+i8mm`` in ``-mattr``: NEON ``usdot``, u8 × s8 quads as they are), "dotprod"
        (aarch64 with ``+dotprod`` or a CPU that has it, no i8mm: same-sign ``sdot`` on the
        unsigned bytes offset by -128, and the offset's products subtracted), "" elsewhere
        (plain integer IR)."""
        if self.kind == "llvm" and self.arch == "aarch64":
            if self.has_feature("i8mm"):
                return "i8mm"
            dotprod = self.mcpu in _AARCH64_DOTPROD
            for f in self.mattr:
                if f[1:] == "dotprod":
                    dotprod = f[0] == "+"
            return "dotprod" if dotprod else ""
        if self.kind != "llvm" or self.arch != "x86_64":
            return ""
        bits = self.vector_bits()
        if self._x86_feature("avx512vnni", _X86_AVX512_VNNI):
            return "vnni512" if bits == 512 else "vnni256" if bits == 256 else ""
        if bits == 256 and self._x86_feature("avxvnni", _X86_AVX_VNNI):
            return "vnni256"
        if bits == 512:
            return "avx512bw" if self._x86_feature("avx512bw", _X86_AVX512 - {"knl", "knm"}) \
                else ""
        return "avx2" if bits == 256 and self._x86_feature("avx2", _X86_AVX - {
            "sandybridge", "corei7-avx", "ivybridge", "core-avx-i", "bdver1", "bdver2",
            "btver2"}) else ""

    def int8_maddubs(self) -> bool:
        """Whether ``vpmaddubsw`` is this target's fastest u8 × s8 product: an x86-64 ``llvm``
        or ``c`` target with AVX2 and neither VNNI (AVX512-VNNI, AVX-VNNI) nor AMX-INT8; a
        multi-level one when one of its levels is (``portable``: x86-64-v3 and -v4, none with
        VNNI; the graph is shared, so every level computes the same saturating sums). There
        the integer dense and conv kernels may take ``dot_u8i8x4_sat16`` (``vpmaddubsw`` +
        ``vpmaddwd`` with ones) where the weights prove that no pair sum saturates, or
        everywhere with ``int8_products="saturate"`` (docs/decisions/049). ``-mcpu=native``
        needs llvmlite to list the host's features (False without it)."""
        if self.levels:
            return any(self.level(name).int8_maddubs() for name in self.levels)
        if self.kind not in ("llvm", "c") or self.arch != "x86_64":
            return False
        try:
            if self.vector_bits() < 256 or not self._x86_feature("avx2", _X86_AVX - {
                    "sandybridge", "corei7-avx", "ivybridge", "core-avx-i", "bdver1",
                    "bdver2", "btver2"} | _X86_AVX512 - {"knl", "knm"}):
                return False
            vnni = self._x86_feature("avx512vnni", _X86_AVX512_VNNI) or \
                self._x86_feature("avxvnni", _X86_AVX_VNNI)
            return not vnni and not self.amx_int8()
        except KilnError:
            return False

    def amx_int8(self) -> bool:
        """Whether integer dense kernels try the support library's AMX ``tdpbusd`` kernel first
        (docs/decisions/026-amx.md): an x86-64 ``llvm`` or ``c`` target whose CPU has AMX-INT8
        (Sapphire Rapids and later by name, ``+amx-int8`` in ``-mattr``, or ``-mcpu=native`` on
        such a host). ``KILN_AMX=0`` or a CPU / kernel without AMX still run the VNNI / AVX2
        loops at run time. ``c -mcpu=native`` without llvmlite (no host feature list): False."""
        if self.kind not in ("llvm", "c") or self.arch != "x86_64":
            return False
        try:
            return self._x86_feature("amx-int8", _X86_AMX_INT8)
        except KilnError:  # -mcpu=native needs llvmlite to list the host's features
            return False

    def vector_registers(self) -> int:
        """SIMD registers the register-blocked schedules may fill: 16 on x86 below AVX-512
        (``xmm``/``ymm0``–``15``), 32 with AVX-512 (``zmm0``–``31``) and on aarch64 / RISC-V
        (``v0``–``v31``) and for the other kinds (no register file is assumed there); a
        multi-level target counts its widest level's, as :meth:`vector_bits` does (its kernels
        are scheduled under :meth:`level`)."""
        if self.kind != "jit" and self.arch in ("x86_64", "i686", "i386") \
                and 0 < self.vector_bits() < 512:
            return 16
        return 32

    def vector_lanes(self, dtype: str = "float32") -> int:
        """Elements of ``dtype`` per SIMD register (at least 1)."""
        bits = {"float64": 64, "int64": 64, "uint64": 64, "float32": 32, "int32": 32,
                "uint32": 32, "float16": 16, "int16": 16, "uint16": 16, "int8": 8,
                "uint8": 8, "bool": 8}.get(dtype)
        if bits is None:
            raise KilnError(f"vector_lanes: unknown dtype {dtype!r}")
        return max(1, self.vector_bits() // bits)


def _stack(local: threading.local) -> list[Target]:
    if not hasattr(local, "stack"):
        local.stack = []
    return local.stack


def _parse(spec: str) -> tuple[str, dict[str, Any]]:
    words = str(spec).split()
    if not words or words[0] not in KINDS:
        raise KilnError(f"unknown target '{spec}': expected one of {', '.join(KINDS)}")
    options: dict[str, Any] = {}
    for w in words[1:]:
        if not w.startswith("-"):
            raise KilnError(f"target '{spec}': option '{w}' must look like -key=value")
        key, _, value = w.lstrip("-").partition("=")
        options[key] = value or True
    if words[0] == "llvm":
        unknown = [k for k in options if k not in LLVM_OPTIONS]
        if unknown:
            raise KilnError(f"target '{spec}': unknown option -{unknown[0]} (llvm options: "
                            f"{', '.join('-' + o for o in LLVM_OPTIONS)})")
        level = options.get("opt-level", "3")
        if str(level) not in ("0", "1", "2", "3"):
            raise KilnError(f"target '{spec}': -opt-level must be 0, 1, 2 or 3, got {level}")
    if words[0] == "jit" and options:
        raise KilnError(f"target '{spec}': the jit target takes no options (its compiler and "
                        "flags are chosen where the model runs: KILN_DEVICE_CC, "
                        "KILN_DEVICE_CFLAGS)")
    return words[0], options
