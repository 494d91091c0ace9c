"""The size cap of Kiln's caches of compiled code (``kiln.runtime.toolchain.cache_limit``): size
parsing,
LRU order, hysteresis, what is never removed, concurrent trims, the cross-process trigger, the
producers' hooks and ``kiln cache``. No compiler needed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kiln.cli import main as cli
from kiln.errors import KilnError
from kiln.runtime.toolchain import cache_limit, compile_cache

BLOCK = 4096
SRC = str(Path(cache_limit.__file__).resolve().parents[3])  # src/


@pytest.fixture
def root(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache"
    path.mkdir(mode=0o700)
    monkeypatch.setenv("KILN_CACHE_DIR", str(path))
    monkeypatch.delenv("KILN_NO_CACHE", raising=False)
    monkeypatch.delenv("KILN_CACHE_MAX_SIZE", raising=False)
    return path


def put(path: Path, nbytes: int = BLOCK, age_s: float = 0.0) -> Path:
    """A file of ``nbytes`` whose modification time is ``age_s`` seconds ago."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    path.write_bytes(os.urandom(nbytes))
    when = time.time() - age_s
    os.utime(path, (when, when))
    return path


def obj(root: Path, n: int) -> Path:
    """The path of compile-cache entry number ``n``."""
    return root / "objects" / f"{compile_cache.make_key(str(n))}.o"


def total(root: Path) -> int:
    return sum(e.size for e in cache_limit.scan())


@pytest.mark.parametrize("text, expected", [
    ("0", 0), ("0.0", 0), ("123B", 123), ("500M", 500 * 10**6), ("500MB", 500 * 10**6),
    ("5G", 5 * 10**9), ("5GiB", 5 * 2**30), ("5gib", 5 * 2**30), ("2Ki", 2048),
    ("1.5G", 1_500_000_000), (" 7 MiB ", 7 * 2**20), ("1T", 10**12), ("10k", 10_000),
])
def test_parse_size_accepts_ccache_sizes(text, expected):
    assert cache_limit.parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "-1", "5X", "G", "5iB", "abc", "5 G B", "1e9", "5GG"])
def test_parse_size_rejects_anything_else_naming_the_variable(text):
    with pytest.raises(KilnError, match=re.escape(f"KILN_CACHE_MAX_SIZE={text!r} is not a size")):
        cache_limit.parse_size(text)


@pytest.mark.parametrize("text", ["10", "0.5", "123"])
def test_parse_size_refuses_a_bare_number(text):
    """ccache reads a bare number as gigabytes, a byte count would make the cap tiny: a unit
    is required (only 0 needs none)."""
    with pytest.raises(KilnError, match="needs a unit"):
        cache_limit.parse_size(text)


@pytest.mark.parametrize("text", ["0.4B", "0.0001K"])
def test_parse_size_refuses_a_size_that_rounds_to_no_limit(text):
    with pytest.raises(KilnError, match="less than one byte"):
        cache_limit.parse_size(text)


def test_parse_size_reads_a_huge_number_exactly():
    """Read as a decimal, not a float (a float overflowed to a bare OverflowError)."""
    assert cache_limit.parse_size("9" * 400 + "G") == int("9" * 400) * 10**9


def test_max_size_default_env_and_bad_value(root, monkeypatch):
    assert cache_limit.max_size() == 5 * 2**30
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", "")
    assert cache_limit.max_size() == 5 * 2**30
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", "64Ki")
    assert cache_limit.max_size() == 65536
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", "lots")
    with pytest.raises(KilnError, match="KILN_CACHE_MAX_SIZE='lots'"):
        cache_limit.max_size()


def test_trim_removes_least_recently_modified_first_across_folders(root):
    paths = [obj(root, 0), root / "llm" / f"m-{'a' * 20}.so",
             root / "device" / f"device-{'b' * 32}.so", root / f"csource-{'c' * 32}.so",
             obj(root, 1)]
    for age, path in zip((500, 400, 300, 200, 100), paths):
        put(path, BLOCK, age)
    report = cache_limit.trim(limit=4 * BLOCK)  # 5 blocks > 4: down to 0.8 * 4 = 3.2 blocks
    assert (report.entries, report.removed) == (5, 2)
    assert [p.exists() for p in paths] == [False, False, True, True, True]
    assert total(root) <= 0.8 * 4 * BLOCK


