"""Measurement throughput of the Ray executor with one measuring node against two.

Starts a local Ray cluster (``ray.cluster_utils.Cluster`` under a fresh ``RAY_TMPDIR``): a head
with one CPU and no fingerprint resource, plus N measuring nodes, each with ``--num-cpus 1``
and ``{"kiln_cpu:<hash>": 1}`` (:func:`kiln.tune.ray_executor.node_resources`), as
``ray start --address ... --resources`` would give two machines of the same CPU. Then sends
``--jobs`` measurement jobs through :meth:`RayExecutor.map_measure` and reports jobs per
second. The job stands in for a candidate's timing: a fixed amount of single-threaded CPU work
(``--matmuls`` 128×128 float32 matrix products with numpy, ``OMP_NUM_THREADS=1``), so
throughput = jobs per second of wall time.

On one machine the nodes share its cores (and, here, other people's work): the speed-up is at
most the number of idle cores. The load average is printed with the numbers.

    PYTHONPATH=src .venv/bin/python benchmarks/tune_ray.py --nodes 1 2 --jobs 24 --matmuls 400
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time

import numpy as np


def fixed_job(index: int, matmuls: int) -> dict:
    """A fixed amount of work (``matmuls`` 128×128 float32 products): throughput counts it."""
    import ray

    a = np.random.default_rng(index).standard_normal((128, 128)).astype(np.float32)
    t0 = time.perf_counter()
    for _ in range(matmuls):
        a = np.tanh(a @ a.T * 1e-2)
    return {"node": ray.get_runtime_context().get_node_id(),
            "seconds": time.perf_counter() - t0}


def run(nodes: int, jobs: int, matmuls: int) -> dict:
    import ray
    from ray.cluster_utils import Cluster

    from kiln.tune.ray_executor import RayExecutor, node_resources

    tmp = tempfile.mkdtemp(prefix="kb", dir="/tmp")
    os.environ["RAY_TMPDIR"] = tmp
    os.makedirs(os.path.join(tmp, "ray"))
    store = 80 * 2**20
    cluster = Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "temp_dir": os.path.join(tmp, "ray"), "include_dashboard": False,
        "object_store_memory": store})
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=1, resources=node_resources(), object_store_memory=store)
        ex = RayExecutor(cluster.address)
        ex.map_measure(fixed_job, [(i, 1) for i in range(2 * nodes)])  # warm the workers
        t0 = time.perf_counter()
        out = ex.map_measure(fixed_job, [(i, matmuls) for i in range(jobs)])
        wall = time.perf_counter() - t0
        errors = [o for o in out if isinstance(o, BaseException)]
        if errors:
            raise errors[0]
        ex.close()
        return {"nodes": nodes, "jobs": jobs, "wall_s": wall, "jobs_per_s": jobs / wall,
                "job_s": float(np.median([o["seconds"] for o in out])),
                "per_node": sorted(
                    sum(1 for o in out if o["node"] == n) for n in {o["node"] for o in out})}
    finally:
        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()
        shutil.rmtree(tmp, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--jobs", type=int, default=24)
    parser.add_argument("--matmuls", type=int, default=400,
                        help="128x128 matmuls per job (about 0.1-0.3 s on one core)")
    args = parser.parse_args()
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # the workers inherit it: one core a job
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    results = []
    for n in args.nodes:
        r = run(n, args.jobs, args.matmuls)
        results.append(r)
        print(f"{n} measuring node(s): {r['jobs']} jobs in {r['wall_s']:.2f} s = "
              f"{r['jobs_per_s']:.2f} jobs/s (median job {r['job_s'] * 1e3:.0f} ms, jobs per "
              f"node {r['per_node']}); load average {os.getloadavg()[0]:.1f} on "
              f"{os.cpu_count()} cores", flush=True)
    if len(results) > 1:
        print(f"throughput {results[-1]['nodes']} nodes / {results[0]['nodes']}: "
              f"{results[-1]['jobs_per_s'] / results[0]['jobs_per_s']:.2f}x")


if __name__ == "__main__":
    main()
