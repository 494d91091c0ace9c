"""The compile cache's *direct mode* for C objects: reuse an object's key without running the
preprocessor when neither the source nor anything the preprocessor looked at has changed.

An object's key (:func:`kiln.runtime.toolchain.compiler.object_cache_key`) is a hash of the
compiler's
identity, the command line and the *preprocessed* source, and running the preprocessor costs
0.1–0.2 s of CPU per source. As in ccache's direct mode (https://ccache.dev/manual/latest.html,
"The direct mode"), the first preprocessing of a source also writes its dependency list
(``-MD -MF``) and the include search list (``-v``), and a *manifest* is stored in the compile
cache (entry kind ``"manifest"``) under a key made of the compiler identity, the command line,
the source's content hash, the current folder and the environment variables that steer
preprocessing (:data:`KEY_ENV`). The manifest records the object key and what the result
depended on:

- every file read (absolute path as the compiler printed it, SHA-256 of its content);
- every path where the compiler looked for a header without finding one, or might look after a
  change elsewhere: for each header name the files spell (``#include``, ``#include_next``,
  ``__has_include``...), that name in every folder of the search list and in the folder of the
  file naming it (a header *created* there later would shadow the one recorded: ccache's
  best-known pitfall) — and whether a file is there;
- the search list's folders, and the ones the compiler skipped because they did not exist.

A later compile with the same key uses the recorded object key when every file still hashes
the same and every probed path is in the same state; otherwise (or when anything is unreadable
or the manifest is corrupt) the caller preprocesses and records the manifest again. Sources
using ``__DATE__``, ``__TIME__`` or ``__TIMESTAMP__`` get no manifest; sources whose headers
use ``__FILE__`` get one pinned to their path. Without those, a manifest is independent of the
source's folder (Kiln copies sources into a fresh temporary folder per export), provided no
header was found in that folder. docs/decisions/029-compile-cache-direct-mode.md lists the
pitfalls and how each is handled.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shlex
import stat
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from kiln.runtime.toolchain import compile_cache

log = logging.getLogger("kiln")

#: compile-cache entry kind of a manifest
KIND = "manifest"
#: the layout of a manifest's JSON (a new layout gets a new number: old manifests then miss)
VERSION = 1
#: environment variables that change what the preprocessor reads or how (gcc manual,
#: "Environment Variables Affecting GCC"; clang reads the same include paths and
#: CCC_OVERRIDE_OPTIONS): their values are part of the manifest key
KEY_ENV = ("CPATH", "C_INCLUDE_PATH", "CPLUS_INCLUDE_PATH", "OBJC_INCLUDE_PATH",
           "OBJCPLUS_INCLUDE_PATH", "SOURCE_DATE_EPOCH", "GCC_EXEC_PREFIX", "COMPILER_PATH",
           "LANG", "LC_ALL", "LC_CTYPE", "CCC_OVERRIDE_OPTIONS", "SDKROOT")
#: environment variables that make the compiler write its own dependency output: no direct mode
UNSAFE_ENV = ("DEPENDENCIES_OUTPUT", "SUNPRO_DEPENDENCIES")
#: a header changed this recently (nanoseconds) before the preprocessor started may have
#: changed while it ran: no manifest is recorded (file times come from a coarse clock that
#: lags by up to a tick, 10 ms at HZ=100)
RECENT_NS = 50_000_000

#: options whose effect the manifest cannot see: files read that the dependency list omits or
#: that are looked up outside the search list (``-include``: the current folder first), option
#: files (``@file``), other dependency outputs, the obsolete ``-I-``
_UNSAFE_OPTION = re.compile(r"@|-include|--include|-imacros|--imacros|-M|-Wp,|-Xpreprocessor"
                            r"|-I-$|--?save-temps|-fdirectives-only|-traditional|--?specs")
#: a line splice in any mode: a backslash (or the ``??/`` trigraph of ISO modes), blanks (gcc
#: accepts them), then a line end
_SPLICE = re.compile(r"(?:\\|\?\?/)[ \t\f\v]*\n")
#: what follows a directive or ``__has_include`` before a splice (the spliced read has it whole)
_SPLICED_ON = re.compile(r"[ \t\f\v]*(?:\\|\?\?/)[ \t\f\v]*(?:\n|$)")
#: ``#``, then a comment (a space to the preprocessor) before what may be a directive name
_HASH_COMMENT = re.compile(r"#[ \t]*/[*/]")
#: a C comment, or a string or character literal (kept: a header name may look like a comment)
_COMMENT_OR_LITERAL = re.compile(r'//[^\n]*|/\*.*?\*/|"(?:\\.|[^"\\\n])*"|'
                                 r"'(?:\\.|[^'\\\n])*'", re.DOTALL)
#: where that simple lexer and gcc's part ways (found in review): a GNU raw string, a C23 digit
#: separator, the ``??/`` trigraph, a splice with blanks before the line end, a CR line end
_LEXER_HAZARD = re.compile(r"""(?<![A-Za-z0-9_])(?:u8|u|U|L)?R"|\d'\d|\?\?/|\\[ \t\f\v]+\r?\n"""
                           r"|\r(?!\n)")
