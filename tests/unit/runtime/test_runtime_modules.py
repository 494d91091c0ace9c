"""Runtime module types and their formats, without a C toolchain: user binary modules and their
loaders (aliases), the const loader (docs/formats.md §7) and ``create_metadata_module``,
the safe ``untar``, and the triple → ELF machine table of the pre-link check.
"""

from __future__ import annotations

import io
import re
import struct
import tarfile

import numpy as np
import pytest

import kiln.runtime as rt
from kiln.errors import KilnError, ModuleLoadError, ToolchainError
from kiln.runtime.blob import pack_imports, unpack_imports
from kiln.runtime.elf import check_objects_machine, machine_name, triple_machine
from kiln.runtime.module import PyFunctionModule
from kiln.runtime.registry import remove_global_func
from kiln.runtime.toolchain.tar import untar


def u64(v: int) -> bytes:
    return struct.pack("<Q", v)


def dmlc_str(s: str) -> bytes:
    return u64(len(s.encode())) + s.encode()


# ------------------------------------------------------------------ user binary modules, loaders
class Tagged(rt.BinaryModule):
    """A user module: one function returning its tag."""

    type_key = "test.tagged"

    def __init__(self, tag: str):
        super().__init__()
        self.tag = tag

    def save_to_binary(self) -> bytes:
        return self.tag.encode()

    @classmethod
    def load_from_binary(cls, data: bytes) -> Tagged:
        return cls(data.decode())

    def get_function(self, name, query_imports=True):
        if name == f"tag_{self.tag}":
            return lambda: self.tag
        return super().get_function(name, query_imports)


@pytest.fixture
def loaders():
    """Registers loaders through the fixture and removes every key it registered afterwards."""
    keys: list[str] = []

    def register(key, loader, aliases=(), **kw):
        keys.extend([key, *aliases])
        return rt.register_module_loader(key, loader, aliases=aliases, **kw)

    yield register
    for k in keys:
        remove_global_func("runtime.module.loadbinary_" + k)


def test_binary_module_functions_and_imports(loaders):
    loaders(Tagged.type_key, Tagged.load_from_binary)
    a, b = Tagged("a"), Tagged("b")
    a.import_module(b)
    assert a["tag_a"]() == "a" and a["tag_b"]() == "b"  # own, then through the import
    assert a.get_function("tag_b", query_imports=False) is None
    assert isinstance(a.get_function("tag_a"), rt.PackedFunc)
    back = unpack_imports(pack_imports(a)[8:], None)
    assert isinstance(back, Tagged) and back.tag == "a"
    (b2,) = back.imported_modules
    assert isinstance(b2, Tagged) and b2.tag == "b" and back["tag_b"]() == "b"


def test_zero_copy_loaders_get_a_view_others_bytes(loaders):
    seen = []

    def load(data):
        seen.append(type(data))
        return Tagged(bytes(data).decode())

    blob = pack_imports(Tagged("v"))[8:]
    loaders(Tagged.type_key, load)
    assert unpack_imports(memoryview(blob), None).tag == "v"
    loaders(Tagged.type_key, load, override=True, zero_copy=True)
    assert unpack_imports(memoryview(blob), None).tag == "v"
    loaders(Tagged.type_key, load, override=True)  # re-registered without: bytes again
    unpack_imports(memoryview(blob), None)
    assert seen == [bytes, memoryview, bytes]


def test_binary_module_without_save_to_binary():
    class Half(rt.BinaryModule):
        type_key = "test.half"

    with pytest.raises(KilnError, match=r"'test.half' \(Half\) does not implement save_to_binary"):
        pack_imports(Half())


