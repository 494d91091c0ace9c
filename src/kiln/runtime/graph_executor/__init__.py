"""kiln.runtime.graph_executor.executor."""
