"""Builds and measurements on a Ray cluster (``kiln tune --ray ADDRESS``).

Resource scheme (Ray's custom resources:
https://docs.ray.io/en/latest/ray-core/scheduling/resources.html):

- a node that may **measure** carries the custom resource ``kiln_cpu:<id>``, where ``<id>``
  is :func:`kiln.driver.tuning_records.fingerprint_id` of its
  :func:`~kiln.driver.tuning_records.cpu_fingerprint`
  (model, ISA features, core count, KILN_NUM_THREADS: the fingerprint the records carry), with
  quantity 1. Start it on the measuring machine, in the environment that runs Kiln (the
  same ``KILN_NUM_THREADS`` as the driver's), with::

      ray start --address HEAD:6379 --resources "$(python -m kiln.tune.ray_executor)"

  (the module prints :func:`node_resources` as JSON, e.g. ``{"kiln_cpu:3f2a...": 1}``);
- **build** jobs are ``ray.remote(num_cpus=1)`` tasks: any node, as many at once as CPUs;
- **measure** jobs request ``{"kiln_cpu:<id>": 1}`` and ``num_cpus`` = the CPU count of the
  measuring nodes (the smallest, if they differ), so a measurement runs only on a machine with
  the driver's CPU fingerprint, one at a time per node, with no build beside it. Several
  measuring nodes measure in parallel (one job each).

:class:`RayExecutor` refuses (:class:`KilnError`) a cluster where no alive node carries the
resource of the fingerprint asked for. Ray is optional (``pip install kiln[tune]``); this
module imports it only when an executor is made.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Any

from kiln.driver.tuning_records import cpu_fingerprint, fingerprint_id
from kiln.errors import KilnError

RESOURCE_PREFIX = "kiln_cpu:"


def import_ray():
    """The ``ray`` module, or :class:`KilnError` naming the extra to install."""
    try:
        import ray
    except ImportError as exc:
        raise KilnError("kiln tune --ray needs Ray: pip install 'kiln[tune]' (ray>=2.58); "
                        f"import failed: {exc}") from exc
    return ray


def resource_name(fingerprint: str | None = None) -> str:
    """``kiln_cpu:<fingerprint id>`` (default: this machine's, the id of the fingerprint its
    records carry, so a measuring node measures exactly for the records it writes)."""
    return RESOURCE_PREFIX + (fingerprint or fingerprint_id(cpu_fingerprint()))


def node_resources() -> dict[str, int]:
    """The custom resources a measuring node of this machine's CPU starts with
    (``ray start --resources``): ``{"kiln_cpu:<id>": 1}``."""
    return {resource_name(): 1}


def measuring_nodes(nodes: Sequence[dict], resource: str) -> list[dict]:
    """The alive nodes of ``ray.nodes()`` that carry ``resource``."""
    return [n for n in nodes if n.get("Alive") and n.get("Resources", {}).get(resource, 0) > 0]


class RayExecutor:
    """The :class:`~kiln.tune.executor.Executor` on a Ray cluster.

    Parameters
    ----------
    address : str
        The cluster (``ray.init(address=...)``: ``"HOST:PORT"`` of the head's GCS, or
        ``"auto"``). If this process is already connected to Ray, that connection is used.
    fingerprint : str, optional
        The fingerprint id measurements need (default: this machine's, so records match
        the machine that will apply them).

    Functions given to :meth:`map_build` / :meth:`map_measure` and their arguments must be
    picklable, and Kiln importable on the nodes. A job that raises yields its exception in its
    slot (an instance of the original exception's type, from Ray's ``RayTaskError``).

    Raises
    ------
    KilnError
        Ray is not installed, the cluster cannot be reached, or no alive node carries
        ``kiln_cpu:<fingerprint>`` (the message says how to start one).
    """

    def __init__(self, address: str, fingerprint: str | None = None):
        self._ray = ray = import_ray()
        self._owns_connection = not ray.is_initialized()
        if self._owns_connection:
            try:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
            except (ConnectionError, RuntimeError, ValueError) as exc:
                raise KilnError(f"cannot connect to the Ray cluster at {address!r}: "
                                f"{exc}") from exc
        self.resource = resource_name(fingerprint)
        nodes = measuring_nodes(ray.nodes(), self.resource)
        if not nodes:
            self.close()
            raise KilnError(
                f"no node of the Ray cluster at {address!r} has the resource "
                f"{self.resource!r} (a CPU with the fingerprint measurements need); on such a "
                f"machine start: ray start --address {address} --resources "
                f"'{json.dumps({self.resource: 1})}'")
        self.measure_cpus = min(int(n["Resources"].get("CPU", 1)) for n in nodes) or 1
        self.measuring_node_ids = [n["NodeID"] for n in nodes]
        self._build = ray.remote(num_cpus=1, max_retries=0)(_call)
        self._measure = ray.remote(num_cpus=self.measure_cpus, resources={self.resource: 1},
                                   max_retries=0)(_call)

    def map_build(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        """``fn(*job)`` as ``num_cpus=1`` Ray tasks on any node, results in input order."""
        return self._gather([self._build.remote(fn, *job) for job in jobs])

    def map_measure(self, fn: Callable[..., Any], jobs: Sequence[tuple]) -> list[Any]:
        """``fn(*job)`` on measuring nodes only, each job holding a whole node."""
        return self._gather([self._measure.remote(fn, *job) for job in jobs])

    def close(self) -> None:
        """Disconnect, if this executor connected (a connection made before it stays)."""
        if self._owns_connection and self._ray.is_initialized():
            self._ray.shutdown()

    def _gather(self, refs: list) -> list[Any]:
        out = []
        for ref in refs:
            try:
                out.append(self._ray.get(ref))
            except self._ray.exceptions.RayTaskError as exc:
                out.append(_cause(exc))
            except self._ray.exceptions.RayError as exc:  # a dead worker or node
                out.append(exc)
        return out


def _call(fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``: what a Ray task runs (``ray.remote`` takes Python functions only, not
    builtins or other callables)."""
    return fn(*args)


def _cause(exc: Any) -> BaseException:
    """The job's own exception type where Ray can rebuild it."""
    try:
        return exc.as_instanceof_cause()
    except Exception:  # noqa: BLE001 - an exception type Ray cannot subclass: keep Ray's
        return exc


def main() -> None:
    """``python -m kiln.tune.ray_executor``: print :func:`node_resources` as JSON."""
    print(json.dumps(node_resources()))


if __name__ == "__main__":
    main()
