"""Tensor layouts such as ``NCHW``, ``NCHW16c`` and ``OIHW16i16o`` (TVM's ``tir.Layout``).

A layout names each dimension of a tensor: an upper-case letter is a *primal* axis (``C``), a
number followed by the same letter in lower case is a *sub-axis* of that primal axis holding
that many consecutive elements (``16c``). ``NCHW16c`` stores channel ``c`` of an NCHW tensor at
``[n, c // 16, h, w, c % 16]``. Used by AlterOpLayout (NCHW → NCHWc) and ``layout_transform``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from kiln.errors import CompileError

_TOKEN = re.compile(r"(\d*)([A-Za-z])")


@dataclass(frozen=True)
class Layout:
    """A parsed layout: ``axes`` is a tuple of (letter, factor) with factor 0 for primal axes."""

    name: str
    axes: tuple[tuple[str, int], ...]

    @staticmethod
    def parse(name: str) -> Layout:
        """Parse ``name``; raises CompileError if it is malformed."""
        axes = []
        pos = 0
        for m in _TOKEN.finditer(name):
            if m.start() != pos:
                break
            pos = m.end()
            digits, letter = m.groups()
            if letter.isupper() != (digits == ""):
                raise CompileError(f"layout {name!r}: sub-axis {m.group()} needs a factor and "
                                   "a lower-case letter")
            axes.append((letter, int(digits) if digits else 0))
        primal = [a for a, f in axes if not f]
        subs = [a.upper() for a, f in axes if f]
        if pos != len(name) or not axes or len(set(primal)) != len(primal) or \
                any(s not in primal for s in subs) or len(set(subs)) != len(subs):
            raise CompileError(f"layout {name!r} is malformed")
        return Layout(name, tuple(axes))

    @property
    def primal(self) -> str:
        """The primal axes in order, e.g. ``"NCHW"`` for ``NCHW16c``."""
        return "".join(a for a, f in self.axes if not f)

    def factor(self, letter: str) -> int:
        """The sub-axis factor of primal axis ``letter`` (0 if it is not split)."""
        return next((f for a, f in self.axes if f and a == letter.lower()), 0)

    def shape(self, primal_shape: dict[str, int]) -> tuple[int, ...]:
        """This layout's shape for a tensor of primal extents ``{"N": 1, "C": 64, ...}``."""
        out = []
        for a, f in self.axes:
            if f:
                out.append(f)
            else:
                sub = self.factor(a)
                if sub and primal_shape[a] % sub:
                    raise CompileError(f"layout {self.name}: {a}={primal_shape[a]} is not a "
                                       f"multiple of {sub}")
                out.append(primal_shape[a] // sub if sub else primal_shape[a])
        return tuple(out)

    def primal_shape(self, shape: tuple[int, ...]) -> dict[str, int]:
        """The primal extents of a tensor of ``shape`` in this layout."""
        if len(shape) != len(self.axes):
            raise CompileError(f"layout {self.name} has {len(self.axes)} dims, shape {shape}")
        ext = {a: n for (a, f), n in zip(self.axes, shape) if not f}
        for (a, f), n in zip(self.axes, shape):
            if f:
                if n != f:
                    raise CompileError(f"layout {self.name}: sub-axis {f}{a} has extent {n}")
                ext[a.upper()] *= f
        return ext

    def primal_index(self, index: tuple) -> dict[str, object]:
        """Primal coordinates (expressions or ints) of an ``index`` in this layout."""
        coords: dict[str, object] = {}
        for (a, f), i in zip(self.axes, index):
            if not f:
                sub = self.factor(a)
                coords[a] = i * sub if sub else i
        for (a, f), i in zip(self.axes, index):
            if f:
                coords[a.upper()] = coords[a.upper()] + i
        return coords

    def index(self, coords: dict[str, object]) -> tuple:
        """This layout's index of the element at primal ``coords`` (uses ``//`` and ``%``)."""
        out = []
        for a, f in self.axes:
            if f:
                out.append(coords[a.upper()] % f)
            else:
                sub = self.factor(a)
                out.append(coords[a] // sub if sub else coords[a])
        return tuple(out)


def transform_array(x: np.ndarray, src: str, dst: str) -> np.ndarray:
    """Reference ``layout_transform`` in numpy (reshape + transpose), C-contiguous result."""
    s, d = Layout.parse(src), Layout.parse(dst)
    if sorted(s.primal) != sorted(d.primal):
        raise CompileError(f"layout_transform: {src} and {dst} have different axes")
    ext = s.primal_shape(x.shape)
    # src → primal order of src: put each sub-axis right after its primal axis, then merge.
    src_pos = {(a, f): i for i, (a, f) in enumerate(s.axes)}
    perm, merged = [], []
    for a in s.primal:
        perm.append(src_pos[(a, 0)])
        sub = s.factor(a)
        if sub:
            perm.append(src_pos[(a.lower(), sub)])
        merged.append(ext[a])
    flat = x.transpose(perm).reshape(merged)
    # primal (src order) → dst: split each primal axis, then order as dst.
    split_shape, names = [], []
    for a in s.primal:
        sub = d.factor(a)
        if sub:
            split_shape += [ext[a] // sub, sub]
            names += [(a, 0), (a.lower(), sub)]
        else:
            split_shape.append(ext[a])
            names.append((a, 0))
    pos = {n: i for i, n in enumerate(names)}
    out = flat.reshape(split_shape).transpose([pos[ax] for ax in d.axes])
    return np.ascontiguousarray(out)
