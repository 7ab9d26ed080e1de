"""``pollama serve`` end to end: a real server subprocess, real models, the official clients.

One server process per configuration (module-scoped fixtures). The default model (SmolLM2-135M)
answers the API tests; stories260K (1.2 MB) carries the fast ones: errors, store operations,
context shift, the schema fuzz.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import ollama
import openai
import pytest

from conftest import STORIES
from serverproc import ROOT, ServerProcess, free_port

SMOL = "smollm2:135m"
STORIES_PATH = str(STORIES)
GREEDY = {"temperature": 0, "seed": 42}


def _start(env: dict[str, str] | None = None) -> ServerProcess:
    return ServerProcess(env).start()


@pytest.fixture(scope="module", params=["old", "new"])
def server(request):
    """The main server, once per engine: every API test below runs on both."""
    proc = _start({"OLLAMA_NUM_PARALLEL": "1", "OLLAMA_CONTEXT_LENGTH": "2048",
                   "OLLAMA_NEW_ENGINE": "1" if request.param == "new" else "0"})
    proc.engine = request.param
    yield proc
    code = proc.stop()
    assert code == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.url, timeout=120)


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="pollama", timeout=120, max_retries=0)


# ------------------------------------------------------------------------------------- basics
def test_root_version_and_unknown_routes(server):
    assert httpx.get(server.url + "/").text == "Ollama is running"
    assert httpx.head(server.url + "/").status_code == 200
    # the Ollama API version pollama speaks (clients compare it), not pollama's own
    assert httpx.get(server.url + "/api/version").json() == {"version": "0.25.0"}
    r = httpx.get(server.url + "/api/nope")
    assert r.status_code == 404 and r.json() == {"error": "404 page not found"}
    r = httpx.put(server.url + "/api/generate")
    assert r.status_code == 405 and isinstance(r.json()["error"], str)


def test_generate_stream_and_not(client):
    # Both compared answers start from a warm slot: a cold prompt evaluates its last token in the
    # prompt's batch, a warm one re-evaluates it alone, and on some CPUs (AVX2 here) the two
    # kernels round differently enough to flip a greedy near-tie a few dozen tokens later.
    client.generate(model=SMOL, prompt="Why is the sky blue?", stream=False, options={**GREEDY, "num_predict": 1})
    parts = list(client.generate(model=SMOL, prompt="Why is the sky blue?", stream=True,
                                 options={**GREEDY, "num_predict": 24}))
    assert all(p.model == SMOL for p in parts)
    final = parts[-1]
    assert final.done and final.done_reason == "length"
    assert final.eval_count == 24
    assert final.total_duration > 0 and final.load_duration > 0
    assert final.prompt_eval_duration > 0 and final.eval_duration > 0
    assert final.context and len(final.context) > 24
    streamed = "".join(p.response for p in parts)
    assert streamed.strip()

    whole = client.generate(model=SMOL, prompt="Why is the sky blue?", stream=False,
                            options={**GREEDY, "num_predict": 24})
    assert whole.done and whole.response == streamed
    assert whole.context == final.context
    # prompt_eval_count is the whole prompt (cached or not), as Ollama reports it
    assert whole.prompt_eval_count == final.prompt_eval_count == len(final.context) - 24


def test_num_predict_gives_exactly_that_many_tokens(client):
    resp = client.generate(model=SMOL, prompt="Write a long poem about the sea.", stream=False,
                           options={**GREEDY, "num_predict": 10}, logprobs=True, top_logprobs=3)
    assert resp.eval_count == 10
    assert resp.done_reason == "length"
    assert len(resp.logprobs) == 10
    for entry in resp.logprobs:
        tops = [t.logprob for t in entry.top_logprobs]
        assert 0 < len(tops) <= 3 and tops == sorted(tops, reverse=True)
        assert entry.logprob <= 0


def test_chat_stream_and_not(client):
    messages = [{"role": "user", "content": "What is 2+2?"}]
    client.chat(model=SMOL, messages=messages, stream=False, options={**GREEDY, "num_predict": 1})  # warm (see above)
    parts = list(client.chat(model=SMOL, messages=messages, stream=True, options={**GREEDY, "num_predict": 32}))
    final = parts[-1]
    assert final.done and final.done_reason in ("stop", "length")
    text = "".join(p.message.content for p in parts)
    assert "4" in text  # greedy and unpenalised, SmolLM2 names Paris only after "L'Étoile, la Cité, ..."
    assert all(p.message.role == "assistant" for p in parts)
    whole = client.chat(model=SMOL, messages=messages, stream=False, options={**GREEDY, "num_predict": 32})
    assert whole.message.content == text
    assert whole.eval_count == final.eval_count


def test_chat_history_reuses_the_slot_cache(client, oai):
    first = [{"role": "system", "content": "You are a helpful assistant who answers briefly."},
             {"role": "user", "content": "Name three colors of the rainbow."}]
    turn1 = client.chat(model=SMOL, messages=first, options={**GREEDY, "num_predict": 40})
    history = first + [{"role": "assistant", "content": turn1.message.content},
                       {"role": "user", "content": "And two more?"}]
    turn2 = client.chat(model=SMOL, messages=history, options={**GREEDY, "num_predict": 20})
    # prompt_eval_count is the whole prompt: turn 2's holds all of turn 1's and more
    assert turn2.prompt_eval_count > turn1.prompt_eval_count + turn1.eval_count
    assert turn2.message.content
    # ... and only the new tokens were evaluated: OpenAI's usage says how many came from the cache
    history += [{"role": "assistant", "content": turn2.message.content}, {"role": "user", "content": "Thanks!"}]
    turn3 = oai.chat.completions.create(model=SMOL, messages=history, max_tokens=4, temperature=0)
    assert turn3.usage.prompt_tokens - turn3.usage.prompt_tokens_details.cached_tokens < 20
    assert turn3.usage.prompt_tokens_details.cached_tokens > turn2.prompt_eval_count


def test_tags_show_ps(client, server):
    names = [m.model for m in client.list().models]
    assert SMOL in names
    entry = next(m for m in client.list().models if m.model == SMOL)
    assert entry.details.family == "llama" and entry.details.parameter_size == "135M"
    assert entry.details.quantization_level == "Q4_1" and entry.size > 0 and entry.digest

    shown = client.show(SMOL)
    assert shown.modelfile and shown.template and shown.modified_at
    assert shown.modelinfo["general.architecture"] == "llama"
    assert shown.details.quantization_level == "Q4_1"

    client.generate(model=SMOL, prompt="Hi", options={"num_predict": 1})
    running = client.ps().models
    smol = next(m for m in running if m.model == SMOL)
    assert smol.context_length == 2048 and smol.size > entry.size and smol.expires_at is not None
    ps = httpx.get(server.url + "/api/ps").json()["models"]
    assert next(m for m in ps if m["model"] == SMOL)["engine"] == server.engine

    r = httpx.post(server.url + "/api/show", json={"model": "no-such-model"})
    assert r.status_code == 404 and r.json() == {"error": 'model "no-such-model" not found'}


def test_embeddings_native(server):
    r = httpx.post(server.url + "/api/embed", json={"model": SMOL, "input": ["hello world", "the sky is blue"]},
                   timeout=120)
    body = r.json()
    assert r.status_code == 200 and len(body["embeddings"]) == 2
    for vector in body["embeddings"]:
        assert len(vector) == 576 and math.isclose(sum(v * v for v in vector), 1.0, rel_tol=1e-4)
    assert body["prompt_eval_count"] > 0 and body["total_duration"] > 0
    r = httpx.post(server.url + "/api/embed", json={"model": SMOL, "input": "hello world", "dimensions": 8}, timeout=120)
    vec = r.json()["embeddings"][0]
    assert len(vec) == 8 and math.isclose(sum(v * v for v in vec), 1.0, rel_tol=1e-4)
    legacy = httpx.post(server.url + "/api/embeddings", json={"model": SMOL, "prompt": "hello world"}, timeout=120).json()
    assert legacy["embedding"] == pytest.approx(body["embeddings"][0], abs=1e-5)


# ------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize("body, status, message", [
    ({"model": "nope", "prompt": "hi"}, 404, 'model "nope" not found'),
    ({"model": STORIES_PATH, "prompt": "hi", "options": {"num_ctx": [1]}}, 400, "num_ctx"),
    ({"model": STORIES_PATH, "prompt": "hi", "options": {"temperature": "hot"}}, 400, "temperature"),
    ({"model": STORIES_PATH, "prompt": 5}, 400, "prompt"),
    ({"model": STORIES_PATH, "prompt": "hi", "format": "xml"}, 400, "format"),
    ({"model": STORIES_PATH, "prompt": "hi", "keep_alive": "soon"}, 400, "keep_alive"),
    ({"model": STORIES_PATH, "prompt": "hi", "context": [10**9]}, 400, "context"),
    ({"model": STORIES_PATH, "prompt": "Once upon a time " * 60, "truncate": False,
      "options": {"num_ctx": 64}}, 400, "exceeds the context length"),
    ({"prompt": "hi"}, 400, "model is required"),
])
def test_generate_errors(server, body, status, message):
    r = httpx.post(server.url + "/api/generate", json=body, timeout=60)
    assert r.status_code == status, r.text
    assert set(r.json()) == {"error"} and message in r.json()["error"]


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b""])
def test_malformed_bodies_are_400(server, raw):
    for path in ("/api/generate", "/api/chat", "/v1/chat/completions", "/api/embed"):
        r = httpx.post(server.url + path, content=raw, headers={"content-type": "application/json"})
        error = r.json()["error"]
        message = error["message"] if path.startswith("/v1/") else error  # OpenAI's shape on /v1
        assert r.status_code == 400 and isinstance(message, str), (path, r.text)


def test_curl_style_form_content_type_is_read_as_json(server):
    body = json.dumps({"model": STORIES_PATH, "prompt": "Once", "stream": False, "options": {"num_predict": 3}})
    r = httpx.post(server.url + "/api/generate", content=body,
                   headers={"content-type": "application/x-www-form-urlencoded"})
    assert r.status_code == 200 and r.json()["done"]


def test_ollama_client_raises_with_status(client):
    with pytest.raises(ollama.ResponseError) as info:
        client.chat(model="missing:latest", messages=[{"role": "user", "content": "hi"}])
    assert info.value.status_code == 404


# ----------------------------------------------------------------------- load, unload, store
def test_preload_unload_and_cli_ps_stop(server):
    gen = httpx.post(server.url + "/api/generate", json={"model": STORIES_PATH}).json()
    assert gen["done"] and gen["done_reason"] == "load"
    names = [m["name"] for m in httpx.get(server.url + "/api/ps").json()["models"]]
    assert STORIES_PATH in names

    env = dict(server.env)
    cli = [sys.executable, "-c", "from cli.main import app; app()"]
    ps = subprocess.run(cli + ["ps"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0, ps.stderr
    header, *rows = ps.stdout.splitlines()
    assert header.split() == ["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    assert any(STORIES_PATH in row and "100% CPU" in row and "from now" in row for row in rows)

    stop = subprocess.run(cli + ["stop", STORIES_PATH], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0, stop.stderr
    names = [m["name"] for m in httpx.get(server.url + "/api/ps").json()["models"]]
    assert STORIES_PATH not in names

    missing = subprocess.run(cli + ["stop", "ghost"], env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert missing.returncode == 1 and 'couldn\'t find model "ghost" to stop' in missing.stderr

    chat = httpx.post(server.url + "/api/chat", json={"model": STORIES_PATH, "messages": [], "keep_alive": 0}).json()
    assert chat["done_reason"] == "unload" and chat["message"]["role"] == "assistant"


def test_cli_without_server_says_so(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OLLAMA_")}
    env.update({"OLLAMA_HOST": f"127.0.0.1:{free_port()}", "HOME": str(tmp_path)})
    cli = [sys.executable, "-c", "from cli.main import app; app()"]
    for args in (["ps"], ["stop", SMOL]):
        res = subprocess.run(cli + args, env=env, cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert res.returncode == 1
        assert "could not connect to pollama server, run 'pollama serve' to start it" in res.stderr


def test_keep_alive_zero_unloads_after_the_request(server):
    r = httpx.post(server.url + "/api/generate", json={"model": STORIES_PATH, "prompt": "Once", "stream": False,
                                                         "keep_alive": 0, "options": {"num_predict": 2}})
    assert r.status_code == 200
    for _ in range(50):
        if STORIES_PATH not in [m["name"] for m in httpx.get(server.url + "/api/ps").json()["models"]]:
            break
        time.sleep(0.1)
    else:
        pytest.fail("the model was not unloaded")


def test_copy_and_delete(server, client):
    client.copy(STORIES_PATH, "tiny:copy")
    client.copy("tiny:copy", "tiny:second")
    names = [m.model for m in client.list().models]
    assert "tiny:copy" in names and "tiny:second" in names
    out = client.generate(model="tiny:second", prompt="Once", options={"num_predict": 3})
    assert out.done
    blobs = sorted(p.name for p in (server.models / "blobs").iterdir())
    client.delete("tiny:copy")
    assert sorted(p.name for p in (server.models / "blobs").iterdir()) == blobs  # still used
    client.delete("tiny:second")
    assert list((server.models / "blobs").iterdir()) == []
    assert "tiny:second" not in [m.model for m in client.list().models]
    with pytest.raises(ollama.ResponseError) as info:
        client.delete("tiny:second")
    assert info.value.status_code == 404
    r = httpx.request("DELETE", server.url + "/api/delete", json={"model": SMOL})
    assert r.status_code == 400 and "default model" in r.json()["error"]


# ------------------------------------------------------------------------------ context shift
def test_context_exhaustion_keeps_generating_through_shifts(client):
    out = client.generate(model=STORIES_PATH, prompt="Once upon a time", stream=False,
                          options={"num_ctx": 128, "num_predict": 400, "temperature": 0.8, "seed": 1,
                                   "repeat_penalty": 1.0})
    assert out.done_reason in ("length", "stop")
    assert out.eval_count > 128  # past the context: the slot was shifted
    assert len(out.response) > 400


# --------------------------------------------------------------------------------- disconnect
def test_disconnect_mid_stream_frees_the_slot(server):
    body = {"model": SMOL, "prompt": "Tell me a very long story about a dragon.", "options": {"num_predict": 5000}}
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", server.url + "/api/generate", json=body) as resp:
            lines = resp.iter_lines()
            for _ in range(3):
                assert json.loads(next(lines))["done"] is False
    # NUM_PARALLEL=1: this only runs once the abandoned sequence has left its slot
    t0 = time.monotonic()
    r = httpx.post(server.url + "/api/generate", timeout=30,
                   json={"model": SMOL, "prompt": "Hi", "stream": False, "options": {"num_predict": 3}})
    assert r.status_code == 200 and r.json()["eval_count"] == 3
    assert time.monotonic() - t0 < 15


# ------------------------------------------------------------------------------------- openai
def test_openai_chat_streamed_with_usage(oai):
    stream = oai.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "What is 2+2?"}],
        stream=True, stream_options={"include_usage": True}, temperature=0, max_tokens=24,
    )
    chunks = list(stream)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert "4" in text
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason in ("stop", "length")
    usage = chunks[-1].usage
    assert usage is not None and chunks[-1].choices == []
    assert usage.prompt_tokens > 10 and 0 < usage.completion_tokens <= 24
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens


def test_openai_chat_not_streamed(oai):
    resp = oai.chat.completions.create(
        model=SMOL, messages=[{"role": "system", "content": "Answer briefly."},
                              {"role": "user", "content": [{"type": "text", "text": "Count to twenty."}]}],
        temperature=0, max_tokens=8, seed=1,
    )
    assert resp.object == "chat.completion" and resp.choices[0].message.role == "assistant"
    assert resp.choices[0].finish_reason == "length" and resp.usage.completion_tokens == 8
    assert resp.choices[0].message.content


def test_openai_completions_and_stop(oai):
    resp = oai.completions.create(model=STORIES_PATH, prompt="Once upon a time", max_tokens=30, temperature=0)
    assert resp.object == "text_completion" and resp.choices[0].text
    assert resp.usage.completion_tokens <= 30
    words = resp.choices[0].text.split()
    cut = oai.completions.create(model=STORIES_PATH, prompt="Once upon a time", max_tokens=30, temperature=0,
                                 stop=[words[2]])
    assert cut.choices[0].finish_reason == "stop" and words[2] not in cut.choices[0].text
    streamed = list(oai.completions.create(model=STORIES_PATH, prompt="Once upon a time", max_tokens=30,
                                           temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in streamed) == resp.choices[0].text


def test_openai_embeddings_and_models(oai):
    resp = oai.embeddings.create(model=SMOL, input=["hello world", "goodbye"])
    assert len(resp.data) == 2 and len(resp.data[0].embedding) == 576
    assert math.isclose(sum(v * v for v in resp.data[1].embedding), 1.0, rel_tol=1e-4)
    assert resp.usage.prompt_tokens > 0
    ids = [m.id for m in oai.models.list().data]
    assert SMOL in ids
    assert oai.models.retrieve(SMOL).id == SMOL
    with pytest.raises(openai.NotFoundError):
        oai.models.retrieve("no-such-model")


def test_openai_json_response_format(oai):
    resp = oai.chat.completions.create(
        model=SMOL, messages=[{"role": "user", "content": "Give a JSON object with a field name."}],
        response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": {
            "type": "object", "properties": {"name": {"type": "string", "maxLength": 12}},
            "required": ["name"], "additionalProperties": False}}},
        temperature=0, max_tokens=40,
    )
    assert "name" in json.loads(resp.choices[0].message.content)


# -------------------------------------------------------------------------------- concurrency
@pytest.fixture(scope="module")
def parallel_server():
    proc = _start({"OLLAMA_NUM_PARALLEL": "2", "OLLAMA_CONTEXT_LENGTH": "1024"})
    yield proc
    assert proc.stop() == 0, proc.last_log


PROMPTS = ["What is 2+2?", "Name a primary color.", "What is two plus two?"]


def _chat(url: str, prompt: str) -> tuple[str, str]:
    r = httpx.post(url + "/api/chat", timeout=180, json={
        "model": SMOL, "stream": False, "options": {**GREEDY, "num_predict": 24},
        "messages": [{"role": "user", "content": prompt}]})
    assert r.status_code == 200, r.text
    return r.json()["message"]["content"], r.json()["done_reason"]


@pytest.mark.slow
def test_parallel_chats_match_their_solo_answers(parallel_server):
    alone = [_chat(parallel_server.url, p) for p in PROMPTS]
    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        together = list(pool.map(lambda p: _chat(parallel_server.url, p), PROMPTS))
    assert together == alone
    assert "4" in alone[0][0]


@pytest.fixture(scope="module")
def busy_server():
    proc = _start({"OLLAMA_NUM_PARALLEL": "1", "OLLAMA_MAX_QUEUE": "1", "OLLAMA_CONTEXT_LENGTH": "1024"})
    yield proc
    assert proc.stop() == 0, proc.last_log


def test_max_queue_answers_503_under_a_burst(busy_server):
    url = busy_server.url
    httpx.post(url + "/api/generate", json={"model": SMOL}, timeout=60)  # loaded: the burst only queues
    body = {"model": SMOL, "prompt": "Tell me about the moon.", "stream": False, "options": {"num_predict": 40}}
    barrier = threading.Barrier(6)

    def one(_: int) -> httpx.Response:
        barrier.wait()
        return httpx.post(url + "/api/generate", json=body, timeout=120)

    with ThreadPoolExecutor(6) as pool:
        results = list(pool.map(one, range(6)))
    statuses = sorted(r.status_code for r in results)
    assert set(statuses) <= {200, 503}, statuses
    assert statuses.count(200) >= 2 and statuses.count(503) >= 1, statuses
    for r in results:
        if r.status_code == 503:
            assert r.json() == {"error": "server busy, please try again.  maximum pending requests exceeded"}
        else:
            assert r.json()["eval_count"] == 40


def test_shutdown_ends_streams_and_exits_cleanly():
    proc = _start({"OLLAMA_NUM_PARALLEL": "1"})
    # num_predict is capped at 10 × num_ctx: 20k tokens keep stories260K busy for seconds
    body = {"model": STORIES_PATH, "prompt": "Once upon a time", "options": {"num_predict": -1, "num_ctx": 2048}}
    got: list[dict] = []
    with httpx.Client(timeout=60) as c:
        with c.stream("POST", proc.url + "/api/generate", json=body) as resp:
            lines = resp.iter_lines()
            got.append(json.loads(next(lines)))
            proc.proc.send_signal(signal.SIGTERM)
            t0 = time.monotonic()
            got.extend(json.loads(line) for line in lines if line)
    assert time.monotonic() - t0 < 15
    assert got[-1].get("error") == "server is shutting down"
    assert proc.proc.wait(30) == 0
    code = proc.stop()
    assert code == 0 and "unloading" in proc.last_log, proc.last_log


def test_answers_on_a_kept_alive_connection_do_not_wait_for_a_delayed_ack(server):
    """A response leaves in two writes (head, then body); with Nagle's rule on, the body waited
    for the client's delayed ACK: 40 ms for every answer after the first on a connection, which
    is how every client library talks (the store-safety test's 700 requests took 37 s)."""
    with httpx.Client(base_url=server.url, timeout=30) as http:
        times = []
        for _ in range(21):
            t = time.perf_counter()
            assert http.post("/api/show", json={"model": "no-such-model"}).status_code == 404
            times.append(time.perf_counter() - t)
    assert sorted(times)[10] < 0.02, sorted(times)


def test_sigusr1_logs_every_threads_stack_and_the_server_goes_on(server):
    """A hung server is told from a dead one: SIGUSR1 (sent by ServerProcess before it kills a
    server that would not stop) logs each thread's Python stack, the batch loop's included."""
    r = httpx.post(server.url + "/api/generate", json={"model": str(STORIES), "prompt": "Once", "stream": False,
                                                       "options": {"num_predict": 2}}, timeout=120)
    assert r.status_code == 200, r.text
    before = server.log()
    server.dump_stacks()
    dumped = server.log()[len(before):]
    assert "Current thread" in dumped or "Thread 0x" in dumped, dumped
    assert dumped.count("Thread 0x") >= 2 and 'File "' in dumped, dumped
    assert httpx.get(server.url + "/", timeout=10).status_code == 200 and server.proc.poll() is None
