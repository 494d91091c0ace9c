"""Benchmark results as a markdown report and a PNG bar chart (rows come from ``models.py``).

A row is one (model, threads) pair: ``kiln_ms``, ``ort_ms``, ``openvino_ms`` (None where
OpenVINO did not run), ``ratio`` (Kiln / onnxruntime), ``best_peer`` and ``kiln_best_peer``
(Kiln / the fastest peer whose outputs agree with onnxruntime's), ``kiln_gflops``,
``ort_gflops``, ``kiln_peak_rss_mib``, ``ort_peak_rss_mib``, ``compile_s``, ``max_abs_err``
(Kiln vs onnxruntime) and ``kiln_ok``, ``openvino_err`` and ``openvino_ok``, ``openvino_error``
(why OpenVINO did not run) — or ``error`` when Kiln failed to load, compile or run the model.
"""

from __future__ import annotations

import math
from pathlib import Path

from peers import PEERS

#: Kiln/peer latency ratios above this are flagged (the issue's per-model bound).
RATIO_FLAG = 1.5


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _openvino_cell(row: dict) -> str:
    if row.get("openvino_error"):
        return "failed"
    cell = _ms(row.get("openvino_ms"))
    return cell if row.get("openvino_ok", True) else f"{cell} ⚠ wrong"


def _ratio_cell(value: float | None) -> str:
    if value is None:
        return "-"
    return f"**{value:.2f}** ⚠" if value > RATIO_FLAG else f"{value:.2f}"


def _err_cell(row: dict, key: str, ok_key: str) -> str:
    if row.get(key) is None:
        return "-"
    return f"{row[key]:.1e}" if row.get(ok_key, True) else f"**{row[key]:.1e}** ⚠"


def _rss_cell(row: dict) -> str:
    cell = f"{row['kiln_peak_rss_mib']:.0f}"
    return f"**{cell}**" if row["kiln_peak_rss_mib"] > row["ort_peak_rss_mib"] else cell


#: (header, cell of a row that ran)
COLUMNS = (("model", lambda r: r["model"]),
           ("Kiln (ms)", lambda r: _ms(r["kiln_ms"])),
           ("ORT (ms)", lambda r: _ms(r["ort_ms"])),
           ("OpenVINO (ms)", _openvino_cell),
           ("Kiln/ORT", lambda r: _ratio_cell(r["ratio"])),
           ("Kiln/best peer", lambda r: _ratio_cell(r.get("kiln_best_peer"))),
           ("Kiln GFLOP/s", lambda r: f"{r['kiln_gflops']:.1f}"),
           ("ORT GFLOP/s", lambda r: f"{r['ort_gflops']:.1f}"),
           ("Kiln peak RSS (MiB)", _rss_cell),
           ("ORT peak RSS (MiB)", lambda r: f"{r['ort_peak_rss_mib']:.0f}"),
           ("Kiln compile (s)", lambda r: f"{r['compile_s']:.1f}"),
           ("max abs err", lambda r: _err_cell(r, "max_abs_err", "kiln_ok")),
           ("OpenVINO err", lambda r: _err_cell(r, "openvino_err", "openvino_ok")))


def geomean(values: list[float]) -> float:
    """Geometric mean of positive numbers (``nan`` for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def _summary(rows: list[dict]) -> list[str]:
    """Geometric means of Kiln/ORT and Kiln/best peer, the models whose Kiln/best peer is above
    :data:`RATIO_FLAG`, and peak RSS vs ORT."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return [f"No model ran ({len(rows)} failed)."]
    gm = geomean([r["ratio"] for r in ok])
    head = (f"Geometric mean Kiln/ORT: **{gm:.2f}** over {len(ok)} of {len(rows)} models "
            f"({'≤' if gm <= 1.0 else '>'} 1.0).")
    lines = [head]
    best = [r["kiln_best_peer"] for r in ok if r.get("kiln_best_peer") is not None]
    if best:
        lines.append(f"Geometric mean Kiln/best peer: **{geomean(best):.2f}** over {len(best)} "
                     "models.")
    slow = [f"{r['model']} ({r['kiln_best_peer']:.2f})" for r in ok
            if (r.get("kiln_best_peer") or 0) > RATIO_FLAG]
    lines.append(f"Kiln/best peer above {RATIO_FLAG}: {', '.join(slow) if slow else 'none'}.")
    fat = [f"{r['model']} ({r['kiln_peak_rss_mib']:.0f} vs {r['ort_peak_rss_mib']:.0f} MiB)"
           for r in ok if r["kiln_peak_rss_mib"] > r["ort_peak_rss_mib"]]
    lines.append(f"Peak RSS above ORT's: {', '.join(fat) if fat else 'none'}.")
    return lines


