"""The tuner's vocabulary, shared by the schedules, the search and the executors.

A **knob** is one choice a schedule makes (a block size, a pixel count, an unroll factor, which
loop the threads split), with its legal values for one workload; the first value is the
default rule's choice, so the default schedule is always candidate 0. A **config** maps knob
names to values. A **task** is one unique kernel of a model: its workload key (a content hash of
the primitive function and the target), how often the model runs it, and its knob space.

Everything here is plain, immutable and picklable: configs and tasks cross process and Ray
boundaries.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

#: knob name -> chosen value (an int, or a short string for layout-like choices)
Config = Mapping[str, int | str]


@dataclass(frozen=True)
class Knob:
    """One schedule choice: ``values[0]`` is what the default rule picks.

    Raises
    ------
    ValueError
        On construction with no value.
    """

    name: str
    values: tuple[int | str, ...]

    def __post_init__(self) -> None:
        if not self.values:
            raise ValueError(f"knob {self.name!r} has no legal value")


@dataclass(frozen=True)
class Task:
    """One unique kernel to tune.

    ``key``: workload key (stable across runs and processes: a hash of the primitive
    function's text, its shapes and dtypes, and the target string); ``name``: a readable kernel
    name for progress and reports; ``weight``: occurrences in the model; ``space``: the knobs
    its schedule declared; ``payload``: whatever the builder needs to lower the kernel again in
    another process (picklable; opaque to the search)."""

    key: str
    name: str
    weight: int
    space: tuple[Knob, ...]
    payload: object = field(default=None, compare=False, repr=False)

    def default_config(self) -> dict[str, int | str]:
        """The config of every knob's first value: the default schedule.

        Returns
        -------
        dict of str to int or str
        """
        return {k.name: k.values[0] for k in self.space}

    def size(self) -> int:
        """The number of configs: the product of the knobs' value counts (1 with no knob).

        Returns
        -------
        int
        """
        return math.prod(len(k.values) for k in self.space)

    def configs(self) -> Iterator[dict[str, int | str]]:
        """Every config, the default first (small spaces only: see :meth:`size`).

        Yields
        ------
        dict of str to int or str
            Knob name to value, in ``itertools.product`` order of the knobs' values.
        """
        names = [k.name for k in self.space]
        for values in itertools.product(*(k.values for k in self.space)):
            yield dict(zip(names, values))
