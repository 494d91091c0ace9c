"""kiln serve end to end on loopback: the tiny llama decoder (random weights) compiled for the
VM, served in-process on a free port and driven through the official openai client (and raw
HTTP for what the client hides)."""

from __future__ import annotations

import asyncio
import json
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import onnx
import pytest
from serve_helpers import CharTokenizer
from test_llama_decoder import CFG, _weights

openai = pytest.importorskip("openai")

from kiln.llm import Decoder, compiled_decoder_path, generate, kiln_decoder  # noqa: E402
from kiln.models.llama_onnx import llama_onnx  # noqa: E402
from kiln.serve.model import ServedModel, vm_decoder  # noqa: E402
from kiln.serve.server import ServerThread  # noqa: E402

NAME = "tiny-llama"
TOK = CharTokenizer()
QUESTIONS = ["Hi!", "What is 2+2?", "Name a colour.", "Say something long, please.", "Why?",
             "Count to five.", "A haiku on rust?", "Hello there, how are you today?"]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    path = root / "tiny_llama.onnx"
    onnx.save(llama_onnx(CFG, _weights(CFG), "tiny_llama"), path)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KILN_CACHE_DIR", str(root / "cache"))
        yield path, kiln_decoder(path, "llvm"), compiled_decoder_path(path, "llvm")


@pytest.fixture(scope="module")
def decoder(tiny):
    return tiny[1]


def test_a_compiled_vm_library_serves_as_a_decoder(tiny):
    _, dec, so = tiny
    lib = vm_decoder(so)
    assert (lib.input_names, lib.kv_shape) == (dec.input_names, dec.kv_shape)
    assert generate(lib, [[5, 6, 7]], 8).tokens == generate(dec, [[5, 6, 7]], 8).tokens


def _model(decoder: Decoder, delay_s: float = 0.0) -> ServedModel:
    if delay_s:
        inner = decoder.run

        def run(inputs):
            time.sleep(delay_s)
            return inner(inputs)

        decoder = Decoder(run, decoder.input_names, decoder.kv_shape, decoder.engine)
    return ServedModel(NAME, decoder, TOK, CFG.context)


@pytest.fixture(scope="module")
def server(decoder):
    with ServerThread(_model(decoder), max_batch=8, max_queue=8) as srv:
        yield srv


@pytest.fixture
def client(server):
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0,
                         timeout=60)


def _lone(decoder: Decoder, question: str, max_tokens: int) -> tuple[str, int, str]:
    ids = TOK.encode(TOK.apply_chat_template([{"role": "user", "content": question}]))
    gen = generate(decoder, [ids], max_new_tokens=max_tokens, stop_token_ids=[TOK.eos_token_id])
    return TOK.decode(gen.tokens[0]), len(gen.tokens[0]), gen.finish_reasons[0]


def _chat(question: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": question}]


def test_models_and_health(client, server):
    assert [m.id for m in client.models.list().data] == [NAME]
    health = httpx.get(server.url + "/health").json()
    assert health["status"] == "ok" and health["max_batch"] == 8


def test_chat_non_streaming_equals_a_lone_greedy_run(client, decoder):
    reply = client.chat.completions.create(model=NAME, messages=_chat(QUESTIONS[1]),
                                           temperature=0, max_tokens=20)
    text, count, finish = _lone(decoder, QUESTIONS[1], 20)
    assert reply.choices[0].message.content == text
    assert reply.choices[0].finish_reason == finish
    prompt = len(TOK.encode(TOK.apply_chat_template(_chat(QUESTIONS[1]))))
    assert (reply.usage.prompt_tokens, reply.usage.completion_tokens) == (prompt, count)
    assert reply.usage.total_tokens == prompt + count


def test_chat_streaming_chunks_and_usage(client, decoder):
    stream = client.chat.completions.create(model=NAME, messages=_chat(QUESTIONS[0]),
                                            temperature=0, max_tokens=16, stream=True,
                                            stream_options={"include_usage": True})
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    expected, count, finish = _lone(decoder, QUESTIONS[0], 16)
    assert text == expected
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == finish
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == count


def test_completions_with_a_stop_sequence(client, decoder):
    prompt = "The quick brown fox"
    full = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=24)
    text = full.choices[0].text
    assert len(text) >= 8, text  # random weights: some text to cut
    stop = text[4:7]
    cut = client.completions.create(model=NAME, prompt=prompt, temperature=0, max_tokens=24,
                                    stop=[stop])
    assert cut.choices[0].text == text[:text.index(stop)]
    assert cut.choices[0].finish_reason == "stop"
    streamed = client.completions.create(model=NAME, prompt=prompt, temperature=0,
                                         max_tokens=24, stop=stop, stream=True)
    assert "".join(c.choices[0].text for c in streamed) == text[:text.index(stop)]


