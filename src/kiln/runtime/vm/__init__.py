"""kiln.runtime.vm.virtual_machine."""
