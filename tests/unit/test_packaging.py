"""Packaging metadata (pyproject.toml, constraints.txt): Kiln installs like a library.

pyproject.toml declares compatible ranges (so ``pip install kiln`` fits into an existing
environment); constraints.txt pins the exact versions make test, make demo and CI install
(``pip install -c constraints.txt -e '.[test,demo,torch-test]'``). ``requires-python`` is the
oldest Python all the pinned wheels make installs accept, read from the installed
distributions' ``Requires-Python``.
"""

import importlib.metadata
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"
CONSTRAINTS = ROOT / "constraints.txt"

#: setuptools' prepare_metadata_for_build_wheel in a fresh interpreter: the dist-info folder's
#: name and every warning raised while building it
METADATA_SCRIPT = """
import json, sys, warnings
from setuptools import build_meta
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    name = build_meta.prepare_metadata_for_build_wheel(sys.argv[1])
print(json.dumps({"dist_info": name,
                  "warnings": [f"{w.category.__name__}: {w.message}" for w in caught]}))
"""


def project() -> dict:
    return tomllib.loads(PYPROJECT.read_text(encoding="utf-8"))["project"]


def requirements() -> list[tuple[str, Requirement]]:
    """(where, requirement) for every dependency and extra, Kiln's own ``kiln[...]`` left out."""
    proj = project()
    out = [("dependencies", Requirement(r)) for r in proj["dependencies"]]
    for extra, reqs in proj["optional-dependencies"].items():
        out += [(f"extra {extra!r}", Requirement(r)) for r in reqs]
    return [(where, r) for where, r in out if canonicalize_name(r.name) != "kiln"]


def pins() -> dict[str, Version]:
    """constraints.txt: canonical name -> pinned version."""
    out = {}
    for line in CONSTRAINTS.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        (spec,) = req.specifier
        assert spec.operator == "==" and not req.extras and req.marker is None, (
            f"constraints.txt: {line!r} is not a plain name==version pin")
        name = canonicalize_name(req.name)
        assert name not in out, f"constraints.txt pins {req.name} twice"
        out[name] = Version(spec.version)
    return out


def python_floor(spec: str) -> tuple[int, int]:
    """The oldest Python 3 minor version some release of which ``spec`` accepts."""
    accepted = SpecifierSet(spec)
    for minor in range(0, 40):
        if any(accepted.contains(f"3.{minor}.{patch}") for patch in range(0, 30)):
            return 3, minor
    raise AssertionError(f"Requires-Python {spec!r} accepts no Python 3 release")


def test_dependencies_are_ranges_not_pins():
    for where, req in requirements():
        ops = {s.operator for s in req.specifier}
        assert not ops & {"==", "==="}, (
            f"pyproject.toml {where}: {req} pins an exact version; declare a compatible range "
            "and put the pin in constraints.txt")
        assert ops & {">=", "~=", ">"}, (
            f"pyproject.toml {where}: {req} has no lower bound (the oldest version the code "
            "works with)")


def test_constraints_pin_exactly_the_declared_dependencies_within_their_ranges():
    pinned = pins()
    declared = {canonicalize_name(r.name) for _, r in requirements()}
    assert set(pinned) == declared, (
        f"constraints.txt pins {sorted(set(pinned) - declared)} that pyproject.toml does not "
        f"declare, and lacks pins for {sorted(declared - set(pinned))}")
    for where, req in requirements():
        version = pinned[canonicalize_name(req.name)]
        assert req.specifier.contains(version, prereleases=True), (
            f"constraints.txt pins {req.name}=={version}, outside pyproject.toml {where}: {req}")


def installed_pins(names) -> tuple[dict[str, tuple[int, int]], list[str]]:
    """({name: Python floor of its installed Requires-Python} for the packages of ``names``
    installed at their pins, [the others, and why])."""
    pinned = pins()
    floors, not_at_pin = {}, []
    for name in sorted(names):
        try:
            meta = importlib.metadata.metadata(name)
        except importlib.metadata.PackageNotFoundError:
            not_at_pin.append(f"{name} (not installed)")
            continue
        if Version(meta["Version"]) != pinned[name]:
            not_at_pin.append(f"{name} ({meta['Version']} installed, {pinned[name]} pinned)")
            continue
        floors[name] = python_floor(meta.get("Requires-Python") or ">=3")
    return floors, not_at_pin


def make_install_line() -> re.Match:
    """The Makefile's venv install: ``pip install ... -c constraints.txt -e '.[EXTRAS]'``."""
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    stamp = re.search(r"^\$\(STAMP\):(.*)\n((?:\t.*\n|\t?.*\\\n)*)", text, re.M)
    assert stamp, "Makefile: no $(STAMP) rule"
    assert "constraints.txt" in stamp[1].split(), (
        "Makefile: $(STAMP) does not depend on constraints.txt (a changed pin would not reinstall)")
    line = re.search(r"pip install (?:--\S+ )*-c constraints\.txt -e '\.\[([\w,-]+)\]'", stamp[2])
    assert line, f"Makefile: the $(STAMP) recipe installs without -c constraints.txt:\n{stamp[2]}"
    return line