def test_a_load_hit_refreshes_the_entry_so_it_survives(root):
    keys = [compile_cache.make_key(str(n)) for n in range(4)]
    for age, key in zip((400, 300, 200, 100), keys):
        compile_cache.store(key, "o", [b"x" * 3000])
        when = time.time() - age
        os.utime(root / "objects" / f"{key}.o", (when, when))
    assert compile_cache.load(keys[0], "o") == [b"x" * 3000]  # the oldest, now the newest
    cache_limit.trim(limit=3 * BLOCK)  # 4 blocks: keep 2
    assert compile_cache.load(keys[0], "o") is not None
    assert [compile_cache.load(k, "o") is not None for k in keys[1:]] == [False, False, True]


def test_hysteresis_trims_to_a_fraction_then_stores_below_the_cap_do_not_trim(root,
                                                                               monkeypatch):
    cap = 10 * BLOCK
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", f"{cap}B")
    for n in range(8):
        put(obj(root, n), BLOCK, 1000 - n)
    assert cache_limit.trim().removed == 0  # 8 blocks: under the cap, nothing to do
    for n in range(8, 11):  # 11 blocks: the store that passes the cap trims to 8
        cache_limit.note_stored(put(obj(root, n), BLOCK, 1000 - n))
    assert total(root) == 8 * BLOCK and not obj(root, 0).exists()
    for n in range(11, 13):  # 10 blocks: at the cap, not above it
        cache_limit.note_stored(put(obj(root, n), BLOCK, 1000 - n))
    assert total(root) == 10 * BLOCK and obj(root, 3).exists()
    cache_limit.note_stored(put(obj(root, 13), BLOCK, 1000 - 13))
    assert total(root) == 8 * BLOCK and not obj(root, 5).exists() and obj(root, 6).exists()


def test_model_temp_lock_and_foreign_files_are_never_removed(root):
    kept = [put(root / name, BLOCK, 10_000) for name in (
        "smollm2-135m-instruct-7c8d36499a8cee8d.onnx", "SmolLM2-135M-Instruct.Q4_1.gguf",
        "bert-uncased-vocab.txt", "smollm2-tokenizer.json", ".smollm2-onnx.lock",
        "objects/.0123456789abcdef.x1y2.tmp", f"objects/{'d' * 64}.o.tmp", "objects/notes.txt",
        f"llm/.{'e' * 20}.lock", f"llm/tmpab12/m-{'f' * 20}.so", f"device/.device-{'a' * 32}.so.x",
        f"object-{'0' * 31}.so", "kiln-jit-note.so")]
    (root / "objects" / f"{'9' * 64}.o").symlink_to(kept[0])
    entries = [put(obj(root, n), BLOCK, 10_000) for n in range(3)]
    report = cache_limit.clear()
    assert report.removed == 3 and not any(p.exists() for p in entries)
    assert all(p.exists() for p in kept)
    assert (root / "objects" / f"{'9' * 64}.o").is_symlink()


def test_a_folder_that_is_not_private_is_left_alone(root):
    entry = put(obj(root, 0), BLOCK, 100)
    os.chmod(root / "objects", 0o777)
    try:
        assert cache_limit.clear().removed == 0 and entry.exists()
    finally:
        os.chmod(root / "objects", 0o700)


def test_entries_removed_by_another_process_during_a_trim_are_fine(root, monkeypatch):
    for n in range(6):
        put(obj(root, n), BLOCK, 100 - n)
    scan = cache_limit.scan

    def scan_then_lose_the_oldest():
        entries = scan()
        os.unlink(obj(root, 0))  # another process evicts it after our scan
        return entries

    monkeypatch.setattr(cache_limit, "scan", scan_then_lose_the_oldest)
    cache_limit.trim(limit=5 * BLOCK)  # 6 blocks: down to 4
    assert sorted(p.name for p in (root / "objects").iterdir()) == sorted(
        obj(root, n).name for n in (2, 3, 4, 5))


