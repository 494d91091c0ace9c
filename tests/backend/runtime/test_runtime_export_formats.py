"""What ``export_library`` writes and ``load_module`` reads back, through the real C compiler:
``.so``, ``.o`` (relocatable) and gzip ``.tar`` (relinked at load), the output format taken
from the fcompile's intent, DSO modules that save ready objects, and the ELF machine check that
refuses foreign objects before the linker says "Relocations in generic ELF".
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import shutil
import struct
import tarfile
import tempfile
from pathlib import Path

import numpy as np
import pytest
from test_runtime_roundtrip import FUNCS, KERNELS, P0, inputs, make_factory, make_graph

import kiln.runtime as rt
from kiln.errors import KilnError, ToolchainError
from kiln.graph_executor import GraphModule
from kiln.runtime import export
from kiln.runtime.elf import host_elf, machine_name, read_elf_header
from kiln.runtime.toolchain import compiler as toolchain
from kiln.runtime.toolchain.tar import tar as tar_fcompile

ET_REL, ET_DYN = 1, 3


def check_runs(path) -> None:
    gm = GraphModule(rt.load_module(path)["default"](rt.cpu()))
    x, y = inputs()
    gm.run(x=x, y=y)
    np.testing.assert_allclose(gm.get_output(0).numpy(), (x + y) * P0 + x, rtol=1e-6)


def elf_type(path) -> int:
    return struct.unpack_from("<H", Path(path).read_bytes(), 16)[0]


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """tempfile's folder for this test, to check that load_module cleans up after itself."""
    d = tmp_path / "tmp"
    d.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(d))
    return d


# ---------------------------------------------------------------------------- tar and object
def test_tar_export_and_load(tmp_path, private_tmp):
    path = tmp_path / "model.tar"
    make_factory().export_library(str(path))
    assert path.read_bytes()[:2] == b"\x1f\x8b"  # gzip
    with tarfile.open(path) as t:
        assert sorted(t.getnames()) == ["devc.c", "kiln_amx.c", "kiln_backend.c", "lib0.c"]
        assert b"fused_add" in t.extractfile("lib0.c").read()
    check_runs(path)
    assert list(private_tmp.iterdir()) == []  # the relink folder is gone


def test_tar_with_incbin_blob(tmp_path, monkeypatch):
    monkeypatch.setattr(export, "INCBIN_THRESHOLD", 0)  # every blob goes through devc.S
    path = tmp_path / "model.tar"
    make_factory().export_library(str(path))
    with tarfile.open(path) as t:
        assert {"devc.S", "devc.bin"} <= set(t.getnames())
        assert b'.incbin "devc.bin"' in t.extractfile("devc.S").read()  # relative: relocatable
    check_runs(path)


def test_object_export_and_load(tmp_path, private_tmp):
    path = tmp_path / "model.o"
    make_factory().export_library(str(path))
    assert elf_type(path) == ET_REL
    check_runs(path)
    assert list(private_tmp.iterdir()) == []


def test_output_format_follows_intent(tmp_path):
    cc = toolchain.find_cc()
    plain = tmp_path / "model"  # no suffix: the fcompile says "so"
    make_factory().export_library(str(plain), fcompile=rt.cross_compiler(cc, output_format="so"))
    assert elf_type(plain) == ET_DYN
    check_runs(plain)
    named_so = tmp_path / "packed.so"  # tar.tar's intent wins over the suffix
    make_factory().export_library(str(named_so), fcompile=tar_fcompile)
    assert tarfile.is_tarfile(named_so)
    check_runs(named_so)
    with pytest.raises(KilnError, match=r"model\.bin\): cannot tell what to write from the "
                                        r"suffix '\.bin'; name it \.so"):
        make_factory().export_library(str(tmp_path / "model.bin"))
    calls = []

    def bare(output, files, options=None):  # states no output_format
        calls.append(output)
        rt.create_shared(output, files, options)

    with pytest.raises(KilnError, match="suffix '.bin'"):
        make_factory().export_library(str(tmp_path / "model.bin"), fcompile=bare)
    assert calls == [] and not (tmp_path / "model.bin").exists()
    make_factory().export_library(str(tmp_path / "bare.so"), fcompile=bare)
    assert len(calls) == 1
    check_runs(tmp_path / "bare.so")


def test_cross_compiler_options_add_files_and_triple(tmp_path, caplog):
    extra = tmp_path / "extra.c"
    extra.write_text("int kiln_extra_value(void) { return KILN_EXTRA; }\n")
    cc = toolchain.find_cc()
    fcompile = rt.cross_compiler(cc, options=["-DKILN_EXTRA=7"], add_files=[str(extra)])
    assert fcompile.output_format == "so"
    assert fcompile.get_target_triple() == toolchain.run([*cc, "-dumpmachine"]).strip()
    for name in ("a.so", "b.so"):
        with caplog.at_level(logging.DEBUG, logger="kiln"):
            caplog.clear()
            make_factory().export_library(str(tmp_path / name), fcompile=fcompile)
        link = [r.getMessage() for r in caplog.records if "-shared" in r.getMessage()]
        assert len(link) == 1 and link[0].count("-DKILN_EXTRA=7") == 1  # options not piled up
        assert ctypes.CDLL(str(tmp_path / name)).kiln_extra_value() == 7
    check_runs(tmp_path / "b.so")


