"""Loop-IR passes (TVM's ``tir.transform``): ``simplify``, ``make_packed_api``, ``fast_exp``.
Each is a function ``PrimFunc -> PrimFunc``."""
