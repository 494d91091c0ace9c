"""Corpus and mutations for the runtime loader fuzzer (``fuzz_runtime.py``).

Every function takes its randomness from the ``random.Random`` it is given, so a case is
reproducible from its seed. Byte mutations (:func:`mutate_bytes`) serve every binary format;
:func:`mutate_text` and :func:`mutate_doc` mutate graph JSON as text and as a parsed document.
"""

from __future__ import annotations

import copy
import json
import random
import re
import struct
from typing import Any

import numpy as np

import kiln.runtime as rt
from kiln.runtime.blob import pack_imports
from kiln.runtime.module import PyFunctionModule

_U64 = struct.Struct("<Q")


# ----------------------------------------------------------------------------------- corpus
def _tvm_op(name: str, func: str, inputs: list[int], n_out: int = 1, flatten: str = "0") -> dict:
    return {"op": "tvm_op", "name": name, "inputs": [[i, 0, 0] for i in inputs],
            "attrs": {"func_name": func, "num_inputs": str(len(inputs)),
                      "num_outputs": str(n_out), "flatten_data": flatten}}


def graph_docs() -> list[dict]:
    """Valid graphs: x, y, p0 → add → mul → add (shared storage); a two-output op with
    ``__copy`` and ``__nop``; a flattened op over int8 and bool entries."""
    n6 = [{"op": "null", "name": n, "inputs": []} for n in ("x", "y", "p0")]
    n6 += [_tvm_op("add1", "fused_add", [0, 1]), _tvm_op("mul2", "fused_mul", [3, 2]),
           _tvm_op("out", "fused_add", [4, 0])]
    g1 = {"nodes": n6, "arg_nodes": [0, 1, 2], "heads": [[5, 0, 0]],
          "node_row_ptr": list(range(7)),
          "attrs": {"dltype": ["list_str", ["float32"] * 6],
                    "storage_id": ["list_int", [0, 1, 2, 3, 4, 3]],
                    "shape": ["list_shape", [[2, 3]] * 6],
                    "device_index": ["list_int", [1] * 6],
                    "output_names": ["list_str", ["out"]]}}
    n2 = [{"op": "null", "name": "x", "inputs": []}, _tvm_op("split", "split2", [0], 2),
          {"op": "tvm_op", "name": "cp", "inputs": [[1, 1, 0]],
           "attrs": {"func_name": "__copy", "num_inputs": "1", "num_outputs": "1"}},
          {"op": "tvm_op", "name": "nop", "inputs": [[1, 0, 0]],
           "attrs": {"func_name": "__nop", "num_inputs": "1", "num_outputs": "1"}}]
    g2 = {"nodes": n2, "arg_nodes": [0], "heads": [[1, 0, 0], [2, 0, 0]],
          "node_row_ptr": [0, 1, 3, 4, 5],
          "attrs": {"dltype": ["list_str", ["float32"] * 5],
                    "storage_id": ["list_int", [0, 1, 2, 3, 1]],
                    "shape": ["list_shape", [[4], [2], [2], [2], [2]]]}}
    n3 = [{"op": "null", "name": "a", "inputs": []}, {"op": "null", "name": "m", "inputs": []},
          _tvm_op("sel", "select", [0, 1], 1, "1")]
    g3 = {"nodes": n3, "arg_nodes": [0, 1], "heads": [[2, 0, 0]], "node_row_ptr": [0, 1, 2, 3],
          "attrs": {"dltype": ["list_str", ["int8", "uint1", "int8"]],
                    "storage_id": ["list_int", [0, 1, 2]],
                    "shape": ["list_shape", [[1, 2, 2], [4], []]],
                    "device_index": ["list_int", [1, 1, 1]]}}
    return [g1, g2, g3]


def graph_params(doc: dict) -> dict[str, np.ndarray]:
    """The params bound to a corpus graph: ``p0`` (2×3 float32) where it has that input."""
    names = [n["name"] for n in doc["nodes"]]
    return {"p0": np.arange(6, dtype="float32").reshape(2, 3)} if "p0" in names else {}


def _noop(*args: Any) -> None:
    return None


def numpy_kernels() -> PyFunctionModule:
    """Python kernels with every name the corpus graphs use (never called: creation only)."""
    return PyFunctionModule({n: _noop for n in ("fused_add", "fused_mul", "split2", "select")})


