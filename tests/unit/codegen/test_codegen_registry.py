"""The code generators by target kind (kiln.codegen.registry): the one table kiln.build, the
tuner and the system library ask."""

from __future__ import annotations

import pytest

from kiln.codegen import registry
from kiln.errors import CompileError
from kiln.target import KINDS


def test_every_target_kind_has_a_code_generator():
    assert {kind: registry.get_codegen(kind).stage for kind in KINDS} == {
        "c": "Generating C", "llvm": "Generating code with LLVM",
        "jit": "Generating C for the jit device"}


def test_an_unknown_kind_names_the_registered_ones():
    with pytest.raises(CompileError, match="no code generator for target kind 'cuda'.*c, jit"):
        registry.get_codegen("cuda")


def test_a_kind_registers_once(monkeypatch):
    monkeypatch.setattr(registry, "_CODEGENS", dict(registry._CODEGENS))
    mine = registry.Codegen(lambda kernels, target, jobs=None: None,
                            lambda names, symbols, prefix, target: None, "Generating mine")
    registry.register_codegen("mine", mine)
    assert registry.get_codegen("mine") is mine
    with pytest.raises(CompileError, match="already registered"):
        registry.register_codegen("mine", mine)


def test_c_flags_follow_mcpu():
    from kiln.target import Target

    assert registry.c_compile_options(Target("c -mcpu=native")) == ["-march=native"]
    assert registry.c_compile_options(Target("c")) == []