def test_bad_requests_are_bad_request_errors(client):
    for kwargs in ({"model": "gpt-4o"}, {"max_tokens": -3}, {"max_tokens": CFG.context},
                   {"temperature": 7}):
        args = {"model": NAME, "messages": _chat("hi"), **kwargs}
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(**args)
        body = err.value.body
        assert set(body) == {"message", "type", "param", "code"}, body
    assert err.value.status_code == 400


@pytest.mark.parametrize("raw", [b"{not json", b"[]", b'{"model": "tiny-llama"}',
                                 b'{"model": "tiny-llama", "messages": [{"role": 1}]}',
                                 b'{"model": "tiny-llama", "messages": "hi", "stream": 1}'])
def test_malformed_bodies_are_400s_of_openai_shape(server, raw):
    reply = httpx.post(server.url + "/v1/chat/completions", content=raw,
                       headers={"Content-Type": "application/json"})
    assert reply.status_code == 400
    assert set(reply.json()["error"]) == {"message", "type", "param", "code"}
    assert httpx.get(server.url + "/health").json()["status"] == "ok"


def test_unknown_routes_and_methods_answer_in_openai_shape(server):
    for method, path, status in (("GET", "/v1/nothing", 404),
                                 ("GET", "/v1/chat/completions", 405)):
        reply = httpx.request(method, server.url + path)
        assert reply.status_code == status
        assert set(reply.json()["error"]) == {"message", "type", "param", "code"}


def test_eight_concurrent_streams_each_get_their_lone_greedy_tokens(server, decoder):
    async def one(client, question):
        stream = await client.chat.completions.create(
            model=NAME, messages=_chat(question), temperature=0, max_tokens=32, stream=True,
            stream_options={"include_usage": True})
        pieces, usage = [], None
        async for chunk in stream:
            if chunk.choices:
                pieces.append(chunk.choices[0].delta.content or "")
            usage = chunk.usage or usage
        return "".join(pieces), usage.completion_tokens

    async def all_of_them():
        client = openai.AsyncOpenAI(base_url=server.url + "/v1", api_key="unused",
                                    max_retries=0)
        return await asyncio.gather(*(one(client, q) for q in QUESTIONS))

    got = asyncio.run(all_of_them())
    assert got == [_lone(decoder, q, 32)[:2] for q in QUESTIONS]
    assert sum(n for _, n in got) > 8 * 4  # random weights, but replies, not stop tokens
    assert server.scheduler.peak_batch >= 4  # they were decoded together
    assert server.scheduler.slots_in_use == 0


def _wait_for(predicate, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_a_disconnect_mid_stream_frees_the_slot(decoder):
    with ServerThread(_model(decoder, delay_s=0.01), max_batch=2) as srv:
        body = {"model": NAME, "messages": _chat("Tell me a story."), "temperature": 0,
                "max_tokens": 200, "stream": True}
        with httpx.stream("POST", srv.url + "/v1/chat/completions", json=body) as reply:
            lines = reply.iter_lines()
            assert next(lines).startswith("data: ")
            assert _wait_for(lambda: srv.scheduler.slots_in_use == 1)
        # the connection is closed here, about 2 s before the reply would end
        assert _wait_for(lambda: srv.scheduler.slots_in_use == 0, 1.0)
        steps = srv.scheduler.steps
        time.sleep(0.1)
        assert srv.scheduler.steps == steps < 150  # nothing decodes for the gone client


def test_an_overfull_queue_answers_429_and_accepted_requests_complete(decoder):
    with ServerThread(_model(decoder, delay_s=0.01), max_batch=2, max_queue=2) as srv:
        body = {"model": NAME, "prompt": "abc", "temperature": 0, "max_tokens": 12}

        def post(_):
            return httpx.post(srv.url + "/v1/completions", json=body, timeout=60)

        with ThreadPoolExecutor(10) as pool:
            replies = list(pool.map(post, range(10)))
        codes = [r.status_code for r in replies]
        assert codes.count(429) >= 1 and set(codes) <= {200, 429}, codes
        for r in replies:
            if r.status_code == 429:
                assert r.headers["Retry-After"] == "1"
                assert r.json()["error"]["code"] == "queue_full"
            else:
                assert r.json()["usage"]["completion_tokens"] >= 1
        assert len({json.dumps(r.json()["choices"][0]["text"]) for r in replies
                    if r.status_code == 200}) == 1  # the same greedy text for all
