"""Generate the native runtime's ``rt_vocabulary.h`` from the Python runtime's tables.

The Python VM and the C VM (src/kiln/native/src/rt_vm*.c) read the same executables, so they
must agree on every number of the format: opcodes and argument kinds
(:mod:`kiln.runtime.vm.bytecode`), the magic, version, section ids, function kinds and constant
tags (:mod:`kiln.runtime.vm.executable_format`), the type key and limits
(:mod:`kiln.runtime.vm.executable`), the builtin prefix, storage id limit and the builtins the C
VM leaves to Python (:mod:`kiln.runtime.vm.builtins`). Typed twice, they could drift with only
an end-to-end run to notice; so the Python tables are the single source and this script writes
the C copy (as IREE generates its op tables)::

    python tools/gen_c_vocabulary.py           # rewrite the header (also: make vocabulary)
    python tools/gen_c_vocabulary.py --check   # exit 1 when the committed header is stale

tests/unit/native/test_c_vocabulary.py renders the header in memory and fails when the committed one
differs. The header is found wherever the C tree keeps it (the one ``rt_vocabulary.h`` under
``kiln.native.RUNTIME_DIR``), so moving the C files does not break the script.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT / "src") not in sys.path:  # run from a checkout without installing kiln
    sys.path.insert(0, str(ROOT / "src"))

sys.path.insert(0, str(Path(__file__).resolve().parent))  # tools/generated.py
from generated import write_or_check  # noqa: E402

from kiln.native import RUNTIME_DIR
from kiln.runtime.vm import builtins as B
from kiln.runtime.vm import bytecode as BC
from kiln.runtime.vm import executable as EX
from kiln.runtime.vm import executable_format as FMT

NAME = "rt_vocabulary.h"
COMMAND = "make vocabulary (or: python tools/gen_c_vocabulary.py)"
_WIDTH = 100


def header_path() -> Path:
    """Where the header is: the one ``rt_vocabulary.h`` of the C tree, else beside ``rt_vm.h``
    (the first generation)."""
    found = sorted(p for p in RUNTIME_DIR.rglob(NAME) if "build" not in p.parts)
    if len(found) > 1:
        raise SystemExit(f"gen_c_vocabulary: {len(found)} copies of {NAME}: "
                         f"{', '.join(map(str, found))}")
    if found:
        return found[0]
    vm_h = sorted(RUNTIME_DIR.rglob("rt_vm.h"))
    return (vm_h[0].parent if vm_h else RUNTIME_DIR / "src") / NAME


def _c_string(s: str) -> str:
    """``s`` as a C string literal; refused when it would need escapes (none of the names
    does, and an escape written wrong here would silently change the name C compares)."""
    if not s.isascii() or any(c in s for c in '"\\') or not s.isprintable():
        raise ValueError(f"gen_c_vocabulary: {s!r} is not a plain C string")
    return f'"{s}"'


def _number(v: int) -> str:
    """``(1 << n)`` for a power of two above 1024 (as the hand-written C had it), else ``v``."""
    if v > 1024 and v & (v - 1) == 0:
        return f"(1 << {v.bit_length() - 1})"
    return str(v)


def _constants(module: object, prefix: str) -> dict[int, str]:
    """``{value: name}`` of the module's ``PREFIX_NAME = int`` constants (name in lower case),
    so that a constant added to the Python table reaches the header with no edit here."""
    out: dict[int, str] = {}
    for attr, value in vars(module).items():
        if attr.startswith(prefix) and type(value) is int:
            if value in out:
                raise ValueError(f"gen_c_vocabulary: {prefix}{out[value].upper()} and {attr} "
                                 f"are both {value}")
            out[value] = attr[len(prefix):].lower()
    if not out:
        raise ValueError(f"gen_c_vocabulary: no {prefix}* constants in {module.__name__}")
    return dict(sorted(out.items()))


def _same(what: str, a: Mapping[int, str], b: Mapping[int, str]) -> None:
    """Refuse a Python table whose constants and name dict disagree (``OP_GOTO = 3`` but
    ``OPCODE_NAMES[3] == "if"``): the header would carry one of them into C unnoticed."""
    if {k: v.lower() for k, v in a.items()} != {k: v.lower() for k, v in b.items()}:
        raise ValueError(f"gen_c_vocabulary: the {what} constants {dict(a)} and their name "
                         f"table {dict(b)} disagree")


def _enum(comment: str, prefix: str, table: Mapping[int, str]) -> list[str]:
    """``enum { PREFIX_NAME = value, ... };`` one member a line, by value."""
    members = [f"  {prefix}{name.upper()} = {value}," for value, name in sorted(table.items())]
    return [f"/* {comment} */", "enum {", *members, "};"]


def _dense(table: Mapping[int, str], what: str) -> list[str | None]:
    """The names of ``table`` indexed by value from 0, ``None`` where no value is (C indexes
    an array with the values, so they must be small and not negative)."""
    if min(table) < 0 or max(table) > 255:
        raise ValueError(f"gen_c_vocabulary: {what} values {sorted(table)} are not in 0..255; "
                         f"the C tables index by value")
    return [table.get(v) for v in range(max(table) + 1)]


def _initializer(macro: str, names: Iterable[str | None]) -> list[str]:
    """``#define MACRO {"a", "b", ...}`` wrapped at the line width (``None``: ``NULL``)."""
    items = [("NULL" if n is None else _c_string(n)) + "," for n in names]
    items[-1] = items[-1][:-1]
    lines, line = [], f"#define {macro} {{"
    for item in items:
        if len(line) + 1 + len(item) + 3 > _WIDTH:
            lines.append(line + " \\")
            line = "   "
        line += ("" if line.endswith("{") else " ") + item
    return lines + [line + "}"]