def test_an_entry_hit_after_the_scan_is_not_removed(root, monkeypatch):
    """A trim decides on the times of its scan; an entry another process hits meanwhile (its
    path handed out for a dlopen) must survive."""
    for n in range(6):
        put(obj(root, n), BLOCK, 100 - n)
    scan = cache_limit.scan

    def scan_then_hit_the_oldest():
        entries = scan()
        cache_limit.touch(obj(root, 0))
        return entries

    monkeypatch.setattr(cache_limit, "scan", scan_then_hit_the_oldest)
    cache_limit.trim(limit=5 * BLOCK)
    assert obj(root, 0).exists()


def test_stale_temp_files_and_staging_folders_are_removed(root):
    """What a crashed store or export left (older than TEMP_STALE_S) goes; fresh ones stay."""
    old = cache_limit.TEMP_STALE_S + 60
    stale = [put(root / "objects" / ".0123456789abcdef.x1y2.tmp", BLOCK, old),
             put(root / f".object-{'a' * 32}.so.k3j4.tmp", BLOCK, old)]
    staging = root / "llm" / "tmpab12cd34"
    put(staging / f"m-{'f' * 20}.so", BLOCK, old)
    os.utime(staging, (time.time() - old,) * 2)
    fresh = [put(root / "objects" / ".fedcba9876543210.z9.tmp", BLOCK, 60),
             put(root / "llm" / "tmpcd34ef56" / f"m-{'e' * 20}.so", BLOCK, 60)]
    cache_limit.trim(limit=0)
    assert not any(p.exists() for p in stale) and not staging.exists()
    assert all(p.exists() for p in fresh)


def test_an_unusable_cache_root_skips_the_accounting_quietly(root, monkeypatch, caplog):
    """No writable ``$KILN_CACHE_DIR`` (a container's HOME=/): stores elsewhere still work,
    without a warning per store."""
    blocker = root / "file"
    blocker.write_text("")
    monkeypatch.setenv("KILN_CACHE_DIR", str(blocker / "cache"))
    entry = put(root / "elsewhere" / "x.o", BLOCK)
    with caplog.at_level("WARNING", logger="kiln"):
        cache_limit.note_stored(entry)
    assert caplog.records == [] and entry.exists()


