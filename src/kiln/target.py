"""Targets: a description of the hardware code is generated for (TVM's ``tvm.target.Target``).

A target string is a kind followed by ``-key=value`` options: ``"c"``,
``"llvm -mtriple=riscv64-unknown-linux-gnu -mattr=+v"``. The target only describes; codegens and
schedules dispatch on it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kiln.errors import KilnError

KINDS = ("c", "llvm")


@dataclass(frozen=True)
class Target:
    """A parsed target: ``kind`` ("c" or "llvm"), ``options`` (e.g. {"mcpu": "native"}),
    ``keys`` (schedule keys, "cpu" for both kinds here)."""

    kind: str
    options: dict = field(default_factory=dict)
    keys: tuple[str, ...] = ("cpu",)

    def __init__(self, spec: str | Target):
        if isinstance(spec, Target):
            object.__setattr__(self, "kind", spec.kind)
            object.__setattr__(self, "options", dict(spec.options))
            object.__setattr__(self, "keys", spec.keys)
            return
        words = spec.split()
        if not words or words[0] not in KINDS:
            raise KilnError(f"unknown target '{spec}': expected one of {', '.join(KINDS)}")
        options = {}
        for w in words[1:]:
            if not w.startswith("-"):
                raise KilnError(f"target '{spec}': option '{w}' must look like -key=value")
            key, _, value = w.lstrip("-").partition("=")
            options[key] = value or True
        object.__setattr__(self, "kind", words[0])
        object.__setattr__(self, "options", options)
        object.__setattr__(self, "keys", ("cpu",))

    def __str__(self) -> str:
        return " ".join([self.kind] + [f"-{k}={v}" for k, v in self.options.items()])

    def __hash__(self) -> int:
        return hash(str(self))
