"""Target parsing and description: LLVM options, -mcpu=native, SIMD widths, the current target."""

from __future__ import annotations

import time

import llvmlite.binding as llvm
import pytest

from kiln.errors import CompileError, KilnError
from kiln.target import Target, host_triple


def test_parse_and_round_trip():
    t = Target("llvm -mtriple=riscv64-unknown-linux-gnu -mcpu=generic-rv64 -mattr=+v,+zvl256b")
    assert t.kind == "llvm" and t.keys == ("cpu",)
    assert t.options == {"mtriple": "riscv64-unknown-linux-gnu", "mcpu": "generic-rv64",
                         "mattr": "+v,+zvl256b"}
    assert Target(str(t)) == t and hash(Target(str(t))) == hash(t)
    assert t.arch == "riscv64" and not t.is_native
    # the Linux RV64GC base comes first, the user's features after (later ones win)
    assert t.mattr == ("+m", "+a", "+f", "+d", "+c", "+v", "+zvl256b")
    assert t.mabi == "lp64d"
    assert Target("c").kind == "c" and Target(Target("c")) == Target("c")


@pytest.mark.parametrize("spec, match", [
    ("cuda", "unknown target 'cuda'"),
    ("llvm mcpu=x", "must look like -key=value"),
    ("llvm -mcpus=native", "unknown option -mcpus"),
    ("llvm -opt-level=5", "-opt-level must be 0, 1, 2 or 3"),
])
def test_bad_targets(spec, match):
    with pytest.raises(KilnError, match=match):
        Target(spec)


def test_default_triple_is_the_host():
    t = Target("llvm")
    assert t.triple == host_triple() == llvm.get_process_triple()
    assert t.is_native and t.mcpu == "" and t.mattr == ()


def test_native_cpu_resolves_name_and_features():
    t = Target("llvm -mcpu=native")
    assert t.mcpu == llvm.get_host_cpu_name()
    features = llvm.get_host_cpu_features()
    for name, on in features.items():
        assert t.has_feature(name) == on
    if t.arch == "x86_64":
        want = 512 if features.get("avx512f") else 256 if features.get("avx") else 128
        assert t.vector_bits() == want
    # -mattr applies after the host's features
    no512 = Target("llvm -mcpu=native -mattr=-avx512f")
    assert not no512.has_feature("avx512f")
    if t.arch == "x86_64":
        assert no512.vector_bits() <= 256
    assert str(t) == "llvm -mcpu=native"  # the description keeps what was written


