"""``fcompile`` functions: how ``export_library`` and ``load_module`` turn files into a library
(TVM's python/tvm/contrib/cc.py).

An *fcompile* is a callable ``fcompile(output, files, options=None)`` with the attribute
``output_format`` saying what it writes: ``"so"`` (a shared library: :func:`create_shared`),
``"o"`` (one relocatable object holding everything: :func:`create_object`) or ``"tar"``
(``kiln.runtime.toolchain.tar.tar``). ``export_library`` decides the link mode from that attribute,
and
from the output's suffix only when no fcompile states one. ``get_target_triple`` (optional)
returns the linker's target triple.

``files`` mixes C/assembler sources (``.c``, ``.S``: compiled here, in parallel, with the Kiln
include path) and ready objects (``.o``: passed to the linker as is). Before linking, every ELF
object's machine is compared with ``cc -dumpmachine`` (``elf.check_objects_machine``), so a
foreign object is a :class:`ToolchainError` naming it instead of "Relocations in generic ELF".
"""

from __future__ import annotations

import os
import shlex
from collections.abc import Callable, Sequence
from typing import Any

from kiln.runtime.elf import check_objects_machine
from kiln.runtime.toolchain import compiler as toolchain

FCompile = Callable[..., Any]


def _cc_words(cc: str | Sequence[str] | None) -> list[str]:
    if cc is None:
        return toolchain.find_cc()
    return shlex.split(cc) if isinstance(cc, str) else [str(w) for w in cc]


def _compile_and_check(files: str | Sequence[str], cc: list[str],
                       options: Sequence[str]) -> list[str]:
    """Compile the sources among ``files`` and check every object's machine; returns the link
    inputs in the order of ``files`` (each source replaced by its object)."""
    files = [os.fspath(files)] if isinstance(files, (str, os.PathLike)) else [
        os.fspath(f) for f in files]
    srcs = [f for f in files if f.endswith(toolchain.SOURCE_SUFFIXES)]
    objs = dict(zip(srcs, toolchain.compile_objects(srcs, cc, options), strict=True))
    inputs = [objs.get(f, f) for f in files]
    triple = toolchain.dump_machine(cc)
    if triple:
        check_objects_machine(inputs, triple, shlex.join(cc))
    return inputs


def create_shared(output: str, objects: str | Sequence[str], options: Sequence[str] | None = None,
                  cc: str | Sequence[str] | None = None) -> None:
    """Build the shared library ``output`` from sources and objects (``output_format`` "so").

    Parameters
    ----------
    output : str
        The library to write.
    objects : str or list of str
        ``.c``/``.S`` sources (compiled with ``toolchain.COMPILE_FLAGS`` and the Kiln include
        path) and ``.o`` objects or other linker inputs.
    options : list of str, optional
        Flags for every compile and for the link.
    cc : str or list of str, optional
        The compiler (default ``$CC``, ``cc``, ``gcc`` or ``clang``).

    Raises
    ------
    ToolchainError
        The compiler is missing or fails, or an object is built for another machine than the
        compiler's target (naming the object, its machine and the target).
    """
    words = _cc_words(cc)
    inputs = _compile_and_check(objects, words, list(options or []))
    toolchain.link_shared(inputs, output, words, list(options or []))


def create_object(output: str, objects: str | Sequence[str], options: Sequence[str] | None = None,
                  cc: str | Sequence[str] | None = None) -> None:
    """Merge sources and objects into one relocatable object ``output`` (``output_format``
    "o"; ``cc -r``). ``load_module`` links such an object into a library when loading it.

    Parameters and errors as :func:`create_shared`; ``options`` go to the compiles only.
    """
    words = _cc_words(cc)
    inputs = _compile_and_check(objects, words, list(options or []))
    toolchain.link_relocatable(inputs, output, words)


def get_target_by_dump_machine(compiler: str | Sequence[str] | None = None
                               ) -> Callable[[], str | None]:
    """A ``get_target_triple`` function asking ``compiler -dumpmachine`` (default: the system
    C compiler); it returns None when the compiler cannot tell."""

    def get_target_triple() -> str | None:
        return toolchain.dump_machine(_cc_words(compiler))

    return get_target_triple


create_shared.output_format = "so"  # type: ignore[attr-defined]
create_shared.get_target_triple = get_target_by_dump_machine()  # type: ignore[attr-defined]
create_object.output_format = "o"  # type: ignore[attr-defined]
create_object.get_target_triple = get_target_by_dump_machine()  # type: ignore[attr-defined]
#: fcompile functions of this module that check object machines themselves
_CHECKING = (create_shared, create_object)


def cross_compiler(compile_func: str | Sequence[str] | FCompile,
                   options: Sequence[str] | None = None, output_format: str | None = None,
                   get_target_triple: Callable[[], str | None] | None = None,
                   add_files: Sequence[str] | None = None) -> FCompile:
    """An fcompile specialized with a compiler or options (TVM's
    ``tvm.contrib.cc.cross_compiler``).

    Parameters
    ----------
    compile_func : str, list of str or callable
        A compiler command (``"aarch64-linux-gnu-gcc"``; words are split like a shell would),
        used through :func:`create_shared`; or an fcompile to specialize.
    options : list of str, optional
        Flags added before the caller's options on every call (e.g. ``["-march=rv64gcv"]``).
    output_format : str, optional
        What the result writes; default: ``compile_func.output_format``, else ``"so"``.
    get_target_triple : callable, optional
        The linker's target; default: ``compile_func.get_target_triple``, or for a compiler
        command its ``-dumpmachine``. With a callable ``compile_func`` that does not check
        object machines itself, the ``.o`` inputs are checked against it before the call.
    add_files : list of str, optional
        Extra sources, objects or libraries passed on every call.

    Returns
    -------
    callable
        ``fcompile(output, objects, options=None)`` with ``output_format`` and
        ``get_target_triple`` attributes.

    Raises
    ------
    ToolchainError
        (from the returned function) The compiler fails or an object's machine differs from the
        target.
    """
    base = list(options or [])
    extra = [os.fspath(f) for f in (add_files or [])]
    kwargs: dict[str, Any] = {}
    func: FCompile
    if isinstance(compile_func, (str, list, tuple)):
        kwargs["cc"] = _cc_words(compile_func)
        func = create_shared
        get_target_triple = get_target_triple or get_target_by_dump_machine(kwargs["cc"])
    else:
        func = compile_func
    fmt = output_format or getattr(func, "output_format", None) or "so"
    triple_of = get_target_triple or getattr(func, "get_target_triple", None)
    check_here = func not in _CHECKING and fmt != "tar"

    def fcompile(output: str, objects: Sequence[str], options: Sequence[str] | None = None
                 ) -> Any:
        files = [*objects, *extra]
        if check_here and triple_of is not None:
            triple = triple_of()
            if triple:
                check_objects_machine([f for f in files if f.endswith(".o")], triple,
                                      getattr(func, "__name__", repr(func)))
        return func(output, files, options=[*base, *(options or [])], **kwargs)

    fcompile.output_format = fmt  # type: ignore[attr-defined]
    fcompile.get_target_triple = triple_of  # type: ignore[attr-defined]
    return fcompile


__all__ = ["create_object", "create_shared", "cross_compiler", "get_target_by_dump_machine"]
