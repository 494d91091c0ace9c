"""The ASGI application: OpenAI's ``/v1/chat/completions``, ``/v1/completions`` and
``/v1/models``, and ``/health``, over one :class:`~kiln.serve.scheduler.Scheduler`.

Each request submits one sequence and reads its events from an asyncio queue that the engine
thread fills (``call_soon_threadsafe``). When the client goes away (a stream's write fails, or
``http.disconnect`` arrives while a non-streaming reply is pending) the sequence is cancelled,
which frees its slot before the next decode step. Every refusal is OpenAI's error object;
an unexpected failure is a 500 of the same shape, never the end of the server.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from kiln.errors import KilnError
from kiln.serve.model import ServedModel
from kiln.serve.protocol import (
    ApiError,
    Completion,
    Reply,
    parse_body,
    parse_completion,
    sse,
)
from kiln.serve.scheduler import GenerationRequest, QueueFull, Scheduler, Stream
from kiln.serve.text import IncrementalText

log = logging.getLogger("kiln.serve")
#: seconds a client told 429 should wait (``Retry-After``)
RETRY_AFTER_S = 1


def _error(err: ApiError) -> JSONResponse:
    return JSONResponse(err.body(), status_code=err.status, headers=err.headers)


class _Events:
    """One submitted sequence's events, on the event loop."""

    def __init__(self, scheduler: Scheduler, request: GenerationRequest):
        loop = asyncio.get_running_loop()
        self.queue: asyncio.Queue = asyncio.Queue()
        self.scheduler = scheduler
        self.stream: Stream = scheduler.submit(
            request, lambda ev: loop.call_soon_threadsafe(self.queue.put_nowait, ev))

    async def __aiter__(self) -> AsyncIterator[tuple[str, object]]:
        while True:
            kind, value = await self.queue.get()
            yield kind, value
            if kind != "token":
                return

    def cancel(self) -> None:
        self.scheduler.cancel(self.stream)


