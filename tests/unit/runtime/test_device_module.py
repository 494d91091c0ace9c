"""The jit device module's bytes (``kiln_jit``): round trip through the blob loader, and the
errors a corrupt or foreign artifact raises. No C compiler: nothing is called here."""

from __future__ import annotations

import struct

import pytest

from kiln.errors import KilnError, ModuleLoadError
from kiln.runtime import get_global_func
from kiln.runtime.jit.device_module import DeviceFunction, SourceDeviceModule
from kiln.runtime.stream import StreamWriter

CODE = "/* kernels */ int x;\n"
FUNCS = [DeviceFunction("fused_add", ("float32", "float32", "float32")),
         DeviceFunction("fused_cast", ("int64", "float16"), 1)]


def test_round_trip_through_the_registered_loader():
    mod = SourceDeviceModule(CODE, FUNCS)
    data = mod.save_to_binary()
    # u64 version, then the sources as strings: the artifact holds them as text
    assert struct.unpack_from("<QQQ", data) == (1, 1, len(CODE)) and CODE.encode() in data
    back = get_global_func("runtime.module.loadbinary_kiln_jit")(data)
    assert isinstance(back, SourceDeviceModule) and back.type_key == "kiln_jit"
    assert back.get_source() == CODE and back.sources == [CODE]
    two = SourceDeviceModule.load_from_binary(SourceDeviceModule([CODE, "int y;\n"],
                                                                 FUNCS).save_to_binary())
    assert two.sources == [CODE, "int y;\n"]
    assert back.list_function_names() == ["fused_add", "fused_cast"]
    assert list(back.functions.values()) == FUNCS
    assert back.get_function("fused_add") is not None and back.get_function("nope") is None


def _bytes(version=1, dtypes=("float32",), num_outputs=1, extra=b""):
    w = StreamWriter()
    w.u64(version)
    w.vec_str([CODE, CODE])
    w.u64(1)
    w.string("f")
    w.vec_str(list(dtypes))
    w.u64(num_outputs)
    return w.getvalue() + extra


@pytest.mark.parametrize("data, match", [
    (_bytes(version=2), "format version 2"),
    (_bytes(dtypes=("complex64",)), "not supported"),
    (_bytes(num_outputs=2), "2 outputs of 1 arguments"),
    (_bytes(extra=b"x"), "trailing bytes"),
    (_bytes()[:-3], "truncated"),
])
def test_corrupt_bytes_raise_module_load_errors(data, match):
    with pytest.raises(ModuleLoadError, match=match):
        SourceDeviceModule.load_from_binary(data)


def test_duplicate_function_names():
    with pytest.raises(KilnError, match="duplicate"):
        SourceDeviceModule(CODE, [FUNCS[0], FUNCS[0]])
