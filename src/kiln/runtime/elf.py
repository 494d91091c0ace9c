"""Just enough ELF parsing to refuse bad libraries before ``dlopen`` sees them, and foreign
objects before the linker sees them.

``dlopen`` of a file for another architecture gives an opaque message, and a truncated file can
map pages past its end (a SIGBUS on first touch, not an exception). Reading the header and the
program headers first turns both into a :class:`ModuleLoadError` naming what was found.
Likewise a linker handed an object for another machine says only "Relocations in generic ELF
(EM: 183)" (a frequent TVM cross-compilation complaint); :func:`check_objects_machine` compares
each object's ``e_machine`` with the linker's target triple first and raises a
:class:`ToolchainError` naming both. Layout: the System V ABI (``elf.h``).
"""

from __future__ import annotations

import os
import struct
import sys
from dataclasses import dataclass

from kiln.errors import ModuleLoadError, ToolchainError

ELF_MAGIC = b"\x7fELF"
PT_LOAD = 1

#: e_machine → name (elf.h); only for messages
MACHINE_NAMES = {
    3: "x86", 8: "mips", 20: "powerpc", 21: "ppc64", 22: "s390x", 40: "arm", 62: "x86-64",
    183: "aarch64", 243: "riscv", 258: "loongarch",
}


def machine_name(e_machine: int) -> str:
    return f"{MACHINE_NAMES.get(e_machine, 'unknown')} (EM {e_machine})"


@dataclass
class Segment:
    vaddr: int
    offset: int
    filesz: int
    memsz: int


@dataclass
class ElfInfo:
    elf_class: int  # 1: 32-bit, 2: 64-bit
    little_endian: bool
    machine: int
    loads: list[Segment]


def read_elf_header(path: str, check_bounds: bool = True) -> ElfInfo:
    """Parse ``path``'s ELF header and PT_LOAD program headers.

    Raises
    ------
    ModuleLoadError
        Not an ELF file, or (``check_bounds``) program header entries too small to hold a
        program header, or a header or loadable segment that lies past the end of the file (a
        truncated or corrupt file).
    """
    size = os.path.getsize(path)
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 20 or head[:4] != ELF_MAGIC:
            raise ModuleLoadError(f"{path} is not a shared library: no ELF header "
                                  f"(starts with {head[:4]!r})")
        elf_class, data = head[4], head[5]
        if elf_class not in (1, 2) or data not in (1, 2):
            raise ModuleLoadError(f"{path}: corrupt ELF header (class {elf_class}, "
                                  f"data {data})")
        end = "<" if data == 1 else ">"
        machine = struct.unpack_from(end + "H", head, 18)[0]
        info = ElfInfo(elf_class, data == 1, machine, [])
        if not check_bounds:
            return info
        if elf_class == 2:
            if len(head) < 64:
                raise ModuleLoadError(f"{path}: truncated ELF header ({size} bytes)")
            phoff, shoff = struct.unpack_from(end + "QQ", head, 32)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 54)
        else:
            if len(head) < 52:
                raise ModuleLoadError(f"{path}: truncated ELF header ({size} bytes)")
            phoff, shoff = struct.unpack_from(end + "II", head, 28)
            phentsize, phnum, shentsize, shnum = struct.unpack_from(end + "HHHH", head, 42)
        need = 56 if elf_class == 2 else 32  # sizeof(Elf64_Phdr) / sizeof(Elf32_Phdr)
        if phnum and phentsize < need:
            raise ModuleLoadError(f"{path}: corrupt ELF header: program header entries of "
                                  f"{phentsize} bytes (an Elf{32 * elf_class}_Phdr has {need})")
        if phoff + phentsize * phnum > size or (shnum and shoff + shentsize * shnum > size):
            raise ModuleLoadError(f"{path} is truncated or corrupt: its ELF headers point past "
                                  f"the end of the file ({size} bytes)")
        f.seek(phoff)
        table = f.read(phentsize * phnum)
    for i in range(phnum):
        ph = table[i * phentsize:(i + 1) * phentsize]
        if elf_class == 2:
            p_type, _flags, off, vaddr, _paddr, filesz, memsz = struct.unpack_from(
                end + "IIQQQQQ", ph)
        else:
            p_type, off, vaddr, _paddr, filesz, memsz = struct.unpack_from(end + "IIIIII", ph)
        if p_type != PT_LOAD:
            continue
        if off + filesz > size:
            raise ModuleLoadError(f"{path} is truncated or corrupt: a loadable segment ends at "
                                  f"byte {off + filesz} but the file has {size} bytes")
        info.loads.append(Segment(vaddr, off, filesz, memsz))
    return info


