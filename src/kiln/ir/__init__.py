"""Kiln's IRs: the graph IR (``graph``, ops in ``ops``, registry in ``op_registry``), symbolic
dims (``arith``) and the loop IR (``loop``, tensor expressions in ``te``). May import numpy and
kiln.errors only."""
