"""The compiler driver (TVM's ``relay.build`` / ``tvm.driver``): the one place that knows the
pipeline.

``build_module`` runs a model from graph IR to runtime modules: the graph passes, fusion,
lowering and scheduling of each fused function, code generation and the executor's artifact
(graph JSON, VM bytecode, AOT C); ``apply_history`` and ``tuning_records`` apply tuning records
to the kernels it lowers; ``onnx_backend`` is the ONNX backend API (``prepare``/``run``) that
the ONNX conformance tests drive; ``torch_backend`` is the TorchDynamo backend
(``torch.compile(model, backend="kiln")``, PyTorch optional). See docs/design.md.

May import: kiln.frontend, kiln.relay, kiln.topi, kiln.tir, kiln.arith, kiln.schedules,
kiln.backend, kiln.codegen, kiln.byoc, kiln.crt, kiln.runtime, kiln.graph_executor, kiln.vm,
kiln.target, kiln.progress (and kiln.errors).
"""
