"""``SourceDeviceModule`` (type_key ``kiln_jit``): kernels shipped as C source and compiled where
the model runs — the source-embedded device of the ``jit`` target (the ``my_device`` of TVM's
custom-device examples; TVM's ``CSourceModule`` kept as source, src/target/source/source_module.cc).

The module is binary-serializable, so ``export_library`` packs it into the blob *as source*
(whatever the ``fcompile``), and ``load_module`` rebuilds it with
``runtime.module.loadbinary_kiln_jit``. Serialized form (docs/formats.md §10.1;
stream encoding of §1)::

    u64 version (1) | vec<string> sources | u64 n | n × (string name | vec<string> arg_dtypes |
                                                        u64 num_outputs)

The source is a few C translation units (kernels grouped by compile cost, as for the ``c``
target) so that the first call compiles them in parallel, one per CPU.

``get_function(name)`` returns a packed function; its first call (of any function of the module)
compiles the sources with the device compiler and flags (:mod:`kiln.runtime.jit.device_toolchain`:
``$KILN_DEVICE_CC``, default the host C compiler; ``-O3 -fPIC``, RVV flags for riscv64,
``-fopenmp-simd`` when accepted, ``$KILN_DEVICE_CFLAGS``), linked ``-shared -pthread`` with the
backend support code (its thread pool runs the kernels' parallel loops), and cached by a hash of
the sources, the compiler's identity and the flags in ``$KILN_CACHE_DIR/device`` (default
``~/.cache/kiln/device``, private, ``0700``), written to a temp name and renamed
(``source_module.build_cached_library``), so processes share it and two compiling at once are
safe; the folder counts toward ``KILN_CACHE_MAX_SIZE`` (:mod:`kiln.runtime.toolchain.cache_limit`).

When the compiler builds for this host's machine the library is ``dlopen``\\ ed and called
through ctypes. When it builds for another ISA (or ``$KILN_DEVICE_LAUNCHER`` is set) the
kernels run in the device server (:mod:`kiln.runtime.jit.device_server`) under ``qemu-<arch>`` or
the launcher; calls cross a pipe, transparently for the graph executor.
"""

from __future__ import annotations

import os
import threading
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from kiln.errors import KilnError, ModuleLoadError
from kiln.runtime import c_types as C
from kiln.runtime.binary_module import register_module_loader
from kiln.runtime.jit.device_toolchain import (
    build_server,
    device_cache_dir,
    device_compiler,
    device_flags,
    is_foreign,
    server_command,
)
from kiln.runtime.library_module import LibraryModule
from kiln.runtime.module import Module
from kiln.runtime.ndarray import NDArray
from kiln.runtime.packed_func import PackedFunc
from kiln.runtime.source_module import build_cached_library
from kiln.runtime.stream import StreamReader, StreamWriter
from kiln.runtime.toolchain import compiler as toolchain

TYPE_KEY = "kiln_jit"
FORMAT_VERSION = 1


@dataclass(frozen=True)
class DeviceFunction:
    """One kernel of the source: its packed name, its arguments' dtypes (inputs then outputs)
    and how many of the last arguments are outputs."""

    name: str
    arg_dtypes: tuple[str, ...]
    num_outputs: int = 1

class _Local:
    """Kernels dlopen'ed into this process."""

    def __init__(self, path: str, names: Sequence[str]):
        self.library = LibraryModule(path, names)

    def __call__(self, func: DeviceFunction, args: tuple[Any, ...]) -> Any:
        packed = self.library._get_own_function(func.name)
        if packed is None:
            raise KilnError(f"{func.name}: not in the compiled device library {self.library.path}")
        return packed(*args)


class _Remote:
    """Kernels run by a device server."""

    def __init__(self, path: str, cc: Sequence[str], flags: Sequence[str]):
        from kiln.runtime.jit.device_server import DeviceServer

        command = server_command(build_server(cc, flags), cc)
        self.server = DeviceServer(command, Path(path).read_bytes(), f"{TYPE_KEY} module")
        self._finalizer = weakref.finalize(self, self.server.close)

    def __call__(self, func: DeviceFunction, args: tuple[Any, ...]) -> None:
        n = len(func.arg_dtypes)
        ints = args[n:]  # a symbolic kernel's shape values follow its tensors
        if len(args) < n or not all(isinstance(v, int) for v in ints):
            raise KilnError(f"{func.name}: expects {n} tensors (then integers), got "
                            f"{len(args)} arguments")
        arrays = [_as_array(a, func, i) for i, a in enumerate(args[:n])]
        first_out = n - func.num_outputs
        self.server.call(func.name, arrays, [i >= first_out for i in range(n)], ints)


def _as_array(value: Any, func: DeviceFunction, i: int) -> np.ndarray:
    arr = value._arr if isinstance(value, NDArray) else value
    if not isinstance(arr, np.ndarray):
        raise KilnError(f"{func.name}: argument {i} is a {type(value).__name__}; the device "
                        "takes tensors (NDArray or numpy arrays) only")
    if C.dtype_name(arr.dtype) != func.arg_dtypes[i] or not arr.flags.c_contiguous:
        raise KilnError(f"{func.name}: argument {i} must be a C-contiguous "
                        f"{func.arg_dtypes[i]} tensor, got {arr.dtype}"
                        + ("" if arr.flags.c_contiguous else " (not contiguous)"))
    return arr