def test_register_module_loader_errors_and_decorator(loaders):
    loaders("test.deco", Tagged.load_from_binary)
    with pytest.raises(KilnError, match="already registered"):
        rt.register_module_loader("test.deco", Tagged.load_from_binary)
    loaders("test.deco", lambda data: Tagged("new " + data.decode()), override=True)
    assert rt.get_global_func("runtime.module.loadbinary_test.deco")(b"z").tag == "new z"
    for bad in ("", "_lib", "_import_tree"):
        with pytest.raises(KilnError, match="cannot be a module type_key"):
            rt.register_module_loader(bad, Tagged)
    with pytest.raises(KilnError, match="must be callable"):
        rt.register_module_loader("test.notcallable", 42)

    @rt.register_module_loader("test.decorated")
    def load(data):
        return Tagged(data.decode() + "!")

    try:
        assert "test.decorated" in rt.list_module_loaders()
        assert rt.get_global_func("runtime.module.loadbinary_test.decorated")(b"x").tag == "x!"
    finally:
        remove_global_func("runtime.module.loadbinary_test.decorated")


def test_renamed_type_key_loads_through_alias(loaders):
    class Old(Tagged):
        type_key = "test.old_name"

    class New(Tagged):
        type_key = "test.new_name"

    blob = pack_imports(Old("x"))[8:]  # an artifact shipped before the rename
    with pytest.raises(ModuleLoadError, match=r"no loader for module type_key 'test.old_name' "
                                              r"\(registered loaders: .*const_loader"):
        unpack_imports(blob, None)
    loaders(New.type_key, New.load_from_binary, aliases=[Old.type_key])
    back = unpack_imports(blob, None)
    assert type(back) is New and back.type_key == "test.new_name" and back.tag == "x"
    assert {"test.new_name", "test.old_name"} <= set(rt.list_module_loaders())


# ------------------------------------------------------------------------ const loader (sec. 7)
W = np.arange(6, dtype="float32").reshape(2, 3)


def test_const_loader_byte_layout_and_round_trip():
    m = rt.ConstLoaderModule({"w": W}, {"ext_f": ["w"]})
    data = m.save_to_binary()
    nd = (u64(0xDD5E40F096B4A13F) + u64(0) + struct.pack("<iii", 1, 0, 2)
          + struct.pack("<BBH", 2, 32, 1) + struct.pack("<qq", 2, 3) + struct.pack("<q", 24)
          + W.tobytes())
    assert data == (u64(1) + dmlc_str("w") + u64(1) + nd
                    + u64(1) + dmlc_str("ext_f") + u64(1) + u64(1) + dmlc_str("w"))
    for key in ("const_loader", "metadata"):  # TVM's old key loads too
        back = rt.get_global_func("runtime.module.loadbinary_" + key)(data)
        assert isinstance(back, rt.ConstLoaderModule)
        assert back.const_vars_by_symbol == {"ext_f": ["w"]}
        np.testing.assert_array_equal(back.const_var_ndarray["w"].numpy(), W)
    for cut in range(0, len(data), 7):
        with pytest.raises(ModuleLoadError):
            rt.ConstLoaderModule.load_from_binary(data[:cut])
    unknown = data.replace(dmlc_str("ext_f") + u64(1) + u64(1) + dmlc_str("w"),
                           dmlc_str("ext_f") + u64(1) + u64(1) + dmlc_str("v"))
    with pytest.raises(ModuleLoadError, match=r"corrupt: .*'ext_f' needs constants \['v'\]"):
        rt.ConstLoaderModule.load_from_binary(unknown)


def make_ext(symbol: str, const_vars: list[str], calls: list):
    """A Python external module needing ``const_vars`` for ``symbol``; records init calls."""
    state = {}

    def init(*arrays):
        calls.append([a.numpy().copy() for a in arrays])
        state["consts"] = arrays

    def run(x):
        return float(x + sum(float(a.numpy().sum()) for a in state["consts"]))

    return PyFunctionModule({"get_symbol": lambda: symbol,
                             "get_const_vars": lambda: list(const_vars),
                             f"__init_{symbol}": init, symbol: run})


