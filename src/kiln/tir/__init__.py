"""The loop IR and its passes (the role of TVM's TIR and TE).

``loop`` is the IR (buffers, loops, loads and stores, ``PrimFunc``), ``te`` the tensor
expressions compute definitions are written in, ``lower`` their schedules and lowering to loop
IR, ``layout`` tensor layouts such as NCHW16c, ``interpreter`` the executable definition of the
loop IR's semantics, ``verify`` its invariants, ``text`` its printed form, ``index``,
``speculation`` and ``intrin_int8`` helpers of the code generators, and ``transform/`` the
loop passes (``PrimFunc -> PrimFunc``).

May import: kiln.arith (and kiln.errors).
"""
