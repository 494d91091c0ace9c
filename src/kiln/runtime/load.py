"""``load_module``: a library exported by Kiln (or TVM) → its module tree
(TVM's ``tvm.runtime.load_module`` and ``ProcessModuleBlob`` in src/runtime/library_module.cc).

What the file is, is read from its first bytes, not its suffix: a tar (plain or gzip) is
extracted into a private temporary folder (``tar.untar``: no absolute names, ``..``, links or
devices) and its sources and objects relinked with the system compiler (plus the ``-l``/``-L``
options of ``kiln_link_options.txt``, which an export writes for modules with ``link_options``,
e.g. a BYOC module that calls OpenBLAS); a relocatable ELF object (``export_library("m.o")``)
is linked alone (such link options are not recorded there); the shared library made so is loaded
like
any other and the folder removed (the mapping outlives the file).

Order of checks for a shared library, each failing with a :class:`ModuleLoadError` that names the
file: it exists; it is an ELF file for this host's machine whose segments lie inside the file
(``elf.py``); this CPU has the features its ``__kiln_target_info`` record lists (read from the
file, before ``dlopen`` runs any of its code: ``cpu_features.py``); ``dlopen`` accepts it; it
defines ``__tvm_dev_mblob``; the blob's ``u64 nbytes`` fits inside the file-backed segment that
holds it (so a corrupt length never reads unmapped memory); the blob unpacks (``blob.py``). The
library itself becomes the ``_lib`` module.
"""

from __future__ import annotations

import ctypes
import mmap
import os
import re
import shutil
import struct
import tempfile

from kiln.errors import ModuleLoadError
from kiln.runtime.blob import unpack_imports
from kiln.runtime.cpu_features import (
    MAX_TARGET_INFO,
    TARGET_INFO_SYMBOL,
    check_features,
    parse_target_info,
)
from kiln.runtime.elf import ELF_MAGIC, ElfInfo, check_loadable, read_elf_header, symbol_bytes
from kiln.runtime.export import LINK_OPTIONS_FILE
from kiln.runtime.library_module import FUNC_NAMES_SYMBOL, LibraryFileModule, LibraryModule
from kiln.runtime.module import Module
from kiln.runtime.toolchain import compiler as toolchain
from kiln.runtime.toolchain.cc import create_shared
from kiln.runtime.toolchain.tar import untar

BLOB_SYMBOL = "__tvm_dev_mblob"
ET_REL = 1  # ELF e_type of a relocatable object
MADV_DONTNEED = 4  # Linux <sys/mman.h>
MAX_FUNC_NAMES = 1 << 26  # bytes of __kiln_func_names read_library reads at most
#: files of an unpacked tar that are linked (sources are compiled first); others are data
LINK_SUFFIXES = (*toolchain.SOURCE_SUFFIXES, ".o")


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


def file_kind(path: str) -> str:
    """``"tar"``, ``"object"`` (relocatable ELF) or ``"shared"`` (anything else: checked as a
    shared library), from the file's first bytes."""
    with open(path, "rb") as f:
        head = f.read(512)
    if head[:2] == b"\x1f\x8b" or head[257:262] == b"ustar":
        return "tar"
    if head[:4] == ELF_MAGIC and len(head) >= 18:
        e_type = struct.unpack_from("<H" if head[5] == 1 else ">H", head, 16)[0]
        if e_type == ET_REL:
            return "object"
    return "shared"