def test_const_loader_initializes_once_then_forwards():
    calls: list = []
    ext = make_ext("ext_f", ["w", "b"], calls)
    target = PyFunctionModule({"host": lambda: "host"})
    b = np.array([10.0], "float32")
    root = rt.create_metadata_module({"w": W, "b": b, "unrelated": np.zeros(3)}, target, [ext])
    assert isinstance(root, rt.ConstLoaderModule)
    assert root.imported_modules == [target, ext]
    assert list(root.const_var_ndarray) == ["w", "b"]  # only what some symbol needs
    assert root["host"]() == "host" and calls == []  # other functions do not initialize
    assert root["ext_f"](1.0) == 1.0 + W.sum() + 10.0
    assert root["ext_f"](2.0) == 2.0 + W.sum() + 10.0
    assert len(calls) == 1
    np.testing.assert_array_equal(calls[0][0], W)
    np.testing.assert_array_equal(calls[0][1], b)


def test_create_metadata_module_leaves_trees_without_constants_alone():
    target = PyFunctionModule({"host": lambda: 1})
    child = PyFunctionModule({"get_symbol": lambda: "s", "get_const_vars": list})
    target.import_module(child)
    assert rt.create_metadata_module({"w": W}, target) is target
    assert target.imported_modules == [child]
    ext = PyFunctionModule({"ext": lambda: 2})  # an external module without constants
    assert rt.create_metadata_module({}, target, [ext]) is target
    assert target.imported_modules == [child, ext] and target["ext"]() == 2


def test_create_metadata_module_errors():
    calls: list = []
    target = PyFunctionModule()
    with pytest.raises(KilnError, match=r"constants \['b'\] \(of symbols \['ext_f'\]\) are not "
                                        r"in params"):
        rt.create_metadata_module({"w": W}, target, [make_ext("ext_f", ["w", "b"], calls)])
    with pytest.raises(KilnError, match="symbol 'ext_f' is declared by two modules"):
        rt.create_metadata_module({"w": W}, target, [make_ext("ext_f", ["w"], calls),
                                                     make_ext("ext_f", ["w"], calls)])
    no_init = PyFunctionModule({"get_symbol": lambda: "g", "get_const_vars": lambda: ["w"],
                                "g": lambda: 0})
    root = rt.create_metadata_module({"w": W}, target, [no_init])
    with pytest.raises(KilnError, match="no imported module defines '__init_g'"):
        root.get_function("g")

    def failing_init(w):
        raise ValueError("bad weights")

    bad = PyFunctionModule({"get_symbol": lambda: "h", "get_const_vars": lambda: ["w"],
                            "__init_h": failing_init, "h": lambda: 0})
    root = rt.create_metadata_module({"w": W}, target, [bad])
    with pytest.raises(KilnError, match="__init_h failed: ValueError\\('bad weights'\\)"):
        root.get_function("h")


# ----------------------------------------------------------------------------------- safe untar
def make_tar(path, members):
    """``members``: (TarInfo, bytes or None)."""
    with tarfile.open(path, "w:gz") as t:
        for info, data in members:
            if data is not None:
                info.size = len(data)
            t.addfile(info, io.BytesIO(data) if data is not None else None)


def info(name: str, kind: bytes = tarfile.REGTYPE, link: str = "") -> tarfile.TarInfo:
    i = tarfile.TarInfo(name)
    i.type = kind
    i.linkname = link
    return i


def test_untar_extracts_regular_files(tmp_path):
    p = tmp_path / "ok.tar"
    make_tar(p, [(info("lib0.c"), b"int x;"), (info("sub", tarfile.DIRTYPE), None),
                 (info("./sub/devc.bin"), b"\x01\x02")])
    out = tmp_path / "out"
    out.mkdir()
    assert untar(str(p), str(out)) == ["lib0.c", "sub/devc.bin"]
    assert (out / "lib0.c").read_bytes() == b"int x;"
    assert (out / "sub" / "devc.bin").read_bytes() == b"\x01\x02"


