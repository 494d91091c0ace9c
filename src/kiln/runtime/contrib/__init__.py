"""kiln.runtime.contrib."""