def load_module(path: str | os.PathLike[str], fmt: str = "") -> Module:
    """Load an exported library and rebuild its module tree.

    .. warning::
       A ``.so`` is code: only load libraries you trust, as with TVM's ``load_module``,
       ``ctypes.CDLL`` or any native plugin. ``dlopen`` runs the library's constructors, and
       its kernels run with your process's rights when the graph runs. Loading itself runs no
       other code from the file: the ELF headers, the blob, the graph JSON and the params are
       only read, and every corruption of them raises :class:`ModuleLoadError` (fuzzed:
       ``tests/helpers/fuzz_runtime.py``). What is checked is integrity, not trust: the checks catch
       truncated or corrupted files, not a malicious one
       (docs/decisions/004-loading-untrusted-artifacts.md).

    Parameters
    ----------
    path : path
        What ``export_library`` wrote: a shared library, a relocatable object (relinked here),
        or a tar (extracted into a temporary folder and relinked here; needs a C compiler).
    fmt : str
        Ignored (TVM compatibility): the kind of file is read from its content.

    Returns
    -------
    Module
        The root (module 0 of the blob): usually the ``GraphExecutorFactoryModule``, whose
        imports include the :class:`LibraryModule`.

    Raises
    ------
    ModuleLoadError
        Missing file, not ELF, another machine (naming both), truncated file, ``dlopen``
        failure, no ``__tvm_dev_mblob`` ("not a Kiln/TVM library"), corrupt blob, a module
        type without a registered loader, or an unreadable or unsafe tar.
    ToolchainError
        (tar and object only) The compiler is missing or fails, or an object in the tar is
        built for another machine than the compiler's.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise ModuleLoadError(f"cannot load module: {path} does not exist or is not a file")
    kind = file_kind(path)
    if kind == "shared":
        return _load_shared(path)
    workdir = tempfile.mkdtemp(prefix="kiln-load-")
    try:
        if kind == "tar":
            src = os.path.join(workdir, "src")
            os.mkdir(src)
            names = [n for n in untar(path, src) if "/" not in n and n.endswith(LINK_SUFFIXES)]
            if not names:
                raise ModuleLoadError(f"{path}: the tar holds no {', '.join(LINK_SUFFIXES)} "
                                      "file to link")
            inputs = [os.path.join(src, n) for n in names]
            options = _tar_link_options(path, os.path.join(src, LINK_OPTIONS_FILE))
        else:
            inputs = [path]
            options = []
        so = os.path.join(workdir, os.path.basename(path) + ".so")
        create_shared(so, inputs, options)
        try:
            return _load_shared(so)
        except ModuleLoadError as err:
            raise ModuleLoadError(f"{path} (relinked into a library): {err}") from None
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


#: what a tar's link options may hold: libraries and library folders, nothing else
_LINK_OPTION = re.compile(r"-l[A-Za-z0-9_.+-]+|-L/[^\s]+")


def _tar_link_options(path: str, options_file: str) -> list[str]:
    """The ``-l``/``-L`` options a tar export recorded for its modules (external libraries such
    as OpenBLAS); anything else in the file is refused."""
    if not os.path.isfile(options_file):
        return []
    with open(options_file, encoding="utf-8", errors="replace") as f:
        options = [ln.strip() for ln in f if ln.strip()]
    bad = [o for o in options if not _LINK_OPTION.fullmatch(o)]
    if bad or len(options) > 64:
        raise ModuleLoadError(f"{path}: {LINK_OPTIONS_FILE} may only list -l<library> and "
                              f"-L<absolute folder> options (found {bad[:3] or len(options)})")
    return options


def read_target_info(path: str) -> dict | None:
    """The ``__kiln_target_info`` record of the file at ``path``, read from the file itself
    (no ``dlopen``; any machine's ELF), or None for a library written before the record
    existed or not by Kiln.

    Raises
    ------
    ModuleLoadError
        A record that is not the JSON object of docs/formats.md §2.1.
    """
    raw = symbol_bytes(path, TARGET_INFO_SYMBOL, MAX_TARGET_INFO)
    return None if raw is None else parse_target_info(raw, path)


def read_library(path: str | os.PathLike[str]) -> tuple[Module, dict | None]:
    """The module tree and the target record of an exported shared library or object, read from
    the file alone: nothing is ``dlopen``'ed or run, so a library for another CPU or another
    machine (a cross-compiled ``aarch64`` one) can be read too (``kiln inspect``). The ``_lib``
    module is a :class:`~kiln.runtime.library_module.LibraryFileModule`: it lists the kernels
    but runs none.

    Returns
    -------
    (Module, dict or None)
        The root (module 0 of the blob) and the ``__kiln_target_info`` record (None: a library
        written before the record existed).

    Raises
    ------
    ModuleLoadError
        Missing file, not ELF, no ``__tvm_dev_mblob``, a blob longer than its symbol, or a
        corrupt blob or record.
    """
    path = os.path.abspath(os.fspath(path))
    if not os.path.isfile(path):
        raise ModuleLoadError(f"cannot read module: {path} does not exist or is not a file")
    read_elf_header(path)
    info = read_target_info(path)
    data = symbol_bytes(path, BLOB_SYMBOL, os.path.getsize(path))
    if data is None or len(data) < 8:
        raise ModuleLoadError(f"{path} has no {BLOB_SYMBOL}: not a Kiln/TVM library")
    nbytes = struct.unpack_from("<Q", data)[0]
    if nbytes > len(data) - 8:
        raise ModuleLoadError(f"{path}: corrupt {BLOB_SYMBOL}: it claims {nbytes} bytes but "
                              f"its symbol holds {len(data) - 8}")
    raw = symbol_bytes(path, FUNC_NAMES_SYMBOL, MAX_FUNC_NAMES) or b"\0"
    names = [n.decode(errors="replace") for n in raw.split(b"\0\0", 1)[0].split(b"\0") if n]
    lib = LibraryFileModule(path, names)
    root = unpack_imports(memoryview(data)[8:8 + nbytes], lib, what=f"{path}: {BLOB_SYMBOL}")
    return root, info


def _load_shared(path: str) -> Module:
    elf = check_loadable(path)
    info = read_target_info(path)
    if info is not None:  # before dlopen: no constructor of the library has run yet
        check_features(info, path)
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
    root = unpack_imports(payload, lib, what=f"{path}: {BLOB_SYMBOL}")
    del payload
    _release_pages(addr, nbytes + 8)
    return root


def _release_pages(addr: int, nbytes: int) -> None:
    """Drop the blob's pages from this process's resident memory once it is unpacked.

    The modules hold their own copies (params as aligned NDArrays), so without this the params
    would be resident twice: once in the mapped library, once in the factory. The blob lies in
    a read-only, file-backed mapping that is never written, so ``MADV_DONTNEED`` only forgets
    the pages; a later read would fetch the same bytes from the file again. Only pages wholly
    inside the blob are released, never a neighbour's (possibly relocated) data. Best effort:
    where ``madvise`` is missing nothing changes but the memory use.
    """
    page = mmap.PAGESIZE
    start = -(-addr // page) * page
    end = (addr + nbytes) // page * page
    if end - start < page:
        return
    try:
        madvise = ctypes.CDLL(None, use_errno=True).madvise
    except (OSError, AttributeError):
        return
    madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    madvise(start, end - start, MADV_DONTNEED)