# (each pattern starts with a literal, which Python's re searches for fast; the characters
# before a match are checked in code)
_DIRECTIVE = re.compile(r"#[ \t]*(?:include_next|include|import|embed)\b[ \t]*(.*)")
#: a directive spelled with the digraph ``%:`` or the trigraph ``??=`` for ``#``
_OTHER_HASH = re.compile(r"(?:%:|\?\?=)[ \t]*(?:include|import|embed)")
_HEADER_NAME = re.compile(r'"([^"\n]*)"|<([^>\n]*)>')
_HAS = re.compile(r"__has_(?:include_next|include|embed)(?:__)?\b")
_HAS_TEST = re.compile(r'\s*\(\s*(?:"([^"\n]*)"|<([^>\n]*)>)')
_HAS_DEFINED = re.compile(r"(?:\bdefined\s*\(?|#\s*(?:ifdef|ifndef|elifdef|elifndef))\s*$")
#: macros whose value depends on the time (no manifest) or on the source's path (pinned)
#: an object key (compile_cache.make_key)
_KEY = re.compile(r"[0-9a-f]{64}")
_TIME_MACROS = ("__DATE__", "__TIME__", "__TIMESTAMP__")
_PATH_MACROS = ("__FILE__", "__BASE_FILE__", "__FILE_NAME__")


@dataclass(frozen=True)
class Direct:
    """A source's direct-mode lookup: its manifest's cache key and what it was made of."""

    key: str
    #: the source's absolute path
    source: str
    #: SHA-256 (hex) of the source's content when the key was made
    source_digest: str


def begin(identity: str, command: Sequence[str], source: str) -> Direct | None:
    """The direct-mode lookup of compiling ``source`` (an absolute path) with ``command`` (the
    compiler and its flags, no file names) whose :func:`~kiln.runtime.toolchain.compiler.
    compiler_identity` is ``identity``; None when direct mode cannot be used: the cache is off,
    an option or environment variable it cannot account for is set, or the source is
    unreadable (the preprocessor then reports it)."""
    if not compile_cache.enabled():
        return None
    unsafe = [w for w in command[1:] if _UNSAFE_OPTION.match(w)]
    unsafe += [f"${v}" for v in UNSAFE_ENV if os.environ.get(v)]
    if unsafe:
        log.debug("compile cache: no direct mode for %s (%s)", source, ", ".join(unsafe))
        return None
    try:
        with open(source, "rb") as f:
            digest = hashlib.sha256(f.read()).hexdigest()
        cwd = os.getcwd()
    except OSError:
        return None
    # as bytes: a value need not be UTF-8 (os.environ holds such bytes as surrogates)
    env = [v.encode() + b"=" + os.environb.get(v.encode(), b"\0unset") for v in KEY_ENV]
    key = compile_cache.make_key("kiln-cc-manifest-v1", identity, shlex.join(command), digest,
                                 cwd, *env)
    return Direct(key, source, digest)


