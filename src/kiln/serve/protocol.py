"""OpenAI's API shapes: reading a request body into a :class:`Completion` (or an
:class:`ApiError`), and writing replies, stream chunks and errors.

Supported request fields (others are ignored, as the API ignores unknown ones): ``model``,
``messages`` (chat; ``content`` a string or text parts) or ``prompt`` (completions; a string
or token ids), ``max_tokens`` / ``max_completion_tokens``, ``temperature`` (0: greedy),
``top_p``, ``top_k`` and ``repetition_penalty`` (extensions, as vLLM has them), ``seed``,
``stop`` (a string or up to 4), ``stream``, ``stream_options.include_usage``, ``n`` (1 only).
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from kiln.errors import KilnError
from kiln.llm.sampling import SamplingConfig

MAX_STOP = 4


class ApiError(KilnError):
    """A request the server refuses, as OpenAI's error object.

    Attributes
    ----------
    status : int
        HTTP status (400, 404, 429, ...).
    type, param, code : str or None
        OpenAI's ``error.type``, ``error.param`` (the offending field) and ``error.code``.
    headers : dict
    """

    def __init__(self, message: str, status: int = 400, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None,
                 headers: dict[str, str] | None = None):
        super().__init__(message)
        self.message, self.status, self.type = message, status, type
        self.param, self.code, self.headers = param, code, headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param,
                          "code": self.code}}


@dataclass
class Completion:
    """A validated request.

    Attributes
    ----------
    chat : bool
        ``/v1/chat/completions`` (else ``/v1/completions``).
    model : str
    messages : list of dict or None
        ``{"role", "content"}`` with string content (chat).
    prompt : str or list of int or None
        (completions).
    max_tokens : int or None
        None: up to the end of the context.
    sampling : SamplingConfig
    stop : list of str
    stream, include_usage : bool
    """

    chat: bool
    model: str
    messages: list[dict[str, str]] | None = None
    prompt: str | list[int] | None = None
    max_tokens: int | None = None
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False


def parse_body(raw: bytes) -> dict[str, Any]:
    """The JSON object of a request body.

    Raises
    ------
    ApiError
        If the body is not a JSON object.
    """
    try:
        body = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as err:
        raise ApiError(f"the request body is not valid JSON: {err}", code="invalid_json"
                       ) from err
    if not isinstance(body, dict):
        raise ApiError("the request body must be a JSON object", code="invalid_json")
    return body


def _get(body: dict, name: str, kinds: tuple[type, ...], what: str, default: Any = None,
         parent: str = "") -> Any:
    value = body.get(name)
    if value is None:
        return default
    # bool is an int in Python, not in JSON
    if isinstance(value, bool) != (bool in kinds) or not isinstance(value, kinds):
        param = parent + name
        raise ApiError(f"'{param}' must be {what}, got {json.dumps(value)[:80]}", param=param,
                       code="invalid_type")
    return value


def _range(ok: bool, name: str, message: str) -> None:
    if not ok:
        raise ApiError(f"'{name}' {message}", param=name, code="invalid_value")


def _messages(body: dict) -> list[dict[str, str]]:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise ApiError("'messages' must be a non-empty array", param="messages",
                       code="invalid_type")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"'{where}' must be an object with a string 'role'", param=where,
                           code="invalid_type")
        content = m.get("content")
        if isinstance(content, list):  # content parts: only text ones
            if not all(isinstance(p, dict) and p.get("type") == "text"
                       and isinstance(p.get("text"), str) for p in content):
                raise ApiError(f"'{where}.content' parts must be text parts", param=where,
                               code="invalid_type")
            content = "".join(p["text"] for p in content)
        if not isinstance(content, str):
            raise ApiError(f"'{where}.content' must be a string", param=where,
                           code="invalid_type")
        out.append({"role": m["role"], "content": content})
    return out


def _prompt(body: dict) -> str | list[int]:
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        return prompt
    if (isinstance(prompt, list) and prompt
            and all(isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in prompt)):
        return prompt
    raise ApiError("'prompt' must be a string or an array of token ids (one prompt)",
                   param="prompt", code="invalid_type")


def _sampling(body: dict) -> SamplingConfig:
    num = (int, float)
    temperature = _get(body, "temperature", num, "a number", 1.0)
    _range(0 <= temperature <= 2, "temperature", "must be in [0, 2]")
    top_p = _get(body, "top_p", num, "a number", 1.0)
    _range(0 < top_p <= 1, "top_p", "must be in (0, 1]")
    top_k = _get(body, "top_k", (int,), "an integer", 0)
    _range(top_k >= 0 or top_k == -1, "top_k", "must be >= 0 (or -1: all)")
    penalty = _get(body, "repetition_penalty", num, "a number", 1.0)
    _range(penalty > 0, "repetition_penalty", "must be > 0")
    seed = _get(body, "seed", (int,), "an integer")
    _range(seed is None or seed >= 0, "seed", "must be >= 0")
    return SamplingConfig(do_sample=temperature > 0, temperature=temperature or 1.0,
                          top_k=max(top_k, 0), top_p=top_p, seed=seed,
                          repetition_penalty=penalty)


def parse_completion(body: dict[str, Any], chat: bool) -> Completion:
    """Validate a chat (``chat``) or completions request body.

    Raises
    ------
    ApiError
        400 naming the field: missing, of the wrong type or out of range.
    """
    model = body.get("model")
    if not isinstance(model, str):
        raise ApiError("'model' must be a string", param="model", code="invalid_type")
    max_tokens = _get(body, "max_completion_tokens", (int,), "an integer")
    name = "max_completion_tokens"
    if max_tokens is None:
        max_tokens, name = _get(body, "max_tokens", (int,), "an integer"), "max_tokens"
    _range(max_tokens is None or max_tokens >= 1, name, "must be >= 1")
    n = _get(body, "n", (int,), "an integer", 1)
    _range(n == 1, "n", "must be 1 (one choice per request)")
    stop = body.get("stop")
    stop = [stop] if isinstance(stop, str) else stop or []
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise ApiError("'stop' must be a string or an array of strings", param="stop",
                       code="invalid_type")
    _range(len(stop) <= MAX_STOP, "stop", f"may hold at most {MAX_STOP} strings")
    stream = _get(body, "stream", (bool,), "a boolean", False)
    options = _get(body, "stream_options", (dict,), "an object", {})
    usage = _get(options, "include_usage", (bool,), "a boolean", False, "stream_options.")
    return Completion(chat, model, _messages(body) if chat else None,
                      None if chat else _prompt(body), max_tokens, _sampling(body), stop,
                      stream, usage)


class Reply:
    """The reply's id, creation time and the shapes of its JSON (one per request)."""

    def __init__(self, req: Completion):
        self.chat = req.chat
        self.model = req.model
        self.id = ("chatcmpl-" if req.chat else "cmpl-") + uuid.uuid4().hex[:24]
        self.created = int(time.time())

    @staticmethod
    def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    def _head(self, obj: str) -> dict[str, Any]:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model}

    def full(self, text: str, finish: str, usage: dict[str, int]) -> dict[str, Any]:
        """The non-streaming reply."""
        if self.chat:
            choice = {"index": 0, "message": {"role": "assistant", "content": text},
                      "logprobs": None, "finish_reason": finish}
            return {**self._head("chat.completion"), "choices": [choice], "usage": usage}
        choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice], "usage": usage}

    def chunk(self, text: str | None, finish: str | None = None,
              first: bool = False) -> dict[str, Any]:
        """One stream chunk: new text, or (``text`` None) the last one with ``finish``."""
        if self.chat:
            delta: dict[str, Any] = {} if text is None else {"content": text}
            if first:
                delta = {"role": "assistant", **delta}
            choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            return {**self._head("chat.completion.chunk"), "choices": [choice]}
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish}
        return {**self._head("text_completion"), "choices": [choice]}

    def usage_chunk(self, usage: dict[str, int]) -> dict[str, Any]:
        """The extra last chunk of ``stream_options.include_usage``: no choices, the usage."""
        obj = "chat.completion.chunk" if self.chat else "text_completion"
        return {**self._head(obj), "choices": [], "usage": usage}


def sse(data: dict[str, Any] | str) -> bytes:
    """One server-sent event: ``data: <json>`` and a blank line."""
    text = data if isinstance(data, str) else json.dumps(data, separators=(",", ":"))
    return f"data: {text}\n\n".encode()
