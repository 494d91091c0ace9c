"""The VM in C (``kiln_run`` on a VM library) vs the Python runtime's VM on the same ``.so``:
paraphrase-MiniLM-L3-v2 with symbolic (batch_size, sequence_length), per-run latency at
several shapes.

Compiles the VM library as ``dynamic.py`` does (or takes ``--so``), builds the runtime with its
Makefile, then per shape, ``--rounds`` times, alternating which goes first: a fresh Python
process (``VirtualMachine(load_module(so))``, a first call, then ``--repeat`` calls of ``main``
on the same inputs, each timed) and ``kiln_run so --shape ... --repeat N`` (the same, timed in
C). One kernel thread (``KILN_NUM_THREADS=1``): on a shared machine the per-run CPU time is the
stable figure. Reports the median over rounds of each side's median and minimum wall time and
median CPU time per run. Then, in one process (``--inprocess``, the default too), the two
VMs alternate call by call on the same inputs: the Python VM over the library and the C VM
(``libkiln_runtime.so`` through ctypes) over a copy of the file (its own ``dlopen``), each
call's thread CPU time recorded: the fairest comparison on a shared machine.

    python benchmarks/native_vm.py [--so minilm_vm.so] [--shapes 1x7,1x32,2x77] [--repeat 20]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent

PY_CHILD = r"""
import json, sys, time
import numpy as np
import kiln
from kiln.vm import VirtualMachine
so, files, shape, repeat = sys.argv[1], sys.argv[2:4], json.loads(sys.argv[4]), int(sys.argv[5])
ids, mask = (np.fromfile(f, "int64").reshape(shape) for f in files)
vm = VirtualMachine(kiln.runtime.load_module(so), kiln.cpu())
vm["main"](ids, mask)
times, cpu = [], []
for _ in range(repeat):
    t, c = time.perf_counter(), time.thread_time()
    vm["main"](ids, mask)
    times.append((time.perf_counter() - t) * 1e3)
    cpu.append((time.thread_time() - c) * 1e3)