def table(rows: list[dict]) -> list[str]:
    """One markdown table; failed models show ``failed`` and empty cells."""
    lines = ["| " + " | ".join(c[0] for c in COLUMNS) + " |",
             "|" + "|".join("---" if c[0] == "model" else "---:" for c in COLUMNS) + "|"]
    for r in rows:
        if "error" in r:
            cells = [r["model"], "failed", *["—"] * (len(COLUMNS) - 2)]
        else:
            cells = [cell(r) for _, cell in COLUMNS]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def peer_notes(rows: list[dict], env: dict) -> list[str]:
    """Lines on the peers: those not installed, and per model those that failed or whose
    outputs disagree with onnxruntime's (their times are shown, never counted as best)."""
    notes = [f"- {PEERS[p]}: not run, {why}" for p, why in env.get("missing_peers", {}).items()]
    for r in rows:
        where = f"{r['model']} at {r['threads']} thread(s)"
        if r.get("openvino_error"):
            notes.append(f"- OpenVINO failed on {where}: {r['openvino_error']}")
        elif r.get("openvino_ok") is False:
            notes.append(f"- OpenVINO's outputs disagree with onnxruntime's on {where} (max abs "
                         f"err {r['openvino_err']:.2e}): its time is not counted as best peer")
        if r.get("kiln_ok") is False:
            notes.append(f"- Kiln's outputs disagree with onnxruntime's on {where} (max abs err "
                         f"{r['max_abs_err']:.2e})")
    return notes


def markdown(rows: list[dict], env: dict) -> str:
    """The whole report: a header naming machine and versions (and the run's note), one table
    and summary per thread count, the peers' notes, then the errors of failed models."""
    head = (f"{env['cpu']} ({env['cores']} cores), target `{env['target']}`, batch 1, median of "
            f"{env['repeat']} runs after {env['warmup']} warm-up; kiln {env['kiln']}, "
            f"onnxruntime {env['onnxruntime']}, OpenVINO {env.get('openvino') or '-'}. "
            f"Load average (1, 5, 15 min) at start: {env['loadavg_start']}, at end: "
            f"{env.get('loadavg_end', '?')}.")
    out = [head] + (["", f"Note: {env['note']}"] if env.get("note") else [])
    for n in env["threads"]:
        sel = [r for r in rows if r["threads"] == n]
        out += ["", f"### {n} thread{'s' if n > 1 else ''}", "", *table(sel), "",
                *_summary(sel)]
    notes = peer_notes(rows, env)
    if notes:
        out += ["", "Peers:", "", *notes]
    errors = sorted({f"- {r['model']}: {r['error']}" for r in rows if "error" in r})
    if errors:
        out += ["", "Errors:", "", *errors]
    return "\n".join(out) + "\n"


def chart(rows: list[dict], env: dict, path: Path) -> None:
    """Grouped bars of Kiln/ORT latency per model, one bar per thread count, a line at 1.0 (and a
    dashed one at :data:`RATIO_FLAG`), on a log axis (a ratio r and 1/r are as far from 1);
    written as PNG (matplotlib, Agg backend)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FixedLocator, FormatStrFormatter, NullLocator

    models = list(dict.fromkeys(r["model"] for r in rows))
    threads = env["threads"]
    width = 0.8 / len(threads)
    fig, ax = plt.subplots(figsize=(max(7.0, 1.6 * len(models) + 2), 4.5))
    for k, n in enumerate(threads):
        by_model = {r["model"]: r for r in rows if r["threads"] == n}
        xs, ys = [], []
        for i, m in enumerate(models):
            r = by_model.get(m)
            x = i + (k - (len(threads) - 1) / 2) * width
            if r is None or "error" in r:
                ax.text(x, 1.0, "failed", rotation=90, ha="center", va="bottom", fontsize=8)
                continue
            xs.append(x)
            ys.append(r["ratio"])
        bars = ax.bar(xs, ys, width, label=f"{n} thread{'s' if n > 1 else ''}")
        ax.bar_label(bars, fmt="%.2f", fontsize=8)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(RATIO_FLAG, color="gray", linewidth=1, linestyle="--")
    ratios = [r["ratio"] for r in rows if "error" not in r] or [1.0]
    lo, hi = min(0.5, min(ratios) / 1.3), max(2.0, max(ratios) * 1.3)
    ax.set_yscale("log")
    ax.set_ylim(lo, hi)
    ticks = [t for t in (0.1, 0.2, 0.5, 1, 1.5, 2, 5, 10, 20, 50, 100) if lo <= t <= hi]
    ax.yaxis.set_major_locator(FixedLocator(ticks))
    ax.yaxis.set_minor_locator(NullLocator())
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.set_xticks(range(len(models)), models)
    ax.set_ylabel("Kiln / onnxruntime latency (lower is better)")
    ax.set_title(f"Kiln vs onnxruntime, batch 1, target {env['target']}\n{env['cpu']}",
                 fontsize=10)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