def test_concurrent_trims_in_threads_and_processes_do_not_raise(root):
    for n in range(300):
        put(obj(root, n), BLOCK, 1000 - n)
    code = (f"import sys; sys.path.insert(0, {SRC!r})\n"
            "from kiln.runtime.toolchain import cache_limit\n"
            "for limit in range(200, 0, -20): cache_limit.trim(limit=limit * 4096)\n")
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    errors: list[BaseException] = []

    def trims():
        try:
            for limit in range(250, 0, -25):
                cache_limit.trim(limit=limit * BLOCK)
        except BaseException as err:  # noqa: BLE001 - reported by the assert below
            errors.append(err)

    threads = [threading.Thread(target=trims) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    outs = [p.communicate(timeout=120)[1] for p in procs]
    assert errors == [] and [p.returncode for p in procs] == [0, 0], outs
    assert total(root) <= 20 * BLOCK


def test_the_cap_holds_across_many_short_processes(root, monkeypatch):
    cap = 16 * BLOCK
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", f"{cap}B")
    code = (f"import sys; sys.path.insert(0, {SRC!r})\n"
            "from kiln.runtime.toolchain import compile_cache\n"
            "for n in range(3): compile_cache.store(compile_cache.make_key(sys.argv[1], str(n)), "
            "'o', [bytes(3000)])\n")
    for run in range(8):  # 24 entries of one block each: 1.5 times the cap
        subprocess.run([sys.executable, "-c", code, str(run)], check=True)
        assert total(root) <= cap
    assert len(list((root / "objects").iterdir())) < 24


def test_a_first_store_trims_a_folder_filled_before_the_cap(root, monkeypatch):
    for n in range(20):  # an unbounded cache from before, no ledger
        put(obj(root, n), BLOCK, 1000 - n)
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", f"{10 * BLOCK}B")
    compile_cache.store(compile_cache.make_key("new"), "o", [b"new"])
    assert total(root) <= 8 * BLOCK
    assert compile_cache.load(compile_cache.make_key("new"), "o") == [b"new"]


def test_unreported_files_are_found_by_the_periodic_rescan(root, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", f"{10 * BLOCK}B")
    cache_limit.trim()  # the ledger: 0 bytes, scanned now
    for n in range(20):  # written by a process that does not report (the C runtime's JIT)
        put(root / "device" / f"device-{n:032x}.so", BLOCK, 1000 - n)
    cache_limit.note_stored(put(obj(root, 0)))
    assert total(root) == 21 * BLOCK  # the ledger was fresh: no scan
    ledger = root / cache_limit.LEDGER_NAME
    size, _ = ledger.read_text().split()
    ledger.write_text(f"{size} {time.time() - cache_limit.RESCAN_S - 1}\n")
    cache_limit.note_stored(put(obj(root, 1)))
    assert total(root) <= 8 * BLOCK and obj(root, 1).exists()


def test_the_entry_just_stored_is_kept_even_above_the_cap(root, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", f"{2 * BLOCK}B")
    put(obj(root, 0), BLOCK, 100)
    big = put(root / "llm" / f"m-{'1' * 20}.so", 4 * BLOCK)
    cache_limit.note_stored(big)
    assert big.exists() and not obj(root, 0).exists()


def test_no_cache_bypasses_the_cap(root, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", f"{BLOCK}B")
    old = [put(obj(root, n), BLOCK, 100) for n in range(3)]
    mtimes = [p.stat().st_mtime_ns for p in old]
    monkeypatch.setenv("KILN_NO_CACHE", "1")
    compile_cache.store(compile_cache.make_key("x"), "o", [b"x"])
    assert compile_cache.load(compile_cache.make_key("0"), "o") is None
    assert [p.stat().st_mtime_ns for p in old] == mtimes
    assert not (root / cache_limit.LEDGER_NAME).exists()


def test_no_limit_never_trims(root, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", "0")
    old = [put(obj(root, n), BLOCK, 100) for n in range(3)]
    compile_cache.store(compile_cache.make_key("x"), "o", [b"x"])
    assert cache_limit.trim().removed == 0 and all(p.exists() for p in old)


def test_a_bad_cap_fails_a_store_with_a_clear_error(root, monkeypatch):
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", "5 gigs")
    with pytest.raises(KilnError, match="KILN_CACHE_MAX_SIZE='5 gigs'"):
        compile_cache.store(compile_cache.make_key("x"), "o", [b"x"])


def test_compiled_decoder_hit_refreshes_and_compile_trims(root, monkeypatch, tmp_path):
    from kiln.llm import decoder

    compiles = []

    def fake_compile(model_path, target, quantize_weights, last_logits, path):
        compiles.append(path)
        put(path, 4 * BLOCK)

    monkeypatch.setattr(decoder, "_compile", fake_compile)
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", f"{4 * BLOCK}B")
    model = put(tmp_path / "tiny.onnx", 100)
    older = put(obj(root, 0), BLOCK, 100)
    path = decoder.compiled_decoder_path(model, "c")
    assert path.exists() and not older.exists()  # the new library stays, the rest goes
    when = time.time() - 500
    os.utime(path, (when, when))
    assert decoder.compiled_decoder_path(model, "c") == path and len(compiles) == 1
    assert time.time() - path.stat().st_mtime < 60


def test_kiln_cache_cli_lists_trims_and_clears(root, monkeypatch, capsys):
    model = put(root / "model.onnx", BLOCK, 10_000)
    for n in range(5):
        put(obj(root, n), BLOCK, 100 - n)
    assert cli.main(["cache"]) == 0
    out = capsys.readouterr().out
    assert f"{root / 'objects'}" in out and "5 entries" in out and "5.0 GiB" in out
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", f"{4 * BLOCK}B")
    assert cli.main(["cache", "--trim"]) == 0
    assert "removed 2 entries (8.0 KiB)" in capsys.readouterr().out
    assert cli.main(["cache", "--clear"]) == 0
    assert "removed 3 entries" in capsys.readouterr().out
    assert list((root / "objects").iterdir()) == [] and model.exists()


def test_kiln_cache_cli_bad_cap_exits_2(root, monkeypatch, capsys):
    monkeypatch.setenv("KILN_CACHE_MAX_SIZE", "-5G")
    assert cli.main(["cache"]) == 2
    assert "KILN_CACHE_MAX_SIZE='-5G' is not a size" in capsys.readouterr().err