times.sort()
cpu.sort()
print(json.dumps({"median_ms": times[len(times) // 2], "min_ms": times[0],
                  "cpu_median_ms": cpu[len(cpu) // 2]}))
"""


INPROC_CHILD = r"""
import ctypes as C, json, sys, time
import numpy as np
import kiln
from kiln.vm import VirtualMachine
rt_so, so, so_copy, files, shape, repeat = (sys.argv[1], sys.argv[2], sys.argv[3],
                                            sys.argv[4:6], json.loads(sys.argv[6]),
                                            int(sys.argv[7]))
ids, mask = (np.fromfile(f, "int64").reshape(shape) for f in files)


class Value(C.Union):
    _fields_ = [("v_int64", C.c_int64), ("v_handle", C.c_void_p), ("v_str", C.c_char_p)]


class DLTensor(C.Structure):
    _fields_ = [("data", C.c_void_p), ("device_type", C.c_int32), ("device_id", C.c_int32),
                ("ndim", C.c_int32), ("code", C.c_uint8), ("bits", C.c_uint8),
                ("lanes", C.c_uint16), ("shape", C.POINTER(C.c_int64)),
                ("strides", C.c_void_p), ("byte_offset", C.c_uint64)]


rt = C.CDLL(rt_so)
def check(rc):
    if rc != 0:
        raise RuntimeError(rt.TVMGetLastError and C.c_char_p(rt.TVMGetLastError()).value)
rt.TVMGetLastError.restype = C.c_void_p
def call(f, vals, codes):
    n = len(vals)
    args, tc = (Value * max(n, 1))(*vals), (C.c_int * max(n, 1))(*codes)
    ret, code = Value(), C.c_int()
    check(rt.TVMFuncCall(f, args, tc, n, C.byref(ret), C.byref(code)))
    return ret
def get(m, name):
    f = C.c_void_p()
    check(rt.TVMModGetFunction(m, name.encode(), 0, C.byref(f)))
    return f
exe = C.c_void_p()
check(rt.TVMModLoadFromFile(so_copy.encode(), b"so", C.byref(exe)))
cvm = C.c_void_p(call(get(exe, "vm_load_executable"), [], []).v_handle)
call(get(cvm, "vm_initialization"), [Value(v_int64=1), Value(v_int64=0), Value(v_int64=2)],
     [0, 0, 0])
cmain = get(cvm, "main")
dims = (C.c_int64 * 2)(*shape)
tensors = [DLTensor(a.ctypes.data, 1, 0, 2, 0, 64, 1, dims, None, 0) for a in (ids, mask)]
cargs = [Value(v_handle=C.addressof(t)) for t in tensors]
pvm = VirtualMachine(kiln.runtime.load_module(so), kiln.cpu())
run = {"python": lambda: pvm["main"](ids, mask), "c": lambda: call(cmain, cargs, [7, 7])}
for f in run.values():
    f()
cpu = {"python": [], "c": []}
for i in range(repeat):
    for side in (("python", "c") if i % 2 == 0 else ("c", "python")):
        c = time.thread_time()
        run[side]()
        cpu[side].append((time.thread_time() - c) * 1e3)
print(json.dumps({k: {"cpu_median_ms": sorted(v)[len(v) // 2], "cpu_min_ms": min(v)}
                  for k, v in cpu.items()}))
"""


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--so", help="a MiniLM VM library (default: compile one)")
    p.add_argument("--target", default="llvm")
    p.add_argument("--shapes", default="1x7,1x32,2x77")
    p.add_argument("--repeat", type=int, default=20)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--inprocess-only", action="store_true",
                   help="only the one-process alternation")
    return p.parse_args(argv)


def kiln_run(runtime: Path, so: str, files: list[str], shape: tuple, repeat: int,
             env: dict) -> dict:
    dims = "x".join(map(str, shape))
    out = subprocess.run([str(runtime / "kiln_run"), so, "--repeat", str(repeat), "--shape",
                          f"input_ids={dims}", "--shape", f"attention_mask={dims}", *files],
                         capture_output=True, text=True, env=env, check=True).stdout
    get = {k: float(re.search(rf"^{k}: ([\d.]+)", out, re.MULTILINE).group(1))
           for k in ("median", "min", "cpu median")}
    return {"median_ms": get["median"], "min_ms": get["min"], "cpu_median_ms": get["cpu median"]}


def main(argv=None) -> int:
    args = parse_args(argv)
    from kiln.native import RUNTIME_DIR

    work = Path(tempfile.mkdtemp(prefix="kiln-native-vm-"))
    runtime = work / "rt"
    subprocess.run(["make", "-s", "-C", str(RUNTIME_DIR), f"BUILD={runtime}", "CFLAGS=-O2"],
                   check=True)
    so = args.so
    if so is None:
        sys.path.insert(0, str(HERE))
        from dynamic import compile_vm

        from kiln import models

        so = str(compile_vm(models.wheel_file_path("minilm_l3"), args.target,
                            work / "minilm_vm.so"))
    env = {**os.environ, "KILN_NUM_THREADS": "1"}
    so_copy = work / "minilm_vm_c.so"  # the C runtime's own dlopen of the same bytes
    so_copy.write_bytes(Path(so).read_bytes())
    inproc = []
    for text in args.shapes.split(","):
        shape = [int(d) for d in text.split("x")]
        files = [str(work / "ids.bin"), str(work / "mask.bin")]
        np.random.default_rng(0).integers(1000, 30000, shape).astype("int64").tofile(files[0])
        np.ones(shape, "int64").tofile(files[1])
        out = subprocess.run([sys.executable, "-c", INPROC_CHILD,
                              str(runtime / "libkiln_runtime.so"), so, str(so_copy), *files,
                              json.dumps(shape), str(2 * args.repeat)],
                             capture_output=True, text=True, env=env, check=True)
        inproc.append((text, json.loads(out.stdout)))
        print(text, out.stdout.strip(), flush=True)
    print("\n| shape (one process, alternating) | Python VM CPU median / min (ms) | "
          "C VM CPU median / min (ms) |")
    print("|---|---|---|")
    for text, r in inproc:
        print(f"| {text} | {r['python']['cpu_median_ms']:.2f} / {r['python']['cpu_min_ms']:.2f} "
              f"| {r['c']['cpu_median_ms']:.2f} / {r['c']['cpu_min_ms']:.2f} |")
    if args.inprocess_only:
        return 0
    rows = []
    for text in args.shapes.split(","):
        shape = tuple(int(d) for d in text.split("x"))
        rng = np.random.default_rng(0)
        files = [str(work / "ids.bin"), str(work / "mask.bin")]
        rng.integers(1000, 30000, shape).astype("int64").tofile(files[0])
        np.ones(shape, "int64").tofile(files[1])
        res: dict[str, list[dict]] = {"python": [], "c": []}
        for r in range(args.rounds):
            for side in (("python", "c") if r % 2 == 0 else ("c", "python")):
                if side == "c":
                    res["c"].append(kiln_run(runtime, so, files, shape, args.repeat, env))
                else:
                    out = subprocess.run([sys.executable, "-c", PY_CHILD, so, *files,
                                          json.dumps(shape), str(args.repeat)],
                                         capture_output=True, text=True, env=env, check=True)
                    res["python"].append(json.loads(out.stdout))
        row = {"shape": text}
        for side, runs in res.items():
            for key in ("median_ms", "min_ms", "cpu_median_ms"):
                row[f"{side}_{key}"] = statistics.median(x[key] for x in runs)
        rows.append(row)
        print(json.dumps(row), flush=True)
    print("\n| shape | Python VM median / min / CPU (ms) | C VM median / min / CPU (ms) |")
    print("|---|---|---|")
    for r in rows:
        print(f"| {r['shape']} | {r['python_median_ms']:.2f} / {r['python_min_ms']:.2f} / "
              f"{r['python_cpu_median_ms']:.2f} | {r['c_median_ms']:.2f} / {r['c_min_ms']:.2f} "
              f"/ {r['c_cpu_median_ms']:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
