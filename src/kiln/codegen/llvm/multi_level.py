"""Multi-level libraries: every kernel compiled once per x86-64 microarchitecture level, the
level chosen on the CPU when the library is loaded (``llvm -mcpu=portable`` or
``-mcpu=x86-64-v2,x86-64-v3,x86-64-v4``; docs/decisions/023-default-target-and-multi-level.md).

How it works:

- The graph (layouts, NCHWc channel blocks, packed weights) is built once, for the widest
  level (:meth:`kiln.target.Target.vector_bits` of a multi-level target), so all levels share
  the params and the graph JSON. ``kiln.build`` then lowers (schedules) the kernels once per
  level, under ``with target.level(name):`` (register blocks for that level's vectors:
  :func:`kiln.schedules.nn_cpu.wide_block_scale`).
- Each level compiles its kernels, renamed ``<name>__<level>`` (``fused_conv2d__x86_64_v3``),
  with :func:`kiln.codegen.llvm.build.build_llvm` for ``llvm -mcpu=<level>`` (that level's vector
  width
  in the codegen, its ISA in LLVM's instruction selection; the compile cache keys each level).
- A small C dispatcher defines every public kernel name as a GNU indirect function (GCC manual,
  "Common Function Attributes": ``ifunc``; the resolver runs when the dynamic linker binds the
  symbol, so ``dlsym`` by name keeps working for the Python loader and C loaders, and a call costs
  what any call into a shared library costs). Its resolver picks the highest level the CPU has
  (``__builtin_cpu_supports`` over the features of each level in the x86-64 psABI,
  "Micro-Architecture Levels"; libgcc checks that the OS saves the AVX / AVX-512 state), as
  onnxruntime's MLAS picks its kernels from ``cpuid`` once at start-up (MLAS_PLATFORM,
  onnxruntime/core/mlas/lib/platform.cpp).
- ``KILN_CPU_LEVEL=x86-64-v2`` (any of :data:`kiln.target.X86_LEVELS`) lowers the level for
  tests and comparisons; it never raises it above the CPU's. A resolver may run before the C
  library is relocated (a program that links the library, or a static archive of it, at
  start-up), so the dispatcher calls nothing in it: the variable is read from
  ``/proc/self/environ`` with raw system calls — the environment the process started with
  (``setenv`` after start does not count; without /proc there is no override).
- On a CPU below the library's lowest level, every kernel is a stub that fails with a message
  naming the levels (never an illegal instruction). ``__kiln_cpu_level()`` (a plain C function,
  weak: several models may be linked into one program) returns the level chosen.
- The level objects and the dispatcher are merged into one relocatable object (``cc -r``):
  the result is one :class:`~kiln.runtime.object_module.ObjectModule` like any ``llvm`` build,
  exported and run (also before export) the same way. The variants have hidden visibility:
  only the public names are exported, and the resolvers take their addresses without dynamic
  relocations.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path

from kiln.codegen.llvm.build import build_llvm
from kiln.codegen.llvm.module import LLVMModule
from kiln.errors import CompileError
from kiln.runtime.toolchain.compiler import compile_objects, link_relocatable
from kiln.target import X86_LEVELS, Target
from kiln.tir import loop as L

#: the symbol that tells which level the dispatcher chose (``const char* __kiln_cpu_level()``)
LEVEL_SYMBOL = "__kiln_cpu_level"
#: the symbol that lists the library's levels (``const char* __kiln_cpu_levels()``: "x86-64-v2,
#: x86-64-v3,x86-64-v4"; ``kiln inspect`` prints both)
LEVELS_SYMBOL = "__kiln_cpu_levels"
#: the environment variable that lowers the level (tests, comparisons)
LEVEL_ENV = "KILN_CPU_LEVEL"

#: ``__builtin_cpu_supports`` names of each level's features beyond the previous level (x86-64
#: psABI; the names GCC and clang both know; CMPXCHG16B and LAHF of v2, F16C, LZCNT and MOVBE of
#: v3 are not emitted by float kernels and have no portable name there)
LEVEL_FEATURES = {
    "x86-64": (),
    "x86-64-v2": ("popcnt", "sse3", "ssse3", "sse4.1", "sse4.2"),
    "x86-64-v3": ("avx", "avx2", "bmi", "bmi2", "fma"),
    "x86-64-v4": ("avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"),
}


def variant_name(name: str, level: str) -> str:
    """The symbol of ``name`` compiled for ``level``: ``f__x86_64_v3``."""
    return f"{name}__{level.replace('-', '_')}"


class MultiLevelModule(LLVMModule):
    """An ``llvm`` module whose kernels dispatch on the CPU at load time.

    Parameters
    ----------
    obj : bytes
        The merged object (every level's kernels and the dispatcher).
    func_names : list of str
        The public kernel names (the ifuncs).
    target : Target
        The multi-level target.
    variants : dict of str to LLVMModule
        Each level's modules (for ``get_source``: IR and assembly of every level).
    """

    def __init__(self, obj: bytes, func_names: Sequence[str], target: Target,
                 variants: dict[str, list[LLVMModule]]):
        self.variants = variants
        super().__init__(obj, func_names, target, self._joined(""))

    def _joined(self, fmt: str) -> str:
        parts = []
        for level, mods in self.variants.items():
            for m in mods:
                parts.append(f"; ---- level {level}\n{m.get_source(fmt)}")
        return "\n".join(parts)

    def get_source(self, fmt: str = "") -> str:
        """``""``/``"ll"``: every level's optimized IR; ``"asm"``: every level's assembly
        (each part headed ``; ---- level <name>``); ``"c"``: the dispatcher's C source."""
        if fmt in ("asm", "s", "S", "", "ll"):
            return self._joined(fmt)
        return super().get_source(fmt)


def dispatcher_source(names: Sequence[str], levels: Sequence[str]) -> str:
    """C source defining each of ``names`` as an ifunc over its ``levels`` variants."""
    ranks = {level: X86_LEVELS.index(level) for level in levels}
    checks = []
    for rank, level in enumerate(X86_LEVELS[1:], 1):
        cond = " && ".join(f'__builtin_cpu_supports("{f}")' for f in LEVEL_FEATURES[level])
        checks.append(f"  if (rank == {rank - 1} && {cond}) rank = {rank};")
    lines = [
        "/* Generated by Kiln (kiln.codegen.llvm.multi_level): CPU dispatch of a multi-level",
        "   library. Every kernel is a GNU ifunc choosing its variant for the CPU's x86-64",
        "   level (x86-64 psABI), lowered by $" + LEVEL_ENV + ". */",
        "#include <stdint.h>",
        "void TVMAPISetLastError(const char* msg);",
        "typedef int32_t (*kiln_packed)(void*, int32_t*, int32_t, void*, int32_t*, void*);",
        "/* The resolvers may run before the C library is relocated (a program linking the",
        "   library at start-up), so nothing here calls it or reads data that needs a",
        "   relocation: the override is read with raw system calls. */",
        f"static const char kiln_all_levels[4][10] = {{{', '.join(map(_q, X86_LEVELS))}}};",
        f"static const int kiln_have[] = {{{', '.join(str(ranks[v]) for v in levels)}}};",
        f"#define KILN_NUM_LEVELS {len(levels)}",
        "static int kiln_choice = -2; /* index into kiln_have; -1: the CPU has none */",
        "static int kiln_cpu_rank(void) {",
        "  int rank = 0;",
        "  __builtin_cpu_init();",
        *checks,
        "  return rank;",
        "}",
        "static long kiln_syscall(long n, long a, long b, long c) {",
        "  long ret;",
        '  __asm__ volatile("syscall" : "=a"(ret) : "a"(n), "D"(a), "S"(b), "d"(c)',
        '                   : "rcx", "r11", "memory");',
        "  return ret;",
        "}",
        f"/* The level named by {LEVEL_ENV} in /proc/self/environ (the environment the process",
        "   started with), 0..3, or 4 when it is not set or names no level. */",
        "static int kiln_env_rank(void) {",
        f'  static const char key[] = "{LEVEL_ENV}=";',
        "  char buf[512], val[16];",
        "  int pos = 0, match = 1, n = 0, found = 4;",
        '  long fd = kiln_syscall(2 /* open */, (long)"/proc/self/environ", 0, 0);',
        "  if (fd < 0) return 4;",
        "  long got;",
        "  while ((got = kiln_syscall(0 /* read */, fd, (long)buf, sizeof buf)) > 0) {",
        "    for (long i = 0; i < got; ++i) {",
        "      char ch = buf[i];",
        "      if (ch == 0) {",
        "        if (match && pos >= (int)sizeof key - 1)",
        "          for (int r = 0; r < 4; ++r) {",
        "            int k = 0;",
        "            while (k < n && kiln_all_levels[r][k] == val[k]) ++k;",
        "            if (k == n && kiln_all_levels[r][k] == 0) found = r;",
        "          }",
        "        pos = 0; match = 1; n = 0;",
        "        continue;",
        "      }",
        "      if (pos < (int)sizeof key - 1) match = match && ch == key[pos];",
        "      else if (match && n < (int)sizeof val) val[n++] = ch;",
        "      else match = 0;",
        "      ++pos;",
        "    }",
        "  }",
        "  kiln_syscall(3 /* close */, fd, 0, 0);",
        "  return found;",
        "}",
        "static int kiln_pick(void) {",
        "  if (kiln_choice != -2) return kiln_choice;",
        "  int rank = kiln_cpu_rank();",
        "  int want = kiln_env_rank();",
        "  if (want < rank) rank = want;",
        "  kiln_choice = -1;",
        "  for (int i = 0; i < KILN_NUM_LEVELS; ++i)",
        "    if (kiln_have[i] <= rank) kiln_choice = i;",
        "  return kiln_choice;",
        "}",
        "/* weak: several multi-level models may be linked into one C program */",
        f"__attribute__((weak)) const char* {LEVELS_SYMBOL}(void) {{",
        f'  return "{",".join(levels)}";',
        "}",
        f"__attribute__((weak)) const char* {LEVEL_SYMBOL}(void) {{",
        "  int i = kiln_pick();",
        '  return i < 0 ? "none" : kiln_all_levels[kiln_have[i]];',
        "}",
        "static int32_t kiln_unsupported(void* a, int32_t* t, int32_t n, void* r, int32_t* rt,",
        "                                void* h) {",
        "  (void)a; (void)t; (void)n; (void)r; (void)rt; (void)h;",
        f'  TVMAPISetLastError("this library has kernels for {", ".join(levels)} only; this "',
        '                     "CPU has a lower x86-64 level");',
        "  return -1;",
        "}",
    ]
    lines.append('#define KILN_VARIANT __attribute__((visibility("hidden")))')
    for name in names:
        variants = [variant_name(name, level) for level in levels]
        lines += [f"KILN_VARIANT int32_t {v}(void*, int32_t*, int32_t, void*, int32_t*, void*);"
                  for v in variants]
        lines += [
            f"static kiln_packed kiln_resolve_{name}(void) {{",
            "  switch (kiln_pick()) {",
            *[f"  case {i}: return {v};" for i, v in enumerate(variants)],
            "  default: return kiln_unsupported;",
            "  }",
            "}",
            (f"int32_t {name}(void*, int32_t*, int32_t, void*, int32_t*, void*) "
             f'__attribute__((ifunc("kiln_resolve_{name}")));'),
        ]
    return "\n".join(lines) + "\n"


def _q(text: str) -> str:
    return f'"{text}"'


def build_multi_level(funcs: dict[str, Sequence[L.PrimFunc]] | Sequence[L.PrimFunc],
                      target: Target) -> MultiLevelModule:
    """Compile packed PrimFuncs for every level of a multi-level ``llvm`` target.

    Parameters
    ----------
    funcs : dict of level to list of PrimFunc, or list of PrimFunc
        Kernels after MakePackedAPI (distinct names, the same in every level), scheduled for
        each level (``kiln.build`` lowers them under ``with target.level(name):``), or one
        list used for every level.
    target : Target
        An ``llvm`` target with :attr:`~kiln.target.Target.levels`.

    Returns
    -------
    MultiLevelModule
        One module: the public names dispatch to the level variants.

    Raises
    ------
    CompileError
        A target without levels, or a kernel the codegen cannot handle.
    ToolchainError
        The C compiler cannot build the dispatcher or merge the objects (it needs GNU ifunc
        support: x86-64 Linux with glibc, GCC or clang; musl has no ifuncs).
    """
    if not target.levels:
        raise CompileError(f"build_multi_level: target '{target}' has no levels")
    per_level = funcs if isinstance(funcs, dict) else {lv: funcs for lv in target.levels}
    if sorted(per_level) != sorted(target.levels):
        raise CompileError(f"build_multi_level: kernels for {sorted(per_level)}, target "
                           f"levels {list(target.levels)}")
    names = [f.name for f in per_level[target.levels[0]]]
    variants: dict[str, list[LLVMModule]] = {}
    for level in target.levels:
        if [f.name for f in per_level[level]] != names:
            raise CompileError(f"build_multi_level: the kernels of {level} are not those of "
                               f"{target.levels[0]}")
        renamed = [L.PrimFunc(variant_name(f.name, level), f.params, f.body, f.attrs)
                   for f in per_level[level]]
        root = build_llvm(renamed, target.level(level))
        variants[level] = [root, *root.imported_modules]
    with tempfile.TemporaryDirectory(prefix="kiln-multi-") as work:
        objs = []
        for level, mods in variants.items():
            for i, m in enumerate(mods):
                path = Path(work) / f"{level}_{i}.o"
                path.write_bytes(m.obj)
                objs.append(str(path))
        src = Path(work) / "dispatch.c"
        src.write_text(dispatcher_source(names, target.levels))
        objs += compile_objects([str(src)], options=["-march=x86-64"])
        merged = Path(work) / "merged.o"
        link_relocatable(objs, str(merged))
        obj = merged.read_bytes()
    return MultiLevelModule(obj, names, target, variants)
