"""The system C toolchain and the caches of compiled code.

``compiler`` finds and runs the C compiler and reports its failures; ``cc`` and ``tar`` are
the ``fcompile`` functions of ``export_library`` (TVM's ``contrib/cc.py``, ``contrib/tar.py``).
``compile_cache`` keys compiled code by content (decision 005), ``cc_manifest`` is its direct
mode for C objects (decision 029), ``cache_limit`` the one LRU size cap over every cache
(decision 027), ``private_dir`` the checked 0700 folders they live in.
"""
