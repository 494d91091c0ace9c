"""The continuous-batching scheduler over a decoder that checks masks and positions: every
sequence gets exactly what a lone generate() gives it, whenever it joins or leaves; slots,
the bounded queue and cancellation."""

from __future__ import annotations

import queue
import threading
import time

import numpy as np
import pytest
from serve_helpers import VOCAB, fake_decoder

from kiln.errors import KilnError
from kiln.llm import SamplingConfig, generate
from kiln.serve.batch import KVBatch
from kiln.serve.scheduler import GenerationRequest, QueueFull, Scheduler

RNG = np.random.default_rng(0)
PROMPTS = [list(RNG.integers(1, VOCAB, n)) for n in (1, 7, 3, 12, 5, 2, 9, 4, 6, 11)]


def _collect(events: queue.Queue, timeout: float = 10.0) -> tuple[list[int], str]:
    tokens = []
    while True:
        kind, value = events.get(timeout=timeout)
        if kind == "token":
            tokens.append(value)
        else:
            return tokens, value


def _submit(sched, prompt, max_tokens, stops=frozenset(), sampling=None):
    events: queue.Queue = queue.Queue()
    req = GenerationRequest([int(t) for t in prompt], max_tokens, sampling or SamplingConfig(),
                            frozenset(stops))
    return sched.submit(req, events.put), events


@pytest.fixture
def sched():
    s = Scheduler(fake_decoder(), max_batch=4, max_queue=16)
    s.start()
    yield s
    s.stop()


def test_kv_batch_right_aligns_rows_and_trims_padding():
    batch = KVBatch(1, (1, 1))
    batch.add([np.full((3, 1, 1, 1), 1.0, np.float32)])
    batch.add([np.full((5, 1, 1, 1), 2.0, np.float32)])
    assert batch.lengths == [3, 5] and batch.cache[0].shape == (5, 2, 1, 1)
    ids, mask, pos = batch.step_inputs([7, 8])
    assert mask.tolist() == [[0, 0, 1, 1, 1, 1], [1, 1, 1, 1, 1, 1]]
    assert pos.ravel().tolist() == [3, 5] and ids.ravel().tolist() == [7, 8]
    batch.remove([1])
    assert batch.lengths == [3] and batch.cache[0][:, 0, 0, 0].tolist() == [1.0] * 3


def test_each_sequence_gets_its_lone_tokens_while_others_join_and_leave(sched):
    lone = [generate(fake_decoder(), [p], max_new_tokens=4 + i % 5).tokens[0]
            for i, p in enumerate(PROMPTS)]
    handles = []
    for i, p in enumerate(PROMPTS):  # 10 requests for 4 slots, arriving during decoding
        handles.append(_submit(sched, p, 4 + i % 5))
        time.sleep(0.002 * (i % 3))
    got = [_collect(ev) for _, ev in handles]
    assert [t for t, _ in got] == lone
    assert all(reason == "length" for _, reason in got)
    assert sched.steps > 0 and sched.slots_in_use == 0


def test_stop_token_ends_a_sequence_without_emitting_it(sched):
    full = generate(fake_decoder(), [PROMPTS[3]], max_new_tokens=6).tokens[0]
    _, ev = _submit(sched, PROMPTS[3], 6, stops={full[2]})
    assert _collect(ev) == (full[:full.index(full[2])], "stop")


def test_sampled_sequences_repeat_with_their_seed(sched):
    cfg = SamplingConfig(do_sample=True, temperature=0.8, seed=3, repetition_penalty=1.2)
    runs = [_collect(_submit(sched, PROMPTS[1], 8, sampling=cfg)[1]) for _ in range(2)]
    assert runs[0] == runs[1]


def test_cancel_frees_the_slot_before_the_next_step():
    gate = threading.Event()
    inner = fake_decoder()

    def slow(inputs):
        gate.wait(5)
        return inner.run(inputs)

    dec = fake_decoder()
    dec.run = slow
    s = Scheduler(dec, max_batch=2, max_queue=0)
    s.start()
    try:
        a, ev_a = _submit(s, PROMPTS[0], 1000)
        b, ev_b = _submit(s, PROMPTS[1], 1000)
        with pytest.raises(QueueFull):  # 2 slots, no queue
            _submit(s, PROMPTS[2], 3)
        gate.set()
        deadline = time.monotonic() + 5
        while s.slots_in_use < 2 and time.monotonic() < deadline:
            time.sleep(0.001)
        s.cancel(a)
        assert _collect(ev_a)[1] == "cancelled"
        while s.slots_in_use != 1 and time.monotonic() < deadline:
            time.sleep(0.001)
        assert s.slots_in_use == 1
        _, ev_c = _submit(s, PROMPTS[2], 3)  # the freed slot takes a new request
        assert len(_collect(ev_c)[0]) == 3
        s.cancel(b)
        assert _collect(ev_b)[1] == "cancelled"
    finally:
        s.stop()


def test_a_failing_decoder_fails_its_requests_not_the_engine():
    calls = {"n": 0}
    inner = fake_decoder()

    def flaky(inputs):
        calls["n"] += 1
        if calls["n"] == 2:
            raise RuntimeError("boom")
        return inner.run(inputs)

    dec = fake_decoder()
    dec.run = flaky
    s = Scheduler(dec, max_batch=2)
    s.start()
    try:
        kind = _collect(_submit(s, PROMPTS[0], 5)[1])
        assert kind == ([int(generate(inner, [PROMPTS[0]], 1).tokens[0][0])],
                        "decode step failed: boom")
        assert len(_collect(_submit(s, PROMPTS[0], 5)[1])[0]) == 5
    finally:
        s.stop()


def test_scheduler_rejects_bad_settings_and_requests():
    with pytest.raises(KilnError, match="max_batch"):
        Scheduler(fake_decoder(), max_batch=65)
    with pytest.raises(KilnError, match="max_queue"):
        Scheduler(fake_decoder(), max_queue=-1)
    with pytest.raises(KilnError, match="max_tokens"):
        Scheduler(fake_decoder()).submit(GenerationRequest([1], 0), print)


def test_an_engine_failure_outside_the_decoder_fails_requests_and_the_engine_goes_on(
        monkeypatch):
    s = Scheduler(fake_decoder(), max_batch=2)
    real_add = KVBatch.add
    monkeypatch.setattr(KVBatch, "add", lambda self, rows: 1 / 0)
    s.start()
    try:
        assert _collect(_submit(s, PROMPTS[0], 5)[1])[1].startswith("engine failed")
        monkeypatch.setattr(KVBatch, "add", real_add)
        assert len(_collect(_submit(s, PROMPTS[0], 5)[1])[0]) == 5
    finally:
        s.stop()
