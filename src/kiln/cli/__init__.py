"""The ``kiln`` command line (TVM's ``tvmc``): one module per command.

``main`` builds the parser and dispatches (entry point ``kiln.cli.main:main``); the commands
are ``compile``, ``run``, ``inspect``, ``tune`` and ``cache`` (``kiln demo`` lives in
``kiln.demo``). ``vm`` holds ``run``/``inspect`` for VM libraries, ``symbols`` the ``--dim`` and
``--input-shape`` parsing, ``graph_info`` a library's graph inputs and outputs. User errors
exit 2 with one line.

May import: anything in kiln.
"""
