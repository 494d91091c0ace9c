"""Greedy decoding of SmolLM2-135M-Instruct from C (examples/generate_vm_c over
libkiln_runtime) vs ``kiln.llm.generate`` on the Python VM, the same VM library, one kernel
thread.

Builds the runtime and the example with their Makefiles, takes the compiled decoder of
``kiln.llm.kiln_decoder`` (cached; or ``--so``), then ``--rounds`` times, alternating which goes
first: the C program on a chat prompt (``--tokens`` new tokens, no stop token) and a fresh
Python process doing the same with ``generate``. Each side reports its decode steps' (all
after the prompt's) wall-clock and process CPU time; the CPU time per token is the stable
figure on a shared machine. Prints the median over rounds of each side's decode tokens/s
(wall) and CPU ms per token, and checks that both produced the same tokens.

    python benchmarks/native_generate.py [--so model.so | --quantize-weights int8|q4]
                                         [--tokens 16] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROMPT = "What is the capital of France?"
TIMING = re.compile(r"decode: (\d+) steps, ([\d.]+) ms \(CPU ([\d.]+) ms\)")

PY_CHILD = r"""
import json, sys, time
import kiln
from kiln.llm import Decoder, generate
from kiln.vm import VirtualMachine
so, ids, n = sys.argv[1], json.loads(sys.argv[2]), int(sys.argv[3])
vm = VirtualMachine(kiln.runtime.load_module(so), kiln.cpu())
exe = vm.module.exe
params = exe.functions[exe.func_index["main"]].params
main = vm["main"]
cpu = []
def run(inputs):
    c0 = time.process_time()
    out = main(*inputs)
    cpu.append(time.process_time() - c0)
    return out
d = Decoder(run, [p.name for p in params], tuple(params[3].dims[2:]), "kiln")
g = generate(d, [ids], max_new_tokens=n)
print(json.dumps({"tokens": g.tokens[0], "steps": g.decode_steps, "wall_s": g.decode_s,
                  "cpu_s": sum(cpu[1:])}))
"""


def build_program(folder: Path) -> Path:
    from kiln.native import RUNTIME_DIR

    rt = folder / "rt"
    subprocess.run(["make", "-s", "-j2", "-C", str(RUNTIME_DIR), f"BUILD={rt}"], check=True)
    src = folder / "generate_vm_c"
    shutil.copytree(ROOT / "examples" / "generate_vm_c", src,
                    ignore=shutil.ignore_patterns("generate_vm_c", "*.so"))
    subprocess.run(["make", "-s", "-C", str(src), f"KILN_RT={rt}"], check=True)
    return src / "generate_vm_c"


def run_c(prog: Path, so: Path, ids: list[int], n: int, env: dict) -> dict:
    proc = subprocess.run([str(prog), str(so), "--max-new-tokens", str(n), *map(str, ids)],
                          capture_output=True, text=True, env=env, check=True, timeout=600)
    m = TIMING.search(proc.stderr)
    return {"tokens": [int(t) for t in proc.stdout.split()], "steps": int(m[1]),
            "wall_s": float(m[2]) / 1e3, "cpu_s": float(m[3]) / 1e3}


def run_python(so: Path, ids: list[int], n: int, env: dict) -> dict:
    proc = subprocess.run([sys.executable, "-c", PY_CHILD, str(so), json.dumps(ids), str(n)],
                          capture_output=True, text=True, env=env, check=True, timeout=600)
    return json.loads(proc.stdout.splitlines()[-1])


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--so", help="the decoder VM library (default: kiln.llm's compiled SmolLM2)")
    p.add_argument("--quantize-weights", choices=["int8", "q4"],
                   help="the compiled decoder with weight-only quantized matmul weights")
    p.add_argument("--tokens", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args(argv)
    from kiln.llm.decoder import compiled_decoder_path
    from kiln.models import smollm2, smollm2_tokenizer

    tok = smollm2_tokenizer()
    ids = tok.encode(tok.apply_chat_template([{"role": "user", "content": PROMPT}]))
    so = Path(args.so) if args.so else compiled_decoder_path(smollm2(), "llvm -mcpu=native",
                                                                    args.quantize_weights)
    env = {**os.environ, "KILN_NUM_THREADS": "1"}
    results: dict[str, list[dict]] = {"C": [], "Python VM": []}
    with tempfile.TemporaryDirectory() as tmp:
        prog = build_program(Path(tmp))
        for r in range(args.rounds):
            sides = [("C", lambda: run_c(prog, so, ids, args.tokens, env)),
                     ("Python VM", lambda: run_python(so, ids, args.tokens, env))]
            for name, run in sides if r % 2 == 0 else sides[::-1]:
                results[name].append(run())
    tokens = {name: rs[0]["tokens"] for name, rs in results.items()}
    print(f"{so.name}: {len(ids)}-token prompt, {args.tokens} new tokens, one kernel thread, "
          f"{args.rounds} rounds (load {os.getloadavg()[0]:.1f})")
    for name, rs in results.items():
        tps = statistics.median(r["steps"] / r["wall_s"] for r in rs)
        cpu = statistics.median(1e3 * r["cpu_s"] / r["steps"] for r in rs)
        print(f"  {name:10s} decode {tps:6.2f} tokens/s (wall), {cpu:6.1f} ms CPU per token")
    same = tokens["C"] == tokens["Python VM"]
    print(f"  tokens {'identical' if same else 'DIFFER'}: {tok.decode(tokens['C'])!r}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
