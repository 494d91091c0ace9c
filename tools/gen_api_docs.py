"""Generate ``docs/api.md``: the Python API reference, from the docstrings.

The page lists the public names of the modules in :data:`SECTIONS` (a module's ``__all__``, or
the names a section lists where the module has none) with their signatures and docstrings:
the first paragraph as prose, the rest verbatim (the docstrings are numpydoc, whose section
underlines markdown would read as headings). Classes list the public methods and properties
they define themselves. tests/unit/test_api_docs.py renders the page in memory and compares it
with the committed one, so a changed signature or docstring fails until the page is
regenerated.

Usage::

    python tools/gen_api_docs.py            # rewrite docs/api.md (also: make docs)
    python tools/gen_api_docs.py --check    # exit 1 when docs/api.md is stale
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import re
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing kiln
    sys.path.insert(0, str(ROOT / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/generated.py
from generated import write_or_check  # noqa: E402

DOC = ROOT / "docs" / "api.md"
COMMAND = "make docs (or: python tools/gen_api_docs.py)"
WIDTH = 100  # a signature longer than this puts one parameter on a line
#: dunder methods that are part of a class's public use (``vm["main"]``, ``vm["main"](x)``)
PUBLIC_DUNDERS = ("__call__", "__getitem__")
_MAY_IMPORT = re.compile(r"^May import:", re.MULTILINE)


@dataclass(frozen=True)
class Section:
    """One module of the page. ``names``: the names to document, in order; ``None`` takes the
    module's ``__all__``. ``note``: a line under the heading, for names that live elsewhere."""

    module: str
    names: tuple[str, ...] | None = None
    note: str = ""


SECTIONS = (
    Section("kiln", ("__version__",),
            note="Aliases, documented where they live: `kiln.build` is "
                 "[`kiln.driver.build_module.build`](#kilndriverbuild_modulebuild), `kiln.cpu` "
                 "is [`kiln.runtime.cpu`](#kilnruntimecpu), `kiln.generate` is "
                 "[`kiln.llm.generate`](#kilnllmgenerate); the error classes are those of "
                 "[`kiln.errors`](#kilnerrors). The subpackages (`kiln.frontend`, "
                 "`kiln.runtime`, `kiln.vm`, `kiln.graph_executor`, ...) are imported on first "
                 "use."),
    Section("kiln.frontend.onnx"),
    Section("kiln.driver.build_module", ("build", "choose_executor")),
    Section("kiln.target", ("Target", "default_target", "host_cpu", "host_triple")),
    Section("kiln.runtime"),
    Section("kiln.graph_executor"),
    Section("kiln.debug_executor"),
    Section("kiln.vm"),
    Section("kiln.errors", ("KilnError", "UnsupportedOpError", "ShapeError", "CompileError",
                            "ToolchainError", "ModuleLoadError", "ScheduleError")),
    Section("kiln.llm"),
    Section("kiln.serve.model", ("ServedModel", "load_model"),
            note="`kiln serve`'s Python side ([serve.md](serve.md)): a model, the server, the "
                 "continuous-batching scheduler."),
    Section("kiln.serve.server", ("serve", "ServerThread")),
    Section("kiln.serve.scheduler", ("Scheduler", "GenerationRequest")),
    Section("kiln.tune.tasks", ("extract_tasks",),
            note="`kiln tune`'s entry points: extract the tasks of a model, then tune them."),
    Section("kiln.tune.tuner", ("tune", "TuneResult")),
)

# ------------------------------------------------------------------------------ text


def _rst_to_md(text: str) -> str:
    """RST roles and literals as markdown code: ``:class:`~a.B``` → `B`, ````x```` → `x`."""
    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"`\1`", text)
    return text.replace("``", "`")


def split_docstring(obj) -> tuple[str, str]:
    """(first paragraph on one line, the rest as written) of ``obj``'s own docstring; a
    module's ``May import:`` sentence (a layering rule, no API) is left out."""
    raw = obj.__doc__ if isinstance(obj.__doc__, str) else ""
    doc = inspect.cleandoc(raw)
    m = _MAY_IMPORT.search(doc)
    if inspect.ismodule(obj) and m:
        doc = doc[:m.start()].rstrip()
    first, _, rest = doc.partition("\n\n")
    return _rst_to_md(" ".join(first.split())), rest.strip("\n")


def signature_text(qualname: str, obj) -> str:
    """``qualname(params) -> ret``, one parameter per line when longer than :data:`WIDTH`."""
    try:
        sig = inspect.signature(obj)
    except (TypeError, ValueError):  # a builtin without a signature
        return f"{qualname}(...)"
    if inspect.isclass(obj):  # a constructor: its ``-> None`` says nothing
        sig = sig.replace(return_annotation=inspect.Signature.empty)
    one_line = f"{qualname}{sig}"
    if len(one_line) <= WIDTH:
        return one_line
    ret = "" if sig.return_annotation is inspect.Signature.empty else \
        f" -> {inspect.formatannotation(sig.return_annotation)}"
    return qualname + "(\n" + "".join(f"    {p},\n" for p in _params(sig)) + ")" + ret


