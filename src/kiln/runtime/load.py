"""``load_module``: a shared library exported by Kiln (or TVM) → its module tree
(TVM's ``tvm.runtime.load_module`` and ``ProcessModuleBlob`` in src/runtime/library_module.cc).

Order of checks, each failing with a :class:`ModuleLoadError` that names the file: it exists;
it is an ELF file for this host's machine whose segments lie inside the file (``elf.py``);
``dlopen`` accepts it; it defines ``__tvm_dev_mblob``; the blob's ``u64 nbytes`` fits inside the
file-backed segment that holds it (so a corrupt length never reads unmapped memory); the blob
unpacks (``blob.py``). The library itself becomes the ``_lib`` module.
"""

from __future__ import annotations

import ctypes
import mmap
import os

from kiln.errors import ModuleLoadError
from kiln.runtime import graph_executor_factory  # noqa: F401  (registers its blob loader)
from kiln.runtime.blob import unpack_imports
from kiln.runtime.elf import ElfInfo, check_loadable
from kiln.runtime.library_module import LibraryModule
from kiln.runtime.module import Module

BLOB_SYMBOL = "__tvm_dev_mblob"


class _DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


def _dladdr_base(addr: int) -> int | None:
    for name in (None, "libdl.so.2"):
        try:
            dladdr = ctypes.CDLL(name).dladdr
        except (OSError, AttributeError):
            continue
        dladdr.argtypes = [ctypes.c_void_p, ctypes.POINTER(_DlInfo)]
        dladdr.restype = ctypes.c_int
        info = _DlInfo()
        if dladdr(addr, ctypes.byref(info)) and info.dli_fbase:
            return int(info.dli_fbase)
        return None
    return None


def _readable_after(addr: int, elf: ElfInfo, file_size: int) -> int:
    """Bytes readable from ``addr`` to the end of the file-backed segment holding it."""
    base = _dladdr_base(addr)
    if base is None or not elf.loads:
        return file_size  # cannot locate the segment: fall back to the file size bound
    page = mmap.PAGESIZE
    bias = base - (min(s.vaddr for s in elf.loads) & ~(page - 1))
    vaddr = addr - bias
    for seg in elf.loads:
        if seg.vaddr <= vaddr < seg.vaddr + seg.filesz:
            return seg.vaddr + seg.filesz - vaddr
    return 0


def load_module(path: str | os.PathLike[str], fmt: str = "") -> Module:
    """Load an exported library and rebuild its module tree.

    .. warning::
       A ``.so`` is code: only load libraries you trust, as with TVM's ``load_module``,
       ``ctypes.CDLL`` or any native plugin. ``dlopen`` runs the library's constructors, and
       its kernels run with your process's rights when the graph runs. Loading itself runs no
       other code from the file: the ELF headers, the blob, the graph JSON and the params are
       only read, and every corruption of them raises :class:`ModuleLoadError` (fuzzed:
       ``tests/fuzz_runtime.py``). What is checked is integrity, not trust: the checks catch
       truncated or corrupted files, not a malicious one
       (docs/decisions/002-loading-untrusted-artifacts.md).

    Parameters
    ----------
    path : path
        A ``.so`` written by ``export_library``.
    fmt : str
        Ignored (TVM compatibility).

    Returns
    -------
    Module
        The root (module 0 of the blob): usually the ``GraphExecutorFactoryModule``, whose
        imports include the :class:`LibraryModule`.

    Raises
    ------
    ModuleLoadError
        Missing file, not ELF, another machine (naming both), truncated file, ``dlopen``
        failure, no ``__tvm_dev_mblob`` ("not a Kiln/TVM library"), corrupt blob, or a module
        type without a registered loader.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise ModuleLoadError(f"cannot load module: {path} does not exist or is not a file")
    elf = check_loadable(path)
    lib = LibraryModule(path)
    try:
        sym = ctypes.c_uint64.in_dll(lib.handle, BLOB_SYMBOL)
    except ValueError:
        raise ModuleLoadError(f"{path} has no {BLOB_SYMBOL}: not a Kiln/TVM library") from None
    addr = ctypes.addressof(sym)
    nbytes = int(sym.value)
    avail = _readable_after(addr, elf, os.path.getsize(path)) - 8
    if nbytes > avail:
        raise ModuleLoadError(f"{path}: corrupt {BLOB_SYMBOL}: it claims {nbytes} bytes but at "
                              f"most {max(avail, 0)} follow it in the file")
    payload = memoryview((ctypes.c_char * nbytes).from_address(addr + 8)).cast("B")
    return unpack_imports(payload, lib, what=f"{path}: {BLOB_SYMBOL}")
