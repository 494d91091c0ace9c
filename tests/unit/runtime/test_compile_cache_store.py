"""The compile cache's storage (no compiler needed): keys, entry format, corrupt entries, the
opt-out, the private folder, concurrent writers; how kernels are split into compilation units
(``kiln.codegen.partition``); and the direct mode's parsers and manifest checks
(``kiln.runtime.toolchain.cc_manifest``)."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import threading

import pytest

from kiln.codegen.partition import partition, stmt_cost
from kiln.runtime.toolchain import cc_manifest, compile_cache
from kiln.tir import loop as L


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.delenv("KILN_NO_CACHE", raising=False)
    return tmp_path / "cache" / "objects"


def test_store_then_load_round_trips_parts(cache):
    key = compile_cache.make_key("a", b"b")
    assert compile_cache.load(key, "o") is None
    compile_cache.store(key, "o", [b"\x7fELF object", b"", b"ir text"])
    assert compile_cache.load(key, "o") == [b"\x7fELF object", b"", b"ir text"]
    assert compile_cache.load(key, "llvm") is None  # the kind is part of the name
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700
    assert os.listdir(cache) == [f"{key}.o"]  # no temporary file left behind


def test_key_separates_parts():
    assert compile_cache.make_key("ab", "c") != compile_cache.make_key("a", "bc")
    assert compile_cache.make_key("x") == compile_cache.make_key(b"x")
    assert len(compile_cache.make_key("x")) == 64


@pytest.mark.parametrize("damage", ["truncate", "flip", "empty", "magic", "extra"])
def test_corrupt_entry_is_a_miss_and_is_replaced(cache, damage, caplog):
    key = compile_cache.make_key("corrupt", damage)
    compile_cache.store(key, "o", [b"object bytes" * 100])
    path = cache / f"{key}.o"
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        data = data[:-7]
    elif damage == "flip":
        data[-3] ^= 0x40
    elif damage == "empty":
        data = bytearray()
    elif damage == "magic":
        data[0:4] = b"JUNK"
    else:
        data += b"trailing"
    path.write_bytes(bytes(data))
    with caplog.at_level("DEBUG", logger="kiln"):
        assert compile_cache.load(key, "o") is None
    assert damage == "empty" or any("corrupt" in r.getMessage() for r in caplog.records)
    compile_cache.store(key, "o", [b"rebuilt"])
    assert compile_cache.load(key, "o") == [b"rebuilt"]


def test_no_cache_env_turns_it_off(cache, monkeypatch):
    key = compile_cache.make_key("off")
    compile_cache.store(key, "o", [b"x"])
    monkeypatch.setenv("KILN_NO_CACHE", "1")
    assert not compile_cache.enabled()
    assert compile_cache.load(key, "o") is None
    compile_cache.store(compile_cache.make_key("other"), "o", [b"y"])
    assert os.listdir(cache) == [f"{key}.o"]
    monkeypatch.setenv("KILN_NO_CACHE", "0")
    assert compile_cache.load(key, "o") == [b"x"]


def test_default_folder_is_under_the_user_cache(tmp_path, monkeypatch):
    monkeypatch.delenv("KILN_CACHE_DIR", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    assert compile_cache.objects_dir() == tmp_path / ".cache" / "kiln" / "objects"
    monkeypatch.setenv("KILN_CACHE_DIR", "")  # empty: the default too
    assert compile_cache.objects_dir() == tmp_path / ".cache" / "kiln" / "objects"


def test_a_shared_cache_folder_is_not_used(tmp_path, monkeypatch):
    shared = tmp_path / "shared"
    (shared / "objects").mkdir(parents=True)
    os.chmod(shared / "objects", 0o777)
    monkeypatch.setenv("KILN_CACHE_DIR", str(shared))
    assert compile_cache.objects_dir() != shared / "objects"


def test_concurrent_stores_of_one_key_leave_one_whole_entry(cache):
    key = compile_cache.make_key("race")
    payload = [os.urandom(1 << 20)]
    errors = []

    def writer():
        try:
            for _ in range(10):
                compile_cache.store(key, "o", payload)
                got = compile_cache.load(key, "o")
                assert got is None or got == payload  # never a partial entry
        except Exception as err:  # noqa: BLE001 - reported below
            errors.append(err)

    threads = [threading.Thread(target=writer) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert compile_cache.load(key, "o") == payload
    assert os.listdir(cache) == [f"{key}.o"]


# ------------------------------------------------------------------------------ partition
def _kernel(name: str, unroll: int) -> L.PrimFunc:
    x = L.Buffer("x", (unroll,), "float32")
    i = L.Var("i")
    body = L.For(i, L.IntImm(0), L.IntImm(unroll), "unrolled", L.BufferStore(x, x[i] + 1.0, [i]))
    return L.PrimFunc(name, [x], body)


def test_partition_balances_cost_and_keeps_order():
    funcs = [_kernel(f"k{i}", u) for i, u in enumerate([64, 1, 1, 1, 64, 1, 1, 32, 32, 1])]
    units = partition(funcs, 4)
    assert len(units) == 3
    assert sorted(f.name for u in units for f in u) == sorted(f.name for f in funcs)
    for u in units:  # original order inside each unit
        assert [f.name for f in u] == sorted((f.name for f in u), key=lambda n: int(n[1:]))
    costs = [sum(stmt_cost(f.body) for f in u) for u in units]
    assert max(costs) <= 70  # the two 64s apart, the 32s together: 65, 65+few, 66
    assert [[f.name for f in u] for u in partition(funcs, 4)] == [[f.name for f in u]
                                                                 for u in units]


def test_partition_small_and_empty():
    assert partition([], 8) == [[]]
    one = [_kernel("a", 2)]
    assert partition(one, 8) == [one]
    assert stmt_cost(_kernel("b", 8).body) == 1 + 8


# ------------------------------------------------------------------- direct mode (manifests)
def test_depfile_parses_escapes_and_continuations():
    text = "kiln: /s/a.c /usr/include/stdio.h \\\n /x/with\\ space.h /x/h\\#.h\n"
    assert cc_manifest.parse_depfile(text) == ["/s/a.c", "/usr/include/stdio.h",
                                               "/x/with space.h", "/x/h#.h"]
    assert cc_manifest.parse_depfile("a.o: /s/a.c\n") is None  # not the target asked for
    assert cc_manifest.parse_depfile("kiln: /s/a$$b.h\n") is None  # Make's $$: not read
    assert cc_manifest.parse_depfile("kiln: /s/a\\b.h\n") is None


def test_search_list_of_gcc_and_clang_reports():
    report = ("ignoring nonexistent directory \"/usr/local/include/x86_64-linux-gnu\"\n"
              "ignoring duplicate directory \"/usr/include\"\n"
              "#include \"...\" search starts here:\n /q\n"
              "#include <...> search starts here:\n /work/inc\n /usr/include\n"
              "End of search list.\n")
    found = cc_manifest.parse_search_list(report)
    assert found == cc_manifest.SearchList(("/q", "/work/inc", "/usr/include"),
                                           ("/usr/local/include/x86_64-linux-gnu",))
    assert cc_manifest.parse_search_list("gcc version 12\n") is None  # e.g. translated
    framework = report.replace(" /q\n", " /Library/Frameworks (framework directory)\n")
    assert cc_manifest.parse_search_list(framework) is None


def test_scan_finds_every_header_name_a_file_spells():
    text = ('#include <stdio.h>\n  #  include_next "next.h" // trailing comment\n'
            '/* a comment\n   over lines */ #include "after_comment.h"\n'
            '#include \\\n  "continued.h"\n'
            'const char* s = "#include <not_a_directive.h>";\n'
            '#if __has_include(<opt.h>) && defined(__has_include)\n#endif\n'
            '#ifdef __has_include_next\n#endif\n'
            '/* #include <commented_out.h> */\n')
    found = cc_manifest.scan(text.encode())
    # names in strings and comments are probed too: more probes never give a wrong hit
    assert found.names == {"stdio.h", "next.h", "after_comment.h", "continued.h", "opt.h",
                           "not_a_directive.h", "commented_out.h"}
    assert found.unsafe == "" and not found.uses_path


@pytest.mark.parametrize("text", [
    '#if __has_inc\\  \nlude("new.h")\n#endif\n',  # backslash, blanks, newline: gcc splices
    '#if __has_inc??/\nlude("new.h")\n#endif\n',  # the ??/ trigraph (ISO modes)
    'int a = 1\'0; const char *s = "\'/*";\n#if __has_include("new.h")\n#endif\n',  # C23
    'const char *r = R"x(" /* )x";\n#if __has_include("new.h")\n#endif\n',  # GNU raw string
    '// comment\r#if __has_include("new.h")\r#endif\r',  # CR line ends
], ids=["backslash-blank-newline", "trigraph-continuation", "digit-separator", "raw-string",
        "cr-only"])
def test_scan_finds_names_however_the_lines_are_lexed(text):
    """Found in review: a lexer differing from gcc's hid a ``__has_include`` name, and a header
    created under it later gave a stale hit. The scan reads every spelling, in and out of
    comments and strings, with lines spliced and not."""
    assert "new.h" in cc_manifest.scan(text.encode()).names


def test_scan_reads_a_comment_between_hash_and_directive_as_a_space():
    found = cc_manifest.scan(b'# /* c */ include "x.h"\n')
    assert "x.h" in found.names and found.unsafe == ""
    hazard = cc_manifest.scan(b'const char *r = R"x(a)x";\n# /* c */ include "y.h"\n')
    assert "comment between #" in hazard.unsafe


def test_prose_in_a_comment_does_not_cost_a_manifest_unless_the_lexer_is_unsure():
    """glibc's limits.h: "#include_next outside the double inclusion check because..."."""
    prose = b"/* We use #include_next outside the double inclusion check. */\n"
    assert cc_manifest.scan(prose).unsafe == ""
    assert "computed" in cc_manifest.scan(prose + b"int a = 1'0;\n").unsafe


