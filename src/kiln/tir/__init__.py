"""kiln.tir."""
