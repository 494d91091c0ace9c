"""The CPU-features check of ``load_module``: a library's ``__kiln_target_info`` record against
the CPU that is about to run it (docs/decisions/031-cpu-features-check.md).

A library built with ``-mcpu=native`` on an AVX-512 machine dies with ``Illegal instruction``
(SIGILL, no message) on a CPU without AVX-512, at the first kernel call or already in a
constructor. ``export_library`` records the features the code needs (docs/formats.md §2.1);
:func:`check_cpu` reads them from the file (no ``dlopen``, so no constructor runs first) and
raises :class:`ModuleLoadError` naming what is missing. The CPU's features are read from
``/proc/cpuinfo`` (Linux: ``flags`` on x86, ``Features`` on aarch64, ``isa`` on RISC-V); where
that line is missing (another OS, an emulator that shows the host's file) nothing is checked.
Only features of :data:`CPUINFO_NAMES` are compared: a name the table does not know is not
judged. The native runtime makes the same check (``kiln_check_target_info``, rt_blob.c, with the
same table).
"""

from __future__ import annotations

import json
import platform
from functools import lru_cache

from kiln.errors import ModuleLoadError

#: the symbol holding the record: a NUL-terminated JSON text
TARGET_INFO_SYMBOL = "__kiln_target_info"
TARGET_INFO_VERSION = 1
#: the longest record a loader reads
MAX_TARGET_INFO = 1 << 16

#: per architecture: feature (LLVM's name, as recorded) → its name in /proc/cpuinfo
CPUINFO_NAMES: dict[str, dict[str, str]] = {
    "x86_64": {
        "sse4.2": "sse4_2", "popcnt": "popcnt", "avx": "avx", "avx2": "avx2", "fma": "fma",
        "f16c": "f16c", "bmi2": "bmi2", "avx512f": "avx512f", "avx512bw": "avx512bw",
        "avx512cd": "avx512cd", "avx512dq": "avx512dq", "avx512vl": "avx512vl",
        "avx512vnni": "avx512_vnni", "avx512bf16": "avx512_bf16", "avx512fp16": "avx512_fp16",
        "avx512vbmi": "avx512vbmi", "avx512vbmi2": "avx512_vbmi2",
        "avx512bitalg": "avx512_bitalg", "avx512vpopcntdq": "avx512_vpopcntdq",
        "avx512ifma": "avx512ifma", "avxvnni": "avx_vnni", "amx-tile": "amx_tile",
        "amx-int8": "amx_int8", "amx-bf16": "amx_bf16",
    },
    "aarch64": {
        "neon": "asimd", "fullfp16": "asimdhp", "dotprod": "asimddp", "i8mm": "i8mm",
        "bf16": "bf16", "sve": "sve", "sve2": "sve2",
    },
    "riscv64": {
        "m": "m", "a": "a", "f": "f", "d": "d", "c": "c", "v": "v", "zfh": "zfh",
        "zvfh": "zvfh", "zba": "zba", "zbb": "zbb", "zbs": "zbs",
    },
}
#: the features recorded, per architecture, in the order messages list them
KNOWN_FEATURES: dict[str, tuple[str, ...]] = {k: tuple(v) for k, v in CPUINFO_NAMES.items()}
#: the /proc/cpuinfo line holding the features
_CPUINFO_KEY = {"x86_64": "flags", "aarch64": "Features", "riscv64": "isa"}
_ARCHES = {"amd64": "x86_64", "arm64": "aarch64"}


def host_arch() -> str:
    machine = platform.machine().lower()
    return _ARCHES.get(machine, machine)


def parse_cpuinfo(text: str, arch: str) -> frozenset[str] | None:
    """The feature names of the first ``flags``/``Features``/``isa`` line of a /proc/cpuinfo
    text (RISC-V: the single-letter extensions of ``rv64imafdcv`` and the ``_z...`` ones), or
    None when it has no such line."""
    key = _CPUINFO_KEY.get(arch)
    if key is None:
        return None
    for line in text.splitlines():
        name, sep, value = line.partition(":")
        if sep and name.strip() == key:
            words = value.split()
            if arch != "riscv64":
                return frozenset(words)
            isa = value.strip().lower()
            base, *exts = isa.split("_")
            letters = base[4:] if base.startswith(("rv64", "rv32")) else ""
            if "g" in letters:
                letters += "imafd"
            return frozenset(set(letters) | set(exts))
    return None


@lru_cache(maxsize=1)
def host_cpuinfo_flags() -> frozenset[str] | None:
    """This CPU's /proc/cpuinfo feature words, or None (unreadable, unknown architecture)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            return parse_cpuinfo(f.read(), host_arch())
    except OSError:
        return None


def missing_features(required: list[str], flags: frozenset[str], arch: str) -> list[str]:
    """The ``required`` features (recorded names) whose /proc/cpuinfo name is not in ``flags``;
    names :data:`CPUINFO_NAMES` does not know for ``arch`` are not judged."""
    names = CPUINFO_NAMES.get(arch, {})
    return [f for f in required if f in names and names[f] not in flags]


def cpu_has(flags: frozenset[str], arch: str) -> list[str]:
    """The known features of ``flags``, as recorded names, in :data:`KNOWN_FEATURES` order."""
    return [f for f, n in CPUINFO_NAMES.get(arch, {}).items() if n in flags]


def parse_target_info(raw: bytes, what: str) -> dict:
    """The record of a ``__kiln_target_info`` text.

    Raises
    ------
    ModuleLoadError
        Not UTF-8 JSON, not an object, or ``features`` not a list of strings.
    """
    try:
        info = json.loads(raw.split(b"\0", 1)[0].decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as err:
        raise ModuleLoadError(f"{what}: corrupt {TARGET_INFO_SYMBOL}: {err}") from None
    feats = info.get("features") if isinstance(info, dict) else None
    if not isinstance(feats, list) or not all(isinstance(f, str) for f in feats):
        raise ModuleLoadError(f"{what}: corrupt {TARGET_INFO_SYMBOL}: no 'features' list")
    return info


def check_features(info: dict, path: str, flags: frozenset[str] | None = None,
                   arch: str | None = None) -> None:
    """Refuse a library whose recorded features this CPU lacks.

    Parameters
    ----------
    info : dict
        The library's record (:func:`parse_target_info`).
    path : str
        Names the library in the message.
    flags, arch : optional
        The CPU's /proc/cpuinfo words and architecture (default: this machine's; tests pass
        fake ones). ``flags`` None: nothing is checked.

    Raises
    ------
    ModuleLoadError
        ``model.so needs avx512fp16; this CPU has sse4.2, popcnt, avx, ...``.
    """
    arch = arch or host_arch()
    flags = host_cpuinfo_flags() if flags is None and arch == host_arch() else flags
    if flags is None:
        return
    missing = missing_features(list(info["features"]), flags, arch)
    if missing:
        target = f" (target '{info['target']}')" if info.get("target") else ""
        portable = " or for every x86-64 CPU (-mcpu=portable)" if arch == "x86_64" else ""
        raise ModuleLoadError(
            f"{path} needs {', '.join(missing)}; this CPU has "
            f"{', '.join(cpu_has(flags, arch)) or 'none of the recorded features'}. It was "
            f"built for another CPU{target}: rebuild it for this one (-mcpu=native){portable}")


__all__ = ["TARGET_INFO_SYMBOL", "check_features", "missing_features", "parse_cpuinfo",
           "parse_target_info"]
