"""The ``tar`` fcompile and a safe ``untar`` (TVM's python/tvm/contrib/tar.py).

``export_library("m.tar")`` does not link: :func:`tar` packs the files it would have linked
(``lib0.c``/``lib0.o``, ``devc.c``, the backend support source...) flat into a gzip tar, and
``load_module`` relinks them with the system compiler. A tar is untrusted input, so
:func:`untar` extracts regular files and folders only, refusing absolute names, ``..``, links
and devices, and writes each file itself (never ``TarFile.extractall``).
"""

from __future__ import annotations

import os
import shutil
import tarfile
import zlib
from collections.abc import Sequence

from kiln.errors import KilnError, ModuleLoadError

try:  # Python may be built without lzma; tarfile then cannot open .tar.xz at all
    from lzma import LZMAError
except ImportError:  # pragma: no cover
    LZMAError = tarfile.TarError  # type: ignore[assignment,misc]

#: gzip level: level 9 costs seconds on large params for a few percent
COMPRESS_LEVEL = 6


def tar(output: str, files: Sequence[str], options: Sequence[str] | None = None) -> None:
    """Write ``files`` into the gzip tar ``output``, each under its base name (``output_format``
    "tar"; ``options`` are ignored: nothing is compiled).

    Raises
    ------
    KilnError
        Two files share a base name, or a file cannot be read.
    """
    names: dict[str, str] = {}
    for f in map(os.fspath, files):
        name = os.path.basename(f)
        if name in names:
            raise KilnError(f"tar {output}: {f} and {names[name]} would both be stored as "
                            f"{name!r}")
        names[name] = f
    try:
        with tarfile.open(output, "w:gz", compresslevel=COMPRESS_LEVEL) as t:
            for name, f in names.items():
                t.add(f, arcname=name, recursive=False)
    except OSError as err:
        raise KilnError(f"tar {output}: {err}") from None


tar.output_format = "tar"  # type: ignore[attr-defined]


def _safe_name(path: str, member: tarfile.TarInfo) -> str:
    """The member's name as a relative path inside the extraction folder, or raise."""
    name = member.name
    if not (member.isreg() or member.isdir()):
        kind = ("a symbolic link" if member.issym() else "a hard link" if member.islnk() else
                "a device" if member.ischr() or member.isblk() else
                "a FIFO" if member.isfifo() else f"of tar type {member.type!r}")
        why = f"is {kind}"
    elif "\0" in name or "\\" in name:
        why = "has a NUL or backslash in its name"
    elif name.startswith("/") or (len(name) > 1 and name[1] == ":"):
        why = "has an absolute path"
    elif ".." in name.split("/"):
        why = "leaves the extraction folder ('..')"
    else:
        parts = [p for p in name.split("/") if p not in ("", ".")]
        if parts or member.isdir():
            return "/".join(parts)
        why = "has an empty name"
    raise ModuleLoadError(f"{path}: refusing tar member {name!r}: it {why}")


def untar(path: str, directory: str) -> list[str]:
    """Extract the tar (plain or compressed) ``path`` into the existing folder ``directory``.

    Parameters
    ----------
    path : str
        The archive; untrusted.
    directory : str
        Where to extract (normally a fresh ``tempfile.mkdtemp`` folder).

    Returns
    -------
    list of str
        The extracted regular files, as paths relative to ``directory``, in archive order.

    Raises
    ------
    ModuleLoadError
        Not a tar archive, a corrupt or truncated one, or a member that is not a regular file or
        folder or whose name is absolute or contains ``..`` (all members are checked before
        anything is written).
    """
    out: list[str] = []
    try:
        with tarfile.open(path, "r:*") as t:
            members = t.getmembers()
            names = [_safe_name(path, m) for m in members]
            for member, name in zip(members, names, strict=True):
                dest = os.path.join(directory, *name.split("/")) if name else directory
                if member.isdir():
                    os.makedirs(dest, exist_ok=True)
                    continue
                os.makedirs(os.path.dirname(dest), exist_ok=True)
                src = t.extractfile(member)
                assert src is not None, "a regular member has data"
                with src, open(dest, "wb") as f:
                    shutil.copyfileobj(src, f)
                out.append(name)
    except (tarfile.TarError, EOFError, zlib.error, LZMAError) as err:
        raise ModuleLoadError(f"{path} is not a readable tar archive: {err}") from None
    except OSError as err:  # gzip's "Not a gzipped file", or writing into ``directory``
        raise ModuleLoadError(f"cannot extract {path}: {err}") from None
    return out


__all__ = ["tar", "untar"]