def _params(sig: inspect.Signature) -> list[str]:
    """The parameters as ``str(sig)`` writes them, with its ``/`` and ``*`` markers."""
    out, star = [], False
    params = list(sig.parameters.values())
    for i, p in enumerate(params):
        if p.kind is p.VAR_POSITIONAL:
            star = True
        elif p.kind is p.KEYWORD_ONLY and not star:
            out.append("*")
            star = True
        out.append(str(p))
        if p.kind is p.POSITIONAL_ONLY and (i + 1 == len(params)
                                            or params[i + 1].kind is not p.POSITIONAL_ONLY):
            out.append("/")
    return out


def _docs(obj) -> list[str]:
    first, rest = split_docstring(obj)
    out = [first or "(no docstring)", ""]
    if rest:
        out += ["```text", rest, "```", ""]
    return out


# ----------------------------------------------------------------------------- items


def _members(cls) -> list[tuple[str, object]]:
    """The public methods and properties ``cls`` defines itself, in source order (an override
    without a docstring of its own is left to its base class's entry)."""
    found = []
    for name, member in vars(cls).items():
        if name.startswith("_") and name not in PUBLIC_DUNDERS:
            continue
        if isinstance(member, classmethod):
            member = getattr(cls, name)  # bound: its signature has no ``cls``
        elif isinstance(member, staticmethod):
            member = member.__func__
        if not (inspect.isroutine(member) or isinstance(member, property)):
            continue
        doc = (member.fget if isinstance(member, property) else member).__doc__
        if not doc and any(hasattr(base, name) for base in cls.__mro__[1:]):
            continue  # an undocumented override: the base class documents it
        found.append((name, member))
    return found


def _python_init(cls) -> bool:
    """Whether ``cls`` is constructed by Python code (its own or a base's ``__init__`` or
    ``__new__``), so its signature says something; an exception's ``(*args)`` does not."""
    return any(inspect.isfunction(vars(c).get(m)) for c in cls.__mro__[:-1]
               for m in ("__init__", "__new__"))


def render_item(qualname: str, obj) -> list[str]:
    """The heading, signature and docstring of one public name (a class with its members)."""
    short = qualname.rsplit(".", 1)[-1]
    out = [f"### {qualname}", ""]
    if inspect.isclass(obj):
        head = signature_text(f"class {qualname}", obj) if _python_init(obj) else \
            f"class {qualname}"
        out += ["```python", head, "```", ""]
        bases = [f"`{b.__module__}.{b.__qualname__}`" for b in obj.__bases__ if b is not object]
        if bases:
            out += [f"Subclass of {', '.join(bases)}.", ""]
        out += _docs(obj)
        for name, member in _members(obj):
            if isinstance(member, property):
                out += [f"#### {short}.{name} (property)", ""] + _docs(member.fget)
            else:
                out += [f"#### {short}.{name}", "", "```python",
                        signature_text(f"{short}.{name}", member), "```", ""] + _docs(member)
    elif callable(obj):
        out += ["```python", signature_text(qualname, obj), "```", ""] + _docs(obj)
    else:
        out += ["```python", f"{qualname} = {obj!r}", "```", ""]
    return out


def section_names(section: Section, module) -> tuple[str, ...]:
    """The names ``section`` documents: its own list, or the module's ``__all__``."""
    if section.names is not None:
        return section.names
    names = getattr(module, "__all__", None)
    if names is None:
        raise SystemExit(f"{section.module} has no __all__: list its public names in SECTIONS")
    return tuple(names)


def render_section(section: Section) -> list[str]:
    module = importlib.import_module(section.module)
    first, _ = split_docstring(module)
    out = [f"## {section.module}", "", first, ""]
    if section.note:
        out += [section.note, ""]
    for name in section_names(section, module):
        out += render_item(f"{section.module}.{name}", getattr(module, name))
    return out


def _anchor(title: str) -> str:
    """GitHub's heading anchor: lower case, punctuation but ``-`` and ``_`` dropped."""
    return re.sub(r"[^\w\- ]", "", title.lower()).replace(" ", "-")


def render(sections=SECTIONS) -> str:
    """The whole page."""
    out = ["# Python API reference", "",
           "<!-- generated by tools/gen_api_docs.py from the docstrings: do not edit; "
           "run make docs -->", "",
           "The public names of Kiln's Python API: each module's `__all__` (or, for modules "
           "without one, the names listed in `tools/gen_api_docs.py`), with signatures and "
           "docstrings as the code has them. How to use them: "
           "[getting-started.md](getting-started.md); the command line: [cli.md](cli.md). "
           "What is stable between versions: [changelog.md](changelog.md#version-policy).", ""]
    out += [f"- [{s.module}](#{_anchor(s.module)})" for s in sections] + [""]
    for s in sections:
        out += render_section(s)
    text = "\n".join(out)
    return re.sub(r"\n{3,}", "\n\n", text).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true",
                        help="write nothing; exit 1 when docs/api.md is stale")
    args = parser.parse_args(argv)
    return write_or_check(DOC, render(), args.check, COMMAND)


if __name__ == "__main__":
    sys.exit(main())
