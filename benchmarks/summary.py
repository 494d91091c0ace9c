"""Committed benchmark summaries: the last results per benchmark and machine class, and the change
against the previous ones.

``make bench`` writes its raw outputs to ``benchmarks/results/`` (git-ignored); each benchmark
that adopts this module also writes a small summary to ``benchmarks/results/summary/`` that *is*
committed: ``<bench>-<machine class>.json`` (the machine, the versions, the note, one entry per
row) and the same as ``.md``. The machine class (:func:`machine_class`) is the CPU's model name,
core count and widest vector extension: numbers from one class compare, numbers from two do
not. When a committed summary of the same benchmark and class exists, the run prints and
records the change per row
(:func:`compare`): Kiln's time now / before, flagged when above :data:`SLOWER_FLAG`, and Kiln /
best peer before and now (the peers ran in the same process both times, so that ratio moves
less with the machine's load than the times do).

A summary row (:func:`summary_row`) is ``{"name", "threads", "kiln_ms", "ort_ms",
"openvino_ms", "wrong_peers", "best_peer", "kiln_best_peer"}`` (times in ms, None where that
engine did not run; ``wrong_peers``: the peers whose outputs disagreed with onnxruntime's), or
``{"name", "threads", "error"}``.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
from pathlib import Path

from peers import PEERS, kiln_over_best_peer, versions

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
SUMMARY_DIR = HERE / "results" / "summary"
#: a row whose Kiln time is more than this × the previous summary's is flagged as slower
SLOWER_FLAG = 1.05


def _cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _git(*args: str) -> str | None:
    try:
        proc = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True,
                              timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return proc.stdout.strip() if proc.returncode == 0 else None


def machine_info() -> dict:
    """This machine and the software measured: CPU model name (/proc/cpuinfo), cores, the ISA
    features Kiln's loader checks (``kiln.runtime.cpu_features``), Python, numpy and peer
    versions, UTC date, git commit (``+dirty`` with uncommitted changes), load average."""
    import numpy

    import kiln
    from kiln.runtime.cpu_features import cpu_has, host_arch, host_cpuinfo_flags

    flags = host_cpuinfo_flags()
    commit = _git("rev-parse", "--short=12", "HEAD")
    if commit and _git("status", "--porcelain", "--untracked-files=no"):
        commit += "+dirty"
    return {"cpu": _cpu_model(), "cores": os.cpu_count(), "arch": host_arch(),
            "isa": cpu_has(flags, host_arch()) if flags is not None else None,
            "python": platform.python_version(), "numpy": numpy.__version__,
            "kiln": kiln.__version__, **versions(),
            "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "commit": commit, "loadavg": " ".join(f"{x:.2f}" for x in os.getloadavg())}


def machine_class(machine: dict) -> str:
    """The file-name part naming a machine class: CPU model name and core count, lower case,
    runs of other characters as one ``-``, and on x86-64 the widest vector extension
    (``"AMD EPYC", 2, avx512f`` → ``amd-epyc-2c-avx512``; without AVX-512 → ``amd-epyc-2c-avx2``):
    a cloud's "AMD EPYC" is a Zen 2 with AVX2 only or a Zen 4 with AVX-512 and VNNI, whose int8
    times differ twofold."""
    cpu = re.sub(r"[^a-z0-9]+", "-", machine["cpu"].lower()).strip("-") or "cpu"
    return f"{cpu}-{machine['cores']}c{_vector_tier(machine.get('isa') or ())}"


def _vector_tier(isa) -> str:
    """``-avx512``, ``-avx2`` or ``""`` (no x86 vector extension named in ``isa``)."""
    for tier, feature in (("avx512", "avx512f"), ("avx2", "avx2")):
        if feature in isa:
            return f"-{tier}"
    return ""


def summary_row(name: str, row: dict, peers: dict[str, str] = PEERS) -> dict:
    """The summary of one result row (``models.py``'s, ``encoders.py``'s or ``llm.py``'s) named
    ``name``, against ``peers`` (row-key prefix → name; default onnxruntime and OpenVINO)."""
    if "error" in row:
        return {"name": name, "threads": row["threads"], "error": row["error"]}
    out = {"name": name, "threads": row["threads"], "kiln_ms": row["kiln_ms"]}
    out |= {f"{p}_ms": row.get(f"{p}_ms") for p in peers}
    out["wrong_peers"] = [p for p in peers if row.get(f"{p}_ok") is False]
    return out | kiln_over_best_peer(row, peers)


def compare(rows: list[dict], previous: list[dict]) -> list[dict]:
    """Per summary row that ran now and in ``previous`` (matched by name and threads):
    ``{"name", "threads", "kiln_ms_before", "kiln_ms", "change"`` (now / before),
    ``"slower"`` (change > :data:`SLOWER_FLAG`), ``"kiln_best_peer_before"``,
    ``"kiln_best_peer"}``, in the order of ``rows``."""
    before = {(r["name"], r["threads"]): r for r in previous if "error" not in r}
    out = []
    for r in rows:
        old = before.get((r["name"], r["threads"]))
        if "error" in r or old is None or not old.get("kiln_ms"):
            continue
        change = r["kiln_ms"] / old["kiln_ms"]
        out.append({"name": r["name"], "threads": r["threads"],
                    "kiln_ms_before": old["kiln_ms"], "kiln_ms": r["kiln_ms"],
                    "change": change, "slower": change > SLOWER_FLAG,
                    "kiln_best_peer_before": old.get("kiln_best_peer"),
                    "kiln_best_peer": r.get("kiln_best_peer")})
    return out


def _num(value: float | None, fmt: str = "{:.2f}") -> str:
    return "-" if value is None else fmt.format(value)


def rows_markdown(rows: list[dict], peers: dict[str, str] = PEERS) -> list[str]:
    """The summary rows as a markdown table, a column per peer of ``peers`` (``-``: that engine
    did not run; ``⚠ wrong``: its outputs disagreed with onnxruntime's, so it is not the best
    peer)."""
    lines = ["| name | threads | Kiln ms | " + "".join(f"{n} ms | " for n in peers.values())
             + "best peer | Kiln / best peer |", "|---|---:|---:|" + "---:|" * len(peers)
             + "---|---:|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['name']} | {r['threads']} | failed | " + "| " * len(peers)
                         + "| |")
            continue
        wrong = r.get("wrong_peers", [])
        cells = [_num(r.get(f"{p}_ms")) + (" ⚠ wrong" if p in wrong else "") for p in peers]
        lines.append(f"| {r['name']} | {r['threads']} | {_num(r['kiln_ms'])} | "
                     + "".join(f"{c} | " for c in cells)
                     + f"{peers.get(r['best_peer'], '-')} | {_num(r['kiln_best_peer'])} |")
    return lines


def changes_markdown(changes: list[dict], previous: dict | None, settings: str = "") -> list[str]:
    """The change against the previous summary (its ``machine`` and ``settings``) as markdown
    lines: a table, or why there is none; says so when the settings of the two runs differ."""
    if previous is None:
        return ["No previous summary of this benchmark for this machine class."]
    head = (f"Against the previous summary ({previous['machine'].get('date', '?')}, commit "
            f"{previous['machine'].get('commit') or '?'}):")
    if previous.get("settings") != settings:
        head += f" (its settings differ: {previous.get('settings') or '?'})"
    if not changes:
        return [head, "", "no row ran in both."]
    lines = [head, "", "| name | threads | Kiln ms before | Kiln ms now | now / before "
             "| Kiln / best peer before | now |", "|---|---:|---:|---:|---:|---:|---:|"]
    for c in changes:
        change = f"**{c['change']:.2f}** ⚠ slower" if c["slower"] else f"{c['change']:.2f}"
        lines.append(f"| {c['name']} | {c['threads']} | {c['kiln_ms_before']:.2f} | "
                     f"{c['kiln_ms']:.2f} | {change} | {_num(c['kiln_best_peer_before'])} | "
                     f"{_num(c['kiln_best_peer'])} |")
    slower = [f"{c['name']} at {c['threads']}" for c in changes if c["slower"]]
    lines += ["", f"More than {SLOWER_FLAG - 1:.0%} slower: {', '.join(slower) or 'none'}."]
    return lines


def markdown(bench: str, summary: dict) -> str:
    """The ``.md`` of a summary: machine, note, rows, change against the previous one."""
    m = summary["machine"]
    peer_names = summary.get("peers") or PEERS
    isa = ", ".join(m["isa"]) if m.get("isa") else "unknown"
    peers = ", ".join(f"{name} {m.get(p) or '- (not installed)'}"
                      for p, name in peer_names.items())
    lines = [f"# {bench}: Kiln vs peers", "",
             f"{m['cpu']}, {m['cores']} cores ({m['arch']}; {isa}); Python {m['python']}, "
             f"numpy {m['numpy']}, kiln {m['kiln']}, {peers}; {m['date']}, commit "
             f"{m.get('commit') or '?'}, load average at the end {m['loadavg']}.", ""]
    if summary.get("settings"):
        lines += [f"Settings: {summary['settings']}", ""]
    if summary.get("note"):
        lines += [f"Note: {summary['note']}", ""]
    lines += [*rows_markdown(summary["rows"], peer_names), "",
              *changes_markdown(summary["changes"], summary.get("previous"),
                                summary.get("settings", ""))]
    return "\n".join(lines) + "\n"


def load_previous(path: Path) -> dict | None:
    """The committed summary at ``path``: its version in git's ``HEAD`` when the file is in a
    git checkout, else (no git, or not committed yet) the file itself; None when there is none
    (or it is not valid JSON)."""
    text = None
    try:
        rel = path.resolve().relative_to(ROOT)
        text = _git("show", f"HEAD:{rel.as_posix()}")
    except ValueError:
        pass
    if text is None and path.is_file():
        text = path.read_text()
    try:
        return json.loads(text) if text else None
    except ValueError:
        return None


def write_summary(bench: str, rows: list[dict], machine: dict, *, note: str = "",
                  settings: str = "", folder: Path = SUMMARY_DIR,
                  peers: dict[str, str] = PEERS) -> tuple[Path, str]:
    """Write ``<bench>-<class>.json`` and ``.md`` to ``folder`` (summary rows ``rows``, compared
    with the committed previous summary there; a column per peer of ``peers``, whose versions
    are ``machine[key]``); returns the JSON path and the markdown."""
    path = folder / f"{bench}-{machine_class(machine)}.json"
    previous = load_previous(path)
    changes = compare(rows, previous["rows"]) if previous else []
    summary = {"bench": bench, "machine": machine, "settings": settings, "note": note,
               "peers": peers, "rows": rows, "changes": changes,
               "previous": ({"machine": previous["machine"],
                             "settings": previous.get("settings", "")} if previous else None)}
    text = markdown(bench, summary)
    folder.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(summary, indent=1) + "\n")
    path.with_suffix(".md").write_text(text)
    return path, text
