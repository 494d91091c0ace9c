"""The Python and C runtimes speak one vocabulary (issue 28).

The C VM (src/kiln/native/src/rt_vm*.c) and the C kiln_json runtime read the files the Python
runtime reads, so any number or name they share must agree; before this test only an
end-to-end run would notice a drift. Two mechanisms:

- numbers (opcodes, argument kinds, magic, version, section ids, function kinds, constant tags,
  type key, limits, the builtin prefix, the Python-only builtins) are *generated* into
  ``rt_vocabulary.h`` by tools/gen_c_vocabulary.py from the Python tables; here the header is
  rendered in memory and must equal the committed one, and no other C file may define those
  names again by hand;
- names dispatched by C code (the ``vm.builtin.*`` the C VM prepares, the kiln_json kernels of
  rt_json_kernels.c) are *parsed* from the C sources and compared both ways with the Python
  registries, minus the documented lists of names only one side has.
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

from kiln.native import RUNTIME_DIR
from kiln.runtime.contrib.json.json_kernels import BUILTIN_KERNELS
from kiln.runtime.vm import bytecode as BC
from kiln.runtime.vm.builtins import BUILTINS, PREFIX, PYTHON_ONLY_BUILTINS
from kiln.runtime.vm.dynamic_builtins import DYNAMIC_BUILTINS

_PATH = Path(__file__).resolve().parents[3] / "tools" / "gen_c_vocabulary.py"
_spec = importlib.util.spec_from_file_location("gen_c_vocabulary", _PATH)
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)

#: ``vm.builtin.*`` names the C VM dispatches that the Python registry lacks, with the reason:
#: none. A builtin only C runs would make executables the Python VM (the spec) cannot load.
C_ONLY_BUILTINS: dict[str, str] = {}
#: kiln_json kernels only one runtime has, with the reason: none. (Vendors may register more
#: Python kernels at run time; only Kiln's own, ``BUILTIN_KERNELS``, are compared.)
PYTHON_ONLY_KERNELS: dict[str, str] = {}
C_ONLY_KERNELS: dict[str, str] = {}

_DISPATCH = re.compile(r'strcmp\(\s*b\s*,\s*"([A-Za-z0-9_.]+)"\s*\)\s*==\s*0')
_DYN_PREPARE = re.compile(r'strcmp\(\s*b\s*,\s*"(\w+)"\s*\)\s*==\s*0\s*\)\s*return\s+'
                          r'kiln_dyn_prepare\(\s*s\s*,\s*\w+\s*,\s*(\d+)\s*,\s*(\d+)\s*\)')
_JSON_TABLE = re.compile(r"kiln_json_kernels\[\]\s*=\s*\{(.*?)\n\};", re.DOTALL)


def _c_files(pattern: str) -> list[Path]:
    """The C tree's files matching ``pattern``, wherever they live under the runtime folder
    (the C files may move into subfolders), build outputs left out."""
    files = sorted(p for p in RUNTIME_DIR.rglob(pattern) if "build" not in p.parts)
    assert files, f"no {pattern} under {RUNTIME_DIR}"
    return files


def _strip_comments(text: str) -> str:
    return re.sub(r"/\*.*?\*/|//[^\n]*", " ", text, flags=re.DOTALL)


def _both_ways(what: str, python: set[str], c: set[str], python_only: dict[str, str],
               c_only: dict[str, str]) -> list[str]:
    """The disagreements between the two name sets, given the documented one-sided lists."""
    problems = []
    if set(python_only) - python:
        problems.append(f"listed as Python-only but not in the Python registry: "
                        f"{sorted(set(python_only) - python)}")
    if set(python_only) & c:
        problems.append(f"listed as Python-only but the C code has them: "
                        f"{sorted(set(python_only) & c)}")
    if set(c_only) - c or set(c_only) & python:
        problems.append(f"the C-only list is out of date: {sorted(c_only)}")
    missing_c = python - c - set(python_only)
    if missing_c:
        problems.append(f"in Python, missing from C (implement them, or list them as "
                        f"Python-only with a reason): {sorted(missing_c)}")
    missing_py = c - python - set(c_only)
    if missing_py:
        problems.append(f"in C, missing from Python (a typo on one side, or list them as C-only "
                        f"with a reason): {sorted(missing_py)}")
    return [f"{what}: {p}" for p in problems]


# ------------------------------------------------------------------- generated numbers
def test_committed_header_is_current():
    path = gen.header_path()
    assert path.is_file(), f"{path} is missing: run {gen.COMMAND}"
    assert path.read_text() == gen.render(), (
        f"{path} is stale (the Python VM's tables changed, or it was edited by hand): "
        f"run {gen.COMMAND} and commit it")
    assert gen.main(["--check"]) == 0


def test_header_follows_the_python_tables(monkeypatch):
    """A drift is seen: swapping two opcodes in Python changes the rendered header, so the
    committed one no longer matches (what test_committed_header_is_current then reports)."""
    committed = gen.header_path().read_text()
    goto, if_ = BC.OP_GOTO, BC.OP_IF
    monkeypatch.setattr(BC, "OP_GOTO", if_)
    monkeypatch.setattr(BC, "OP_IF", goto)
    monkeypatch.setattr(BC, "OPCODE_NAMES", {**BC.OPCODE_NAMES, goto: "if", if_: "goto"})
    drifted = gen.render()
    assert drifted != committed
    assert f"KILN_OP_IF = {goto}," in drifted
    monkeypatch.setattr(BC, "OPCODE_NAMES", {**BC.OPCODE_NAMES, BC.OP_IF: "jump"})
    with pytest.raises(ValueError, match="disagree"):
        gen.render()  # an OP_* constant and OPCODE_NAMES that disagree are refused


def test_no_hand_typed_copies_in_c():
    """Every name of the generated header is defined there only: no C file of the runtime
    types its own copy (an enum member or a #define), and the VM's header includes it."""
    path = gen.header_path()
    text = path.read_text()
    names = set(re.findall(r"^#define (KILN_\w+)", text, re.MULTILINE))
    names |= set(re.findall(r"^\s+(KILN_\w+) = ", text, re.MULTILINE))
    assert {"KILN_OP_CALL", "KILN_ARG_HEAP", "KILN_SEC_CODE", "KILN_TAG_INT",
            "KILN_VM_MAGIC"} <= names
    copies = []
    for f in _c_files("*.[ch]"):
        if f == path:
            continue
        code = _strip_comments(f.read_text())
        for name in names:
            if re.search(rf"#\s*define\s+{name}\b|\b{name}\s*=(?!=)", code):
                copies.append(f"{f.name}: {name}")
        if '"KILNVMEX"' in code:
            copies.append(f"{f.name}: the magic as a literal")
    assert not copies, f"hand-typed copies of generated names (use {path.name}): {copies}"
    vm_h = _c_files("rt_vm.h")[0].read_text()
    assert f'#include "{path.name}"' in vm_h


# ------------------------------------------------------------------ parsed builtin names
def _c_builtins() -> set[str]:
    names: set[str] = set()
    for f in _c_files("rt_vm*.c"):
        names |= set(_DISPATCH.findall(_strip_comments(f.read_text())))
    return names


def test_builtin_names_match_the_c_dispatch():
    python = {n[len(PREFIX):] for n in BUILTINS}
    assert all(n.startswith(PREFIX) for n in BUILTINS)
    c = _c_builtins()
    assert len(c) >= 20, f"the C dispatch parse found only {sorted(c)}"
    problems = _both_ways("vm.builtin", python, c, PYTHON_ONLY_BUILTINS, C_ONLY_BUILTINS)
    assert not problems, "\n".join(problems)
    assert all(reason.strip() for reason in PYTHON_ONLY_BUILTINS.values())


def test_the_comparison_sees_a_drift():
    """Both directions report: a name added on one side only, a Python-only name C has."""
    python, c = {"copy", "trap", "unique"}, {"copy", "trap"}
    assert not _both_ways("x", python, c, {"unique": "why"}, {})
    assert "missing from C" in _both_ways("x", python | {"new"}, c, {"unique": "why"}, {})[0]
    assert "missing from Python" in _both_ways("x", python, c | {"tarp"}, {"unique": "w"}, {})[0]
    assert "the C code has them" in _both_ways("x", python, c | {"unique"}, {"unique": "w"},
                                               {})[0]


def test_dynamic_builtin_arities_match():
    """The data-dependent builtins (decision 016): C's ``kiln_dyn_prepare(s, run, ntensors,
    nimm)`` counts are those of the Python factories (``_tensor_op``)."""
    c = {}
    for f in _c_files("rt_vm*.c"):
        for name, nt, ni in _DYN_PREPARE.findall(_strip_comments(f.read_text())):
            c[name] = (int(nt), int(ni))
    assert len(c) >= 5, f"the kiln_dyn_prepare parse found only {c}"
    python = {n: DYNAMIC_BUILTINS[n].arity for n in c if n in DYNAMIC_BUILTINS}
    assert set(python) == set(c), sorted(set(c) - set(python))
    wrong = {n: {"python": python[n], "c": c[n]} for n in c if python[n] != c[n]}
    assert not wrong, f"(tensors, immediates) differ: {wrong}"


# ------------------------------------------------------------------- parsed kernel names
def test_json_kernel_names_match_the_c_table():
    (src,) = _c_files("rt_json_kernels.c")
    table = _JSON_TABLE.search(_strip_comments(src.read_text()))
    assert table, f"no kiln_json_kernels[] table in {src}"
    c = set(re.findall(r'\{\s*"([^"]+)"\s*,', table.group(1)))
    assert len(c) >= 10, f"the kernel table parse found only {sorted(c)}"
    problems = _both_ways("kiln_json kernel", set(BUILTIN_KERNELS), c, PYTHON_ONLY_KERNELS,
                          C_ONLY_KERNELS)
    assert not problems, "\n".join(problems)
