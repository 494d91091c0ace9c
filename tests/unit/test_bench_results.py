"""benchmarks/peers.py, summary.py, report.py: best peer, output agreement, committed summaries
and their comparison with the previous one, on synthetic rows (no timing)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))
import llm
import peers
import report
import summary

MACHINE = {"cpu": "AMD EPYC", "cores": 2, "arch": "x86_64", "isa": ["avx2", "avx512f"],
           "python": "3.11.9", "numpy": "2.4.6", "kiln": "0.1.0", "ort": "1.31.1",
           "openvino": "2026.4.1", "date": "2026-12-02 05:00 UTC", "commit": "abc123",
           "loadavg": "1.00 1.00 1.00"}


def _row(name, threads, kiln, ort, openvino=None, **extra):
    return {"name": name, "threads": threads, "kiln_ms": kiln, "ort_ms": ort,
            "openvino_ms": openvino, **extra}


def test_best_peer_is_the_fastest_peer_that_agrees():
    assert peers.best_peer(_row("m", 1, 5.0, 10.0, 8.0, openvino_ok=True)) == ("openvino", 8.0)
    assert peers.best_peer(_row("m", 1, 5.0, 10.0, 12.0, openvino_ok=True)) == ("ort", 10.0)
    # a peer with wrong outputs is timed but never the best
    assert peers.best_peer(_row("m", 1, 5.0, 10.0, 1.0, openvino_ok=False)) == ("ort", 10.0)
    assert peers.best_peer(_row("m", 1, 5.0, 10.0)) == ("ort", 10.0)  # OpenVINO did not run
    assert peers.best_peer({"kiln_ms": 5.0, "ort_ms": None, "openvino_ms": None}) is None


def test_agreement_is_relative_to_each_outputs_largest_value():
    softmax = [np.array([1e-3, -1.5e-3], np.float32)]  # a Softmax's small values
    assert peers.agree([1e-6], softmax, int8=False)
    assert not peers.agree([1e-5], softmax, int8=False)  # 0.7 % of the largest output: wrong
    assert peers.agree([1e-4], softmax, int8=True)  # int8 engines round differently: 7 %
    assert not peers.agree([2e-4], softmax, int8=True)  # 13 %
    zeros = [np.zeros(3, np.float32)]
    assert peers.agree([0.0], zeros, int8=False)
    assert not peers.agree([1e-9], zeros, int8=False)
    # token ids passed through beside hidden states: the ids' magnitude excuses nothing
    ids_and_hidden = [np.array([29151, 7], np.int64), np.array([2.5, -1.0], np.float32)]
    assert peers.agree([0.0, 1e-3], ids_and_hidden, int8=False)
    assert not peers.agree([0.0, 1.0], ids_and_hidden, int8=False)


def test_output_errors_per_output_and_mismatches_refused():
    ref = [np.zeros((2, 2), np.float32), np.ones(3, np.float32), np.zeros(0, np.float32)]
    out = [np.full((2, 2), 0.25, np.float32), np.array([1, 1, 0.5], np.float32),
           np.zeros(0, np.float32)]
    assert peers.output_errors(out, ref) == [0.25, 0.5, 0.0]
    with pytest.raises(ValueError, match="1 outputs, the reference has 3"):
        peers.output_errors(out[:1], ref)
    with pytest.raises(ValueError, match=r"output 1: shape \(2,\)"):
        peers.output_errors([out[0], np.ones(2), out[2]], ref)


def test_check_outputs_reports_wrong_and_failing_peers_and_raises_for_kiln():
    ref = [np.array([1.0, 2.0], np.float32)]

    def fails():
        raise RuntimeError("boom")

    runs = {"kiln": lambda: [ref[0] + np.float32(2**-20)], "ort": lambda: ref,
            "openvino": lambda: [ref[0] * 2]}
    errors = {}
    out = peers.check_outputs(runs, errors, int8=False)
    assert out["kiln_ok"] and out["kiln_err"] == 2**-20
    assert not out["openvino_ok"] and out["openvino_err"] == 2.0 and errors == {}
    runs["openvino"] = fails
    assert "openvino_ok" not in peers.check_outputs(runs, errors, int8=False)
    assert "openvino" not in runs and errors == {"openvino": "run: RuntimeError: boom"}
    runs["kiln"] = fails
    with pytest.raises(RuntimeError, match="boom"):
        peers.check_outputs(runs, {}, int8=False)


def test_a_peer_that_is_not_installed_is_a_note_not_a_crash(monkeypatch):
    monkeypatch.setitem(peers._MODULES, "openvino", "kiln_no_such_module")
    assert peers.versions()["openvino"] is None
    notes = peers.missing_peers()
    assert list(notes) == ["openvino"] and "OpenVINO is not installed" in notes["openvino"]
    row = {"model": "squeezenet", "threads": 1, "kiln_ms": 3.0, "ort_ms": 4.0,
           "openvino_ms": None, "ratio": 0.75, "kiln_best_peer": 0.75, "kiln_gflops": 200.0,
           "ort_gflops": 150.0, "kiln_peak_rss_mib": 50.0, "ort_peak_rss_mib": 80.0,
           "compile_s": 3.0, "max_abs_err": 1e-7, "kiln_ok": True}
    cells = report.table([row])[2].split(" | ")
    assert cells[3] == "-" and cells[-1] == "- |"  # OpenVINO's time and error
    assert report.peer_notes([row], {"missing_peers": notes}) == [
        f"- OpenVINO: not run, {notes['openvino']}"]


def test_report_marks_wrong_and_failed_peers():
    base = {"model": "resnet50", "threads": 2, "kiln_ms": 30.0, "ort_ms": 20.0,
            "openvino_ms": 10.0, "ratio": 1.5, "kiln_gflops": 1.0, "ort_gflops": 1.0,
            "kiln_peak_rss_mib": 90.0, "ort_peak_rss_mib": 80.0, "compile_s": 9.0,
            "max_abs_err": 1e-6, "kiln_ok": True, "openvino_err": 0.5, "openvino_ok": False,
            "kiln_best_peer": 1.6}
    failed = {**base, "model": "squeezenet", "openvino_ms": None, "openvino_error": "load: X"}
    lines = report.table([base, failed])
    assert "| 10.00 ⚠ wrong |" in lines[2] and "| **1.60** ⚠ |" in lines[2]
    assert "**5.0e-01** ⚠" in lines[2] and "| failed |" in lines[3]
    notes = report.peer_notes([base, failed], {})
    assert "disagree with onnxruntime's on resnet50 at 2 thread(s)" in notes[0]
    assert notes[1] == "- OpenVINO failed on squeezenet at 2 thread(s): load: X"


def test_summary_row_takes_kiln_over_the_best_agreeing_peer():
    row = {"model": "m", "threads": 1, "kiln_ms": 6.0, "ort_ms": 12.0, "openvino_ms": 3.0,
           "openvino_ok": False, "ratio": 0.5}
    assert summary.summary_row("m", row) == {
        "name": "m", "threads": 1, "kiln_ms": 6.0, "ort_ms": 12.0, "openvino_ms": 3.0,
        "wrong_peers": ["openvino"], "best_peer": "ort", "kiln_best_peer": 0.5}
    assert "| m | 1 | 6.00 | 12.00 | 3.00 ⚠ wrong | onnxruntime | 0.50 |" in summary.rows_markdown(
        [summary.summary_row("m", row)])
    assert summary.summary_row("m", {"threads": 2, "error": "compile: E"}) == {
        "name": "m", "threads": 2, "error": "compile: E"}


def test_compare_flags_rows_more_than_five_percent_slower():
    before = [_row("a", 1, 10.0, 10.0, kiln_best_peer=1.0), _row("b", 1, 10.0, 10.0),
              _row("b", 2, 10.0, 10.0), _row("c", 1, 10.0, 10.0), _row("gone", 1, 1.0, 1.0)]
    now = [_row("b", 1, 10.6, 10.0, kiln_best_peer=1.06), _row("a", 1, 10.4, 13.0),
           _row("b", 2, 9.0, 10.0), {"name": "c", "threads": 1, "error": "run: E"},
           _row("new", 1, 1.0, 1.0)]
    changes = summary.compare(now, before)
    assert [(c["name"], c["threads"]) for c in changes] == [("b", 1), ("a", 1), ("b", 2)]
    assert [c["slower"] for c in changes] == [True, False, False]
    assert changes[0]["change"] == pytest.approx(1.06)
    assert changes[2]["change"] == pytest.approx(0.9)
    assert changes[0]["kiln_best_peer"] == 1.06 and changes[1]["kiln_best_peer_before"] == 1.0


def test_machine_class_names_cpu_cores_and_vector_tier():
    assert summary.machine_class(MACHINE) == "amd-epyc-2c-avx512"
    # one CPU name covers EPYCs with and without AVX-512/VNNI (int8 differs by 2x): two classes
    zen2 = MACHINE | {"isa": ["sse4.2", "avx", "avx2", "fma", "f16c"]}
    assert summary.machine_class(zen2) == "amd-epyc-2c-avx2"
    xeon = {"cpu": "Intel(R) Xeon(R) Platinum 8481C CPU @ 2.70GHz", "cores": 4}
    assert summary.machine_class(xeon) == "intel-r-xeon-r-platinum-8481c-cpu-2-70ghz-4c"
    arm = {"cpu": "aarch64", "cores": 8, "arch": "aarch64", "isa": ["neon"]}
    assert summary.machine_class(arm) == "aarch64-8c"


def test_write_summary_compares_with_the_previous_of_the_same_class(tmp_path):
    first = [_row("squeezenet", 1, 10.0, 12.0, 11.0, best_peer="openvino",
                  kiln_best_peer=10 / 11)]
    path, text = summary.write_summary("models", first, MACHINE, note="under load",
                                       folder=tmp_path)
    assert path == tmp_path / "models-amd-epyc-2c-avx512.json"
    assert "No previous summary" in text and "Note: under load" in text
    assert "| squeezenet | 1 | 10.00 | 12.00 | 11.00 | OpenVINO | 0.91 |" in text
    assert path.with_suffix(".md").read_text() == text
    assert "avx2, avx512f" in text and "commit abc123" in text

    later = {**MACHINE, "commit": "def456"}
    slower = [_row("squeezenet", 1, 11.0, 12.0, 11.0, best_peer="openvino", kiln_best_peer=1.0)]
    path, text = summary.write_summary("models", slower, later, folder=tmp_path)
    assert "settings differ" not in text
    saved = json.loads(path.read_text())
    assert saved["previous"]["machine"]["commit"] == "abc123"
    assert [c["slower"] for c in saved["changes"]] == [True]
    assert "| squeezenet | 1 | 10.00 | 11.00 | **1.10** ⚠ slower | 0.91 | 1.00 |" in text
    assert "More than 5% slower: squeezenet at 1." in text

    _, text = summary.write_summary("models", slower, later, settings="target c",
                                    folder=tmp_path)
    assert "(its settings differ: ?)" in text  # the first two runs recorded none

    other = {**MACHINE, "cores": 4}  # another machine class: nothing to compare with
    path, text = summary.write_summary("models", slower, other, folder=tmp_path)
    assert path.name == "models-amd-epyc-4c-avx512.json" and "No previous summary" in text


def test_previous_summary_is_the_committed_one(tmp_path, monkeypatch):
    def git(*args):
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    git("init", "-q")
    path = tmp_path / "results" / "summary" / "models-amd-epyc-2c-avx512.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"machine": MACHINE, "rows": [], "committed": True}))
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "summary")
    path.write_text(json.dumps({"machine": MACHINE, "rows": [], "committed": False}))
    monkeypatch.setattr(summary, "ROOT", tmp_path)
    assert summary.load_previous(path)["committed"] is True
    assert summary.load_previous(tmp_path / "results" / "summary" / "none.json") is None


def test_machine_info_names_this_machine():
    info = summary.machine_info()
    assert info["cores"] >= 1 and info["cpu"] and info["python"].count(".") == 2
    assert info["ort"] and "-" not in (info["openvino"] or "")
    assert info["isa"] is None or all(isinstance(f, str) for f in info["isa"])


def test_llm_summary_rows_compare_fp32_with_onnxruntime_and_q4_with_llama_cpp(tmp_path):
    best = {("ort", "prefill", 16): 100.0, ("fp32", "prefill", 16): 80.0,
            ("q4", "prefill", 16): 90.0, ("llama.cpp", "prefill", 16): 120.0,
            ("ort", "decode", 256): 20.0, ("fp32", "decode", 256): 25.0,
            ("q4", "decode", 256): 50.0, ("llama.cpp", "decode", 256): 40.0}
    rows = llm.summary_rows(["ort", "fp32", "q4", "llama.cpp"], [16], [256], best, 1)
    by_name = {r["name"]: r for r in rows}
    assert list(by_name) == ["fp32 prefill 16", "fp32 decode @256", "q4 prefill 16",
                             "q4 decode @256"]
    assert by_name["fp32 prefill 16"]["kiln_best_peer"] == pytest.approx(0.8)
    assert by_name["fp32 prefill 16"]["best_peer"] == "ort"
    # decode rows are ms per token: 1000/50 over 1000/40
    assert by_name["q4 decode @256"]["kiln_ms"] == pytest.approx(20.0)
    assert by_name["q4 decode @256"]["kiln_best_peer"] == pytest.approx(0.8)
    assert by_name["q4 decode @256"]["best_peer"] == "llama_cpp"
    assert by_name["q4 decode @256"]["ort_ms"] is None
    _, text = summary.write_summary("llm-1t", rows, MACHINE | {"llama_cpp": "0.3.36"},
                                    folder=tmp_path, peers=llm.SUMMARY_PEERS)
    assert "| q4 decode @256 | 1 | 20.00 | - | 25.00 | llama.cpp Q4_1 | 0.80 |" in text
    assert "llama.cpp Q4_1 0.3.36" in text
    # without llama.cpp the quantized rows have no peer
    rows = llm.summary_rows(["ort", "q4"], [16], [], best, 1)
    assert rows[0]["best_peer"] is None and rows[0]["kiln_best_peer"] is None
