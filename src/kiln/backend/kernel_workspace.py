"""How much workspace stack a kernel needs in the C runtime
(``kiln/native/src/crt/kiln_crt_backend.c``).

Codegen gives every ``Allocate`` above ``STACK_LIMIT`` bytes (and not ``local``) to
``TVMBackendAllocWorkspace``; the CRT serves those from a stack in which each block takes a
64-byte header plus its size rounded up to 64 bytes, and frees them in reverse order. The
C runtime runs parallel loops serially (one task), so nested allocations add up and sequential
ones reuse the same bytes: the peak is the largest sum along any nesting path. The AOT executor
reserves that peak (the maximum over its kernels) after its activations.
"""

from __future__ import annotations

import numpy as np

from kiln.codegen.c.source import STACK_LIMIT
from kiln.tir import loop as L

#: the CRT's workspace alignment and block header (KILN_CRT_ALIGN in kiln_crt.h)
CRT_ALIGN = 64


def _round(n: int) -> int:
    return (n + CRT_ALIGN - 1) // CRT_ALIGN * CRT_ALIGN


def _peak(s: L.Stmt) -> int:
    if isinstance(s, L.Allocate):
        nbytes = s.buffer.size * np.dtype(s.buffer.dtype).itemsize
        own = 0 if s.buffer.scope == "local" or nbytes <= STACK_LIMIT else (
            CRT_ALIGN + _round(nbytes))
        return own + _peak(s.body)
    if isinstance(s, (L.For, L.AssertStmt, L.LetStmt)):
        return _peak(s.body)
    if isinstance(s, L.SeqStmt):
        return max((_peak(x) for x in s.stmts), default=0)
    if isinstance(s, L.IfThenElse):
        return max(_peak(s.then_case), _peak(s.else_case) if s.else_case else 0)
    return 0


def workspace_bytes(func: L.PrimFunc) -> int:
    """Peak bytes of the CRT workspace stack while ``func`` runs (0 when it allocates none)."""
    return _peak(func.body)
