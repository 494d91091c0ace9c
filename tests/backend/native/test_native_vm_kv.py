"""The C VM's ``vm.builtin.kv_append`` (decision 019, src/kiln/native/src/rt_vm_kv.c): the tiny
llama decoder of test_llama_decoder.py compiled for ``llvm`` and run step by step through the
C API (ctypes over ``libkiln_runtime.so``), its logits and caches compared with the Python VM
on the same file and with onnxruntime; the present caches fed back are appended to in place
(the same buffer step after step) until they outgrow their capacity."""

from __future__ import annotations

import ctypes as C
import subprocess

import numpy as np
import onnx
import pytest
from test_llama_decoder import CFG, PROMPTS, _weights
from test_native_vm import run_vm_fuzz

import kiln
from kiln.frontend import from_onnx
from kiln.llm import Decoder, generate, ort_decoder
from kiln.llm.decoder import DIM_BOUNDS, MASK_SHAPE
from kiln.models.llama_onnx import llama_onnx
from kiln.vm import VirtualMachine

NAMES = ["input_ids", "attention_mask", "position_ids"] + [
    f"past_key_values.{i}.{kv}" for i in range(CFG.layers) for kv in ("key", "value")]
DTYPES = {"float32": (2, 32), "int64": (0, 64)}


class _Value(C.Union):
    _fields_ = [("v_int64", C.c_int64), ("v_handle", C.c_void_p)]


class _DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device_type", C.c_int32), ("device_id", C.c_int32),
                ("ndim", C.c_int32), ("code", C.c_uint8), ("bits", C.c_uint8),
                ("lanes", C.c_uint16), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.c_void_p), ("byte_offset", C.c_uint64)]


class CVM:
    """``main`` of a VM library run by the C VM through the C API: ``run(inputs)`` returns the
    logits (a copy) and the present caches as zero-copy numpy views of the C VM's memory
    (valid until the call after next, decision 022), to be fed back as they are; a function
    returning one tensor gives a list of its copy."""

    def __init__(self, runtime, so):
        self.rt = C.CDLL(str(runtime))
        self.rt.TVMGetLastError.restype = C.c_char_p
        exe = C.c_void_p()
        self._check(self.rt.TVMModLoadFromFile(str(so).encode(), b"so", C.byref(exe)))
        self.vm = C.c_void_p(self._call(self._get(exe, "vm_load_executable"), [])[0].v_handle)
        self._call(self._get(self.vm, "vm_initialization"), [1, 0, 2])
        self.main = self._get(self.vm, "main")

    def _check(self, rc):
        if rc != 0:
            raise RuntimeError(self.rt.TVMGetLastError().decode())

    def _get(self, mod, name):
        f = C.c_void_p()
        self._check(self.rt.TVMModGetFunction(mod, name.encode(), 0, C.byref(f)))
        return f

    def _call(self, f, args):
        vals = (_Value * max(len(args), 1))()
        codes = (C.c_int * max(len(args), 1))()
        for i, a in enumerate(args):
            if isinstance(a, int):
                vals[i].v_int64, codes[i] = a, 0
            else:
                vals[i].v_handle, codes[i] = C.addressof(a), 7
        ret, code = _Value(), C.c_int()
        self._check(self.rt.TVMFuncCall(f, vals, codes, len(args), C.byref(ret), C.byref(code)))
        return ret, code.value

    @staticmethod
    def _tensor(a):
        shape = (C.c_int64 * max(a.ndim, 1))(*a.shape)
        code, bits = DTYPES[str(a.dtype)]
        t = _DLTensor(a.ctypes.data, 1, 0, a.ndim, code, bits, 1, shape, None, 0)
        t._keep = (a, shape)
        return t

    @staticmethod
    def _array(t):
        shape = tuple(t.shape[d] for d in range(t.ndim))
        dtype = {(2, 32): np.float32, (0, 64): np.int64}[(t.code, t.bits)]
        n = int(np.prod(shape)) * np.dtype(dtype).itemsize
        buf = (C.c_uint8 * n).from_address(t.data) if n else bytearray(0)
        return np.frombuffer(buf, dtype).reshape(shape)

    def run(self, inputs):
        args = [self._tensor(np.require(a, requirements="C")) for a in inputs]
        ret, code = self._call(self.main, args)
        if code == 7:  # one tensor
            return [self._array(_DLTensor.from_address(ret.v_handle)).copy()]
        assert code == 8  # a KilnTuple
        out = []
        for i in range(self.rt.KilnTupleSize(C.c_void_p(ret.v_handle))):
            item, icode = _Value(), C.c_int()
            self._check(self.rt.KilnTupleGetItem(C.c_void_p(ret.v_handle), i, C.byref(item),
                                                 C.byref(icode)))
            out.append(self._array(_DLTensor.from_address(item.v_handle)))
        return [out[0].copy(), *out[1:]]


@pytest.fixture(scope="module")
def llama_so(tmp_path_factory):
    folder = tmp_path_factory.mktemp("kv")
    model = llama_onnx(CFG, _weights(CFG), "tiny_llama")
    onnx.save(model, folder / "tiny_llama.onnx")
    mod, params = from_onnx(model, shape={"attention_mask": MASK_SHAPE}, dim_bounds=DIM_BOUNDS)
    kiln.build(mod, target="llvm", params=params).export_library(str(folder / "tiny.so"))
    return folder / "tiny.so", folder / "tiny_llama.onnx"


