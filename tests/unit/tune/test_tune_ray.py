"""RayExecutor (kiln.tune.ray_executor) on a local cluster started here: a head without the
fingerprint resource and a worker node with it; builds run anywhere, measurements only on the
worker; a cluster without the resource is refused; a small tune runs through it, and so does
``kiln tune --ray`` on a one-MatMul model (records like a local tune's, applied by compile)."""

from __future__ import annotations

import math
import os
import shutil
import sys
import tempfile
import time

import pytest
from tune_models import dense_model

from kiln.driver.tuning_records import cpu_fingerprint, fingerprint_id
from kiln.errors import KilnError

ray = pytest.importorskip("ray", reason="the Ray executor needs ray (pip install kiln[tune])")
cluster_utils = pytest.importorskip("ray.cluster_utils")

from kiln.tune.ray_executor import RayExecutor, node_resources, resource_name

STORE = 80 * 2**20  # a small object store per node (bytes)


@pytest.fixture(scope="module")
def cluster():
    """One head (1 CPU) and one measuring worker (1 CPU + kiln_cpu:<hash>) for the module,
    all under a fresh temp dir (RAY_TMPDIR), shut down at the end whatever happened."""
    tmp = tempfile.mkdtemp(prefix="kr", dir="/tmp")  # short: Ray's socket paths are limited
    old = os.environ.get("RAY_TMPDIR")
    os.environ["RAY_TMPDIR"] = tmp
    os.makedirs(os.path.join(tmp, "ray"))
    # the jobs below are functions of this test module, which the Ray workers cannot import
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])
    c = None
    try:
        c = cluster_utils.Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "temp_dir": os.path.join(tmp, "ray"), "include_dashboard": False,
            "object_store_memory": STORE})
        worker = c.add_node(num_cpus=1, resources=node_resources(), object_store_memory=STORE)
        ex = RayExecutor(c.address)
        yield c, worker, ex
        ex.close()
    finally:
        if ray.is_initialized():
            ray.shutdown()
        if c is not None:
            c.shutdown()
        if old is None:
            os.environ.pop("RAY_TMPDIR", None)
        else:
            os.environ["RAY_TMPDIR"] = old
        for _ in range(10):  # late log writers of the stopped processes may recreate files
            shutil.rmtree(tmp, ignore_errors=True)
            if not os.path.exists(tmp):
                break
            time.sleep(0.5)


def _node_id():
    import ray as r

    return r.get_runtime_context().get_node_id()


def test_measurements_run_only_on_the_fingerprinted_node(cluster):
    _, worker, ex = cluster
    assert ex.resource == "kiln_cpu:" + fingerprint_id(cpu_fingerprint())
    assert ex.measuring_node_ids == [worker.node_id] and ex.measure_cpus == 1
    where = ex.map_measure(_node_id, [()] * 3)
    assert where == [worker.node_id] * 3
    out = ex.map_measure(math.sqrt, [(9.0,), (-1.0,)])
    assert out[0] == 3.0 and isinstance(out[1], ValueError)


def test_builds_run_anywhere_in_order_with_errors_in_slots(cluster):
    _, _, ex = cluster
    out = ex.map_build(math.sqrt, [(4.0,), (-1.0,), (16.0,)])
    assert out[0] == 2.0 and out[2] == 4.0
    assert isinstance(out[1], ValueError) and "math domain error" in str(out[1])


def test_a_cluster_without_the_fingerprint_is_refused(cluster):
    c, _, _ = cluster
    with pytest.raises(KilnError, match=r"kiln_cpu:0000000000000000.*ray start --address"):
        RayExecutor(c.address, fingerprint="0000000000000000")
    assert resource_name("ab") == "kiln_cpu:ab"


def _build(config):
    return repr(sorted(config.items())).encode()  # stands in for library bytes


def _measure(lib, config):
    assert lib == repr(sorted(config.items())).encode()
    return 1e-3 * (1 + abs(math.log2(config["block"]) - 3)) * (1 + config["unroll"])


def test_a_small_tune_through_ray(cluster):
    pytest.importorskip("lightgbm")
    from kiln.schedules.space import Knob, Task
    from kiln.tune.task_scheduler import TaskScheduler

    _, _, ex = cluster
    task = Task("dense-1", "dense", 1, (Knob("block", (8, 1, 2, 4, 16, 32)),
                                        Knob("unroll", (1, 0, 2))))

    def measure(batch):
        libs = ex.map_build(_build, [(c,) for _, c in batch])
        return ex.map_measure(_measure, [(lib, c) for lib, (_, c) in zip(libs, batch)])

    result = TaskScheduler([task], measure, batch_size=6).tune(trials=18)
    assert result.trials == 18
    assert result.best[task.key].cost == pytest.approx(1e-3)
    assert result.best[task.key].config == {"block": 8, "unroll": 0}


def test_kiln_tune_on_ray_writes_the_records_a_local_tune_writes(cluster, tmp_path, capsys,
                                                                 monkeypatch):
    """``kiln tune --ray`` on a one-MatMul model: builds and measurements on the cluster, the
    same record fields, fingerprint and target as a local tune, and kiln compile applies them."""
    pytest.importorskip("lightgbm")
    import json

    import onnx

    from kiln.cli import main as cli
    from kiln.driver.tuning_records import load_records
    from kiln.tune import ray_executor

    c, _, _ = cluster
    jobs = []

    class Counting(RayExecutor):  # the CLI's executor, counting what it sends to the cluster
        def map_build(self, fn, batch):
            jobs.append(("build", fn.__name__, len(batch)))
            return super().map_build(fn, batch)

        def map_measure(self, fn, batch):
            jobs.append(("measure", getattr(fn, "func", fn).__name__, len(batch)))
            return super().map_measure(fn, batch)

    monkeypatch.setattr(ray_executor, "RayExecutor", Counting)
    model = tmp_path / "matmul.onnx"
    onnx.save(dense_model(), model)
    on_ray, local = tmp_path / "ray.jsonl", tmp_path / "local.jsonl"
    common = [str(model), "--target", "llvm", "--repeat", "2", "--confirm", "0", "--no-in-model",
              "-q"]
    assert cli.main(["tune", *common, "--trials", "3", "--batch-size", "3", "--ray",
                     c.address, "-o", str(on_ray)]) == 0
    assert jobs == [("build", "build_candidate", 3), ("measure", "measure_candidate", 3)]
    assert cli.main(["tune", *common, "--trials", "1", "-o", str(local)]) == 0
    records, (here,) = load_records(on_ray), load_records(local)
    assert len(records) == 3 and len({r.config_key() for r in records}) == 3
    assert records[0].config == here.config  # both begin with the default
    for r in records:
        assert r.error is None and len(r.costs) == 2, r.error
        assert (r.workload_key, r.kernel, r.target, dict(r.fingerprint), r.kiln_version) == \
            (here.workload_key, here.kernel, here.target, dict(here.fingerprint),
             here.kiln_version)
    keys = {frozenset(json.loads(line)) for line in
            on_ray.read_text().splitlines() + local.read_text().splitlines()}
    assert len(keys) == 1
    capsys.readouterr()
    assert cli.main(["compile", *common[:3], "--tuning-records", str(on_ray), "-o",
                     str(tmp_path / "m.so"), "-q"]) == 0
    assert "tuning records: 1 of 1 kernels tuned" in capsys.readouterr().out
