"""The graph executor (TVM's ``src/runtime/graph_executor/``): a static graph of kernel calls
over planned storage.

``factory`` (``GraphExecutorFactoryModule``: graph JSON + params + kernel library, one module
in the blob) creates ``executor`` (``GraphExecutor``), which parses ``graph_json``, allocates
``storage`` and runs its nodes as prepared C calls in batches (``call_batch``); ``debug`` is the
per-node timing and output dump (TVM's ``GraphExecutorDebug``). The user-facing wrappers are
``kiln.graph_executor`` and ``kiln.debug_executor``.
"""
