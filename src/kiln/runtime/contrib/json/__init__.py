"""The ``kiln_json`` BYOC runtime (TVM's ``src/runtime/contrib/json/``): ``json_runtime``
(``JSONRuntimeModule``, an external function shipped as a JSON graph with its constants) and
``json_kernels`` (the numpy kernels it runs; the C twin is ``kiln/native/src/rt_json_kernels.c``).
"""