class _Stream(StreamingResponse):
    """A streaming response that cancels its sequence however it ends (finished, the
    client gone, the server stopping)."""

    def __init__(self, body, events: _Events):
        super().__init__(body, media_type="text/event-stream",
                         headers={"Cache-Control": "no-cache"})
        self._events = events

    async def __call__(self, scope, receive, send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self._events.cancel()


class Api:
    """The routes over ``model`` and ``scheduler`` (started and stopped by the caller)."""

    def __init__(self, model: ServedModel, scheduler: Scheduler):
        self.model = model
        self.scheduler = scheduler

    def app(self) -> Starlette:
        routes = [Route("/health", self.health), Route("/v1/models", self.models),
                  Route("/v1/chat/completions", self.chat, methods=["POST"]),
                  Route("/v1/completions", self.completions, methods=["POST"])]
        return Starlette(routes=routes, exception_handlers={
            HTTPException: self._http_error, Exception: self._crash})

    async def _http_error(self, request: Request, exc: HTTPException) -> JSONResponse:
        """Starlette's own refusals (no such route: 404, wrong method: 405) in OpenAI's
        shape."""
        return _error(ApiError(f"{request.method} {request.url.path}: {exc.detail}",
                               exc.status_code, code="not_found" if exc.status_code == 404
                               else "method_not_allowed", headers=dict(exc.headers or {})))

    async def _crash(self, request: Request, exc: Exception) -> JSONResponse:
        log.exception("request failed", exc_info=exc)
        return _error(ApiError(f"internal error: {type(exc).__name__}", 500, "server_error"))

    async def health(self, request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok", "model": self.model.name,
                             "slots_in_use": self.scheduler.slots_in_use,
                             "max_batch": self.scheduler.max_batch,
                             "waiting": self.scheduler.waiting})

    async def models(self, request: Request) -> JSONResponse:
        return JSONResponse({"object": "list", "data": [
            {"id": self.model.name, "object": "model", "created": 0, "owned_by": "kiln"}]})

    async def chat(self, request: Request) -> Response:
        return await self._complete(request, chat=True)

    async def completions(self, request: Request) -> Response:
        return await self._complete(request, chat=False)

    async def _complete(self, request: Request, chat: bool) -> Response:
        try:
            req = parse_completion(parse_body(await request.body()), chat)
            prompt, gen = self._generation(req)
            events = self._submit(gen)
        except ApiError as err:
            return _error(err)
        reply = Reply(req)
        if req.stream:
            return _Stream(self._sse(req, reply, prompt, events), events)
        return await self._full(request, req, reply, prompt, events)

    def _generation(self, req: Completion) -> tuple[list[int], GenerationRequest]:
        if req.model != self.model.name:
            raise ApiError(f"the model '{req.model}' does not exist (this server has "
                           f"'{self.model.name}')", param="model", code="model_not_found")
        tok = self.model.tokenizer
        try:
            prompt = (tok.encode(tok.apply_chat_template(req.messages)) if req.chat else
                      tok.encode(req.prompt) if isinstance(req.prompt, str) else req.prompt)
        except KilnError as err:
            raise ApiError(str(err), param="messages" if req.chat else "prompt") from err
        if not prompt:
            raise ApiError("the prompt has no tokens", param="prompt")
        vocab_limit = max(prompt)
        if not req.chat and vocab_limit >= self._vocab():
            raise ApiError(f"token id {vocab_limit} is outside the vocabulary",
                           param="prompt", code="invalid_value")
        room = self.model.context_length - len(prompt)
        max_tokens = req.max_tokens if req.max_tokens is not None else room
        if max_tokens > room or room < 1:
            raise ApiError(f"this model's context is {self.model.context_length} tokens; the "
                           f"prompt has {len(prompt)} and {max_tokens} more were asked for",
                           param="max_tokens" if room >= 1 else "messages",
                           code="context_length_exceeded")
        return prompt, GenerationRequest(prompt, max_tokens, req.sampling,
                                         frozenset([tok.eos_token_id]))

    def _vocab(self) -> int:
        size = getattr(self.model.tokenizer, "vocab_size", None)
        if size is None:
            size = self.model.tokenizer.tokenizer.get_vocab_size()
        return int(size)

    def _submit(self, gen: GenerationRequest) -> _Events:
        try:
            return _Events(self.scheduler, gen)
        except QueueFull as err:
            raise ApiError(f"the server is busy: {err}; retry in {RETRY_AFTER_S} s", 429,
                           "rate_limit_exceeded", code="queue_full",
                           headers={"Retry-After": str(RETRY_AFTER_S)}) from err

    async def _full(self, request: Request, req: Completion, reply: Reply, prompt: list[int],
                    events: _Events) -> Response:
        text = IncrementalText(self.model.tokenizer.decode, req.stop)
        gone = asyncio.ensure_future(_disconnected(request))
        try:
            finish, count = await _race(self._collect(text, events), gone)
        finally:
            gone.cancel()
            events.cancel()
        if finish is None:  # the client left; nobody reads this
            return Response(status_code=499)
        if finish.startswith("error:"):
            return _error(ApiError(finish, 500, "server_error"))
        return JSONResponse(reply.full(text.text, finish, Reply.usage(len(prompt), count)))

    async def _collect(self, text: IncrementalText, events: _Events) -> tuple[str, int]:
        count = 0
        async for kind, value in events:
            if kind == "token":
                count += 1
                text.push(int(value))
                if text.stopped:
                    return "stop", count
            elif kind == "error":
                return f"error: {value}", count
            else:
                text.flush()
                return str(value), count
        return "stop", count

    async def _sse(self, req: Completion, reply: Reply, prompt: list[int],
                   events: _Events) -> AsyncIterator[bytes]:
        text = IncrementalText(self.model.tokenizer.decode, req.stop)
        count, finish = 0, "stop"
        if req.chat:
            yield sse(reply.chunk("", first=True))
        async for kind, value in events:
            if kind == "token":
                count += 1
                piece = text.push(int(value))
                if piece:
                    yield sse(reply.chunk(piece))
                if text.stopped:
                    events.cancel()
                    break
            elif kind == "error":
                yield sse(ApiError(str(value), 500, "server_error").body())
                return
            else:
                finish = str(value)
                piece = text.flush()
                if piece:
                    yield sse(reply.chunk(piece))
        yield sse(reply.chunk(None, finish))
        if req.include_usage:
            yield sse(reply.usage_chunk(Reply.usage(len(prompt), count)))
        yield sse("[DONE]")


async def _disconnected(request: Request) -> None:
    """Returns when the client has gone (after the body was read, ``receive`` has nothing
    else to say)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


async def _race(work, gone: asyncio.Future):
    task = asyncio.ensure_future(work)
    done, _ = await asyncio.wait({task, gone}, return_when=asyncio.FIRST_COMPLETED)
    if task in done:
        return task.result()
    task.cancel()
    return None, 0
