"""Fused attention (``nn.attention``) vs the separate kernels vs onnxruntime, one layer's heads.

The exported BERT chain ``MatMul(q, Transpose(k)) / √D + mask → Softmax → MatMul(·, v)`` with
paraphrase-MiniLM-L3's heads (12 of 32), one query per key, at several key counts. Per count,
two Kiln builds (``FuseAttention.MAX_KEYS`` lifted: the fused op; set to 0: the separate
kernels) and an onnxruntime session are timed in one process, alternating in blocks, by
**thread CPU time** (``time.thread_time``: on a shared, loaded machine wall time measures the
scheduler), 1 thread (run with ``KILN_NUM_THREADS=1``). Reported: median µs per call of each
and the ratios (docs/decisions/025-fused-attention.md).

    KILN_NUM_THREADS=1 .venv/bin/python benchmarks/attention.py [--keys 32,64,128,256]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

H, D = 12, 32


def attention_model(s: int, t: int):
    from onnx import TensorProto, helper, numpy_helper

    f = TensorProto.FLOAT
    nodes = [helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["q", "kt"], ["qk"]),
             helper.make_node("Div", ["qk", "c"], ["x"]),
             helper.make_node("Add", ["x", "mask"], ["xm"]),
             helper.make_node("Softmax", ["xm"], ["p"], axis=-1),
             helper.make_node("MatMul", ["p", "v"], ["y"])]
    inputs = [helper.make_tensor_value_info("q", f, [1, H, s, D]),
              helper.make_tensor_value_info("k", f, [1, H, t, D]),
              helper.make_tensor_value_info("v", f, [1, H, t, D]),
              helper.make_tensor_value_info("mask", f, [1, 1, 1, t])]
    graph = helper.make_graph(
        nodes, "attention", inputs, [helper.make_tensor_value_info("y", f, [1, H, s, D])],
        [numpy_helper.from_array(np.array(np.sqrt(D), "float32"), "c")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def _build(model, max_keys, target: str, so: Path):
    import kiln
    from kiln.frontend import from_onnx
    from kiln.relay.transform import fuse_attention

    old = fuse_attention.MAX_KEYS
    fuse_attention.MAX_KEYS = max_keys
    try:
        mod, params = from_onnx(model)
        kiln.build(mod, target=target, params=params).export_library(str(so))
    finally:
        fuse_attention.MAX_KEYS = old
    return kiln.graph_executor.GraphModule(kiln.runtime.load_module(str(so))["default"](kiln.cpu()))


def _block_us(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.thread_time()
        fn()
        times.append(time.thread_time() - t)
    return statistics.median(times) * 1e6


def time_keys(t: int, target: str, work: Path, blocks: int, repeat: int) -> dict[str, float]:
    import onnxruntime as ort

    model = attention_model(t, t)
    rng = np.random.default_rng(0)
    feed = {n: rng.standard_normal((1, H, t, D)).astype("float32") for n in "qkv"}
    feed["mask"] = np.zeros((1, 1, 1, t), "float32")
    feed["mask"][..., t - t // 4:] = -10000.0
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = opts.inter_op_num_threads = 1
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    want = sess.run(None, feed)[0]
    engines = {"ort": lambda: sess.run(None, feed)}
    for name, max_keys in (("fused", None), ("separate", 0)):
        g = _build(model, max_keys, target, work / f"{name}{t}.so")
        for k, v in feed.items():
            g.set_input(k, v)
        g.run()
        np.testing.assert_allclose(g.get_output(0).numpy(), want, rtol=1e-4, atol=1e-4)
        engines[name] = g.run
    samples: dict[str, list[float]] = {k: [] for k in engines}
    for _ in range(blocks):
        for name, fn in engines.items():
            fn()
            samples[name].append(_block_us(fn, repeat))
    return {k: statistics.median(v) for k, v in samples.items()}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--keys", default="32,64,128,256")
    p.add_argument("--target", default="llvm -mcpu=native")
    p.add_argument("--blocks", type=int, default=9)
    p.add_argument("--repeat", type=int, default=30, help="calls per engine and block")
    args = p.parse_args(argv)
    print("| keys | fused us | separate us | ORT us | fused / separate | fused / ORT |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        for t in (int(x) for x in args.keys.split(",")):
            r = time_keys(t, args.target, Path(tmp), args.blocks, args.repeat)
            print(f"| {t} | {r['fused']:.1f} | {r['separate']:.1f} | {r['ort']:.1f} | "
                  f"{r['fused'] / r['separate']:.2f} | {r['fused'] / r['ort']:.2f} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
