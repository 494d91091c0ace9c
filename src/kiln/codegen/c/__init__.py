"""The C code generator (TVM's ``codegen_c_host``): ``source`` turns packed-API PrimFuncs into
one C translation unit, compiled by the system C compiler when the library is exported (the
``c`` target) or where the model runs (the ``jit`` target)."""