SHT_SYMTAB, SHT_DYNSYM, SHT_NOBITS = 2, 11, 8
_MAX_SYMBOLS = 1 << 22  # bound on a corrupt symbol table's scan


def _sections(f, size: int, head: bytes) -> list[tuple[int, int, int, int, int, int]]:
    """(sh_type, sh_addr, sh_offset, sh_size, sh_link, sh_entsize) of every section header."""
    end = "<" if head[5] == 1 else ">"
    if head[4] == 2:
        shoff, = struct.unpack_from(end + "Q", head, 40)
        shentsize, shnum = struct.unpack_from(end + "HH", head, 58)
        fmt, need = end + "IIQQQQIIQQ", 64
    else:
        shoff, = struct.unpack_from(end + "I", head, 32)
        shentsize, shnum = struct.unpack_from(end + "HH", head, 46)
        fmt, need = end + "IIIIIIIIII", 40
    if not shnum or shentsize < need or shoff + shentsize * shnum > size:
        return []
    f.seek(shoff)
    table = f.read(shentsize * shnum)
    out = []
    for i in range(shnum):
        _n, typ, _fl, addr, off, sz, link, _info, _al, ent = struct.unpack_from(
            fmt, table, i * shentsize)
        out.append((typ, addr, off, sz, link, ent))
    return out