def _decoders(native_rt, llama_so):
    vm = VirtualMachine(kiln.runtime.load_module(str(llama_so[0])), kiln.cpu())
    kv = (CFG.kv_heads, CFG.head_dim)
    py = Decoder(lambda inputs: vm["main"](*inputs), NAMES, kv, "kiln")
    cvm = CVM(native_rt / "libkiln_runtime.so", llama_so[0])
    return Decoder(cvm.run, NAMES, kv, "kiln"), py, ort_decoder(llama_so[1])


def test_greedy_tokens_equal_python_vm_and_onnxruntime(native_rt, llama_so):
    """A left-padded batch of two prompts, 4 greedy tokens each."""
    c, py, ref = _decoders(native_rt, llama_so)
    got = generate(c, PROMPTS, max_new_tokens=4).tokens
    assert got == generate(py, PROMPTS, max_new_tokens=4).tokens
    assert got == generate(ref, PROMPTS, max_new_tokens=4).tokens


def test_logits_and_caches_in_place_then_grown(native_rt, llama_so):
    """Prefill 30 tokens (a 64-row buffer), two single steps appended in place (the same
    memory), a 40-token chunk that outgrows the buffer (a new one), two more in place; every
    step's logits and caches equal the Python VM's and onnxruntime's."""
    c, py, ref = _decoders(native_rt, llama_so)
    rng = np.random.default_rng(1)
    chunks = [30, 1, 1, 40, 1, 1]
    pasts = [d.empty_cache(1) for d in (c, py, ref)]
    total, addresses = 0, []
    for n in chunks:
        ids = rng.integers(0, CFG.vocab, (1, n))
        mask = np.ones((1, total + n), np.int64)
        pos = np.arange(total, total + n)[None]
        outs = [d(ids, mask, pos, p) for d, p in zip((c, py, ref), pasts)]
        pasts = [o[1] for o in outs]
        total += n
        np.testing.assert_allclose(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(outs[0][0], outs[2][0], rtol=1e-4, atol=1e-4)
        for x, y, z in zip(*pasts):
            assert x.shape == (total, 1, CFG.kv_heads, CFG.head_dim)
            np.testing.assert_array_equal(x, np.asarray(y))
            np.testing.assert_allclose(x, z, rtol=1e-4, atol=1e-5)
        addresses.append([x.ctypes.data for x in pasts[0]])
    assert addresses[1] == addresses[0] == addresses[2]  # appended in place
    assert addresses[3] != addresses[2] and addresses[5] == addresses[4] == addresses[3]


def test_stale_and_foreign_pasts_are_copied(native_rt, llama_so):
    """A step run twice from the same past (beam search: the second sees a shorter view than
    the buffer's rows) and a past that is a numpy copy give the same results as the first."""
    c, _, _ = _decoders(native_rt, llama_so)
    ids, mask, pos = np.array([PROMPTS[0]]), np.ones((1, 6), np.int64), np.arange(6)[None]
    _, past = c(ids, mask, pos, c.empty_cache(1))
    foreign_past = [x.copy() for x in past]
    step = (np.array([[3]]), np.ones((1, 7), np.int64), np.array([[6]]))
    first, present = c(*step, past)
    first_present = [x.copy() for x in present]
    # past is now shorter than its buffer's filled rows; after this call it is freed (the C
    # VM's results are valid until the call after the one they were fed to)
    again, present2 = c(*step, past)
    np.testing.assert_array_equal(first, again)
    for x, y in zip(present2, first_present):
        np.testing.assert_array_equal(x, y)
    foreign, present3 = c(*step, foreign_past)
    np.testing.assert_array_equal(first, foreign)
    for x, y in zip(present3, first_present):
        np.testing.assert_array_equal(x, y)


def test_kiln_run_under_sanitizers(native_rt_asan, llama_so, tmp_path):
    """A prefill step from an empty cache by kiln_run under ASan + UBSan, three times (each
    call frees the buffers of the one before)."""
    ref = ort_decoder(llama_so[1])
    ids, mask, pos = np.array([PROMPTS[0]]), np.ones((1, 6), np.int64), np.arange(6)[None]
    inputs = [ids, mask, pos, *ref.empty_cache(1)]
    files, shapes = [], []
    for name, a in zip(NAMES, inputs):
        f = tmp_path / f"{name}.bin"
        np.ascontiguousarray(a).tofile(f)
        files.append(str(f))
        shapes += ["--shape", f"{name}={'x'.join(map(str, a.shape))}"]
    outs = [str(tmp_path / f"out{i}.bin") for i in range(1 + 2 * CFG.layers)]
    proc = subprocess.run([str(native_rt_asan / "kiln_run"), str(llama_so[0]), "--repeat", "3",
                           *shapes, *files, *outs], check=False, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    logits, present = ref(ids, mask, pos, ref.empty_cache(1))
    got = np.fromfile(outs[0], np.float32).reshape(logits.shape)
    np.testing.assert_allclose(got, logits, rtol=1e-4, atol=1e-4)
    for f, want in zip(outs[1:], present):
        np.testing.assert_allclose(np.fromfile(f, np.float32).reshape(want.shape), want,
                                   rtol=1e-4, atol=1e-5)


def test_damaged_decoder_executable_under_sanitizers(native_vm_drivers, llama_so, tmp_path):  # noqa: F811
    """The VM fuzz of test_native_vm.py over the decoder's executable (kv_append's sites
    damaged too): no crash, the damage is an error."""
    run_vm_fuzz(native_vm_drivers, llama_so[0], tmp_path, 150)
