"""kiln.relay."""
