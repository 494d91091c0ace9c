"""benchmarks/serve.py's pure logic (stream accounting, best rounds, summary rows) and
serve_launch.py's subprocess handling (a real child process; no timing)."""

from __future__ import annotations

import math
import os
import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[2] / "benchmarks"))
import serve
import serve_launch
import summary

MACHINE = {"cpu": "AMD EPYC", "cores": 2, "arch": "x86_64", "isa": ["avx2", "avx512f"],
           "python": "3.11.9", "numpy": "2.4.6", "kiln": "0.1.0", "llama_cpp": "0.3.36",
           "date": "2026-12-02 05:00 UTC", "commit": "abc123", "loadavg": "1.00 1.00 1.00"}


def _chunk(content=None, role=None, finish=None):
    delta = {k: v for k, v in (("content", content), ("role", role)) if v is not None}
    return {"object": "chat.completion.chunk",
            "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}


def test_stream_tokens_come_from_usage_when_the_server_sends_it():
    events = [(1.0, _chunk(role="assistant")), (1.5, _chunk("Par")), (1.75, _chunk("is")),
              (2.25, _chunk(".")), (2.3, _chunk(finish="stop")),
              (2.3, {"choices": [], "usage": {"prompt_tokens": 37, "completion_tokens": 5}})]
    stats = serve.stream_stats(1.0, events)
    assert stats["tokens"] == 5 and stats["source"] == "usage"
    assert stats["ttft"] == pytest.approx(0.5)
    assert stats["gaps"] == pytest.approx([0.25, 0.5])


def test_stream_tokens_are_the_content_chunks_without_usage():
    # llama-cpp-python 0.3's streams: a role chunk, one content chunk per token, a finish chunk
    events = [(0.0, _chunk(role="assistant")), (0.25, _chunk("The")), (0.5, _chunk(" sea")),
              (0.75, _chunk(finish="stop"))]
    stats = serve.stream_stats(0.0, events)
    assert stats["tokens"] == 2 and stats["source"] == "chunks"
    assert stats["gaps"] == pytest.approx([0.25])
    empty = serve.stream_stats(0.0, [(0.5, _chunk(role="assistant"))])
    assert empty["tokens"] == 0 and math.isnan(empty["ttft"]) and empty["gaps"] == []


def test_level_stats_are_tokens_over_wall_time_and_percentiles_over_all_streams():
    streams = [{"gaps": [0.01, 0.02], "ttft": 0.1, "tokens": 3, "source": "usage"},
               {"gaps": [0.03], "ttft": 0.3, "tokens": 5, "source": "chunks"}]
    r = serve.level_stats(2, streams, wall=4.0)
    assert r["tokens"] == 8 and r["tokens_per_s"] == pytest.approx(2.0)
    assert r["tokens_per_request"] == pytest.approx(4.0)
    assert r["token_source"] == "chunks,usage"
    assert r["tbt_p50_ms"] == pytest.approx(20.0) and r["tbt_p99_ms"] == pytest.approx(30.0)
    assert r["ttft_p50_ms"] == pytest.approx(100.0)  # nearest rank: round(0.5) is 0
    assert r["ttft_p99_ms"] == pytest.approx(300.0)


def test_every_engine_gets_the_same_request_with_llama_cpp_filters_off():
    body = serve.request_body("m", "Hi?", 7, 32)
    assert body["messages"] == [{"role": "user", "content": "Hi?"}]
    assert body["seed"] == 7 and body["max_tokens"] == 32 and body["stream"] is True
    assert body["stream_options"] == {"include_usage": True}
    assert (body["top_k"], body["min_p"], body["repeat_penalty"]) == (0, 0.0, 1.0)
    assert body["repetition_penalty"] == 1.0
    assert "stream_options" not in serve.request_body("m", "Hi?", 7, 1, stream=False)


def test_rounds_alternate_the_engine_order():
    assert serve.round_order(["kiln", "llama.cpp"], 0) == ["kiln", "llama.cpp"]
    assert serve.round_order(["kiln", "llama.cpp"], 1) == ["llama.cpp", "kiln"]


def _level(clients, tps):
    return {"clients": clients, "tokens_per_s": tps, "tbt_p99_ms": 1000 / tps}


def test_best_levels_keep_each_engine_and_concurrency_at_its_fastest_round():
    rounds = {"kiln": [[_level(1, 50.0), _level(4, 100.0)], [_level(1, 60.0), _level(4, 90.0)]],
              "llama.cpp": [[_level(1, 80.0), _level(4, 40.0)]]}
    best = serve.best_levels(rounds)
    assert best[("kiln", 1)]["tokens_per_s"] == 60.0
    assert best[("kiln", 4)]["tokens_per_s"] == 100.0
    assert best[("llama.cpp", 4)]["tokens_per_s"] == 40.0
    assert serve.throughput_ratio(best, 4) == pytest.approx(2.5)
    assert serve.throughput_ratio(best, 16) is None


def test_summary_rows_are_ms_per_token_over_all_clients_beside_llama_cpp(tmp_path):
    best = serve.best_levels({"kiln": [[_level(1, 50.0), _level(16, 400.0)]],
                              "llama.cpp": [[_level(1, 100.0), _level(16, 100.0)]]})
    rows = serve.summary_rows(best, [1, 16], threads=2)
    assert [r["name"] for r in rows] == ["1 clients", "16 clients"]
    assert rows[0]["kiln_ms"] == pytest.approx(20.0) and rows[0]["llama_cpp_ms"] == 10.0
    assert rows[0]["kiln_best_peer"] == pytest.approx(2.0)  # Kiln half the throughput
    assert rows[1]["kiln_best_peer"] == pytest.approx(0.25)
    assert rows[1]["best_peer"] == "llama_cpp"
    _, text = summary.write_summary("serve-2t", rows, MACHINE, folder=tmp_path,
                                    peers=serve.SUMMARY_PEERS)
    assert "| 16 clients | 2 | 2.50 | 10.00 | llama.cpp server | 0.25 |" in text
    assert "llama.cpp server 0.3.36" in text
    # without llama.cpp the rows have no peer; a concurrency Kiln did not run has no row
    alone = serve.summary_rows(serve.best_levels({"kiln": [[_level(1, 50.0)]]}), [1, 4], 2)
    assert len(alone) == 1 and alone[0]["best_peer"] is None


def test_both_engines_get_the_same_threads_and_loopback_port():
    llama = serve_launch.llama_cpp_command("m.gguf", 8123, threads=3, context=2048, alias="a")
    assert llama[llama.index("--n_threads") + 1] == "3"
    assert llama[llama.index("--n_threads_batch") + 1] == "3"
    assert llama[llama.index("--interrupt_requests") + 1] == "False"
    assert llama[llama.index("--port") + 1] == "8123"
    assert llama[llama.index("--host") + 1] == "127.0.0.1"
    kiln = serve_launch.kiln_command("smollm2", 8124, max_batch=16, context=2048,
                                     target="llvm", quantize_weights="q4")
    assert kiln[kiln.index("--port") + 1] == "8124"
    assert kiln[kiln.index("--max-batch") + 1] == "16"
    assert kiln[kiln.index("--quantize-weights") + 1] == "q4"


# a stand-in server: records its pid and KILN_NUM_THREADS, answers GET /v1/models
_SERVER = """
import http.server, os, sys
open(sys.argv[2], "w").write(f"{os.getpid()} {os.environ.get('KILN_NUM_THREADS')}")
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200 if self.path == "/v1/models" else 404)
        self.end_headers()
    def log_message(self, *args):
        pass
http.server.HTTPServer(("127.0.0.1", int(sys.argv[1])), H).serve_forever()
"""


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


def test_launched_server_is_stopped_when_the_block_raises(tmp_path):
    port, info = serve_launch.free_port(), tmp_path / "info"
    cmd = [sys.executable, "-c", _SERVER, str(port), str(info)]
    with pytest.raises(KeyboardInterrupt):
        with serve_launch.launched(cmd, port, {"KILN_NUM_THREADS": "3"}, timeout_s=60) as url:
            assert url == f"http://127.0.0.1:{port}/v1"
            pid, threads = info.read_text().split()
            assert threads == "3" and not _gone(int(pid))
            raise KeyboardInterrupt
    assert _gone(int(pid))  # terminated and reaped: no orphan


def test_a_server_that_exits_before_answering_is_an_error_with_its_output():
    cmd = [sys.executable, "-c", "print('no such model'); raise SystemExit(3)"]
    with pytest.raises(serve_launch.ServerStartError, match="(?s)exited with 3.*no such model"):
        with serve_launch.launched(cmd, serve_launch.free_port(), timeout_s=60):
            pass
