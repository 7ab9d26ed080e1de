"""Remote models against upstreams that fail: a real broken HTTP server on 127.0.0.1
(tests/brokenupstream.py) and ports nobody listens on. Every failure ends as one clear error
naming the upstream, in the API's own shape, never a hang; a replica that fails before its first
byte hands the request to another. Also: a pulled model may name only OLLAMA_REMOTES hosts."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import httpx
import pytest

import runner
from cli.server_cmds import ps_table
from brokenupstream import MODEL, BrokenUpstream
from registry import MANIFEST, LocalRegistry
from runner import config, prepare
from runner.api import InvalidRequest, Message, Request, UpstreamError
from runner.remote.upstream import RemoteSpec
from runner.store.create import CreateSpec, create
from runner.store.pull import pull
from serverproc import ROOT, ServerProcess, free_port


@pytest.fixture(scope="module")
def broken():
    with BrokenUpstream() as upstream:
        yield upstream


@pytest.fixture(scope="module")
def other():
    with BrokenUpstream() as upstream:
        yield upstream


@pytest.fixture
def cfg(tmp_path):
    return config.load({"OLLAMA_MODELS": str(tmp_path / "models"), "POLLAMA_REMOTE_TIMEOUT": "1"})


def make(cfg, *urls, model: str = ""):
    """Create a remote model of ``urls``, then load its runner (closed by the caller)."""
    events = list(create(cfg, CreateSpec(model="rem", remote=RemoteSpec(list(urls), model))))
    assert events[-1].status == "success"
    return runner.load(runner.resolve("rem", cfg), cfg=cfg)


def prepared(cfg, text: str = "hi", options=None) -> Request:
    request = Request(messages=[Message("user", text)])
    return prepare.prepare(runner.resolve("rem", cfg), request, options)


def answer(r, cfg, text: str = "hi"):
    return list(r.stream(prepared(cfg, text)))


@pytest.fixture
def remote(cfg, broken):
    broken.mode = "ok"
    r = make(cfg, broken.url)
    yield r
    r.close()


# ------------------------------------------------------------------------------ one replica
def test_a_healthy_stream_arrives_as_chunks(remote, cfg, broken):
    chunks = answer(remote, cfg)
    assert "".join(c.text for c in chunks) == "Hello world"
    final = chunks[-1]
    assert final.done and final.metrics.prompt_tokens == 7 and final.metrics.eval_count == 2
    path, body = broken.requests[-1]
    assert path == "/v1/chat/completions" and body["model"] == MODEL and body["stream"] is True
    assert body["messages"] == [{"role": "user", "content": "hi"}]


@pytest.mark.parametrize("mode,why", [
    ("garbage", "not JSON"),
    ("redirect", "redirects to another host are not followed"),
    ("oversized", "longer than"),
    ("truncated", "before the answer was complete"),
    ("server_error", "answered 500: CUDA out of memory"),
])
def test_a_broken_answer_is_one_error_naming_the_upstream(remote, cfg, broken, mode, why):
    broken.mode = mode
    before = len(broken.requests)
    with pytest.raises(UpstreamError) as err:
        answer(remote, cfg)
    assert why in str(err.value) and broken.url in str(err.value)
    assert err.value.status == 502
    assert len(broken.requests) == before + 1  # tried once: the redirect was not followed either


def test_an_upstreams_4xx_is_passed_on_as_its_status(remote, cfg, broken):
    broken.mode = "not_found"
    with pytest.raises(UpstreamError) as err:
        answer(remote, cfg)
    assert err.value.status == 404 and f"The model '{MODEL}' does not exist" in str(err.value)


def test_silence_before_the_first_byte_times_out(remote, cfg, broken):
    broken.mode = "hang"
    t0 = time.monotonic()
    with pytest.raises(UpstreamError, match="did not answer"):
        answer(remote, cfg)
    assert time.monotonic() - t0 < 20  # POLLAMA_REMOTE_TIMEOUT=1, not the upstream's whim


@pytest.mark.parametrize("mode,why", [("die", "before the answer was complete"), ("hang_after_first", "broke off")])
def test_a_failure_after_the_first_byte_ends_the_stream_with_an_error(remote, cfg, broken, mode, why):
    broken.mode = mode
    got = []
    with pytest.raises(UpstreamError, match=why):
        for chunk in remote.stream(prepared(cfg)):
            got.append(chunk)
    assert [c.text for c in got] == ["Hel"]


def test_options_the_upstream_has_not_are_refused_before_anything_is_sent(remote, cfg, broken):
    before = len(broken.requests)
    request = prepared(cfg, options={"repeat_penalty": 1.3})
    with pytest.raises(InvalidRequest, match="repeat_penalty"):
        remote.stream(request)
    assert len(broken.requests) == before


def test_embeddings_are_forwarded(remote, broken):
    result = remote.embed(["a", "b"])
    assert result.vectors == [[0.6, 0.8], [0.6, 0.8]] and result.prompt_eval_count == 6
    assert broken.requests[-1] == ("/v1/embeddings", {"model": MODEL, "input": ["a", "b"], "encoding_format": "float"})


# --------------------------------------------------------------------------------- replicas
def test_a_refused_replica_hands_the_request_to_another_and_is_marked_down(cfg, broken):
    broken.mode = "ok"
    dead = f"http://127.0.0.1:{free_port()}/v1"
    r = make(cfg, dead, broken.url)
    try:
        for text in ("one", "two", "three"):
            assert "".join(c.text for c in answer(r, cfg, text)) == "Hello world"
        assert r.replicas.downs(time.monotonic()) == [0]
    finally:
        r.close()


def test_a_replica_failing_before_its_first_byte_is_retried_on_another(cfg, broken, other):
    broken.mode, other.mode = "ok", "server_error"
    r = make(cfg, other.url, broken.url)
    try:
        assert "".join(c.text for c in answer(r, cfg, "first")) == "Hello world"
        assert any(path == "/v1/chat/completions" for path, _ in other.requests)  # it was tried first
    finally:
        r.close()
        other.mode = "ok"


def test_every_replica_down_is_one_error(cfg):
    urls = [f"http://127.0.0.1:{free_port()}/v1" for _ in range(2)]
    with pytest.raises(InvalidRequest, match="cannot ask it which model"):
        list(create(cfg, CreateSpec(model="rem", remote=RemoteSpec(urls))))
    r = make(cfg, *urls, model="m")  # named: created while its upstreams are down
    try:
        with pytest.raises(UpstreamError, match="did not answer"):
            answer(r, cfg)
    finally:
        r.close()


def test_create_needs_a_named_model_when_the_upstream_serves_several(cfg, broken):
    broken.mode = "ok"
    with pytest.raises(InvalidRequest, match="does not serve \"nope\"; it serves: broken-model"):
        list(create(cfg, CreateSpec(model="rem", remote=RemoteSpec([broken.url], "nope"))))


# -------------------------------------------------------------------------------- pulling
def test_a_pulled_remote_model_needs_its_host_in_ollama_remotes(tmp_path, broken):
    with LocalRegistry() as registry:
        config_blob = registry.add_blob(json.dumps({"model_format": "", "remote_host": broken.url,
                                                    "remote_model": MODEL}).encode())
        params = registry.add_blob(json.dumps({"temperature": 0}).encode())
        registry.manifests[("library", "sneaky", "latest")] = json.dumps({
            "schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config_blob},
            "layers": [{"mediaType": "application/vnd.ollama.image.params", **params}]}).encode()
        name = registry.name("library", "sneaky", "latest")
        cfg = config.load({"OLLAMA_MODELS": str(tmp_path / "models")})
        with pytest.raises(InvalidRequest, match="OLLAMA_REMOTES=127.0.0.1"):
            list(pull(cfg, name, insecure=True))
        with pytest.raises(runner.ModelNotFound):
            runner.resolve(name, cfg)
        allowed = config.load({"OLLAMA_MODELS": str(tmp_path / "models"), "OLLAMA_REMOTES": "127.0.0.1"})
        assert list(pull(allowed, name, insecure=True))[-1].status == "success"
        assert runner.resolve(name, allowed).remote.model == MODEL


# ------------------------------------------------------------------------ through the server
@pytest.fixture(scope="module")
def front(broken):
    broken.mode = "ok"
    with ServerProcess(env={"POLLAMA_REMOTE_TIMEOUT": "1"}) as server:
        r = httpx.post(server.url + "/api/create", json={"model": "rem", "from": broken.url, "stream": False},
                       timeout=30)
        assert r.status_code == 200, r.text
        yield server


def test_api_errors_take_each_apis_shape(front, broken):
    broken.mode = "not_found"
    r = httpx.post(front.url + "/api/chat", json={"model": "rem", "messages": [{"role": "user", "content": "hi"}],
                                                  "stream": False}, timeout=30)
    assert r.status_code == 404 and broken.url in r.json()["error"]
    broken.mode = "server_error"
    r = httpx.post(front.url + "/v1/messages", json={"model": "rem", "max_tokens": 5,
                                                     "messages": [{"role": "user", "content": "hi"}]}, timeout=30)
    assert r.status_code == 502 and r.json()["type"] == "error" and "CUDA" in r.json()["error"]["message"]
    broken.mode = "ok"
    r = httpx.post(front.url + "/v1/chat/completions", json={
        "model": "rem", "messages": [{"role": "user", "content": "hi"}], "stream": False}, timeout=30)
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == "Hello world"
    r = httpx.post(front.url + "/api/generate", json={"model": "rem", "prompt": "hi", "raw": True}, timeout=30)
    assert r.status_code == 400 and "raw" in r.json()["error"]
    r = httpx.post(front.url + "/api/generate", json={"model": "rem", "prompt": "hi",
                                                      "options": {"typical_p": 0.5}}, timeout=30)
    assert r.status_code == 400 and "typical_p" in r.json()["error"]


def test_a_stream_cut_mid_way_ends_with_the_apis_error_event(front, broken):
    broken.mode = "die"
    with httpx.stream("POST", front.url + "/v1/chat/completions", timeout=30, json={
            "model": "rem", "messages": [{"role": "user", "content": "hi"}], "stream": True}) as r:
        assert r.status_code == 200
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
    assert events[1]["choices"][0]["delta"]["content"] == "Hel"
    assert "before the answer was complete" in events[-1]["error"]["message"]
    with httpx.stream("POST", front.url + "/api/chat", timeout=30, json={
            "model": "rem", "messages": [{"role": "user", "content": "hi"}]}) as r:
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert lines[0]["message"]["content"] == "Hel" and "before the answer was complete" in lines[-1]["error"]
    broken.mode = "ok"


def test_ps_and_tags_list_the_remote_model(front, broken):
    broken.mode = "ok"
    r = httpx.post(front.url + "/api/chat", timeout=30, json={
        "model": "rem", "messages": [{"role": "user", "content": "hi"}], "stream": False})
    assert r.json()["message"]["content"] == "Hello world"
    ps = httpx.get(front.url + "/api/ps", timeout=10).json()
    entry = next(m for m in ps["models"] if m["name"] == "rem:latest")
    assert (entry["remote_model"], entry["remote_host"], entry["engine"]) == (MODEL, broken.url, "remote")
    row = ps_table([entry]).splitlines()[1]
    assert row.startswith("rem:latest") and f"remote: {broken.url}" in row and "CPU" not in row
    tags = httpx.get(front.url + "/api/tags", timeout=10).json()
    entry = next(m for m in tags["models"] if m["name"] == "rem:latest")
    assert entry["remote_model"] == MODEL and entry["capabilities"] == ["completion"]


def test_every_generation_api_reaches_the_upstream(front, broken):
    broken.mode = "ok"
    calls = {
        "/api/generate": ({"model": "rem", "prompt": "hi", "stream": False}, lambda b: b["response"]),
        "/v1/completions": ({"model": "rem", "prompt": "hi"}, lambda b: b["choices"][0]["text"]),
        "/v1/responses": ({"model": "rem", "input": "hi"}, lambda b: b["output"][-1]["content"][0]["text"]),
        "/v1/messages": ({"model": "rem", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]},
                         lambda b: b["content"][0]["text"]),
    }
    for path, (body, text) in calls.items():
        before = len(broken.requests)
        r = httpx.post(front.url + path, json=body, timeout=30)
        assert r.status_code == 200, (path, r.text)
        assert text(r.json()) == "Hello world", path
        sent = broken.requests[before][1]
        assert sent["messages"][-1] == {"role": "user", "content": "hi"}, path
    r = httpx.post(front.url + "/v1/embeddings", json={"model": "rem", "input": "a"}, timeout=30)
    assert r.status_code == 200 and r.json()["data"][0]["embedding"] == [0.6, 0.8]


# ------------------------------------------------------------------------------ API keys
def test_each_upstream_gets_its_own_key_and_a_refused_one_is_named_not_shown():
    """Three key-checking upstreams behind one server: two with POLLAMA_REMOTE_API_KEYS entries
    (one by host and port; one by host alone, written in another case than its FROM URL), one
    with the global POLLAMA_REMOTE_API_KEY. Each gets only its own key, at create (the model
    list) and at each request; a refused key is the upstream's 401 in each API's shape, naming
    the upstream and where the key came from, and no key shows in an answer, the log or the store."""
    keys = ("sk-a-1111", "sk-b-2222", "sk-global-3333")
    with BrokenUpstream() as a, BrokenUpstream() as b, BrokenUpstream() as c:
        a.key, b.key, c.key = keys
        env = {"POLLAMA_REMOTE_TIMEOUT": "5", "OLLAMA_DEBUG": "1", "POLLAMA_REMOTE_API_KEY": keys[2],
               "POLLAMA_REMOTE_API_KEYS": f"127.0.0.1:{a.port}={keys[0]}, localhost={keys[1]}"}
        froms = {"ka": a.url, "kb": f"http://LocalHost:{b.port}/v1", "kc": c.url}
        with ServerProcess(env=env) as server:
            for name, url in froms.items():
                r = httpx.post(server.url + "/api/create", json={"model": name, "from": url, "stream": False},
                               timeout=30)
                assert r.status_code == 200, r.text
                r = httpx.post(server.url + "/api/chat", timeout=30, json={
                    "model": name, "messages": [{"role": "user", "content": "hi"}], "stream": False})
                assert r.status_code == 200 and r.json()["message"]["content"] == "Hello world", r.text
            assert set(a.auth) == {f"Bearer {keys[0]}"} and set(b.auth) == {f"Bearer {keys[1]}"}
            assert set(c.auth) == {f"Bearer {keys[2]}"} and len(c.auth) == 2  # /v1/models, the chat

            c.key = a.key = "sk-rotated"
            r = httpx.post(server.url + "/api/chat", timeout=30, json={
                "model": "kc", "messages": [{"role": "user", "content": "hi"}], "stream": False})
            assert r.status_code == 401
            message = r.json()["error"]
            assert message.startswith(f"upstream {c.url} answered 401: Incorrect API key provided: ***")
            assert message.endswith("(pollama sent the key from POLLAMA_REMOTE_API_KEY)")
            r = httpx.post(server.url + "/v1/chat/completions", timeout=30, json={
                "model": "ka", "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 401 and a.url in r.json()["error"]["message"]
            assert f"POLLAMA_REMOTE_API_KEYS entry 127.0.0.1:{a.port}" in r.json()["error"]["message"]
            r = httpx.post(server.url + "/v1/messages", timeout=30, json={
                "model": "ka", "max_tokens": 5, "messages": [{"role": "user", "content": "hi"}]})
            assert r.status_code == 401 and r.json()["type"] == "error" and a.url in r.json()["error"]["message"]
            r = httpx.post(server.url + "/api/chat", timeout=30, json={
                "model": "kb", "messages": [{"role": "user", "content": "hi"}], "stream": False})
            assert r.status_code == 200  # b's key was not rotated

            seen = [httpx.post(server.url + "/api/show", json={"model": name}, timeout=10).text for name in froms]
            seen += [httpx.get(server.url + path, timeout=10).text for path in ("/api/tags", "/api/ps")]
            for args in (["show", "ka"], ["show", "--modelfile", "kb"], ["show", "-v", "kc"]):
                shown = subprocess.run([sys.executable, "-c", "from cli.main import main; main()", *args], cwd=ROOT,
                                       env=dict(server.env, PYTHONPATH=str(ROOT)), capture_output=True, text=True,
                                       timeout=120, stdin=subprocess.DEVNULL)
                assert shown.returncode == 0 and "/v1" in shown.stdout, shown.stderr
                seen += [shown.stdout, shown.stderr]
            seen.append(server.log())
            seen += [p.read_bytes().decode("utf-8", "replace") for p in server.models.rglob("*") if p.is_file()]
            assert not [text for text in seen for key in keys if key in text]


def test_a_key_wanted_and_none_set_says_which_variables_would_give_it(tmp_path, broken):
    cfg = config.load({"OLLAMA_MODELS": str(tmp_path / "models"), "POLLAMA_REMOTE_API_KEYS": "other-box=sk-x"})
    broken.mode, broken.key = "ok", "sk-wanted"
    try:
        with pytest.raises(UpstreamError) as err:
            list(create(cfg, CreateSpec(model="rem", remote=RemoteSpec([broken.url], ""))))
    finally:
        broken.key = None
    assert err.value.status == 401 and broken.url in str(err.value) and broken.auth[-1] == ""
    assert str(err.value).endswith(f"(set POLLAMA_REMOTE_API_KEY, or 127.0.0.1:{broken.port}=KEY in "
                                   "POLLAMA_REMOTE_API_KEYS)")