def lookup(direct: Direct) -> str | None:
    """The object key recorded for ``direct``, when every file it lists still has the same
    content and every probed path the same state; else None (logged at DEBUG)."""
    parts = compile_cache.load(direct.key, KIND, what=f"manifest of {direct.source}")
    if parts is None:
        return None
    try:
        manifest = json.loads(parts[0])
        why = _stale(manifest, direct.source)
    except (ValueError, KeyError, TypeError, IndexError, RecursionError) as err:
        why = f"unreadable manifest ({type(err).__name__})"
    if why:
        log.debug("compile cache manifest miss: %s (%s)", direct.source, why)
        return None
    log.debug("compile cache manifest hit: %s", direct.source)
    return manifest["object_key"]


def _stale(manifest: dict, source: str) -> str | None:
    """Why ``manifest`` does not hold for ``source`` now, or None when it does."""
    if manifest["version"] != VERSION:
        return "another manifest version"
    if not _KEY.fullmatch(str(manifest["object_key"])):
        return "no object key"
    pinned = manifest["source"]
    if pinned is not None and pinned != source:
        return f"recorded for {pinned}"
    for path, is_dir in manifest["dirs"]:
        if os.path.isdir(path) != is_dir:
            return f"search folder {path} {'gone' if is_dir else 'created'}"
    folder = os.path.dirname(source)
    probes = [(p, s) for p, s in manifest["probes"]]
    probes += [(os.path.join(folder, n), s) for n, s in manifest["source_probes"]]
    for path, is_file in probes:
        if os.path.isfile(path) != is_file:
            return f"{path} {'gone' if is_file else 'created'}"
    for path, digest in manifest["files"]:
        if file_digest(path) != digest:
            return f"{path} changed"
    return None


def record(direct: Direct, object_key: str, depfile: str, search_report: str,
           started_ns: int) -> None:
    """Store the manifest of ``direct`` after a preprocessor run that gave ``object_key``,
    wrote the dependency list ``depfile`` (text of ``-MD -MF``) and the search list
    ``search_report`` (stderr of ``-v``) and started at ``started_ns`` (``time.time_ns``).
    Nothing is stored (logged at DEBUG) when the result cannot be trusted to hold: the source
    or a header changed meanwhile, a header name is computed by a macro, the source uses the
    date or time, or a report does not parse."""
    try:
        manifest, why = _manifest(direct, object_key, depfile, search_report, started_ns)
    except OSError as err:
        manifest, why = None, f"{err.filename}: {err.strerror}"
    if manifest is None:
        log.debug("compile cache: no manifest for %s (%s)", direct.source, why)
        return
    data = json.dumps(manifest, separators=(",", ":"), sort_keys=True).encode()
    compile_cache.store(direct.key, KIND, [data], what=f"manifest of {direct.source}")


@dataclass(frozen=True)
class SearchList:
    """The include search list a compiler reported (``-v``)."""

    #: the folders searched, ``#include "..."`` ones first
    dirs: tuple[str, ...]
    #: the folders it skipped because they do not exist
    missing: tuple[str, ...]


def parse_search_list(report: str) -> SearchList | None:
    """The search list in the ``-v`` report of gcc or clang (English messages), or None when
    the report has none or has entries this parser does not know (macOS frameworks)."""
    lines = report.splitlines()
    try:
        start = lines.index('#include "..." search starts here:')
        end = lines.index("End of search list.", start)
    except ValueError:
        return None
    dirs = []
    for line in lines[start + 1:end]:
        if line == "#include <...> search starts here:":
            continue
        if not line.startswith(" ") or line.endswith(")"):  # "(framework directory)"
            return None
        dirs.append(line[1:])
    missing = [m.group(1) for m in re.finditer(r'^ignoring nonexistent directory "(.*)"$',
                                                report, re.MULTILINE)]
    return SearchList(tuple(dirs), tuple(missing))


