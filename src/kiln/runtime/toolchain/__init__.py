"""kiln.runtime.toolchain.compiler."""