def symbol_bytes(path: str, name: str, limit: int) -> bytes | None:
    """The file bytes of the data symbol ``name`` (its ``st_size``, at most ``limit``; a
    symbol without a size: up to ``limit`` bytes), found in ``.dynsym`` (shared libraries) or
    ``.symtab`` (objects) without loading the file; None when the file defines no such symbol
    or its tables are unreadable. Reads ELF files of any machine (``kiln inspect`` of a
    cross-compiled library)."""
    size = os.path.getsize(path)
    want = name.encode()
    with open(path, "rb") as f:
        head = f.read(64)
        if len(head) < 64 or head[:4] != ELF_MAGIC or head[4] not in (1, 2):
            return None
        end = "<" if head[5] == 1 else ">"
        sects = _sections(f, size, head)
        for kind in (SHT_DYNSYM, SHT_SYMTAB):
            for typ, _addr, off, sz, link, ent in sects:
                if typ != kind or link >= len(sects) or off + sz > size:
                    continue
                str_off, str_size = sects[link][2], sects[link][3]
                if str_off + str_size > size:
                    continue
                f.seek(str_off)
                strtab = f.read(str_size)
                f.seek(off)
                syms = f.read(sz)
                ent = ent or (24 if head[4] == 2 else 16)
                if ent < (24 if head[4] == 2 else 16):
                    continue
                for i in range(min(sz // ent, _MAX_SYMBOLS)):
                    if head[4] == 2:
                        st_name, _info, _other, shndx, value, st_size = struct.unpack_from(
                            end + "IBBHQQ", syms, i * ent)
                    else:
                        st_name, value, st_size, _info, _other, shndx = struct.unpack_from(
                            end + "IIIBBH", syms, i * ent)
                    if strtab[st_name:st_name + len(want) + 1] != want + b"\0":
                        continue
                    if not 0 < shndx < min(len(sects), 0xFF00):
                        return None
                    s_typ, s_addr, s_off, s_size = sects[shndx][:4]
                    start = value - s_addr  # an object's values are section offsets (addr 0)
                    if s_typ == SHT_NOBITS or not 0 <= start <= s_size:
                        return None
                    n = min(st_size or limit, limit, s_size - start, size - s_off - start)
                    f.seek(s_off + start)
                    return f.read(max(n, 0))
    return None


_HOST: ElfInfo | None = None


def host_elf() -> ElfInfo | None:
    """ELF class/machine of the running Python (read from ``sys.executable``), or None."""
    global _HOST
    if _HOST is None:
        try:
            _HOST = read_elf_header(os.path.realpath(sys.executable), check_bounds=False)
        except (OSError, ModuleLoadError):
            return None
    return _HOST


def check_loadable(path: str) -> ElfInfo:
    """Header checks before ``dlopen``: ELF, same machine and class as this process, intact.

    Raises
    ------
    ModuleLoadError
        Naming the library's machine and the host's, e.g.
        "built for aarch64 (EM 183) but this host is x86-64 (EM 62)".
    """
    info = read_elf_header(path)
    host = host_elf()
    if host is not None:
        if info.machine != host.machine:
            raise ModuleLoadError(
                f"{path} was built for {machine_name(info.machine)} but this host is "
                f"{machine_name(host.machine)}; cross-compiled libraries must be loaded on "
                "their target (or under qemu-user)")
        if (info.elf_class, info.little_endian) != (host.elf_class, host.little_endian):
            raise ModuleLoadError(
                f"{path} is a {32 * info.elf_class}-bit "
                f"{'little' if info.little_endian else 'big'}-endian ELF but this host is "
                f"{32 * host.elf_class}-bit {'little' if host.little_endian else 'big'}-endian")
    return info


#: first word of a target triple (``cc -dumpmachine``) → (e_machine, little-endian); the
#: longest matching prefix wins ("aarch64_be" before "aarch64", "mipsel" before "mips")
TRIPLE_ARCHES: dict[str, tuple[int, bool]] = {
    "x86_64": (62, True), "amd64": (62, True), "i386": (3, True), "i486": (3, True),
    "i586": (3, True), "i686": (3, True), "aarch64": (183, True), "arm64": (183, True),
    "aarch64_be": (183, False), "arm": (40, True), "armeb": (40, False), "thumb": (40, True),
    "riscv64": (243, True), "riscv32": (243, True), "powerpc64le": (21, True),
    "ppc64le": (21, True), "powerpc64": (21, False), "ppc64": (21, False),
    "powerpc": (20, False), "s390x": (22, False), "mips": (8, False), "mipsel": (8, True),
    "mips64": (8, False), "mips64el": (8, True), "loongarch64": (258, True),
}


def triple_machine(triple: str) -> tuple[int, bool] | None:
    """``(e_machine, little_endian)`` of a target triple such as ``aarch64-linux-gnu``; None for
    an architecture this table does not know (then no check is made)."""
    arch = triple.strip().split("-", 1)[0].lower()
    best = max((k for k in TRIPLE_ARCHES if arch.startswith(k)), key=len, default=None)
    return TRIPLE_ARCHES[best] if best is not None else None


def check_objects_machine(objects: list[str], triple: str, linker: str) -> None:
    """Refuse to link ELF objects built for another machine than ``triple``.

    Parameters
    ----------
    objects : list of str
        Files about to be linked; files that are not ELF (archives, linker scripts) and
        architectures :data:`TRIPLE_ARCHES` does not know are not checked.
    triple : str
        The linker's target (``<linker> -dumpmachine``).
    linker : str
        Names the linker in the message.

    Raises
    ------
    ToolchainError
        Naming the object, its machine and the linker's target, e.g. "lib0.o is built for
        aarch64 (EM 183) but the linker gcc targets x86_64-linux-gnu (x86-64 (EM 62))".
    """
    want = triple_machine(triple)
    if want is None:
        return
    machine, little = want
    for path in objects:
        try:
            info = read_elf_header(path, check_bounds=False)
        except (OSError, ModuleLoadError):
            continue  # not an ELF object: the linker judges it
        if info.machine != machine or info.little_endian != little:
            endian = "" if info.little_endian == little else (
                f", {'little' if info.little_endian else 'big'}-endian")
            raise ToolchainError(
                f"{path} is built for {machine_name(info.machine)}{endian} but the linker "
                f"{linker} targets {triple.strip()} ({machine_name(machine)}); compile it for "
                "that target, or link with a matching cross compiler "
                "(fcompile=cross_compiler(...))")
