"""Runtime modules of the BYOC backends (TVM's ``src/runtime/contrib/``)."""
