"""Build a fixed set of artifacts and record their SHA-256, to show that a refactor leaves
generated code byte for byte as it was.

    python tools/artifact_hashes.py build OUT_DIR      # writes OUT_DIR/hashes.json
    python tools/artifact_hashes.py compare A B        # exit 1 when any artifact differs

To compare two commits, build each tree's set with that tree first on ``PYTHONPATH``::

    git worktree add /tmp/before <commit>
    PYTHONPATH=/tmp/before/src python tools/artifact_hashes.py build /tmp/hashes-before
    python tools/artifact_hashes.py build /tmp/hashes-after
    python tools/artifact_hashes.py compare /tmp/hashes-before /tmp/hashes-after

The set covers every executor and code generator: graph executor libraries for the llvm, c
and jit targets, a portable (multi-level) library, AOT C projects and static libraries, a
system library for the C runtime, a VM library with symbolic shapes (a tiny llama decoder
with its KV cache), a QDQ int8 model, and cross-compiled aarch64 / riscv64 libraries when
their cross compilers are installed. Every build goes through the ``kiln`` command line.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

CLI = "import sys; from kiln.cli.main import main; sys.exit(main())"


def _models(folder: Path) -> dict[str, Path]:
    import numpy as np
    import onnx

    from kiln.models.fetch import light_model_path
    from kiln.models.llama_onnx import LlamaConfig, llama_onnx

    cfg = LlamaConfig(layers=1, hidden=32, ffn=48, heads=4, kv_heads=2, vocab=61, context=64,
                      rope_base=1e4, rms_eps=1e-5)
    rng = np.random.default_rng(0)
    kv = cfg.kv_heads * cfg.head_dim
    shapes = {"token_embd.weight": (cfg.vocab, cfg.hidden), "output_norm.weight": (cfg.hidden,),
              "blk.0.attn_norm.weight": (cfg.hidden,), "blk.0.ffn_norm.weight": (cfg.hidden,),
              "blk.0.attn_q.weight": (cfg.hidden, cfg.hidden),
              "blk.0.attn_k.weight": (kv, cfg.hidden),
              "blk.0.attn_v.weight": (kv, cfg.hidden),
              "blk.0.attn_output.weight": (cfg.hidden, cfg.hidden),
              "blk.0.ffn_gate.weight": (cfg.ffn, cfg.hidden),
              "blk.0.ffn_up.weight": (cfg.ffn, cfg.hidden),
              "blk.0.ffn_down.weight": (cfg.hidden, cfg.ffn)}
    weights = {k: (rng.standard_normal(s) * 0.2).astype(np.float32) for k, s in shapes.items()}
    llama = folder / "tiny_llama.onnx"
    onnx.save(llama_onnx(cfg, weights, "tiny_llama"), llama)
    out = {"squeezenet": light_model_path("squeezenet"),
           "inception_v1": light_model_path("inception_v1"), "llama": llama}
    try:
        from kiln.models.qdq import qdq_mobilenet_v2

        out["qdq_mobilenet_v2"] = Path(qdq_mobilenet_v2(folder, per_channel=True))
    except ImportError as err:  # onnxruntime's quantizer missing
        print(f"skipping qdq_mobilenet_v2: {err}", file=sys.stderr)
    return out


def _builds(models: dict[str, Path]) -> list[tuple[str, list[str]]]:
    sq, inc, llama = models["squeezenet"], models["inception_v1"], models["llama"]
    builds = [
        ("squeezenet_llvm.so", [str(sq)]),
        ("squeezenet_c.so", [str(sq), "--target", "c"]),
        ("squeezenet_jit.so", [str(sq), "--target", "jit"]),
        ("squeezenet_portable.so", [str(sq), "--target", "llvm -mcpu=portable"]),
        ("squeezenet_aot.a", [str(sq), "--executor", "aot"]),
        ("squeezenet_aot_project", [str(sq), "--executor", "aot", "--emit-c-project"]),
        ("squeezenet_system_lib.a", [str(sq), "--system-lib"]),
        ("inception_v1_llvm.so", [str(inc)]),
        ("llama_vm.so", [str(llama), "--input-shape", "attention_mask:batchxpast+sequence",
                         "--dim", "past=0..64"]),
        ("llama_vm_c.so", [str(llama), "--target", "c", "--input-shape",
                           "attention_mask:batchxpast+sequence", "--dim", "past=0..64"]),
    ]
    if "qdq_mobilenet_v2" in models:
        builds.append(("qdq_mobilenet_v2_llvm.so", [str(models["qdq_mobilenet_v2"])]))
    for triple in ("aarch64-linux-gnu", "riscv64-linux-gnu"):
        if shutil.which(f"{triple}-gcc"):
            attr = " -mattr=+v" if triple.startswith("riscv") else ""
            builds.append((f"squeezenet_{triple.split('-')[0]}.so",
                           [str(sq), "--target", f"llvm -mtriple={triple}{attr}"]))
    return builds


def _digest(path: Path) -> dict[str, str]:
    if path.is_dir():
        return {str(p.relative_to(path)): hashlib.sha256(p.read_bytes()).hexdigest()
                for p in sorted(path.rglob("*")) if p.is_file()}
    return {"": hashlib.sha256(path.read_bytes()).hexdigest()}


def build(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    hashes: dict[str, str] = {}
    with tempfile.TemporaryDirectory() as tmp:
        models = _models(Path(tmp))
        for name, args in _builds(models):
            dest = Path(tmp) / name
            where = ["--emit-c-project" if name.endswith("_project") else "-o", str(dest)]
            args = [a for a in args if a != "--emit-c-project"]
            cmd = [sys.executable, "-c", CLI, "compile", *args, *where, "--quiet"]
            subprocess.run(cmd, check=True, env={**os.environ, "KILN_NUM_THREADS": "1"})
            produced = [dest] + sorted(Path(tmp).glob(Path(name).stem + ".*"))
            for p in dict.fromkeys(produced):
                if p.exists() and p.suffix != ".onnx":
                    for rel, h in _digest(p).items():
                        hashes[p.name + ("/" + rel if rel else "")] = h
            print(f"{name}: built", flush=True)
    (out / "hashes.json").write_text(json.dumps(hashes, indent=1, sort_keys=True) + "\n")
    print(f"{len(hashes)} files hashed into {out / 'hashes.json'}")


def compare(a: Path, b: Path) -> int:
    ha = json.loads((a / "hashes.json").read_text())
    hb = json.loads((b / "hashes.json").read_text())
    differ = sorted(k for k in ha.keys() | hb.keys() if ha.get(k) != hb.get(k))
    for k in differ:
        print(f"differs: {k}  {ha.get(k, '-')[:12]} vs {hb.get(k, '-')[:12]}")
    print(f"{len(ha.keys() & hb.keys()) - len(set(differ) & ha.keys() & hb.keys())} identical,"
          f" {len(differ)} different")
    return 1 if differ else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "build":
        build(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
