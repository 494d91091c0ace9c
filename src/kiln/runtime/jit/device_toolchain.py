"""The device toolchain of the ``jit`` target: which compiler, which flags, and how to start the
device server for a foreign ISA (used by :mod:`kiln.runtime.jit.device_module`).

- the compiler: ``$KILN_DEVICE_CC`` (words, e.g. ``clang-14 --target=riscv64-linux-gnu``),
  default the host C compiler (``$CC``, ``cc``);
- the flags: ``-O3 -fPIC -std=gnu99``; ``-march=rv64gcv -mabi=lp64d`` when the compiler targets
  riscv64 (its ``-dumpmachine``), and with clang ``-mllvm -riscv-v-vector-bits-min=128`` so
  loops vectorize for RVV; ``-fopenmp-simd`` when the compiler accepts it (the kernels'
  ``#pragma omp simd`` hints; no OpenMP runtime is needed: parallel loops run on the support
  code's own thread pool, so a compiler without libgomp/libomp builds parallel kernels too);
  then ``$KILN_DEVICE_CFLAGS``; linked ``-shared -pthread``;
- foreign ISA (the compiler's ELF machine is not this host's) or ``$KILN_DEVICE_LAUNCHER`` set:
  the kernels run in the device server (``support/device_server.c``, built by the same compiler
  and cached), started under ``$KILN_DEVICE_LAUNCHER`` or ``qemu-<arch>`` user mode with the
  Debian cross sysroot (``-L /usr/<arch>-linux-gnu``; riscv64: ``-cpu rv64,v=true,vlen=128``).
"""

from __future__ import annotations

import functools
import logging
import os
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path

from kiln.errors import KilnError, ToolchainError
from kiln.native import SUPPORT_DIR
from kiln.runtime.elf import host_elf, triple_machine
from kiln.runtime.toolchain import cache_limit, compile_cache
from kiln.runtime.toolchain import compiler as toolchain
from kiln.runtime.toolchain.private_dir import private_dir, user_cache_dir

log = logging.getLogger("kiln")

SERVER_C = SUPPORT_DIR / "device_server.c"
#: the device flags every compile gets (the issue's ``-O3 -fPIC``; gnu99 as the host's)
BASE_FLAGS = ("-O3", "-fPIC", "-std=gnu99")
#: flags that make a riscv64 compiler emit RVV code (VLEN >= 128, Debian's lp64d ABI)
RISCV_FLAGS = ("-march=rv64gcv", "-mabi=lp64d")
RISCV_CLANG_FLAGS = ("-mllvm", "-riscv-v-vector-bits-min=128")
#: qemu-user CPU options per architecture (RVV on, VLEN 128)
QEMU_CPU = {"riscv64": ("-cpu", "rv64,v=true,vlen=128")}


def device_cache_dir() -> Path:
    """``$KILN_CACHE_DIR/device`` (default ``~/.cache/kiln/device``), private (``0700``)."""
    return private_dir(user_cache_dir() / "device", "device cache")


def device_compiler() -> list[str]:
    """The device compiler: ``$KILN_DEVICE_CC`` split into words, else the host C compiler.

    Raises
    ------
    ToolchainError
        If the named program is not found.
    """
    env = os.environ.get("KILN_DEVICE_CC", "").strip()
    if not env:
        return toolchain.find_cc()
    words = shlex.split(env)
    if shutil.which(words[0]) is None:
        raise ToolchainError(f"device compiler $KILN_DEVICE_CC={env!r} not found: install it "
                             "(Debian: apt-get install clang-14 or gcc-riscv64-linux-gnu) or "
                             "unset KILN_DEVICE_CC to use the host C compiler")
    return words


def compiler_arch(cc: Sequence[str]) -> str | None:
    """The architecture ``cc`` builds for (first word of ``-dumpmachine``: ``x86_64``,
    ``riscv64``), or None when it cannot tell."""
    triple = toolchain.dump_machine(cc)
    return triple.split("-", 1)[0].lower() if triple else None


@functools.lru_cache(maxsize=16)
def _is_clang(cc: tuple[str, ...]) -> bool:
    try:
        return "clang" in toolchain.run([*cc, "--version"]).lower()
    except ToolchainError:
        return False


_SIMD_PROBE = ("void kiln_probe(float* a) {\n#pragma omp simd\n"
               "for (int i = 0; i < 64; ++i) a[i] += 1.0f; }\n")