@pytest.mark.parametrize("spec, bits", [
    ("llvm -mtriple=x86_64-linux-gnu", 128),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=haswell", 256),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512", 512),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=skylake-avx512 -mattr=-avx512f", 256),
    ("llvm -mtriple=x86_64-linux-gnu -mattr=+avx2", 256),
    ("llvm -mtriple=x86_64-linux-gnu -mcpu=znver4", 512),
    ("llvm -mtriple=aarch64-linux-gnu", 128),
    ("llvm -mtriple=riscv64-linux-gnu", 0),
    ("llvm -mtriple=riscv64-linux-gnu -mattr=+v", 128),
    ("llvm -mtriple=riscv64-linux-gnu -mattr=+v,+zvl512b", 512),
])
def test_vector_width(spec, bits):
    t = Target(spec)
    assert t.vector_bits() == bits
    assert t.vector_lanes("float32") == max(1, bits // 32)
    assert t.vector_lanes("float64") == max(1, bits // 64)
    assert t.vector_lanes("int8") == max(1, bits // 8)


def test_c_target_width_and_riscv_cpu_default():
    assert Target("c").vector_lanes("float32") in (1, 4)
    assert Target("llvm -mtriple=riscv64-linux-gnu").mcpu == "generic-rv64"
    assert Target("llvm -mtriple=aarch64-linux-gnu").mabi == ""


def test_current_target_context_and_host():
    assert Target.current() is None
    with pytest.raises(KilnError, match="no current target"):
        Target.current(allow_none=False)
    outer = Target("llvm -mcpu=haswell", host="llvm")
    assert outer.host == Target("llvm")
    with outer:
        assert Target.current() is outer
        with Target("c") as inner:
            assert Target.current() is inner
        assert Target.current() is outer
    assert Target.current() is None
    with pytest.raises(AttributeError):
        outer.kind = "c"


def test_jit_target_and_its_host():
    t = Target("jit")
    assert t.kind == "jit" and t.keys == ("cpu",) and t.host == Target("c")
    assert Target("jit", host="llvm").host.kind == "llvm"
    assert Target(Target("jit", host="llvm")) == Target("jit", host="llvm") != t
    assert t.vector_bits() == 128 and t.vector_lanes("float32") == 4  # any device: 128 bits
    with pytest.raises(KilnError, match="host must be one of c, llvm"):
        Target("jit", host="jit")
    with pytest.raises(KilnError, match="jit target takes no options"):
        Target("jit -mcpu=native")


X86 = "-mtriple=x86_64-unknown-linux-gnu"
AARCH64 = "-mtriple=aarch64-unknown-linux-gnu"
RISCV = "-mtriple=riscv64-unknown-linux-gnu"


@pytest.mark.parametrize("spec, match", [
    # the CPU, the triple and the closest names LLVM knows for it
    (f"llvm {X86} -mcpu=foo", "CPU 'foo' for triple x86_64-unknown-linux-gnu"),
    (f"llvm {X86} -mcpu=skylake-avx51", "did you mean skylake-avx512, skylake"),
    (f"llvm {AARCH64} -mcpu=cortex-a67", "'cortex-a67' for triple aarch64.*cortex-a76"),
    (f"llvm {AARCH64} -mcpu=x86-64-v3", "CPU 'x86-64-v3' for triple aarch64"),
    (f"llvm {AARCH64} -mcpu=skylake", "CPU 'skylake' for triple aarch64"),
    (f"llvm {RISCV} -mcpu=generic-rv46", "'generic-rv46' for triple riscv64.*generic-rv64"),
    (f"llvm {RISCV} -mattr=+v,+zvl256", r"feature '\+zvl256' \(-mattr\).*zvl256b"),
    (f"llvm {X86} -mcpu=haswell -mattr=+avx2,-avx52", r"feature '-avx52'.*avx2"),
    ("llvm -mcpu", "-mcpu needs a value"),
])
def test_unknown_llvm_cpu_or_feature_is_refused_up_front(spec, match, capfd):
    with pytest.raises(CompileError, match=match):
        Target(spec)
    # LLVM's own warnings ("not a recognized processor") do not reach the terminal
    assert "not a recognized" not in capfd.readouterr().err


@pytest.mark.parametrize("spec", [
    "llvm -mcpu=native", "llvm -mcpu=native -mattr=-avx512f", f"llvm {X86} -mcpu=portable",
    f"llvm {X86} -mcpu=x86-64", f"llvm {X86} -mcpu=x86-64-v2", f"llvm {X86} -mcpu=x86-64-v4",
    f"llvm {X86} -mcpu=x86-64-v3,x86-64-v4", f"llvm {X86} -mcpu=sapphirerapids -mattr=-amx-int8",
    f"llvm {AARCH64} -mcpu=neoverse-n1 -mattr=+dotprod,+i8mm", f"llvm {RISCV} -mattr=v,+zvl512b",
    f"llvm {RISCV} -mcpu=generic-rv64", "llvm -mattr=-prefer-no-gather",
    "c -mcpu=whatever",  # the C compiler's -march: its own check
    "llvm -mtriple=nosuch-unknown-linux-gnu -mcpu=foo",  # no such LLVM target: building says
])
def test_known_llvm_names_stay_valid(spec, capfd):
    t = Target(spec)
    assert Target(str(t)) == t
    if t.levels:
        t.level(t.levels[0])
    assert "not a recognized" not in capfd.readouterr().err


def test_name_check_is_cached_and_cheap():
    Target(f"llvm {AARCH64} -mcpu=cortex-a76")
    start = time.perf_counter()
    for _ in range(200):
        Target(f"llvm {AARCH64} -mcpu=cortex-a76")
    assert time.perf_counter() - start < 0.5