def test_every_make_install_uses_the_constraints():
    make_install_line()
    text = (ROOT / "Makefile").read_text(encoding="utf-8")
    installs = re.findall(r"pip install [^\n]*-e '\.[^\n]*", text)
    assert installs
    for line in installs:
        assert "-c constraints.txt" in line, f"Makefile: {line!r} installs without the pins"


def make_installed_names() -> set[str]:
    """The pinned packages make's venv install brings: the dependencies and the extras the
    $(STAMP) recipe names, with the extras those name (kiln[llm])."""
    proj = project()
    todo, extras = list(make_install_line()[1].split(",")), set()
    reqs = [Requirement(r) for r in proj["dependencies"]]
    while todo:
        extra = todo.pop()
        if extra in extras:
            continue
        extras.add(extra)
        for r in map(Requirement, proj["optional-dependencies"][extra]):
            if canonicalize_name(r.name) == "kiln":
                todo += sorted(r.extras)
            else:
                reqs.append(r)
    return {canonicalize_name(r.name) for r in reqs}


def test_requires_python_is_the_floor_of_the_pinned_wheels_make_installs():
    declared = python_floor(project()["requires-python"])
    floors, not_at_pin = installed_pins(make_installed_names())
    if not_at_pin:
        pytest.skip("not installed as make installs them (pip install -c constraints.txt): "
                    + ", ".join(not_at_pin))
    need = max(floors.values())
    assert need == declared, (
        f"requires-python is >={declared[0]}.{declared[1]}, but the pinned wheels make installs "
        f"need >={need[0]}.{need[1]}: "
        + ", ".join(f"{n} >={f[0]}.{f[1]}" for n, f in sorted(floors.items()) if f == need))


def test_no_pinned_wheel_needs_a_newer_python():
    """The other extras' pins (bench, dev) too, where installed."""
    declared = python_floor(project()["requires-python"])
    floors, _ = installed_pins(pins())
    if not floors:
        pytest.skip("no package is installed at its constraints.txt pin")
    too_new = {n: f"{f[0]}.{f[1]}" for n, f in floors.items() if f > declared}
    assert not too_new, (
        f"requires-python is >={declared[0]}.{declared[1]}, but pinned wheels need newer: "
        f"{too_new}")


def test_license_is_an_spdx_expression():
    proj = project()
    assert proj["license"] == "Apache-2.0"
    assert not [c for c in proj.get("classifiers", []) if c.startswith("License ::")], (
        "a License classifier beside the SPDX license expression is an error (PEP 639)")


def build_metadata(src: Path, out: Path) -> dict:
    setuptools = pytest.importorskip("setuptools")
    if Version(setuptools.__version__) < Version("77"):
        pytest.skip(f"setuptools {setuptools.__version__} < 77 cannot read SPDX license strings")
    proc = subprocess.run([sys.executable, "-c", METADATA_SCRIPT, str(out)], cwd=src,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_building_the_metadata_warns_about_nothing(tmp_path):
    result = build_metadata(ROOT, tmp_path)
    assert not result["warnings"], "\n".join(result["warnings"])
    meta = (tmp_path / result["dist_info"] / "METADATA").read_text(encoding="utf-8")
    assert "License-Expression: Apache-2.0" in meta.splitlines()
    assert f"Requires-Python: {project()['requires-python']}" in meta.splitlines()


def test_the_warning_check_sees_a_deprecated_license_table(tmp_path):
    """The check above can fail: a copy of pyproject.toml with the old ``{ text = ... }`` table
    warns."""
    src = tmp_path / "src_tree"
    (src / "src" / "kiln").mkdir(parents=True)
    (src / "src" / "kiln" / "__init__.py").touch()
    shutil.copy(ROOT / "README.md", src / "README.md")
    text = PYPROJECT.read_text(encoding="utf-8")
    assert 'license = "Apache-2.0"\n' in text
    (src / "pyproject.toml").write_text(
        text.replace('license = "Apache-2.0"\n', 'license = { text = "Apache-2.0" }\n'),
        encoding="utf-8")
    (tmp_path / "out").mkdir()
    result = build_metadata(src, tmp_path / "out")
    assert any("Deprecat" in w and "license" in w for w in result["warnings"]), result


def _python_versions_tool():
    spec = importlib.util.spec_from_file_location(
        "check_python_versions", ROOT / "tools" / "check_python_versions.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_no_source_imports_a_module_newer_pythons_removed():
    """The supported 3.12 and 3.13 dropped distutils, imp and the PEP 594 modules, which this
    3.11 interpreter would still import (make check-python resolves the wheels for them)."""
    assert _python_versions_tool().removed_imports() == []


def test_the_removed_module_scan_finds_one(tmp_path, monkeypatch):
    tool = _python_versions_tool()
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "old.py").write_text("import os\nfrom distutils.util import strtobool\n")
    monkeypatch.setattr(tool, "ROOT", tmp_path)
    assert tool.removed_imports() == ["src/old.py:2: distutils.util"]