@functools.lru_cache(maxsize=16)
def openmp_flags(cc: tuple[str, ...], flags: tuple[str, ...]) -> tuple[str, ...]:
    """``("-fopenmp-simd",)`` when ``cc flags`` accepts it (the kernels' SIMD pragmas apply;
    it needs no OpenMP runtime), else ``()``."""
    work = tempfile.mkdtemp(prefix="kiln-omp-probe-")
    try:
        src = os.path.join(work, "probe.c")
        with open(src, "w") as f:
            f.write(_SIMD_PROBE)
        try:
            toolchain.run([*cc, *flags, "-fopenmp-simd", "-c", src, "-o",
                           os.path.join(work, "probe.o")])
            return ("-fopenmp-simd",)
        except ToolchainError as err:
            log.debug("device compiler: -fopenmp-simd unusable: %s", err)
            return ()
    finally:
        shutil.rmtree(work, ignore_errors=True)


def device_flags(cc: Sequence[str]) -> tuple[list[str], list[str]]:
    """(compile flags, link flags) of the device compiler ``cc`` (see the module doc).

    Raises
    ------
    KilnError
        If ``$KILN_DEVICE_CFLAGS`` cannot be split into words.
    """
    flags = list(BASE_FLAGS)
    if compiler_arch(cc) == "riscv64":
        flags += RISCV_FLAGS
        if _is_clang(tuple(cc)):
            flags += RISCV_CLANG_FLAGS
    try:
        extra = shlex.split(os.environ.get("KILN_DEVICE_CFLAGS", ""))
    except ValueError as err:
        raise KilnError(f"$KILN_DEVICE_CFLAGS: {err}") from None
    omp = list(openmp_flags(tuple(cc), tuple(flags + extra)))
    return flags + omp + extra, ["-shared", "-pthread", "-Wl,-Bsymbolic", *extra]


def is_foreign(cc: Sequence[str]) -> bool:
    """True when ``cc`` builds for another machine than this host's (so its code runs in the
    device server); False when it builds for this host or cannot tell."""
    triple = toolchain.dump_machine(cc)
    machine = triple_machine(triple) if triple else None
    host = host_elf()
    return machine is not None and host is not None and machine[0] != host.machine


def build_server(cc: Sequence[str], flags: Sequence[str]) -> str:
    """The device server executable for ``cc`` (``support/device_server.c``), built once and
    cached in :func:`device_cache_dir` by source, compiler identity and flags.

    Raises
    ------
    ToolchainError
        If the compiler fails.
    """
    ident = toolchain.compiler_identity(tuple(cc), tuple(flags)) or ""
    source = SERVER_C.read_bytes()
    key = compile_cache.make_key("kiln-device-server-v1", source, shlex.join(cc), ident,
                                 shlex.join(flags))
    path = device_cache_dir() / f"server-{key[:32]}"

    def build(tmp: str) -> None:
        toolchain.run([*cc, *flags, f"-I{toolchain.INCLUDE_DIR}", str(SERVER_C), "-o", tmp,
                       "-ldl"])
        os.chmod(tmp, 0o700)  # executable before it is renamed into place

    if path.exists():
        cache_limit.touch(path)
    else:
        toolchain.build_atomic(path, build)
        cache_limit.note_stored(path)
    return str(path)


def server_command(server: str, cc: Sequence[str]) -> list[str]:
    """How to start ``server``: ``$KILN_DEVICE_LAUNCHER``'s words followed by the server's
    path, else ``qemu-<arch>`` user mode with the Debian cross sysroot
    (``-L /usr/<arch>-linux-gnu``) and, for riscv64, ``-cpu rv64,v=true,vlen=128``.

    Raises
    ------
    ToolchainError
        If no launcher is set and ``qemu-<arch>`` is not installed.
    """
    launcher = os.environ.get("KILN_DEVICE_LAUNCHER", "").strip()
    if launcher:
        return [*shlex.split(launcher), server]
    arch = compiler_arch(cc) or "unknown"
    qemu = f"qemu-{arch}"
    if shutil.which(qemu) is None:
        raise ToolchainError(f"the device compiler {shlex.join(cc)} builds for {arch}, and "
                             f"{qemu} is not installed to run it (Debian: apt-get install "
                             "qemu-user) — or set KILN_DEVICE_LAUNCHER to a command that runs "
                             f"the device server on a {arch} machine")
    cmd = [qemu]
    sysroot = f"/usr/{arch}-linux-gnu"
    if os.path.isdir(sysroot):
        cmd += ["-L", sysroot]
    return [*cmd, *QEMU_CPU.get(arch, ()), server]


__all__ = ["build_server", "device_cache_dir", "device_compiler", "device_flags", "is_foreign",
           "openmp_flags", "server_command"]
