"""kiln.runtime.contrib.json."""