@pytest.mark.parametrize("text, why", [
    ("#include HEADER\n", "computed header name"),
    ("#define H(x) __has_include(x)\n", "computed __has_include argument"),
    ("%:include <a.h>\n", "%:"),
    ("const char* d = __DATE__;\n", "date or time"),
    ("#define T __TIMESTAMP__\n", "date or time"),
])
def test_scan_refuses_what_a_manifest_cannot_follow(text, why):
    assert why in cc_manifest.scan(text.encode()).unsafe


def test_scan_notes_the_file_macros_and_ignores_lookalikes():
    assert cc_manifest.scan(b"#define W __FILE__\n").uses_path
    assert cc_manifest.scan(b"#define W __BASE_FILE__\n").uses_path
    assert not cc_manifest.scan(b"int my__FILE__x;\n").uses_path
    assert cc_manifest.scan(b"int my__DATE__x;\n").unsafe == ""


def test_begin_refuses_spec_files_and_reads_any_environment(monkeypatch):
    """``-specs`` can add ``-include`` (found in review); a non-UTF-8 ``CPATH`` is hashed as
    bytes, not a traceback."""
    import kiln.runtime.toolchain.cc_manifest as m

    assert m.begin("id", ["cc", "-specs=my.specs"], __file__) is None
    monkeypatch.setenv("CPATH", os.fsdecode(b"/tmp/\xff"))
    assert m.begin("id", ["cc", "-O2"], __file__) is not None