def parse_depfile(text: str) -> list[str] | None:
    """The files of a ``-MT kiln -MD`` dependency list (Make syntax), or None for one this
    parser does not read unambiguously (names with ``$`` or backslashes but escaped spaces)."""
    text = text.replace("\\\n", " ")
    if not text.startswith("kiln:") or "$" in text:
        return None
    words = re.findall(r"(?:\\ |\\#|[^\s])+", text[len("kiln:"):])
    paths = [w.replace("\\ ", " ").replace("\\#", "#") for w in words]
    return None if any("\\" in p for p in paths) else paths


@dataclass(frozen=True)
class FileScan:
    """What one file's text says about the preprocessor's lookups."""

    #: header names in its ``#include`` (``_next``, ``#import``, ``#embed``) directives and
    #: ``__has_include`` tests
    names: frozenset[str]
    #: why no manifest can hold for a source reading it (a computed header name, a time
    #: macro), or ""
    unsafe: str
    #: it uses ``__FILE__``, ``__BASE_FILE__`` or ``__FILE_NAME__``: the preprocessed text
    #: may hold the source's path
    uses_path: bool


_scans: dict[str, FileScan] = {}


def scan(data: bytes) -> FileScan:
    """:class:`FileScan` of a file's content (memoized by content hash for the process)."""
    digest = hashlib.sha256(data).hexdigest()
    found = _scans.get(digest)
    if found is None:
        found = _scans[digest] = _scan_text(data.decode("latin-1"))
    return found


def _scan_text(text: str) -> FileScan:
    # The header names to probe are read over-wide, never narrower than gcc: probing a name gcc
    # does not read costs a stat, missing one it reads can give a stale hit (review found a
    # lexer unlike gcc's hiding names). So they come from the text as written and with lines
    # spliced, comments and literals included, and from the lexed text below.
    lines = text.replace("\r\n", "\n").replace("\r", "\n")
    wide = [_scan_lines(lines, anywhere=True),
            _scan_lines(_SPLICE.sub("", lines), anywhere=True)]
    names = wide[0].names | wide[1].names
    if _LEXER_HAZARD.search(text):
        # what cannot be followed (a computed name, the time) is judged over-wide too: a
        # comment mentioning one costs this file its manifest, never a wrong hit
        return FileScan(names, next((p.unsafe for p in wide if p.unsafe), "")
                        or ("a comment between # and a directive name"
                            if _HASH_COMMENT.search(lines) else ""),
                        any(p.uses_path for p in wide))
    # Otherwise comments and literals are lexed as gcc does (translation phases 2–3: join
    # continued lines, a comment becomes one space), so prose in a system header's comment
    # ("#include_next outside the ...") does not cost it its manifest.
    lexed = text.replace("\\\n", "")
    lexed = _COMMENT_OR_LITERAL.sub(lambda m: " " if m.group(0)[0] == "/" else m.group(0), lexed)
    exact = _scan_lines(lexed, anywhere=False)
    return FileScan(names | exact.names, exact.unsafe, exact.uses_path)


def _scan_lines(text: str, anywhere: bool) -> FileScan:
    """Header names, why no manifest can follow, and the path macros, of ``text``;
    ``anywhere``: directives are taken wherever ``#`` stands, not only first on a line."""
    names, unsafe = set(), ""
    for m in _DIRECTIVE.finditer(text):
        if not anywhere and text[text.rfind("\n", 0, m.start()) + 1:m.start()].strip(" \t\f\v"):
            continue  # not at the start of a line: no directive
        name = _HEADER_NAME.match(m.group(1))
        if name is None and not _SPLICED_ON.match(m.group(1)):
            unsafe = f"computed header name: {m.group(0).strip()[:80]}"
        elif name is not None:
            names.add(name.group(1) if name.group(1) is not None else name.group(2))
    for m in _HAS.finditer(text):
        if m.start() and _is_word(text[m.start() - 1]):
            continue
        test = _HAS_TEST.match(text, m.end())
        if test is not None:
            names.add(test.group(1) if test.group(1) is not None else test.group(2))
        elif not _HAS_DEFINED.search(text, max(0, m.start() - 40), m.start()) \
                and not _SPLICED_ON.match(text, m.end()):
            unsafe = f"computed {m.group(0)} argument"
    if _OTHER_HASH.search(text):
        unsafe = "a directive spelled with %: or ??="
    if _uses(text, _TIME_MACROS):
        unsafe = "uses the date or time"
    return FileScan(frozenset(names), unsafe, _uses(text, _PATH_MACROS))


