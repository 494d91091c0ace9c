"""The graph IR and its passes (the role of TVM's Relay).

``graph`` is the IR (a typed dataflow graph of operator calls), ``op_registry`` and ``op/`` the
op vocabulary (type relations, fusion patterns, numpy references), ``interpreter`` the
reference evaluator built from those references, ``pattern`` the dataflow patterns of BYOC
pattern tables, and ``transform/`` the graph passes (``Function -> Function``). Shapes are
ints or ``kiln.arith`` expressions.

May import: kiln.topi, kiln.tir, kiln.arith, kiln.target, kiln.runtime.dynamic_ops (and
kiln.errors).
"""
