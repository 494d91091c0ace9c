"""docs/api.md, the Python API reference, is generated from the docstrings and current.

tools/gen_api_docs.py renders the page from the public names of the modules it lists; here the
page is rendered in memory and must equal the committed one (run ``make docs`` when it does
not), and the renderer is checked to follow the code: a new public name, a changed signature
or docstring changes the page.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
import types
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "tools" / "gen_api_docs.py"
_spec = importlib.util.spec_from_file_location("gen_api_docs", _PATH)
gen = importlib.util.module_from_spec(_spec)
sys.modules.setdefault(_spec.name, gen)  # its dataclass looks its module up by name
_spec.loader.exec_module(gen)


def test_committed_page_is_current():
    assert gen.DOC.is_file(), f"{gen.DOC} is missing: run {gen.COMMAND}"
    assert gen.DOC.read_text() == gen.render(), (
        f"{gen.DOC} is stale (a public signature or docstring changed): run {gen.COMMAND} "
        "and commit it")


def test_every_public_name_has_an_entry():
    page = gen.render()
    for section in gen.SECTIONS:
        module = importlib.import_module(section.module)
        assert f"\n## {section.module}\n" in page
        for name in gen.section_names(section, module):
            assert hasattr(module, name), f"{section.module}.{name} does not exist"
            assert f"\n### {section.module}.{name}\n" in page
    # the entry points the docs name
    for entry in ("kiln.runtime.load_module", "kiln.vm.VirtualMachine", "kiln.target.Target",
                  "kiln.graph_executor.GraphModule", "kiln.driver.build_module.build",
                  "kiln.frontend.onnx.from_onnx", "kiln.errors.ShapeError",
                  "kiln.llm.kiln_decoder", "kiln.tune.tuner.tune"):
        assert f"\n### {entry}\n" in page, entry


def _fake_module(monkeypatch, doc: str, **names) -> str:
    mod = types.ModuleType("kiln_fake_api", doc)
    mod.__dict__.update(names)
    mod.__all__ = sorted(names)
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    return mod.__name__


def test_the_page_follows_the_code(monkeypatch):
    def load(path: str, *, strict: bool = True) -> int:
        """Load a thing.

        Parameters
        ----------
        path : str
        """
        return 0

    name = _fake_module(monkeypatch, "A fake module.\n\nMay import: nothing.", load=load)
    page = gen.render([gen.Section(name)])
    assert "### kiln_fake_api.load\n" in page
    assert "kiln_fake_api.load(path: 'str', *, strict: 'bool' = True) -> 'int'" in page
    assert "Load a thing.\n\n```text\nParameters\n----------\npath : str\n```" in page
    assert "May import" not in page  # the layering sentence is no API

    def load2(path: str, *, strict: bool = False) -> int:
        """Load a thing."""
        return 0

    monkeypatch.setattr(sys.modules[name], "load", load2)
    assert gen.render([gen.Section(name)]) != page  # a default changed: the page changes
    monkeypatch.setattr(sys.modules[name], "__all__", ["load", "extra"], raising=False)
    monkeypatch.setattr(sys.modules[name], "extra", 3, raising=False)
    assert "### kiln_fake_api.extra\n\n```python\nkiln_fake_api.extra = 3\n```" in \
        gen.render([gen.Section(name)])


def test_classes_list_their_own_public_members(monkeypatch):
    class Base:
        def run(self) -> None:
            """Run it."""

    class Thing(Base):
        """A thing.

        More about it.
        """

        def __init__(self, a: int, b: str = "x"):
            self.a = a

        def run(self) -> None:  # an undocumented override: Base's entry covers it
            pass

        def step(self, n: int = 1) -> int:
            """One step of ``n``."""
            return n

        @property
        def size(self) -> int:
            """The size (bytes)."""
            return 1

        @classmethod
        def create(cls, a: int) -> Thing:
            """A new one."""
            return cls(a)

        def _private(self):
            """Not listed."""

    name = _fake_module(monkeypatch, "Fake.", Thing=Thing)
    page = gen.render([gen.Section(name)])
    assert "class kiln_fake_api.Thing(a: 'int', b: 'str' = 'x')" in page
    assert "A thing.\n\n```text\nMore about it.\n```" in page
    assert "#### Thing.step\n\n```python\nThing.step(self, n: 'int' = 1) -> 'int'\n```\n\n" \
           "One step of `n`." in page
    assert "#### Thing.size (property)\n\nThe size (bytes)." in page
    assert "Thing.create(a: 'int') -> 'Thing'" in page  # bound: no cls
    assert "Thing.run" not in page and "_private" not in page


def test_long_signatures_break_per_parameter():
    def f(first_argument_name: int, second_argument_name: str = "default value", /,
          *rest: int, keyword_only_argument: float = 1.0, **options: str) -> None:
        pass

    text = gen.signature_text("kiln.module.f", f)
    # annotations are strings here (from __future__ import annotations), as in kiln
    assert text == ("kiln.module.f(\n    first_argument_name: 'int',\n"
                    "    second_argument_name: 'str' = 'default value',\n    /,\n"
                    "    *rest: 'int',\n    keyword_only_argument: 'float' = 1.0,\n"
                    "    **options: 'str',\n) -> 'None'")

    def g(a, *, b=1):
        pass

    assert gen._params(__import__("inspect").signature(g)) == ["a", "*", "b=1"]


def test_a_module_without_all_needs_its_names_listed(monkeypatch):
    mod = types.ModuleType("kiln_fake_noall", "Fake.")
    monkeypatch.setitem(sys.modules, mod.__name__, mod)
    with pytest.raises(SystemExit, match="no __all__"):
        gen.render([gen.Section(mod.__name__)])


def test_check_mode(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(gen, "DOC", tmp_path / "api.md")
    assert gen.main(["--check"]) == 1  # missing
    assert "is stale" in capsys.readouterr().err
    assert gen.main([]) == 0 and gen.main(["--check"]) == 0
