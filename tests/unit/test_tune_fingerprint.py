"""The CPU fingerprint (kiln.tune.fingerprint): model, codegen-relevant ISA flags, cores."""

from __future__ import annotations

from kiln.tune.fingerprint import cpu_fingerprint, fingerprint_hash

X86 = """processor\t: 0
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz
flags\t\t: fpu sse4_1 sse4_2 avx avx2 fma hypervisor avx512f avx512_vnni pni

processor\t: 1
model name\t: something else
"""
ARM = """processor\t: 0
Features\t: fp asimd evtstrm aes asimddp sve i8mm
CPU implementer\t: 0x41
CPU part\t: 0xd40
"""


def test_x86_fields():
    fp = cpu_fingerprint(X86, cores=8)
    assert fp["model"] == "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"
    assert fp["isa"] == ["avx", "avx2", "avx512_vnni", "avx512f", "fma", "sse4_1", "sse4_2"]
    assert fp["cores"] == 8


def test_arm_fields():
    fp = cpu_fingerprint(ARM, cores=4)
    assert fp["model"] == "implementer 0x41 part 0xd40"
    assert fp["isa"] == ["asimd", "asimddp", "i8mm", "sve"]


def test_hash_is_stable_and_separates_cpus():
    a = cpu_fingerprint(X86, cores=8)
    assert fingerprint_hash(a) == fingerprint_hash(dict(a))
    assert len(fingerprint_hash(a)) == 16
    assert fingerprint_hash(a) != fingerprint_hash(cpu_fingerprint(X86, cores=4))
    assert fingerprint_hash(a) != fingerprint_hash(cpu_fingerprint(X86.replace(" avx512f", ""),
                                                                   cores=8))
    # flags that do not change code (hypervisor, pni) do not change the hash
    assert fingerprint_hash(a) == fingerprint_hash(cpu_fingerprint(
        X86.replace(" hypervisor", ""), cores=8))
    here = cpu_fingerprint()
    assert here["cores"] >= 1 and fingerprint_hash() == fingerprint_hash(here)
