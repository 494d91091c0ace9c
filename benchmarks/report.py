"""Benchmark results as a markdown report and a PNG bar chart (rows come from ``models.py``).

A row is one (model, threads) pair: ``kiln_ms``, ``ort_ms``, ``ratio``, ``kiln_gflops``,
``ort_gflops``, ``kiln_peak_rss_mib``, ``ort_peak_rss_mib``, ``compile_s``, ``max_abs_err`` —
or ``error`` when the model failed to load, compile or run.
"""

from __future__ import annotations

import math
from pathlib import Path

#: Kiln/onnxruntime latency ratios above this are flagged (the issue's per-model bound).
RATIO_FLAG = 1.5

COLUMNS = (("model", "model", "{}"), ("kiln_ms", "Kiln (ms)", "{:.2f}"),
           ("ort_ms", "ORT (ms)", "{:.2f}"), ("ratio", "Kiln/ORT", "{:.2f}"),
           ("kiln_gflops", "Kiln GFLOP/s", "{:.1f}"), ("ort_gflops", "ORT GFLOP/s", "{:.1f}"),
           ("kiln_peak_rss_mib", "Kiln peak RSS (MiB)", "{:.0f}"),
           ("ort_peak_rss_mib", "ORT peak RSS (MiB)", "{:.0f}"),
           ("compile_s", "Kiln compile (s)", "{:.1f}"), ("max_abs_err", "max abs err", "{:.1e}"))


def geomean(values: list[float]) -> float:
    """Geometric mean of positive numbers (``nan`` for none)."""
    return math.exp(sum(math.log(v) for v in values) / len(values)) if values else math.nan


def _cells(row: dict) -> list[str]:
    cells = [fmt.format(row[key]) for key, _, fmt in COLUMNS]
    if row["ratio"] > RATIO_FLAG:
        cells[3] = f"**{cells[3]}** ⚠"
    if row["kiln_peak_rss_mib"] > row["ort_peak_rss_mib"]:
        cells[6] = f"**{cells[6]}**"
    return cells


def _summary(rows: list[dict]) -> list[str]:
    """Geometric mean of the ratios, the models above :data:`RATIO_FLAG`, and RSS vs ORT."""
    ok = [r for r in rows if "error" not in r]
    if not ok:
        return [f"No model ran ({len(rows)} failed)."]
    gm = geomean([r["ratio"] for r in ok])
    head = (f"Geometric mean Kiln/ORT: **{gm:.2f}** over {len(ok)} of {len(rows)} models "
            f"({'≤' if gm <= 1.0 else '>'} 1.0).")
    lines = [head]
    slow = [f"{r['model']} ({r['ratio']:.2f})" for r in ok if r["ratio"] > RATIO_FLAG]
    lines.append(f"Above {RATIO_FLAG}: {', '.join(slow) if slow else 'none'}.")
    fat = [f"{r['model']} ({r['kiln_peak_rss_mib']:.0f} vs {r['ort_peak_rss_mib']:.0f} MiB)"
           for r in ok if r["kiln_peak_rss_mib"] > r["ort_peak_rss_mib"]]
    lines.append(f"Peak RSS above ORT's: {', '.join(fat) if fat else 'none'}.")
    return lines


def table(rows: list[dict]) -> list[str]:
    """One markdown table; failed models show ``failed`` and empty cells."""
    lines = ["| " + " | ".join(c[1] for c in COLUMNS) + " |",
             "|" + "|".join("---" if c[0] == "model" else "---:" for c in COLUMNS) + "|"]
    for r in rows:
        cells = [r["model"], "failed", *["—"] * (len(COLUMNS) - 2)] if "error" in r else _cells(r)
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def markdown(rows: list[dict], env: dict) -> str:
    """The whole report: a header naming machine and versions, one table and summary per thread
    count, then the errors of failed models."""
    head = (f"{env['cpu']} ({env['cores']} cores), target `{env['target']}`, batch 1, median of "
            f"{env['repeat']} runs after {env['warmup']} warm-up; kiln {env['kiln']}, "
            f"onnxruntime {env['onnxruntime']}. Load average (1, 5, 15 min) at start: "
            f"{env['loadavg_start']}, at end: {env.get('loadavg_end', '?')}.")
    out = [head]
    for n in env["threads"]:
        sel = [r for r in rows if r["threads"] == n]
        out += ["", f"### {n} thread{'s' if n > 1 else ''}", "", *table(sel), "",
                *_summary(sel)]
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