def _define(name: str, value: str, comment: str = "") -> str:
    """One ``#define NAME VALUE`` line, with an optional trailing comment."""
    return f"#define {name} {value}" + (f" /* {comment} */" if comment else "")


def render() -> str:
    """The header's text, from the Python tables as they are now."""
    opcodes = _constants(BC, "OP_")
    _same("opcode", opcodes, BC.OPCODE_NAMES)
    arg_kinds = {v: n.lower() for v, n in BC.ARG_KIND_NAMES.items()}
    section_ids = _constants(FMT, "SEC_")
    _same("section", section_ids, FMT.SECTION_NAMES)
    sections = _dense(FMT.SECTION_NAMES, "section id")
    ops = _dense(BC.OPCODE_NAMES, "opcode")
    out = [
        "/*",
        " * Generated by tools/gen_c_vocabulary.py from the Python runtime's tables: do not edit.",
        f" * Regenerate: {COMMAND};",
        " * tests/unit/native/test_c_vocabulary.py fails when this file is stale.",
        " *",
        " * The numbers and names the C VM shares with the Python VM: kiln/runtime/vm/bytecode.py",
        " * (opcodes, argument kinds), executable_format.py (magic, version, sections, function",
        " * kinds, constant tags), executable.py (type key, limits) and builtins.py (the builtin",
        " * prefix, the storage id limit, the builtins only the Python VM runs).",
        " */",
        "#ifndef KILN_RT_VOCABULARY_H_",
        "#define KILN_RT_VOCABULARY_H_",
        "",
        "#include <stddef.h> /* NULL */",
        "",
        *_enum("opcodes (bytecode.OP_*)", "KILN_OP_", opcodes),
        "/* their names, indexed by opcode */",
        *_initializer("KILN_OP_NAMES_INIT", [n or "unknown" for n in ops]),
        *_enum("argument kinds, in bits 63..VALUE_BITS of an argument word (bytecode.REG...)",
               "KILN_ARG_", arg_kinds),
        _define("KILN_ARG_VALUE_BITS", str(BC.VALUE_BITS), "bytecode.VALUE_BITS"),
        "",
        "/* the executable's byte format (executable_format) */",
        _define("KILN_VM_MAGIC", _c_string(FMT.MAGIC.decode("ascii"))),
        _define("KILN_VM_MAGIC_LEN", str(len(FMT.MAGIC))),
        _define("KILN_VM_VERSION", str(FMT.VERSION)),
        _define("KILN_VM_HEADER_SIZE", str(FMT.HEADER_SIZE), "magic, u32 version, u32 count"),
        _define("KILN_VM_ENTRY_SIZE", str(FMT.ENTRY_SIZE), "u32 id, u64 offset, u64 length"),
        *_enum("section ids (executable_format.SEC_*)", "KILN_SEC_", section_ids),
        _define("KILN_SEC_FIRST", str(min(FMT.SECTION_NAMES))),
        _define("KILN_SEC_LAST", str(max(FMT.SECTION_NAMES))),
        "/* their names and the label of their readers' errors, indexed by id (\"unknown\" and",
        "   NULL: no section has that id) */",
        *_initializer("KILN_SEC_NAMES_INIT", [n or "unknown" for n in sections]),
        *_initializer("KILN_SEC_WHAT_INIT",
                      [n and f"VM executable section '{n}'" for n in sections]),
        *_enum("function kinds (executable_format.KIND_*)", "KILN_VM_KIND_",
               _constants(FMT, "KIND_")),
        *_enum("constant pool tags (executable_format.TAG_*)", "KILN_TAG_",
               _constants(FMT, "TAG_")),
        "",
        "/* the executable module (executable) */",
        _define("KILN_VM_TYPE_KEY", _c_string(EX.TYPE_KEY)),
        _define("KILN_VM_MAX_REGS", _number(EX.MAX_REGS)),
        _define("KILN_VM_MAX_HEAP", _number(EX.MAX_HEAP)),
        "",
        "/* the builtins (builtins) */",
        _define("KILN_VM_BUILTIN_PREFIX", _c_string(B.PREFIX)),
        _define("KILN_VM_BUILTIN_PREFIX_LEN", str(len(B.PREFIX))),
        _define("KILN_VM_MAX_STORAGE_ID", _number(B.MAX_STORAGE_ID)),
        "/* the builtins only the Python VM runs (builtins.PYTHON_ONLY_BUILTINS, with reasons),",
        "   NULL-terminated: the C VM refuses them at vm_initialization pointing to Python */",
        *_initializer("KILN_VM_PYTHON_ONLY_BUILTINS_INIT",
                      [*sorted(B.PYTHON_ONLY_BUILTINS), None]),
        "",
        "#endif /* KILN_RT_VOCABULARY_H_ */",
        "",
    ]
    too_long = [line for line in out if len(line) > _WIDTH]
    if too_long:
        raise ValueError(f"gen_c_vocabulary: lines over {_WIDTH} characters: {too_long}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    """Write the header, or with ``--check`` only compare it (exit 1 when stale)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="do not write; exit 1 when the header differs from the tables")
    args = parser.parse_args(argv)
    return write_or_check(header_path(), render(), args.check, COMMAND)


if __name__ == "__main__":
    sys.exit(main())
