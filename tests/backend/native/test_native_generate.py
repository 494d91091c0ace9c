"""examples/generate_vm_c: greedy generation from C through libkiln_runtime (token ids in, token
ids out; the prompt in one call, then one token per call with the present caches fed back).
Its tokens equal ``kiln.llm.generate``'s on the Python VM over the same file: the tiny llama
decoder of test_llama_decoder.py and SmolLM2-135M-Instruct (``slow``: the compiled decoder of
test_smollm2.py, cached), both also with the runtime and the program under ASan + UBSan."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from test_llama_decoder import PROMPTS
from test_native_vm import SANITIZE, _env, tiny  # noqa: F401 (tiny: a fixture)
from test_native_vm_kv import NAMES, llama_so  # noqa: F401 (llama_so: a fixture)
from test_smollm2 import PROMPTS as CHAT_PROMPTS
from test_smollm2 import _cache_env, _chat_ids

import kiln
from kiln.llm import Decoder, generate
from kiln.vm import VirtualMachine

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "generate_vm_c"
#: the program's timing line on stderr
TIMING = re.compile(r"prefill: (\d+) tokens, [\d.]+ ms \(CPU [\d.]+ ms\); decode: (\d+) steps, "
                    r"([\d.]+) ms \(CPU ([\d.]+) ms\), ([\d.]+) tokens/s")

ASAN_CFLAGS = " ".join(["-g", "-O1", *SANITIZE])


def build_example(rt: Path, folder: Path, cflags: str = "-O2") -> Path:
    """examples/generate_vm_c built by its Makefile against the runtime folder ``rt``."""
    if shutil.which("cc") is None or shutil.which("make") is None:
        pytest.skip("needs make and cc")
    src = folder / "generate_vm_c"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("generate_vm_c", "*.so"))
    subprocess.run(["make", "-s", "-C", str(src), f"KILN_RT={rt}", f"CFLAGS={cflags}"],
                   check=True, capture_output=True, text=True, timeout=300)
    return src / "generate_vm_c"


def run_example(prog: Path, so: Path, prompt: list[int], *options: str,
                env: dict | None = None) -> tuple[list[int], re.Match]:
    """The program's new tokens and its timing line."""
    proc = subprocess.run([str(prog), str(so), *options, *map(str, prompt)], capture_output=True,
                          text=True, timeout=900, env=env or {**os.environ,
                                                              "KILN_NUM_THREADS": "1"},
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    timing = TIMING.search(proc.stderr)
    assert timing, proc.stderr
    return [int(t) for t in proc.stdout.split()], timing


def python_vm_decoder(so: Path) -> Decoder:
    """``main`` of the library ``so`` run by the Python VM, as kiln.llm.kiln_decoder runs it."""
    vm = VirtualMachine(kiln.runtime.load_module(str(so)), kiln.cpu())
    exe = vm.module.exe
    params = exe.functions[exe.func_index["main"]].params
    main = vm["main"]
    return Decoder(lambda inputs: main(*inputs), [p.name for p in params],
                   tuple(params[3].dims[2:]), "kiln")


@pytest.fixture(scope="module")
def example(native_rt, tmp_path_factory) -> Path:
    return build_example(native_rt, tmp_path_factory.mktemp("generate"))


def test_tiny_decoder_tokens_equal_python_vm(example, llama_so):  # noqa: F811
    """Both prompts, 12 greedy tokens; with a stop token, the reply ends before it."""
    py = python_vm_decoder(llama_so[0])
    assert py.input_names == NAMES
    for prompt in PROMPTS:
        want = generate(py, [prompt], max_new_tokens=12).tokens[0]
        got, timing = run_example(example, llama_so[0], prompt, "--max-new-tokens", "12")
        assert got == want
        assert int(timing[1]) == len(prompt) and int(timing[2]) == 11
    stop = want[3]
    got, timing = run_example(example, llama_so[0], PROMPTS[1], "--max-new-tokens", "12",
                              "--stop", "1000", "--stop", str(stop))
    assert got == generate(py, [PROMPTS[1]], max_new_tokens=12, stop_token_ids=[stop]).tokens[0]
    assert got == want[:want.index(stop)] and int(timing[2]) == len(got)


def test_tiny_decoder_under_sanitizers(native_rt_asan, llama_so, tmp_path):  # noqa: F811
    """The runtime and the program under ASan + UBSan (leaks too): 40 tokens, so the caches
    outgrow their first 64-row buffers."""
    prog = build_example(native_rt_asan, tmp_path, ASAN_CFLAGS)
    py = python_vm_decoder(llama_so[0])
    got, _ = run_example(prog, llama_so[0], PROMPTS[0], "--max-new-tokens", "40", env=_env())
    assert got == generate(py, [PROMPTS[0]], max_new_tokens=40).tokens[0]


def test_bad_command_lines(example, llama_so, tiny, tmp_path):  # noqa: F811
    """Usage errors exit 2 naming the usage, and so does a prompt id past the vocabulary (the
    model's Gather would clamp it); a file that is not a library, and a VM library that is not
    a decoder, exit 1 naming the file."""
    so = str(llama_so[0])
    for args in ([so], [so, "--max-new-tokens", "0", "5"], [so, "--max-new-tokens", "3"],
                 [so, "--top-k", "3", "5"], [so, "5", "x"], [so, "-5"]):
        proc = subprocess.run([str(example), *args], capture_output=True, text=True,
                              timeout=60, check=False)
        assert proc.returncode == 2 and "usage:" in proc.stderr, (args, proc.stderr)
    proc = subprocess.run([str(example), so, "5", "101"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 2 and proc.stdout == ""
    assert "prompt id 101 (position 1) is not below the vocabulary size 101" in proc.stderr
    (tmp_path / "not.so").write_bytes(b"not a library")
    proc = subprocess.run([str(example), str(tmp_path / "not.so"), "5"], capture_output=True,
                          text=True, timeout=60, check=False)
    assert proc.returncode == 1 and "not.so" in proc.stderr, proc.stderr
    proc = subprocess.run([str(example), str(tiny[0]), "5"], capture_output=True, text=True,
                          timeout=60, check=False)
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr == f"{tiny[0]}: main takes 1 inputs, not a decoder's 3 + caches\n"


def _smollm2(kiln_cache_dir, quantize_weights: str | None = None):
    """(a compiled SmolLM2 decoder of test_smollm2.py, its tokenizer)."""
    pytest.importorskip("gguf")
    from kiln.llm.decoder import compiled_decoder_path
    from kiln.models import smollm2, smollm2_tokenizer

    with _cache_env(kiln_cache_dir):
        return (compiled_decoder_path(smollm2(), "llvm -mcpu=native", quantize_weights),
                smollm2_tokenizer())


@pytest.fixture(scope="module")
def smollm2_so(kiln_cache_dir):
    return _smollm2(kiln_cache_dir)


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")
@pytest.mark.parametrize("quantize_weights", [None, "int8", "q4"])
def test_smollm2_tokens_equal_python_vm(example, kiln_cache_dir, quantize_weights):
    """A chat prompt, 16 greedy tokens (no stop token), float32 and weight-only int8 / q4
    weights (the artifacts of test_smollm2.py); prints both decoders' speed."""
    so, tok = _smollm2(kiln_cache_dir, quantize_weights)
    ids = _chat_ids(tok, CHAT_PROMPTS[0])
    want = generate(python_vm_decoder(so), [ids], max_new_tokens=16)
    got, timing = run_example(example, so, ids, "--max-new-tokens", "16")
    assert got == want.tokens[0], (tok.decode(got), tok.decode(want.tokens[0]))
    assert "Paris" in tok.decode(got)
    print(f"{quantize_weights}: decode tokens/s at one thread: C {float(timing[5]):.2f}, Python VM "
          f"{want.decode_tokens_per_s:.2f}")


@pytest.mark.slow
@pytest.mark.xdist_group("smollm2")
def test_smollm2_under_sanitizers(native_rt_asan, smollm2_so, tmp_path):
    """The runtime and the program under ASan + UBSan (leaks too) over the 655 MB decoder:
    4 greedy tokens, the Python VM's."""
    so, tok = smollm2_so
    ids = _chat_ids(tok, CHAT_PROMPTS[0])
    prog = build_example(native_rt_asan, tmp_path, ASAN_CFLAGS)
    got, _ = run_example(prog, so, ids, "--max-new-tokens", "4", env=_env())
    assert got == generate(python_vm_decoder(so), [ids], max_new_tokens=4).tokens[0]