def params_corpus() -> list[bytes]:
    rng = np.random.default_rng(0)
    return [
        rt.save_param_dict({"w": rng.standard_normal((3, 4)).astype("float32"),
                            "b": np.array(7, "int64"), "m": np.array([True, False]),
                            "e": np.zeros((0, 5), "float16")}),
        rt.save_param_dict({}),
        rt.save_param_dict({"u": np.arange(5, dtype="uint8"), "d": np.ones((1, 1, 2))}),
    ]


def factory_corpus() -> list[bytes]:
    out = []
    for doc in graph_docs():
        fac = rt.GraphExecutorFactoryModule(json.dumps(doc), None, graph_params(doc), "default")
        out.append(fac.save_to_binary())
    return out


def blob_corpus() -> list[bytes]:
    """Payloads (without ``u64 nbytes``) as ``export_library`` writes them."""
    out = []
    for doc in graph_docs():
        lib = rt.CSourceModule("", ["fused_add", "fused_mul", "split2", "select"])
        fac = rt.GraphExecutorFactoryModule(json.dumps(doc), lib, graph_params(doc))
        out.append(pack_imports(fac)[8:])
    return out


def json_runtime_corpus() -> list[bytes]:
    """``kiln_json`` (BYOC) module bytes: symbol | graph JSON | constant names."""
    def t(*shape):
        return {"shape": [list(shape)], "dtype": ["float32"]}

    conv = {"strides": [1, 1], "padding": [1, 1, 1, 1], "dilation": [1, 1], "groups": 1,
            "bias": 1, "activation": "relu"}
    graphs = [
        ("f0", {"nodes": [{"op": "input", "name": "x", "attrs": t(1, 2, 4, 4)},
                          {"op": "const", "name": "f0_const_0", "attrs": t(3, 2, 3, 3)},
                          {"op": "const", "name": "f0_const_1", "attrs": t(3)},
                          {"op": "kernel", "name": "kiln_json.conv2d_bias_relu",
                           "inputs": [[0, 0, 0], [1, 0, 0], [2, 0, 0]],
                           "attrs": dict(conv, **t(1, 3, 4, 4))},
                          {"op": "kernel", "name": "nn.max_pool2d", "inputs": [[3, 0, 0]],
                           "attrs": dict(t(1, 3, 2, 2), pool_size=[2, 2], strides=[2, 2],
                                         padding=[0, 0, 0, 0], dilation=[1, 1],
                                         ceil_mode=False)}],
                "arg_nodes": [0], "heads": [[4, 0, 0], [3, 0, 0]],
                "node_row_ptr": [0, 1, 2, 3, 4, 5]}, ["f0_const_0", "f0_const_1"]),
        ("f1", {"nodes": [{"op": "input", "name": "a", "attrs": t(2, 3)},
                          {"op": "input", "name": "b", "attrs": t(2, 3)},
                          {"op": "kernel", "name": "add", "inputs": [[0, 0, 0], [1, 0, 0]],
                           "attrs": t(2, 3)},
                          {"op": "kernel", "name": "nn.relu", "inputs": [[2, 0, 0]],
                           "attrs": t(2, 3)}],
                "arg_nodes": [0, 1], "heads": [[3, 0, 0]]}, []),
    ]
    return [rt.JSONRuntimeModule(sym, json.dumps(g), consts).save_to_binary()
            for sym, g, consts in graphs]


# --------------------------------------------------------------------------- byte mutations
_HUGE = (2**64 - 1, 2**63 - 1, 2**63, 2**62, 2**40, 2**32 - 1, 2**32, 2**31, 2**31 - 1)
_I32 = (-1, -2**31, 2**31 - 1, 64, 65, 4096, 0)


def vm_exec_corpus() -> list[bytes]:
    """VM executables (``vm_programs``): straight-line, loop, tuples with a VM call, and every
    kind of constant."""
    import vm_programs as P

    return [P.add_mul().save_to_binary(), P.loop().save_to_binary(),
            P.tuple_prog().save_to_binary(), P.consts_exe().save_to_binary()]


def vm_kernels() -> PyFunctionModule:
    """Python kernels with every name the VM corpus calls."""
    import vm_programs as P

    return P.py_kernels()


