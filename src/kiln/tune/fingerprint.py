"""The CPU fingerprint: what must match for a measured time to mean anything on another machine.

Three things decide what code the tuner's candidates become and how fast it runs: the CPU model,
the instruction-set extensions the code generator may use, and the logical core count (the
thread pool's width). :func:`cpu_fingerprint` reads them (``/proc/cpuinfo`` on Linux, the
``platform`` module elsewhere); :func:`fingerprint_hash` makes a short stable name of them, used
in records and as the Ray custom resource ``kiln_cpu:<hash>`` of the nodes that may measure
(:mod:`kiln.tune.ray_executor`).
"""

from __future__ import annotations

import hashlib
import json
import os
import platform

#: the ISA extensions that change generated code or its speed (x86 ``flags``; Arm ``Features``;
#: names as the Linux kernel prints them); others (e.g. ``pni``, ``hypervisor``) are left out
#: so that two identical machines under different kernels or hypervisors still match
ISA_FLAGS = frozenset({
    "sse4_1", "sse4_2", "avx", "avx2", "fma", "f16c", "bmi2", "avx512f", "avx512cd",
    "avx512bw", "avx512dq", "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16",
    "avx_vnni", "amx_tile", "amx_int8", "amx_bf16",
    "asimd", "asimdhp", "asimddp", "i8mm", "bf16", "sve", "sve2", "sme",
})


def cpu_fingerprint(cpuinfo: str | None = None, cores: int | None = None) -> dict:
    """This machine's CPU, as a JSON-able dict.

    Parameters
    ----------
    cpuinfo : str, optional
        The text of ``/proc/cpuinfo`` (default: read it; empty where it does not exist).
    cores : int, optional
        Logical core count (default ``os.cpu_count()``).

    Returns
    -------
    dict
        ``{"machine": str, "model": str, "isa": sorted list of str, "cores": int}``: the
        architecture (``platform.machine()``), the model name (x86 ``model name``, Arm
        ``CPU part`` with ``CPU implementer``, RISC-V ``uarch``; else ``platform.processor()``),
        the ISA extensions of :data:`ISA_FLAGS` the first CPU lists (RISC-V: its ``isa``
        string), and the cores.
    """
    if cpuinfo is None:
        try:
            with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
                cpuinfo = f.read()
        except OSError:
            cpuinfo = ""
    fields = _first_cpu(cpuinfo)
    model = fields.get("model name") or fields.get("uarch") or ""
    if not model and "CPU part" in fields:
        model = f"implementer {fields.get('CPU implementer', '?')} part {fields['CPU part']}"
    flags = (fields.get("flags") or fields.get("Features") or "").split()
    isa = sorted(ISA_FLAGS.intersection(flags))
    if "isa" in fields:  # RISC-V: the ISA string is the extension list
        isa.append(fields["isa"])
    return {
        "machine": platform.machine(),
        "model": model.strip() or platform.processor(),
        "isa": isa,
        "cores": cores if cores is not None else (os.cpu_count() or 1),
    }


def fingerprint_hash(fingerprint: dict | None = None) -> str:
    """16 hex digits of the SHA-256 of ``fingerprint`` (default: this machine's) as sorted
    JSON: equal exactly when the fingerprints are equal."""
    fp = cpu_fingerprint() if fingerprint is None else fingerprint
    text = json.dumps(fp, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def _first_cpu(cpuinfo: str) -> dict[str, str]:
    """``key: value`` lines up to the first blank line that ends a processor's block."""
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        if not line.strip():
            if fields:
                break
            continue
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields
