"""Graph-level passes (TVM's relay.transform): each is a function ``Function -> Function`` with a
``name`` attribute, pure (its input is not modified), iterative over
:func:`kiln.relay.graph.post_order` so deep models do not hit Python's recursion limit.

- :func:`bind_params` turns named parameter Vars into Constants (the weights).
- :func:`simplify_inference` rewrites inference-only ops (batch_norm → scale/shift, dropout → id).
- :func:`fold_constant` evaluates every call whose arguments are all constants.

BYOC (``kiln.byoc.partition_for`` runs them in this order, after FoldConstant and before
AlterOpLayout): :mod:`merge_composite` (patterns → composite functions), :mod:`annotate_target`
(compiler_begin/end around what each external compiler takes), :mod:`merge_compiler_regions`
(grow regions, never into a cycle; regions: :mod:`annotated_regions`), :mod:`partition_graph`
(regions → external functions with ``Compiler`` and ``global_symbol``).

The order they run in is one list, :data:`kiln.driver.build_module.GRAPH_PASSES` (BindParams
... FuseOps). They import the graph IR, :mod:`kiln.arith` and the op vocabulary, never the
runtime, the frontend or the code generators.
"""

from kiln.relay.transform.bind_params import bind_params
from kiln.relay.transform.fold_constant import fold_constant
from kiln.relay.transform.simplify_inference import simplify_inference

__all__ = ["bind_params", "fold_constant", "simplify_inference"]