def mutate_vm_words(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """Overwrite one to three ``i64`` words of the code section with values the decoder must
    judge: opcodes, registers and counts off by one or huge, argument words of every kind
    (valid and not), jump offsets."""
    n = struct.unpack_from("<I", data, 12)[0]
    off = length = 0
    for i in range(n):
        sid, o, ln = struct.unpack_from("<IQQ", data, 16 + 20 * i)
        if sid == 4:
            off, length = o, ln
    words = (length - 8) // 8
    if words <= 0:
        return mutate_bytes(rng, data)
    buf = bytearray(data)
    steps = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        w = rng.randrange(words)
        kind = rng.randrange(8)
        value = rng.choice((0, 1, -1, 2, 3, 4, 5, 7, 63, 1 << 20, 2**55 - 1, -(2**55),
                            rng.randrange(-100, 100)))
        word = ((kind << 56) | (value & ((1 << 56) - 1))) if rng.random() < 0.5 else value
        word = word - (1 << 64) if word >= 1 << 63 else word
        struct.pack_into("<q", buf, off + 8 + 8 * w, word)
        steps.append(f"word{w}={word}")
    return bytes(buf), " ".join(steps)


def _length_offsets(data: bytes) -> list[int]:
    """Offsets of 8-byte windows whose value could be a length or count (0 < v <= len)."""
    return [i for i in range(len(data) - 7) if 0 < _U64.unpack_from(data, i)[0] <= len(data)]


_OFFSETS: dict[bytes, list[int]] = {}


_KINDS = ("flip", "flip", "byte", "insert", "delete", "length", "length", "i32", "truncate",
          "dup")
_IN_PLACE = ("flip", "flip", "byte", "length", "length", "i32")


def mutate_bytes(rng: random.Random, data: bytes, lo: int = 0, hi: int | None = None,
                 resize: bool = True) -> tuple[bytes, str]:
    """One to four mutations of ``data`` inside ``[lo, hi)``; returns (bytes, description).

    Kinds: bit flips, byte replacements, inserted / deleted / duplicated ranges, truncation,
    and ``u64`` / ``i32`` fields overwritten with huge or off-by-one values (``u64`` offsets
    are mostly ones whose value could be a length or count). ``resize=False``: only the
    in-place kinds, so bytes outside ``[lo, hi)`` stay where they are.
    """
    buf = bytearray(data)
    hi = len(buf) if hi is None else hi
    steps = []
    for _ in range(rng.choice((1, 1, 1, 2, 2, 3, 4))):
        span = max(hi - lo, 1)
        pos = lo + rng.randrange(span)
        kind = rng.choice(_KINDS if resize else _IN_PLACE)
        if kind == "flip" and pos < len(buf):
            bit = rng.randrange(8)
            buf[pos] ^= 1 << bit
            steps.append(f"flip@{pos}.{bit}")
        elif kind == "byte" and pos < len(buf):
            val = rng.choice((0, 0xFF, 0x7F, 0x80, rng.randrange(256)))
            buf[pos] = val
            steps.append(f"byte@{pos}={val:#x}")
        elif kind == "insert":
            n = rng.choice((1, 8, rng.randrange(1, 65)))
            ins = bytes(rng.randrange(256) for _ in range(n)) if rng.random() < 0.5 else \
                bytes(buf[pos:pos + n])
            buf[pos:pos] = ins
            hi += len(ins)
            steps.append(f"insert@{pos}+{len(ins)}")
        elif kind == "delete":
            n = min(rng.choice((1, 8, rng.randrange(1, 65))), hi - pos)
            del buf[pos:pos + n]
            hi -= n
            steps.append(f"delete@{pos}-{n}")
        elif kind == "length":
            key = bytes(buf)
            cands = [o for o in _OFFSETS.setdefault(key, _length_offsets(key)) if lo <= o < hi]
            if len(_OFFSETS) > 256:
                _OFFSETS.clear()
            off = rng.choice(cands) if cands and rng.random() < 0.8 else pos
            off = min(off, max(len(buf) - 8, 0) if resize else hi - 8)
            old = _U64.unpack_from(bytes(buf[off:off + 8]).ljust(8, b"\0"))[0]
            remaining = len(buf) - off - 8
            val = rng.choice((*_HUGE, old + 1, max(old - 1, 0), old * 2, remaining,
                              remaining + 1, len(buf), 0)) % 2**64
            buf[off:off + 8] = _U64.pack(val)
            steps.append(f"u64@{off}={val}")
        elif kind == "i32":
            off = min(pos, max(len(buf) - 4, 0) if resize else hi - 4)
            val = rng.choice(_I32)
            buf[off:off + 4] = struct.pack("<i", val)
            steps.append(f"i32@{off}={val}")
        elif kind == "truncate":
            del buf[pos:]
            hi = min(hi, pos)
            steps.append(f"truncate@{pos}")
        elif kind == "dup":
            n = rng.randrange(1, 65)
            buf[pos:pos] = buf[pos:pos + n]
            hi += len(buf[pos:pos + n])
            steps.append(f"dup@{pos}+{n}")
        hi = max(min(hi, len(buf)), lo)
    return bytes(buf), " ".join(steps) or "none"


_TOKENS = re.compile(rb'-?\d+|"[^"\\]*"')
_NUMBERS = (b"-1", b"0", b"2", b"4294967296", b"1099511627776", b"9223372036854775807",
            b"18446744073709551616", b"1e400", b"-0", b"1.5", b"NaN", b"-Infinity", b"9" * 5000,
            b"true", b"null", b'"1"', b"[]", b"{}")
_STRINGS = (b'""', b'"float31"', b'"\\ud800"', b'"tvm_op"', b'"null"', b'"list_int"',
            b'"__copy"', b'"x"', b"0", b"null", b"[]", b'"' + b"a" * 300 + b'"')


def mutate_text(rng: random.Random, data: bytes) -> tuple[bytes, str]:
    """JSON-aware mutations of JSON text: replace number and string tokens (so the text stays
    mostly valid and the mutation reaches the validator), else :func:`mutate_bytes`."""
    if rng.random() < 0.4:
        return mutate_bytes(rng, data)
    steps = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        tokens = list(_TOKENS.finditer(data))
        m = rng.choice(tokens)
        new = rng.choice(_NUMBERS if m.group()[:1] != b'"' else _STRINGS)
        data = data[:m.start()] + new + data[m.end():]
        steps.append(f"token@{m.start()}:{m.group()[:20]!r}->{new[:20]!r}")
    return data, " ".join(steps)


# ---------------------------------------------------------------------- structural mutations
_BAD_DLTYPES = ("float31", "int", "float", "f4", ">f4", "<i8", "float32x4", "", "uint1", "bool",
                "bfloat16", "complex64", "f4,f4", "(2,)f4", "O", "U10", "S0", "V8", "M8[xyz]",
                "a", "object", "float128", "int4", "handle", "void", "Float32", " float32",
                "float32\x00", "\udcff", 7, None, ["float32"])
_DIMS = (-1, -2**63, 0, 1, 2**20, 2**31, 2**32, 2**40, 2**62, 2**63 - 1, 2**63, 2**64, 10**30,
         1.5, "3", "-3", True, None, [2], float("nan"), float("inf"))


def _interesting(rng: random.Random) -> Any:
    deep: Any = 0
    for _ in range(rng.choice((5, 50, 400))):
        deep = [deep]
    return rng.choice((None, True, False, 0, -1, 1, 2, 2**31, 2**32, 2**40, 2**63 - 1, 2**63,
                       2**64, -2**63, 10**30, 1.5, float("nan"), float("inf"), "", "0", "-1",
                       "1", "x", "9" * 30, "float32", "null", "tvm_op", [], [0], [-1], [0, 0],
                       [[0, 0, 0]], [0, 0, 0, 0], {}, {"a": 1}, {"func_name": "fused_add"},
                       deep, "\u00e9\udcff"))


def _slots(obj: Any, path: tuple = ()) -> list[tuple]:
    """Every (path) to a value inside ``obj``."""
    out = [path]
    if isinstance(obj, dict):
        for k, v in obj.items():
            out += _slots(v, (*path, k))
    elif isinstance(obj, list):
        for i, v in enumerate(obj):
            out += _slots(v, (*path, i))
    return out


def _get(obj: Any, path: tuple) -> Any:
    for k in path:
        obj = obj[k]
    return obj


def _targeted(rng: random.Random, doc: dict) -> str:
    attrs = doc.get("attrs") if isinstance(doc.get("attrs"), dict) else None
    nodes = doc.get("nodes") if isinstance(doc.get("nodes"), list) else []
    kind = rng.choice(("shape", "shape", "dltype", "dltype", "row_ptr", "input", "num", "sid",
                       "args", "kind", "drop_key"))

    def entry_list(key: str) -> list | None:
        v = attrs.get(key) if attrs else None
        return v[1] if isinstance(v, list) and len(v) == 2 and isinstance(v[1], list) and v[1] \
            else None

    if kind == "shape" and (shapes := entry_list("shape")):
        eid = rng.randrange(len(shapes))
        n = rng.choice((1, 1, 2, 3, 65))
        dims = [rng.choice(_DIMS) if n < 65 else 1 for _ in range(n)]
        if rng.random() < 0.3:
            dims = [0, 2**62, 4] if rng.random() < 0.5 else [2**20, 2**20]
        shapes[eid] = dims
        return f"shape[{eid}]={dims!r}"
    if kind == "dltype" and (dl := entry_list("dltype")):
        eid = rng.randrange(len(dl))
        dl[eid] = rng.choice(_BAD_DLTYPES)
        return f"dltype[{eid}]={dl[eid]!r}"
    if kind == "row_ptr" and isinstance(doc.get("node_row_ptr"), list) and doc["node_row_ptr"]:
        rp = doc["node_row_ptr"]
        i = rng.randrange(len(rp))
        old = rp[i] if isinstance(rp[i], int) else 0
        rp[i] = rng.choice((old + 1, old - 1, -1, 2**63, "1", None))
        return f"node_row_ptr[{i}]={rp[i]!r}"
    if kind == "input" and nodes:
        nid = rng.randrange(len(nodes))
        node = nodes[nid]
        if isinstance(node, dict):
            ref = [rng.choice((nid, nid + 1, -1, 0, 2**63, len(nodes), "0")),
                   rng.choice((0, 1, 2, -1, 2**40, "0")), 0][:rng.choice((1, 2, 3, 3, 4))]
            node["inputs"] = [ref] + list(node.get("inputs") or [])[1:] \
                if isinstance(node.get("inputs"), list) else [ref]
            return f"node[{nid}].inputs[0]={ref!r}"
    if kind == "num" and nodes:
        nid = rng.randrange(len(nodes))
        node = nodes[nid]
        if isinstance(node, dict) and isinstance(node.get("attrs"), dict):
            key = rng.choice(("num_outputs", "num_inputs", "flatten_data", "func_name"))
            node["attrs"][key] = rng.choice(("0", "-1", "2", "3", "99999999999999999999", "x",
                                             3, None, "1.0", " 1", "__copy", "__nop", ""))
            return f"node[{nid}].{key}={node['attrs'][key]!r}"
    if kind == "sid" and (sid := entry_list("storage_id")):
        eid = rng.randrange(len(sid))
        sid[eid] = rng.choice((-1, 2**63, 2**64, 10**6, "0", 0.5, sid[0]))
        return f"storage_id[{eid}]={sid[eid]!r}"
    if kind == "args":
        key = rng.choice(("arg_nodes", "heads"))
        val = rng.choice(([len(nodes)], [-1], [[len(nodes), 0, 0]], [[0, 5, 0]], [[0]], "x",
                          [2**63], [[-1, 0, 0]], [[0, 0, 0]] * 3))
        doc[key] = val
        return f"{key}={val!r}"
    if kind == "kind" and attrs:
        key = rng.choice(("dltype", "shape", "storage_id", "device_index"))
        if isinstance(attrs.get(key), list) and attrs[key]:
            attrs[key][0] = rng.choice(("list_int", "list_str", "list_shape", "x", None))
            return f"attrs.{key}[0]={attrs[key][0]!r}"
    key = rng.choice(("nodes", "arg_nodes", "heads", "attrs", "node_row_ptr"))
    doc.pop(key, None)
    return f"drop {key}"


def mutate_doc(rng: random.Random, doc: dict) -> tuple[bytes, str]:
    """One to three structural mutations of a graph document; returns (JSON bytes, desc)."""
    doc = copy.deepcopy(doc)
    steps = []
    for _ in range(rng.choice((1, 1, 2, 3))):
        if rng.random() < 0.5:
            steps.append(_targeted(rng, doc))
            continue
        path = rng.choice(_slots(doc)[1:])
        parent, key = _get(doc, path[:-1]), path[-1]
        action = rng.choice(("replace", "replace", "delete", "append"))
        if action == "delete":
            del parent[key]
        elif action == "append" and isinstance(parent[key], list):
            parent[key].append(_interesting(rng) if rng.random() < 0.5 else
                               copy.deepcopy(rng.choice(parent[key]) if parent[key] else 0))
        else:
            parent[key] = _interesting(rng)
        steps.append(f"{action} {'.'.join(map(str, path))}")
    text = json.dumps(doc)
    if rng.random() < 0.05:  # nesting deeper than Python's recursion limit
        n = rng.choice((2000, 100000))
        text = text.replace('"heads": [', '"heads": ' + "[" * n, 1).replace(
            '"node_row_ptr"', "]" * (n - 1) + ', "node_row_ptr"', 1)
        steps.append(f"nest heads {n}")
    return text.encode("utf-8", "surrogatepass"), " ".join(steps)
