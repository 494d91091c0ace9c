"""The house rules, as tests: the layering every package declares, no import circles between
packages, and no source file over 600 lines (docs/design.md, "Layering").

A *unit* is a first-level package or module of ``kiln`` (``kiln.relay``, ``kiln.runtime``,
``kiln.errors``, ``kiln.vm``, ...). Each unit's docstring (its ``__init__.py`` for a package)
carries one sentence ``May import: kiln.x, kiln.y.z (and kiln.errors).`` — the units (or single
modules, such as ``kiln.runtime.dynamic_ops``) its modules may import, function-level imports
included; ``kiln.errors`` is allowed everywhere; ``anything in kiln`` opens the whole package
(the CLI, the demos, the facade). The root facade's ``__version__`` is no dependency.

The exceptions are listed in :data:`ALLOWED_BREAKS`, each with its reason. Later commits may
only shrink that list: a test fails when an entry no longer breaks a rule.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SRC = ROOT / "src"
MAX_LINES = 600

#: (importing module, imported unit): why the import is still there
ALLOWED_BREAKS: dict[tuple[str, str], str] = {
    ("kiln.graph_executor", "kiln.debug_executor"): "GraphModule.debug() hands back the debug "
    "wrapper of the same executor (TVM's graph_executor has the same hook)",
}


def _modules() -> dict[str, Path]:
    mods = {}
    for path in sorted((SRC / "kiln").rglob("*.py")):
        parts = list(path.relative_to(SRC).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        mods[".".join(parts)] = path
    return mods


MODULES = _modules()


def unit_of(module: str) -> str:
    return ".".join(module.split(".")[:2])


def imports_of(path: Path) -> set[str]:
    """Every kiln module or package ``path`` imports, at any depth of its code."""
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{a.name}" for a in node.names]
            subs = [n for n in names if n in MODULES]
            out.update(subs)
            plain = [a.name for a in node.names if f"{node.module}.{a.name}" not in MODULES]
            if plain and (node.module != "kiln" or set(plain) - {"__version__"}):
                out.add(node.module)
    return {m for m in out if m == "kiln" or m.startswith("kiln.")}


def declared_rules() -> dict[str, list[str]]:
    """``{unit: allowed}`` from each unit's ``May import:`` sentence; ``["*"]`` for anything."""
    rules = {}
    for unit in sorted({unit_of(m) for m in MODULES}):
        doc = ast.get_docstring(ast.parse(MODULES[unit].read_text())) or ""
        m = re.search(r"May import:(.*?)\.(?:\s|$)", doc, re.S)
        if m is None:
            rules[unit] = None
            continue
        text = m.group(1)
        rules[unit] = ["*"] if "anything in kiln" in text else re.findall(r"kiln(?:\.\w+)+",
                                                                           text)
    return rules


def _allowed(target: str, allowed: list[str]) -> bool:
    return "*" in allowed or target == "kiln.errors" or any(
        target == a or target.startswith(a + ".") for a in allowed)


def breaks() -> dict[tuple[str, str], list[str]]:
    """``{(module, imported unit): [imported modules]}`` for every import outside the rules."""
    rules = declared_rules()
    out = defaultdict(list)
    for module, path in MODULES.items():
        unit = unit_of(module)
        for target in sorted(imports_of(path)):
            if unit_of(target) == unit or target == "kiln" and rules[unit] == ["*"]:
                continue
            if not _allowed(target, rules[unit] or []):
                out[(module, unit_of(target))].append(target)
    return dict(out)


def test_every_unit_declares_what_it_may_import():
    missing = [u for u, r in declared_rules().items() if r is None]
    assert not missing, f"no 'May import:' sentence in the docstring of {missing}"


def test_declared_units_exist():
    units = {unit_of(m) for m in MODULES}
    unknown = {a for r in declared_rules().values() for a in r or [] if a != "*"
               and unit_of(a) not in units}
    assert not unknown, f"'May import:' names units that do not exist: {sorted(unknown)}"


def test_imports_follow_the_declared_layering():
    found = breaks()
    new = {k: v for k, v in found.items() if k not in ALLOWED_BREAKS}
    assert not new, "imports outside the 'May import:' rules (fix, or justify in " \
        "ALLOWED_BREAKS):\n" + "\n".join(f"  {m} imports {', '.join(t)}"
                                         for (m, _), t in sorted(new.items()))
    stale = sorted(set(ALLOWED_BREAKS) - set(found))
    assert not stale, f"ALLOWED_BREAKS entries that no longer break a rule: {stale}"


def unit_graph(skip_allowed: bool) -> dict[str, set[str]]:
    graph = defaultdict(set)
    for module, path in MODULES.items():
        for target in imports_of(path):
            a, b = unit_of(module), unit_of(target)
            if a != b and not (skip_allowed and (module, b) in ALLOWED_BREAKS):
                graph[a].add(b)
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one unit (Tarjan's algorithm)."""
    index, low, stack, on_stack, out = {}, {}, [], set(), []

    def visit(v):
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return out


def test_no_import_circles_between_packages():
    # The root facade imports lazily what its attributes name; no unit may import it back.
    graph = unit_graph(skip_allowed=True)
    circles = import_circles(graph)
    assert not circles, f"import circles between packages: {circles}"


def test_the_circle_detector_finds_a_circle():
    assert import_circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


@pytest.mark.parametrize("suffix", [".py", ".c", ".h"])
def test_no_source_file_over_600_lines(suffix):
    roots = [ROOT / d for d in ("src", "tests", "benchmarks", "conformance", "tools",
                                "examples")]
    long = sorted((str(p.relative_to(ROOT)), n) for r in roots if r.exists()
                  for p in r.rglob(f"*{suffix}") if ".venv" not in p.parts
                  and (n := len(p.read_text(errors="replace").splitlines())) > MAX_LINES)
    assert not long, f"files over {MAX_LINES} lines (split them by concept): {long}"
