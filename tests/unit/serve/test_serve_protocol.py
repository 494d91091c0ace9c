"""Request validation: every malformed field is a 400 ApiError naming it."""

from __future__ import annotations

import pytest

from kiln.serve.protocol import ApiError, parse_body, parse_completion

CHAT = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("raw", [b"{", b"[1, 2]", b"\xff\xfe", b""])
def test_a_body_that_is_not_a_json_object_is_invalid_json(raw):
    with pytest.raises(ApiError) as err:
        parse_body(raw)
    assert err.value.status == 400 and err.value.code == "invalid_json"


@pytest.mark.parametrize("field, value", [
    ("max_tokens", -1), ("max_tokens", "10"), ("max_tokens", True), ("max_tokens", 1.5),
    ("temperature", -0.1), ("temperature", "hot"), ("top_p", 0), ("top_k", -2),
    ("seed", "x"), ("stop", 3), ("stop", ["a"] * 5), ("stream", "yes"), ("n", 2),
    ("messages", []), ("messages", [{"role": "user"}]), ("messages", "hi"), ("model", None),
    ("stream_options", {"include_usage": 1}), ("repetition_penalty", 0),
])
def test_bad_field_is_a_400_naming_it(field, value):
    body = {**CHAT, field: value}
    with pytest.raises(ApiError) as err:
        parse_completion(body, chat=True)
    assert err.value.status == 400
    assert err.value.param is not None and err.value.param.startswith(field.split("_")[0])
    assert set(err.value.body()["error"]) == {"message", "type", "param", "code"}


def test_valid_requests_read_as_given():
    req = parse_completion({**CHAT, "temperature": 0, "max_tokens": 5, "stop": "x",
                            "stream": True, "stream_options": {"include_usage": True},
                            "messages": [{"role": "user", "content": [
                                {"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]},
                           chat=True)
    assert not req.sampling.do_sample and req.max_tokens == 5 and req.stop == ["x"]
    assert req.stream and req.include_usage and req.messages[0]["content"] == "ab"
    done = parse_completion({"model": "m", "prompt": [3, 4], "temperature": 0.5, "seed": 1},
                            chat=False)
    assert done.prompt == [3, 4] and done.sampling.do_sample and done.sampling.seed == 1
