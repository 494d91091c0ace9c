"""Continuous batching: one engine thread steps the decoder over every running sequence.

Between two decode steps the engine drops the sequences that finished or were cancelled (a
client that went away), then admits waiting requests while there are free slots: each joins
after a prefill of its own prompt (batch 1, past 0, the same call as a lone
:func:`kiln.llm.generate`), its cache becoming one row of the shared :class:`KVBatch`. The
next step decodes one token for every row. A request waits in a bounded queue while all
``max_batch`` slots are busy; :meth:`Scheduler.submit` raises :class:`QueueFull` when that
queue is full too.

Results leave through the ``emit`` callable given with each request, called on the engine
thread with one event at a time: ``("token", id)`` per new token, then ``("finish", reason)``
(``"stop"``: a stop token; ``"length"``: ``max_tokens``; ``"cancelled"``) or
``("error", message)`` when the decoder failed.
"""

from __future__ import annotations

import collections
import itertools
import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.errors import KilnError
from kiln.llm.decoder import Decoder
from kiln.llm.sampling import SamplingConfig, next_tokens
from kiln.serve.batch import KVBatch

log = logging.getLogger("kiln.serve")
Event = tuple[str, object]


class QueueFull(KilnError):  # noqa: N818 (the name says what happened, as queue.Full does)
    """Every slot is busy and the waiting queue is full: retry later."""


@dataclass
class GenerationRequest:
    """One sequence to generate.

    Attributes
    ----------
    prompt : list of int
        Token ids (at least one).
    max_tokens : int
        The most new tokens (>= 1).
    sampling : SamplingConfig
    stop_token_ids : frozenset of int
        The sequence ends at the first of these (not emitted).
    """

    prompt: list[int]
    max_tokens: int
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop_token_ids: frozenset[int] = frozenset()


@dataclass(eq=False)
class Stream:
    """A submitted request and its decoding state (written by the engine thread; ``cancel``
    sets ``cancelled``)."""

    id: int
    request: GenerationRequest
    emit: Callable[[Event], None]
    rng: np.random.Generator
    tokens: list[int] = field(default_factory=list)
    pending: int = -1  # the last picked token, fed to the next step
    cancelled: bool = False
    finished: bool = False


