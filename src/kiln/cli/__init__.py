"""kiln.cli.main."""
