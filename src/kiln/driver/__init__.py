"""kiln.driver."""