class SourceDeviceModule(Module):
    """C source of packed kernels, compiled on first call where the model runs.

    Parameters
    ----------
    sources : str or sequence of str
        C translation units (``kiln.codegen.c.source.build_c_source``) that together define every
        function.
    functions : sequence of DeviceFunction
        The packed functions it defines, with their argument dtypes and output count.

    Raises
    ------
    KilnError
        Duplicate function names.
    """

    type_key = TYPE_KEY
    is_binary_serializable = True

    def __init__(self, sources: str | Sequence[str], functions: Sequence[DeviceFunction]):
        super().__init__()
        self.sources = [sources] if isinstance(sources, str) else [str(s) for s in sources]
        self.functions = {f.name: f for f in functions}
        if len(self.functions) != len(functions):
            raise KilnError(f"{TYPE_KEY} module: duplicate function names")
        self._lock = threading.Lock()
        self._impl: Callable[[DeviceFunction, tuple[Any, ...]], Any] | None = None
        self._packed: dict[str, PackedFunc] = {}
        #: the compiled library, once the first call built it
        self.library_path: str | None = None

    def get_source(self, fmt: str = "") -> str:
        """The translation units, one after another (each compiles on its own)."""
        return "\n".join(self.sources)

    def list_function_names(self) -> list[str]:
        return list(self.functions)

    def _get_own_function(self, name: str) -> PackedFunc | None:
        func = self.functions.get(name)
        if func is None:
            return None
        packed = self._packed.get(name)
        if packed is None:
            def call(*args: Any) -> Any:
                impl = self._impl or self._start()
                return impl(func, args)

            packed = self._packed[name] = PackedFunc(call, name)
        return packed

    @property
    def compiled(self) -> bool:
        """Whether the library is built and open (the first call, or :meth:`prepare`, did)."""
        return self._impl is not None

    def prepare(self) -> None:
        """Compile (or find in the cache) and open the library now rather than on the first
        call, e.g. so that a timed first run measures the kernels and not the compiler.

        Raises
        ------
        ToolchainError, KilnError
            As the first call would (:meth:`_start`).
        """
        self._start()

    def _start(self) -> Callable[[DeviceFunction, tuple[Any, ...]], Any]:
        """Compile (or find in the cache) the library and open it here or in a server.

        Raises
        ------
        ToolchainError
            The device compiler is missing or fails, or qemu is missing for a foreign ISA.
        KilnError
            The device server cannot be started or cannot load the library.
        """
        with self._lock:
            if self._impl is not None:
                return self._impl
            cc = device_compiler()
            flags, link_flags = device_flags(cc)
            path = self._compile(cc, flags, link_flags)
            remote = is_foreign(cc) or bool(os.environ.get("KILN_DEVICE_LAUNCHER", "").strip())
            self._impl = _Remote(path, cc, flags) if remote else _Local(path, list(self.functions))
            self.library_path = path
            return self._impl

    def _compile(self, cc: list[str], flags: list[str], link_flags: list[str]) -> str:
        def objects(work: Path) -> list[str]:
            srcs = [work / f"device{i}.c" for i in range(len(self.sources))]
            for src, code in zip(srcs, self.sources, strict=True):
                src.write_text(code)
            return toolchain.compile_objects(srcs, cc, flags=flags)

        parts = [s.encode() for s in self.sources]
        return build_cached_library("device", parts, objects, cc=cc,
                                    flags=flags, link_flags=link_flags,
                                    folder=device_cache_dir(),
                                    support=toolchain.DEVICE_SUPPORT_SOURCES)

    # -- serialization
    def save_to_binary(self) -> bytes:
        w = StreamWriter()
        w.u64(FORMAT_VERSION)
        w.vec_str(self.sources)
        w.u64(len(self.functions))
        for f in self.functions.values():
            w.string(f.name)
            w.vec_str(list(f.arg_dtypes))
            w.u64(f.num_outputs)
        return w.getvalue()

    @staticmethod
    def load_from_binary(data: bytes) -> SourceDeviceModule:
        """Inverse of :meth:`save_to_binary` (``runtime.module.loadbinary_kiln_jit``).

        Raises
        ------
        ModuleLoadError
            Truncated or corrupt bytes, an unknown format version, unknown dtypes.
        """
        r = StreamReader(data, f"{TYPE_KEY} module")
        version = r.u64("version")
        if version != FORMAT_VERSION:
            raise r.error(f"format version {version}; this Kiln reads {FORMAT_VERSION}")
        sources = r.vec_str("sources")
        funcs = []
        for _ in range(r.count(24, "functions")):
            name = r.string("name")
            dtypes = tuple(r.vec_str("arg_dtypes"))
            num_outputs = r.u64("num_outputs")
            if num_outputs > len(dtypes):
                raise r.error(f"{name}: {num_outputs} outputs of {len(dtypes)} arguments")
            try:
                dtypes = tuple(C.dtype_name(d) for d in dtypes)
            except KilnError as err:
                raise r.error(f"{name}: {err}") from None
            funcs.append(DeviceFunction(name, dtypes, num_outputs))
        if r.remaining:
            raise r.error(f"{r.remaining} unexpected trailing bytes")
        try:
            return SourceDeviceModule(sources, funcs)
        except KilnError as err:
            raise ModuleLoadError(str(err)) from None

    def __repr__(self) -> str:
        return (f"<kiln.runtime.SourceDeviceModule functions={len(self.functions)} "
                f"imports={len(self._imports)}>")


register_module_loader(TYPE_KEY, SourceDeviceModule.load_from_binary, override=True)

__all__ = ["DeviceFunction", "SourceDeviceModule"]
