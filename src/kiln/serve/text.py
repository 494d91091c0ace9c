"""Token ids to text as it grows, with OpenAI's ``stop`` strings.

The text of all ids so far is decoded again after each token (a byte-level BPE piece can be
half a UTF-8 character, shown as U+FFFD until the rest arrives), and only what can no longer
change is released: nothing while the text ends in U+FFFD, and never a tail that could still
grow into a stop string. A stop string ends the reply before it (it is not part of the reply,
as in OpenAI's API).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence


class IncrementalText:
    """The released text of one reply.

    Parameters
    ----------
    decode : callable
        ``decode(ids) -> str``.
    stop : list of str
        Stop strings (empty strings are ignored).

    Attributes
    ----------
    text : str
        Everything released so far.
    stopped : bool
        Whether a stop string was found (push nothing more).
    """

    def __init__(self, decode: Callable[[list[int]], str], stop: Sequence[str] = ()):
        self._decode = decode
        self._stop = [s for s in stop if s]
        self._ids: list[int] = []
        self.text = ""
        self.stopped = False

    def push(self, token_id: int) -> str:
        """Add one token; returns the newly released text (often empty)."""
        self._ids.append(token_id)
        full = self._decode(self._ids)
        cut = min((i for i in (full.find(s) for s in self._stop) if i >= 0), default=-1)
        if cut >= 0:
            self.stopped = True
            return self._release(full[:cut])
        if full.endswith("\ufffd"):
            return ""
        return self._release(full[:len(full) - self._held(full)])

    def flush(self) -> str:
        """The reply ended without a stop string: release the rest."""
        if self.stopped:
            return ""
        return self._release(self._decode(self._ids))

    def _held(self, full: str) -> int:
        """Length of the longest tail of ``full`` that begins a stop string."""
        for n in range(min(len(full), max((len(s) for s in self._stop), default=0)), 0, -1):
            if any(s.startswith(full[-n:]) for s in self._stop):
                return n
        return 0

    def _release(self, upto: str) -> str:
        new = upto[len(self.text):] if upto.startswith(self.text) else ""
        self.text += new
        return new
