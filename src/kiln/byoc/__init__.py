"""Bring your own codegen (BYOC): offload parts of a model to external compilers and runtime
modules without editing Kiln (TVM's BYOC flow: python/tvm/relay/op/contrib/,
src/relay/transforms/partition_graph.cc, src/relay/backend/contrib/).

Design note. A backend registers, from its own module:

- a pattern table (``@register_pattern_table("name")``): composites such as conv2d + bias +
  relu that it runs as one kernel;
- per-op support predicates (``register_op_support("name", "nn.relu", predicate)``);
- an external codegen (``@register_external_codegen("name")``): partitioned functions →
  runtime :class:`~kiln.runtime.Module` (DSO-exportable C source linked into the library, or a
  binary-serializable module packed into its blob).

``kiln.build(mod, byoc=["name"])`` then runs :func:`partition_for` (MergeComposite →
AnnotateTarget → MergeCompilerRegions → PartitionGraph, passes in ``kiln.relay.transform``), the
codegens (:func:`build_external`), and attaches the modules to the kernel library — through a
const loader when one of them needs constants. Built in: ``cblas`` (OpenBLAS ``cblas_sgemm``,
C source, type_key ``c``; ``kiln.byoc.cblas``) and ``kiln_json`` (a JSON graph + constants run by
``kiln.runtime.contrib.json.json_runtime``; ``kiln.byoc.kiln_json``). docs/byoc.md walks through a
new one.

May import: kiln.relay, kiln.tir, kiln.codegen, kiln.runtime, kiln.target, kiln.native (and
kiln.errors).
"""

from kiln.byoc.codegen import build_external, constant_names, external_functions
from kiln.byoc.partition import partition_for
from kiln.byoc.registry import (
    get_compiler,
    list_compilers,
    register_external_codegen,
    register_op_support,
    register_pattern_table,
    unregister,
)

__all__ = ["build_external", "constant_names", "external_functions", "get_compiler",
           "list_compilers", "partition_for", "register_external_codegen",
           "register_op_support", "register_pattern_table", "unregister"]
