"""The CPU-features check of the loaders (kiln.runtime.cpu_features, decision 031) with fake
/proc/cpuinfo texts and flag sets, and the ELF symbol reader it uses (elf.symbol_bytes) on
hand-made ELF files: no compiler, no library loaded."""

from __future__ import annotations

import json
import struct

import pytest

from kiln.errors import KilnError, ModuleLoadError
from kiln.runtime.cpu_features import (
    CPUINFO_NAMES,
    KNOWN_FEATURES,
    check_features,
    cpu_has,
    missing_features,
    parse_cpuinfo,
    parse_target_info,
)
from kiln.runtime.elf import symbol_bytes

AVX2_HOST = frozenset("fpu sse sse2 pni ssse3 fma cx16 sse4_1 sse4_2 popcnt avx f16c bmi1 avx2 "
                      "bmi2".split())
X86_CPUINFO = """processor\t: 0
vendor_id\t: AuthenticAMD
model name\t: AMD EPYC 7R13 Processor
flags\t\t: fpu sse2 sse4_2 avx avx2 fma f16c avx512f avx512_vnni amx_tile
bugs\t\t: sysret_ss_attrs
"""


def record(features, target="llvm -mcpu=skylake-avx512") -> dict:
    return {"version": 1, "target": target, "triple": "x86_64-unknown-linux-gnu",
            "cpu": "skylake-avx512", "features": list(features), "levels": []}


def test_missing_features_uses_cpuinfo_names():
    need = ["sse4.2", "avx2", "fma", "avx512f", "avx512bw", "avx512vnni"]
    assert missing_features(need, AVX2_HOST, "x86_64") == ["avx512f", "avx512bw", "avx512vnni"]
    assert missing_features(need, AVX2_HOST | {"avx512f", "avx512bw", "avx512_vnni"},
                            "x86_64") == []


def test_unknown_feature_names_are_not_judged():
    assert missing_features(["sse4.2", "some-new-isa"], AVX2_HOST, "x86_64") == []
    assert missing_features(["avx512f"], frozenset(), "mips64") == []


def test_check_names_the_missing_and_the_present_features():
    with pytest.raises(ModuleLoadError) as err:
        check_features(record(["avx2", "fma", "avx512f", "avx512bw"]), "/m/model.so",
                       flags=AVX2_HOST, arch="x86_64")
    msg = str(err.value)
    assert isinstance(err.value, KilnError)
    assert msg.startswith("/m/model.so needs avx512f, avx512bw; this CPU has sse4.2, popcnt, "
                          "avx, avx2, fma, f16c, bmi2.")
    assert "llvm -mcpu=skylake-avx512" in msg and "-mcpu=portable" in msg


def test_check_passes_and_skips():
    check_features(record(["sse4.2", "avx2", "fma"]), "m.so", flags=AVX2_HOST, arch="x86_64")
    check_features(record([]), "m.so", flags=frozenset(), arch="x86_64")
    # another architecture's CPU with no flags to compare: nothing is checked
    check_features(record(["avx512f"]), "m.so", flags=None, arch="riscv64")


def test_aarch64_names():
    flags = parse_cpuinfo("Features\t: fp asimd evtstrm aes asimddp\n", "aarch64")
    assert flags is not None and "asimddp" in flags
    assert missing_features(["neon", "dotprod", "i8mm"], flags, "aarch64") == ["i8mm"]
    with pytest.raises(ModuleLoadError, match="needs i8mm; this CPU has neon, dotprod") as err:
        check_features({"features": ["i8mm"], "target": ""}, "a.so", flags=flags,
                       arch="aarch64")
    assert "portable" not in str(err.value)