class Scheduler:
    """The engine: a thread that runs ``decoder`` over up to ``max_batch`` sequences at once.

    Parameters
    ----------
    decoder : Decoder
        Any :class:`kiln.llm.Decoder` (Kiln's VM decoder; onnxruntime's; a test's).
    max_batch : int
        Slots: sequences decoded together (1..64, the decoder's batch bound).
    max_queue : int
        Requests that may wait for a slot (>= 0).

    Raises
    ------
    KilnError
        If ``max_batch`` or ``max_queue`` is out of range.
    """

    def __init__(self, decoder: Decoder, max_batch: int = 8, max_queue: int = 64):
        if not 1 <= max_batch <= 64:
            raise KilnError(f"max_batch must be in 1..64, got {max_batch}")
        if max_queue < 0:
            raise KilnError(f"max_queue must be >= 0, got {max_queue}")
        self.decoder = decoder
        self.max_batch = max_batch
        self.max_queue = max_queue
        self._cond = threading.Condition()
        self._waiting: collections.deque[Stream] = collections.deque()
        self._rows: list[Stream] = []  # row b of self._batch; engine thread only
        self._admitting = 0  # taken from the queue, being prefilled: their slots are taken
        self._batch = KVBatch(decoder.num_cache_tensors, decoder.kv_shape)
        self._ids = itertools.count()
        self._stopping = False
        self._thread: threading.Thread | None = None
        self.steps = 0  # decode steps run (tests, benchmarks)
        self.peak_batch = 0  # the most rows one decode step has run

    # -- the callers' side (any thread) -------------------------------------------------
    @property
    def slots_in_use(self) -> int:
        """Sequences holding a slot now (a row of the batch, or being prefilled for one)."""
        return len(self._rows) + self._admitting

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    def start(self) -> None:
        """Start the engine thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="kiln-serve-engine",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        """Cancel everything and end the engine thread."""
        with self._cond:
            self._stopping = True
            self._cond.notify()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def submit(self, request: GenerationRequest, emit: Callable[[Event], None]) -> Stream:
        """Queue ``request``; its events go to ``emit`` (on the engine thread).

        Raises
        ------
        QueueFull
            When all slots are busy and ``max_queue`` requests already wait.
        KilnError
            For an empty prompt or ``max_tokens < 1``.
        """
        if not request.prompt or request.max_tokens < 1:
            raise KilnError("a request needs a prompt and max_tokens >= 1")
        seq = Stream(next(self._ids), request, emit,
                        np.random.default_rng(request.sampling.seed))
        with self._cond:
            if self._stopping:
                raise KilnError("the server is shutting down")
            free = self.max_batch - self.slots_in_use - len(self._waiting)
            if free <= 0 and len(self._waiting) >= self.max_queue:
                raise QueueFull(f"all {self.max_batch} slots are busy and {self.max_queue} "
                                "requests are waiting")
            self._waiting.append(seq)
            self._cond.notify()
        return seq

    def cancel(self, seq: Stream) -> None:
        """Stop generating for ``seq`` (a no-op once it finished): a waiting one leaves the
        queue now, a running one frees its slot before the next step."""
        with self._cond:
            if seq.finished or seq.cancelled:
                return
            seq.cancelled = True
            if seq in self._waiting:
                self._waiting.remove(seq)
                self._finish(seq, "cancelled")
            self._cond.notify()

    # -- the engine thread ---------------------------------------------------------------
    def _run(self) -> None:
        while True:
            with self._cond:
                while not (self._stopping or self._waiting or self._rows):
                    self._cond.wait()
                if self._stopping:
                    break
                admit = []
                while self._waiting and len(self._rows) + len(admit) < self.max_batch:
                    admit.append(self._waiting.popleft())
                self._admitting = len(admit)
            try:
                self._iterate(admit)
            except Exception as err:  # a bug here must fail requests, not hang them all
                log.exception("engine step failed")
                for seq in admit + self._rows:
                    self._finish(seq, f"engine failed: {err}", "error")
                self._rows = []
                self._batch = KVBatch(self.decoder.num_cache_tensors, self.decoder.kv_shape)
                self._admitting = 0
        self._drop(list(range(len(self._rows))), "cancelled")
        for seq in list(self._waiting):
            self._finish(seq, "cancelled")
        self._waiting.clear()

    def _iterate(self, admit: list[Stream]) -> None:
        """One round: drop the cancelled, prefill the admitted, decode a step."""
        self._drop([b for b, s in enumerate(self._rows) if s.cancelled], "cancelled")
        for seq in admit:
            self._prefill(seq)
            self._admitting -= 1
        if self._rows:
            self._step()

    def _finish(self, seq: Stream, reason: str, kind: str = "finish") -> None:
        if not seq.finished:
            seq.finished = True
            _emit(seq, (kind, reason))

    def _drop(self, rows: Sequence[int], reason: str) -> None:
        if not rows:
            return
        for b in rows:
            self._finish(self._rows[b], reason)
        self._batch.remove(rows)
        drop = set(rows)
        self._rows = [s for b, s in enumerate(self._rows) if b not in drop]

    def _prefill(self, seq: Stream) -> None:
        if seq.cancelled:
            self._finish(seq, "cancelled")
            return
        prompt = np.asarray(seq.request.prompt, np.int64)[None]
        n = prompt.shape[1]
        try:
            logits, present = self.decoder(prompt, np.ones_like(prompt),
                                           np.arange(n, dtype=np.int64)[None],
                                           self.decoder.empty_cache(1))
        except Exception as err:  # the decoder's error ends this request, not the server
            log.exception("prefill failed")
            self._finish(seq, f"prefill failed: {err}", "error")
            return
        if self._pick(seq, logits[:, -1]):
            self._batch.add(present)
            self._rows.append(seq)
        else:
            self._finish(seq, "cancelled")  # a no-op unless it was cancelled meanwhile

    def _step(self) -> None:
        ids, mask, pos = self._batch.step_inputs([s.pending for s in self._rows])
        try:
            logits, present = self.decoder(ids, mask, pos, self._batch.cache)
        except Exception as err:  # fail the batch, keep serving
            log.exception("decode step failed")
            for seq in self._rows:
                self._finish(seq, f"decode step failed: {err}", "error")
            self._drop(list(range(len(self._rows))), "error")
            return
        self.steps += 1
        self.peak_batch = max(self.peak_batch, len(self._rows))
        self._batch.advance(present)
        done = [b for b, seq in enumerate(self._rows) if not self._pick(seq, logits[b:b + 1, -1])]
        self._drop(done, "cancelled")  # those not already finished by a stop or the length

    def _pick(self, seq: Stream, logits: np.ndarray) -> bool:
        """Pick ``seq``'s next token from ``logits`` ``[1, vocab]`` and emit it; whether the
        sequence goes on."""
        req = seq.request
        context = ([req.prompt + seq.tokens] if req.sampling.repetition_penalty != 1.0
                   else None)
        t = int(next_tokens(logits, req.sampling, seq.rng, context)[0])
        if t in req.stop_token_ids:
            self._finish(seq, "stop")
            return False
        seq.tokens.append(t)
        seq.pending = t
        _emit(seq, ("token", t))
        if len(seq.tokens) >= req.max_tokens:
            self._finish(seq, "length")
            return False
        return not seq.cancelled


def _emit(seq: Stream, event: Event) -> None:
    try:
        seq.emit(event)
    except Exception:  # a consumer's failure (a closed event loop) must not stop the engine
        log.exception("emit failed for request %d", seq.id)
