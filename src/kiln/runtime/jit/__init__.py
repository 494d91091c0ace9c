"""kiln.runtime.jit."""