def test_parse_cpuinfo():
    flags = parse_cpuinfo(X86_CPUINFO, "x86_64")
    assert flags is not None and {"avx512_vnni", "amx_tile", "sse4_2"} <= flags
    assert cpu_has(flags, "x86_64") == ["sse4.2", "avx", "avx2", "fma", "f16c", "avx512f",
                                        "avx512vnni", "amx-tile"]
    # an emulator that shows the host's file: no Features line for aarch64, nothing checked
    assert parse_cpuinfo(X86_CPUINFO, "aarch64") is None
    rv = parse_cpuinfo("isa\t\t: rv64imafdcv_zicsr_zba_zbb\n", "riscv64")
    assert rv is not None and {"m", "a", "f", "d", "c", "v", "zba", "zbb"} <= rv
    assert missing_features(["v", "zfh"], rv, "riscv64") == ["zfh"]
    assert "d" in parse_cpuinfo("isa : rv64gc\n", "riscv64")


def test_tables_agree():
    for arch, names in CPUINFO_NAMES.items():
        assert KNOWN_FEATURES[arch] == tuple(names)
        assert len(set(names.values())) == len(names)


@pytest.mark.parametrize("raw", [b"\xff\xfe", b"[1, 2]", b'{"features": "avx"}', b"{not json"])
def test_corrupt_record(raw):
    with pytest.raises(ModuleLoadError, match="corrupt __kiln_target_info"):
        parse_target_info(raw, "m.so")


def test_record_ends_at_nul():
    info = parse_target_info(json.dumps(record(["avx"])).encode() + b"\0garbage", "m.so")
    assert info["features"] == ["avx"]


# ---------------------------------------------------------------------------- the ELF reader
def tiny_elf(name: bytes, data: bytes, sym_size: int | None = None, shndx: int = 1,
             et: int = 3) -> bytes:
    """A minimal little-endian ELF64: sections [null, .rodata (data), .dynsym, .dynstr]."""
    strtab = b"\0" + name + b"\0"
    sym = struct.pack("<IBBHQQ", 1, 0x11, 0, shndx, 0x1000,
                      len(data) if sym_size is None else sym_size)
    syms = b"\0" * 24 + sym
    body_off = 64
    rodata_off, dynsym_off = body_off, body_off + len(data)
    dynstr_off = dynsym_off + len(syms)
    shoff = dynstr_off + len(strtab)
    shdrs = b"\0" * 64
    shdrs += struct.pack("<IIQQQQIIQQ", 0, 1, 2, 0x1000, rodata_off, len(data), 0, 0, 1, 0)
    shdrs += struct.pack("<IIQQQQIIQQ", 0, 11, 2, 0, dynsym_off, len(syms), 3, 1, 8, 24)
    shdrs += struct.pack("<IIQQQQIIQQ", 0, 3, 2, 0, dynstr_off, len(strtab), 0, 0, 1, 0)
    ident = b"\x7fELF" + bytes([2, 1, 1]) + b"\0" * 9
    head = ident + struct.pack("<HHIQQQIHHHHHH", et, 62, 1, 0, 0, shoff, 0, 64, 56, 0, 64, 4, 0)
    return head + data + syms + strtab + shdrs


def test_symbol_bytes_reads_the_file(tmp_path):
    path = tmp_path / "lib.so"
    path.write_bytes(tiny_elf(b"__kiln_target_info", b'{"features":[]}\0'))
    assert symbol_bytes(str(path), "__kiln_target_info", 1 << 16) == b'{"features":[]}\0'
    assert symbol_bytes(str(path), "__kiln_target_inf", 1 << 16) is None
    assert symbol_bytes(str(path), "__kiln_target_info", 4) == b'{"fe'


@pytest.mark.parametrize("kwargs", [{"sym_size": 1 << 40}, {"shndx": 9}, {"shndx": 0}])
def test_symbol_bytes_never_reads_past_the_file(tmp_path, kwargs):
    path = tmp_path / "lib.so"
    path.write_bytes(tiny_elf(b"sym", b"abcd", **kwargs))
    got = symbol_bytes(str(path), "sym", 1 << 16)
    assert got is None or got == b"abcd"


def test_symbol_bytes_of_a_truncated_or_foreign_file(tmp_path):
    good = tiny_elf(b"sym", b"abcd")
    path = tmp_path / "lib.so"
    for data in (good[:100], b"not an elf file at all" * 4, b""):
        path.write_bytes(data)
        assert symbol_bytes(str(path), "sym", 1 << 16) is None