def _is_word(char: str) -> bool:
    return char.isalnum() or char == "_"


def _uses(text: str, macros: Iterable[str]) -> bool:
    """Whether ``text`` holds one of ``macros`` as a whole identifier."""
    for macro in macros:
        at = text.find(macro)
        while at >= 0:
            end = at + len(macro)
            if not (at and _is_word(text[at - 1])) and not (end < len(text)
                                                            and _is_word(text[end])):
                return True
            at = text.find(macro, at + 1)
    return False


#: content hashes of files, keyed by path, valid while the file's stat says the same
_digests: dict[str, tuple[tuple[int, ...], str]] = {}


def file_digest(path: str) -> str | None:
    """SHA-256 (hex) of the file at ``path``, or None when it cannot be read. Remembered for
    the process while its device, inode, size, modification and change times stay the same
    (and only once those times are :data:`RECENT_NS` old: a write within the same clock tick
    would not change them)."""
    try:
        st = os.stat(path)
        if not stat.S_ISREG(st.st_mode):  # a FIFO would block the read: not a header to trust
            return None
        stamp = _stamp(st)
        known = _digests.get(path)
        if known is not None and known[0] == stamp:
            return known[1]
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # replaced by a FIFO meanwhile
        with open(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
                return None
            digest = hashlib.sha256(f.read()).hexdigest()
    except OSError:
        return None
    if max(st.st_mtime_ns, st.st_ctime_ns) < time.time_ns() - RECENT_NS:
        _digests[path] = (stamp, digest)
    return digest


def _stamp(st: os.stat_result) -> tuple[int, ...]:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _manifest(direct: Direct, object_key: str, depfile: str, search_report: str,
              started_ns: int) -> tuple[dict | None, str]:
    """The manifest to store, or (None, why not)."""
    deps = parse_depfile(depfile)
    search = parse_search_list(search_report)
    if deps is None or search is None:
        return None, "unexpected dependency list" if deps is None else "no search list"
    if not deps or deps[0] != direct.source:
        return None, f"dependency list does not start with the source: {deps[:1]}"
    with open(direct.source, "rb") as f:
        source_data = f.read()
    if hashlib.sha256(source_data).hexdigest() != direct.source_digest:
        return None, "the source changed while it was preprocessed"
    recent = started_ns - RECENT_NS
    files: dict[str, str] = {}
    scans = {direct.source: scan(source_data)}
    for path in dict.fromkeys(deps[1:]):
        with open(path, "rb") as f:
            st = os.fstat(f.fileno())
            data = f.read()
        if max(st.st_mtime_ns, st.st_ctime_ns) >= recent:
            return None, f"{path} changed while the source was preprocessed"
        files[path] = hashlib.sha256(data).hexdigest()
        _digests[path] = (_stamp(st), files[path])  # older than RECENT_NS: see file_digest
        scans[path] = scan(data)
    unsafe = next((f"{p}: {s.unsafe}" for p, s in scans.items() if s.unsafe), "")
    if unsafe:
        return None, unsafe
    folder = os.path.dirname(direct.source)
    # Headers in the source's folder, or __FILE__ anywhere: the result depends on the folder
    # or the path, so the manifest only holds there (else it holds for a copy anywhere).
    pinned = any(p.startswith(folder + os.sep) for p in files) or any(
        s.uses_path for s in scans.values())
    probes, source_names, why = _probes(direct.source, scans, files, search)
    if why:
        return None, why
    if pinned:
        probes |= _join_all([folder], *source_names)
        source_names = set()
    probe_states = {p: os.path.isfile(p) for p in probes - files.keys()}
    moved = _changed_since([p for p, found in probe_states.items() if found]
                           + sorted(_folders_of(probe_states, skip=folder)), recent)
    if moved:
        return None, f"{moved} changed while the source was preprocessed"
    return {
        "version": VERSION,
        "object_key": object_key,
        "source": direct.source if pinned else None,
        "files": sorted(files.items()),
        # the folders as the compiler saw them (one created or removed since is a miss)
        "dirs": sorted([(d, True) for d in search.dirs] + [(d, False) for d in search.missing]),
        "probes": sorted(probe_states.items()),
        "source_probes": sorted((n, os.path.isfile(os.path.join(folder, n)))
                                for n in source_names),
    }, ""


def _changed_since(paths: Iterable[str], since_ns: int) -> str | None:
    """The first of ``paths`` modified (or its status changed) at or after ``since_ns``."""
    for path in paths:
        try:
            st = os.stat(path)
        except OSError:
            continue
        if max(st.st_mtime_ns, st.st_ctime_ns) >= since_ns:
            return path
    return None


def _folders_of(paths: Iterable[str], skip: str) -> set[str]:
    """The nearest existing folder above each path (creating or removing an entry changes its
    modification time), except ``skip`` (the source's folder, where Kiln writes objects while
    it compiles)."""
    found: set[str] = set()
    for path in {os.path.dirname(p) for p in paths}:
        while path and not os.path.isdir(path) and os.path.dirname(path) != path:
            path = os.path.dirname(path)
        found.add(path or ".")
    return found - {skip}


def _probes(source: str, scans: dict[str, FileScan], files: dict[str, str],
            search: SearchList) -> tuple[set[str], set[str], str]:
    """The paths where the preprocessor looked, or would look, for the headers the files
    name: (absolute probes, names probed in the source's folder, why not when that cannot be
    told). A name is probed in every search folder and in the folder of each file naming it
    (``#include "..."`` searches there first); a dependency no name explains (the implicit
    ``stdc-predef.h``) adds its names relative to every folder it lies in, probed in every
    folder seen."""
    probes: set[str] = set()
    source_names: set[str] = set()
    folders = {os.path.dirname(p) for p in scans}
    explained: set[str] = set()
    for path, found in scans.items():
        for name in found.names:
            if os.path.isabs(name):
                probes.add(name)
                explained.add(name)
                continue
            here = _join_all(search.dirs, name)
            probes |= here
            explained |= here
            explained.add(os.path.join(os.path.dirname(path), name))
            if path == source:
                source_names.add(name)
            else:
                probes.add(os.path.join(os.path.dirname(path), name))
    everywhere = set(search.dirs) | folders
    # the source's own folder is probed through source_names (a copy elsewhere probes its own)
    elsewhere = set(search.dirs) | (folders - {os.path.dirname(source)})
    for path in files.keys() - explained:
        if os.path.normpath(path) != path:
            return set(), set(), f"{path} was found under a name that no file spells"
        names = {path[len(d) + 1:] for d in everywhere if path.startswith(d + os.sep)}
        if not names:
            return set(), set(), f"{path} is in no folder the preprocessor searched"
        for name in names:
            probes |= _join_all(elsewhere, name)
            source_names.add(name)
    return probes, source_names, ""


def _join_all(folders: Iterable[str], *names: str) -> set[str]:
    return {os.path.join(d, n) for d in folders for n in names}


__all__ = ["KEY_ENV", "KIND", "Direct", "FileScan", "SearchList", "begin", "file_digest",
           "lookup", "parse_depfile", "parse_search_list", "record", "scan"]