def test_file_digest_of_a_fifo_is_none_not_a_hang(tmp_path):
    fifo = tmp_path / "h.h"
    os.mkfifo(fifo)
    assert cc_manifest.file_digest(str(fifo)) is None


def test_file_digest_follows_content(tmp_path):
    path = tmp_path / "h.h"
    path.write_bytes(b"#define A 1\n")
    first = cc_manifest.file_digest(str(path))
    assert first == hashlib.sha256(b"#define A 1\n").hexdigest()
    path.write_bytes(b"#define A 2\n")  # same size, within the same clock tick
    assert cc_manifest.file_digest(str(path)) == hashlib.sha256(b"#define A 2\n").hexdigest()
    assert cc_manifest.file_digest(str(tmp_path / "missing.h")) is None


def test_manifest_lookup_misses_on_a_corrupt_or_foreign_manifest(cache, caplog):
    direct = cc_manifest.Direct(compile_cache.make_key("m"), "/s/a.c", "0" * 64)
    assert cc_manifest.lookup(direct) is None
    key = "ab" * 32
    for text in (b"[1, 2", b'{"version": 99}', b'{"version": 1, "source": null}',
                 b'{"version": 1, "source": null, "object_key": "../../x"}',
                 b'{"version": 1, "source": "/t/a.c", "object_key": "%s"}' % key.encode()):
        compile_cache.store(direct.key, "manifest", [text])
        with caplog.at_level("DEBUG", logger="kiln"):
            assert cc_manifest.lookup(direct) is None
    assert "manifest miss" in caplog.records[-1].getMessage()
    good = {"version": 1, "source": None, "object_key": key, "files": [], "dirs": [],
            "probes": [["/nonexistent/kiln-probe.h", False]], "source_probes": []}
    compile_cache.store(direct.key, "manifest", [json.dumps(good).encode()])
    assert cc_manifest.lookup(direct) == key