@pytest.mark.parametrize("member, why", [
    (info("/etc/evil.c"), "has an absolute path"),
    (info("../evil.c"), r"leaves the extraction folder \('..'\)"),
    (info("a/../../evil.c"), r"leaves the extraction folder"),
    (info("lib0.c", tarfile.SYMTYPE, "/etc/passwd"), "is a symbolic link"),
    (info("lib1.c", tarfile.LNKTYPE, "lib0.c"), "is a hard link"),
    (info("dev", tarfile.CHRTYPE), "is a device"),
    (info("fifo", tarfile.FIFOTYPE), "is a FIFO"),
])
def test_untar_refuses_unsafe_members(tmp_path, member, why):
    p = tmp_path / "bad.tar"
    make_tar(p, [(info("first.c"), b"int y;"), (member, b"x" if member.isreg() else None)])
    out = tmp_path / "out"
    out.mkdir()
    with pytest.raises(ModuleLoadError, match=rf"refusing tar member '{member.name}': it {why}"):
        untar(str(p), str(out))
    assert list(out.iterdir()) == []  # every member is checked before anything is written
    with pytest.raises(ModuleLoadError, match="refusing tar member"):
        rt.load_module(p)  # refused before any compiler runs


def test_untar_and_load_corrupt_archives(tmp_path):
    good = tmp_path / "good.tar"
    make_tar(good, [(info("lib0.c"), b"int z;" * 100)])
    data = good.read_bytes()
    cut = tmp_path / "cut.tar"
    cut.write_bytes(data[:len(data) // 2])
    with pytest.raises(ModuleLoadError, match="cut.tar"):
        rt.load_module(cut)
    empty = tmp_path / "empty.tar"
    make_tar(empty, [(info("README"), b"nothing to link")])
    with pytest.raises(ModuleLoadError, match=r"holds no .c, .S, .o file to link"):
        rt.load_module(empty)
    plain = tmp_path / "plain"  # an uncompressed tar (TVM's), no suffix: known by its bytes
    with tarfile.open(plain, "w") as t:
        t.addfile(info("README", tarfile.REGTYPE), io.BytesIO(b""))
    with pytest.raises(ModuleLoadError, match=r"plain: the tar holds no"):
        rt.load_module(plain)


# ------------------------------------------------------------- triple → machine, pre-link check
@pytest.mark.parametrize("triple, want", [
    ("x86_64-linux-gnu", (62, True)), ("x86_64-pc-linux-gnu\n", (62, True)),
    ("i686-linux-gnu", (3, True)), ("aarch64-linux-gnu", (183, True)),
    ("aarch64_be-linux-gnu", (183, False)), ("arm-linux-gnueabihf", (40, True)),
    ("armv7l-unknown-linux-gnueabihf", (40, True)), ("riscv64-unknown-linux-gnu", (243, True)),
    ("powerpc64le-linux-gnu", (21, True)), ("powerpc64-linux-gnu", (21, False)),
    ("mipsel-linux-gnu", (8, True)), ("s390x-linux-gnu", (22, False)),
    ("wasm32-unknown-unknown", None),
])
def test_triple_machine(triple, want):
    assert triple_machine(triple) == want


def elf_object(machine: int, little: bool = True) -> bytes:
    """A bare ELF64 relocatable header: enough for the machine check."""
    end = "<" if little else ">"
    head = b"\x7fELF" + bytes([2, 1 if little else 2, 1]) + b"\0" * 9
    return head + struct.pack(end + "HHI", 1, machine, 1) + b"\0" * 40


def test_check_objects_machine(tmp_path):
    ok, arm, be, text = (tmp_path / n for n in ("ok.o", "arm.o", "be.o", "script.ld"))
    ok.write_bytes(elf_object(62))
    arm.write_bytes(elf_object(183))
    be.write_bytes(elf_object(62, little=False))
    text.write_text("/* a linker script is not checked */")
    check_objects_machine([str(ok), str(text)], "x86_64-linux-gnu", "gcc")
    check_objects_machine([str(arm)], "wasm32-unknown-unknown", "clang")  # unknown: no check
    want = (f"{arm} is built for {machine_name(183)} but the linker gcc targets "
            f"x86_64-linux-gnu ({machine_name(62)})")
    with pytest.raises(ToolchainError, match=re.escape(want)):
        check_objects_machine([str(ok), str(arm)], "x86_64-linux-gnu", "gcc")
    with pytest.raises(ToolchainError, match="big-endian but the linker"):
        check_objects_machine([str(be)], "x86_64-linux-gnu", "gcc")