# ------------------------------------------------------------- modules that save ready objects
class ObjectModule(rt.Module):
    """A DSO-exportable module that saves a ready relocatable object (as an LLVM module does)."""

    type_key = "test_object"
    is_dso_exportable = True
    export_suffix = "o"

    def __init__(self, obj: str, func_names):
        super().__init__()
        self.obj = obj
        self.func_names = list(func_names)

    def save(self, path, fmt=""):
        shutil.copyfile(self.obj, path)

    def list_function_names(self):
        return list(self.func_names)


def object_factory(obj: str) -> rt.GraphExecutorFactoryModule:
    return rt.GraphExecutorFactoryModule(make_graph(), ObjectModule(obj, FUNCS), {"p0": P0})


@pytest.fixture(scope="module")
def host_object(tmp_path_factory) -> str:
    src = tmp_path_factory.mktemp("obj") / "kernels.c"
    src.write_text(KERNELS)
    (obj,) = toolchain.compile_objects([src])
    return obj


FOREIGN_CC = {62: "aarch64-linux-gnu-gcc", 183: "x86_64-linux-gnu-gcc"}


@pytest.fixture(scope="module")
def foreign_object(host_object, tmp_path_factory) -> tuple[str, int]:
    """The kernels as an object for another machine: built by a real cross compiler when one is
    installed, else the host object with its ``e_machine`` patched."""
    host = host_elf().machine
    other = 183 if host != 183 else 62
    out = tmp_path_factory.mktemp("foreign") / "kernels_foreign.o"
    cross = shutil.which(FOREIGN_CC.get(host, "aarch64-linux-gnu-gcc"))
    if cross:
        src = out.with_suffix(".c")
        src.write_text(KERNELS)
        toolchain.run([cross, *toolchain.COMPILE_FLAGS, f"-I{toolchain.INCLUDE_DIR}", "-c",
                       str(src), "-o", str(out)])
    else:
        data = bytearray(Path(host_object).read_bytes())
        data[18:20] = struct.pack("<H", other)
        out.write_bytes(bytes(data))
    assert read_elf_header(str(out), check_bounds=False).machine == other
    return str(out), other


@pytest.mark.parametrize("suffix", [".so", ".tar"])
def test_dso_module_saving_an_object(host_object, tmp_path, suffix):
    path = tmp_path / f"model{suffix}"
    object_factory(host_object).export_library(str(path))
    if suffix == ".tar":
        with tarfile.open(path) as t:
            assert "lib0.o" in t.getnames() and "lib0.c" not in t.getnames()
    check_runs(path)


def test_module_with_unknown_export_suffix(tmp_path):
    m = ObjectModule("unused", [])
    m.export_suffix = "ll"
    fac = rt.GraphExecutorFactoryModule(make_graph(), m, {"p0": P0})
    with pytest.raises(KilnError, match="'test_object' declares export_suffix 'll'"):
        fac.export_library(str(tmp_path / "m.so"))


def mismatch(obj: str, machine: int) -> str:
    triple = toolchain.dump_machine()
    return (re.escape(f"{obj} is built for {machine_name(machine)} but the linker ")
            + r".* targets " + re.escape(f"{triple} ({machine_name(host_elf().machine)})"))


def test_foreign_object_refused_before_linking(foreign_object, tmp_path):
    obj, machine = foreign_object
    path = tmp_path / "model.so"
    with pytest.raises(ToolchainError, match=mismatch("lib0.o", machine).replace(
            re.escape("lib0.o"), r"\S*lib0\.o")):
        object_factory(obj).export_library(str(path))
    assert os.listdir(tmp_path) == []
    tar_path = tmp_path / "model.tar"
    object_factory(obj).export_library(str(tar_path))  # a tar is not linked: no check yet
    with pytest.raises(ToolchainError, match=r"\S*lib0\.o is built for " + re.escape(
            machine_name(machine))):
        rt.load_module(tar_path)


def test_foreign_object_through_a_user_fcompile(foreign_object, tmp_path):
    obj, _ = foreign_object
    calls = []

    def my_link(output, files, options=None):
        calls.append(output)
        rt.create_shared(output, files, options)

    fcompile = rt.cross_compiler(my_link, get_target_triple=toolchain.dump_machine)
    with pytest.raises(ToolchainError, match=r"lib0\.o is built for .* but the linker my_link"):
        object_factory(obj).export_library(str(tmp_path / "m.so"), fcompile=fcompile)
    assert calls == []  # refused before the user's linker ran


def test_load_foreign_relocatable_object(tmp_path):
    path = tmp_path / "model.o"
    make_factory().export_library(str(path))
    data = bytearray(path.read_bytes())
    other = 183 if host_elf().machine != 183 else 62
    data[18:20] = struct.pack("<H", other)
    path.write_bytes(bytes(data))
    with pytest.raises(ToolchainError, match=mismatch(str(path), other)):
        rt.load_module(path)
