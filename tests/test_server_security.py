"""``pollama serve``'s browser and network safety, its OpenAI error shape and its /v1 input checks.

Everything runs against a real server subprocess; stories260K (1.2 MB) is the model where one is
needed, and the official ``openai`` client is the witness for the /v1 errors.
"""

from __future__ import annotations

import json
import signal
import time

import httpx
import openai
import pytest

from conftest import STORIES
from serverproc import ServerProcess

STORIES_PATH = str(STORIES)
HI = [{"role": "user", "content": "Once upon a time"}]


def _stop(proc: ServerProcess) -> None:
    code = proc.stop()
    assert code == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


@pytest.fixture(scope="module")
def server():
    """Bound to 127.0.0.1, as by default."""
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "2048"}).start()
    yield proc
    _stop(proc)


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="pollama", timeout=60, max_retries=0)


# ----------------------------------------------------------------------------- OpenAI errors
def test_openai_errors_show_their_reason(oai, server):
    cases = [
        (openai.NotFoundError, 'model "missing:latest" not found',
         lambda: oai.chat.completions.create(model="missing:latest", messages=HI)),
        (openai.NotFoundError, 'model "missing:latest" not found',  # a stream that fails before its first byte
         lambda: oai.chat.completions.create(model="missing:latest", messages=HI, stream=True)),
        (openai.NotFoundError, 'model "missing:latest" not found',
         lambda: oai.completions.create(model="missing:latest", prompt="Once")),
        (openai.NotFoundError, "not found", lambda: oai.embeddings.create(model="missing:latest", input="Once")),
        (openai.NotFoundError, "not found", lambda: oai.models.retrieve("missing:latest")),
        (openai.BadRequestError, "messages.0.role",  # a validation error
         lambda: oai.chat.completions.create(model=STORIES_PATH, messages=[{"role": "wizard", "content": "hi"}])),
        (openai.BadRequestError, "invalid response_format", lambda: oai.chat.completions.create(
            model=STORIES_PATH, messages=HI, response_format={"type": "yaml"})),  # a handler's error
        (openai.NotFoundError, "404 page not found", lambda: oai.get("/no/such/route", cast_to=object)),
    ]
    for kind, reason, call in cases:
        with pytest.raises(kind) as info:
            call()
        assert reason in str(info.value), (reason, str(info.value))
        assert info.value.type == {400: "invalid_request_error", 404: "not_found_error"}[info.value.status_code]
    r = httpx.put(server.url + "/v1/chat/completions")
    assert r.status_code == 405 and r.json() == {"error": {
        "message": "405 method not allowed", "type": "api_error", "param": None, "code": None}}
    # Ollama's API keeps its own shape
    r = httpx.post(server.url + "/api/generate", json={"model": "missing:latest", "prompt": "hi"})
    assert r.status_code == 404 and r.json() == {"error": 'model "missing:latest" not found'}


def test_openai_error_mid_stream_shows_its_reason():
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "2048"}).start()
    client = openai.OpenAI(base_url=proc.url + "/v1", api_key="pollama", timeout=60, max_retries=0)
    stream = client.completions.create(model=STORIES_PATH, prompt="Once upon a time", max_tokens=20000,
                                       seed=1, stream=True)
    chunks = iter(stream)
    next(chunks)
    proc.proc.send_signal(signal.SIGTERM)  # ends the running stream with an error
    with pytest.raises(openai.APIError) as info:
        for _ in chunks:
            pass
    assert "server is shutting down" in str(info.value)
    assert info.value.body == {"message": "server is shutting down", "type": "api_error", "param": None, "code": None}
    assert proc.proc.wait(30) == 0
    _stop(proc)


# ------------------------------------------------------------------------------ /v1 limits
@pytest.mark.parametrize("kwargs, reason", [
    ({"max_tokens": 0}, "invalid max_tokens 0"),
    ({"max_tokens": -3}, "invalid max_tokens -3"),
    ({"max_completion_tokens": 0}, "invalid max_completion_tokens 0"),
    ({"n": 2}, "invalid n 2"),
    ({"n": 0}, "invalid n 0"),
])
def test_chat_completions_limits(oai, kwargs, reason):
    with pytest.raises(openai.BadRequestError) as info:
        oai.chat.completions.create(model=STORIES_PATH, messages=HI, **kwargs)
    assert reason in str(info.value)


@pytest.mark.parametrize("kwargs, reason", [
    ({"max_tokens": 0}, "invalid max_tokens 0"),
    ({"n": 3}, "invalid n 3"),
])
def test_completions_limits(oai, kwargs, reason):
    with pytest.raises(openai.BadRequestError) as info:
        oai.completions.create(model=STORIES_PATH, prompt="Once", **kwargs)
    assert reason in str(info.value)


def test_one_choice_and_one_token_are_fine(oai):
    out = oai.chat.completions.create(model=STORIES_PATH, messages=HI, n=1, max_completion_tokens=1)
    assert len(out.choices) == 1 and out.usage.completion_tokens == 1
    out = oai.completions.create(model=STORIES_PATH, prompt="Once", n=1, max_tokens=1)
    assert len(out.choices) == 1 and out.usage.completion_tokens == 1


# -------------------------------------------------------------------------- lone surrogates
M = json.dumps(STORIES_PATH)
SURROGATE_BODIES = [  # JSON text: \ud800 below is the six characters of a JSON escape
    ("/api/generate", '{"model": %s, "prompt": "a \\ud800 b", "stream": false}' % M),
    ("/api/generate", '{"model": %s, "prompt": "hi", "system": "\\udfff", "stream": false}' % M),
    ("/api/chat", '{"model": %s, "messages": [{"role": "user", "content": "\\ud83d"}], "stream": false}' % M),
    ("/api/embed", '{"model": %s, "input": ["ok", "\\ud800"]}' % M),
    ("/api/embeddings", '{"model": %s, "prompt": "\\ud800"}' % M),
    ("/api/show", '{"model": "tiny\\ud800"}'),
    ("/api/copy", '{"source": %s, "destination": "x\\udc00y"}' % M),
    ("/api/generate", '{"model": %s, "prompt": "hi", "\\ud800": 1, "stream": false}' % M),  # in a key
    ("/v1/chat/completions", '{"model": %s, "messages": [{"role": "user", "content": "\\ud800"}]}' % M),
    ("/v1/completions", '{"model": %s, "prompt": "\\ude00"}' % M),
    ("/v1/embeddings", '{"model": %s, "input": "\\ud800"}' % M),
]


@pytest.mark.parametrize("path, body", SURROGATE_BODIES)
def test_lone_surrogates_are_400(server, path, body):
    r = httpx.post(server.url + path, content=body, headers={"content-type": "application/json"}, timeout=60)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert "surrogate" in (error["message"] if path.startswith("/v1/") else error)


def test_lone_surrogate_as_raw_bytes_is_400(server):
    body = b'{"model": %s, "prompt": "a \xed\xa0\x80 b", "stream": false}' % M.encode()
    r = httpx.post(server.url + "/api/generate", content=body, timeout=60)
    assert r.status_code == 400 and "surrogate" in r.json()["error"]


def test_surrogate_pairs_and_escaped_backslashes_are_fine(server):
    for prompt in ('"\\ud83d\\ude00 Once"', '"\\\\ud800 Once"'):  # 😀, and the text \ud800
        body = '{"model": %s, "prompt": %s, "stream": false, "options": {"num_predict": 1}}' % (M, prompt)
        r = httpx.post(server.url + "/api/generate", content=body, timeout=60)
        assert r.status_code == 200 and r.json()["done"], r.text
