"""Embedding requests against a real ``pollama serve``: a client that leaves ends its work, a
shutdown does not wait for it, and an embedding leaves a warm chat slot alone.

The long job: 400 inputs of ~150 tokens (60k tokens) keep SmolLM2 busy for minutes here, so a
request that gets through within seconds after the first client left proves that the work
stopped; one slot (OLLAMA_NUM_PARALLEL=1) means the follow-up would otherwise wait for all of it.
"""

from __future__ import annotations

import signal
import threading
import time

import httpx
import openai
import pytest

from serverproc import ServerProcess

SMOL = "smollm2:135m"
LONG_INPUTS = [f"Note {i}. " + "The quick brown fox jumps over the lazy dog while the sun sets slowly. " * 10
               for i in range(400)]  # distinct: equal texts are evaluated once


def _embed_and_leave(url: str, path: str, model_field: str = "model") -> None:
    """Post the long job and give up after a second (httpx closes the connection)."""
    body = {model_field: SMOL, "input": LONG_INPUTS}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(url + path, json=body, timeout=httpx.Timeout(60, read=1.5))


@pytest.fixture(scope="module", params=["old", "new"])
def server(request):
    proc = ServerProcess({"OLLAMA_NUM_PARALLEL": "1", "OLLAMA_CONTEXT_LENGTH": "2048",
                          "OLLAMA_NEW_ENGINE": "1" if request.param == "new" else "0"}).start()
    # load the model and its embedding lanes first: the timings below are about the work only
    assert httpx.post(proc.url + "/api/embed", json={"model": SMOL, "input": ["warm up"]}, timeout=120).status_code == 200
    yield proc
    code = proc.stop()
    assert code == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


@pytest.mark.parametrize("path", ["/api/embed", "/v1/embeddings"])
def test_5000_inputs_answer_without_holding_other_clients(server, path):
    """5,000 equal inputs are evaluated once, and their 37 MB of JSON is built off the event
    loop: /api/version answers within a second throughout (FastAPI's encoder held it for 3 s,
    and the 5,000 inputs took minutes)."""
    waits: list[float] = []
    done = threading.Event()

    def poll() -> None:
        with httpx.Client(timeout=30) as client:
            while not done.is_set():
                t = time.monotonic()
                assert client.get(server.url + "/api/version").status_code == 200
                waits.append(time.monotonic() - t)
                time.sleep(0.05)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        t0 = time.monotonic()
        r = httpx.post(server.url + path, json={"model": SMOL, "input": ["a sentence to embed"] * 5000}, timeout=120)
        took = time.monotonic() - t0
    finally:
        done.set()
        poller.join()
    assert r.status_code == 200
    vectors = r.json()["embeddings"] if path == "/api/embed" else [d["embedding"] for d in r.json()["data"]]
    assert len(vectors) == 5000 and vectors[0] == vectors[-1] and len(vectors[0]) == 576
    assert took < 30, took
    assert len(waits) > 5 and max(waits) < 1.0, sorted(waits)[-5:]


@pytest.mark.slow
@pytest.mark.parametrize("path", ["/api/embed", "/v1/embeddings"])
def test_a_client_that_leaves_ends_its_embedding(server, path):
    _embed_and_leave(server.url, path)
    t0 = time.monotonic()
    r = httpx.post(server.url + "/api/embed", json={"model": SMOL, "input": ["hello"]}, timeout=120)
    assert r.status_code == 200 and len(r.json()["embeddings"]) == 1
    assert time.monotonic() - t0 < 20, "the next request waited for the abandoned embedding"
    assert "embedding cancelled: the client disconnected" in server.log()


@pytest.mark.slow
def test_shutdown_during_a_long_embedding_is_prompt():
    proc = ServerProcess({"OLLAMA_NUM_PARALLEL": "1", "OLLAMA_CONTEXT_LENGTH": "2048"}).start()
    try:
        result: dict = {}

        def post() -> None:
            try:
                # One thread: on a machine whose cores are all busy, two GGML threads wait on each
                # other's barriers and a 128-token decode (the most a shutdown waits for) takes
                # seconds instead of a second.
                body = {"model": SMOL, "input": LONG_INPUTS, "options": {"num_thread": 1}}
                result["response"] = httpx.post(proc.url + "/api/embed", json=body, timeout=300)
            except httpx.HTTPError as err:
                result["error"] = err

        caller = threading.Thread(target=post)
        caller.start()
        deadline = time.monotonic() + 120
        while "loaded smollm2" not in proc.log().lower() and time.monotonic() < deadline:
            time.sleep(0.1)
        time.sleep(1.0)  # the embedding is under way
        proc.proc.send_signal(signal.SIGTERM)
        t0 = time.monotonic()
        code = proc.proc.wait(30)
        elapsed = time.monotonic() - t0
        caller.join(30)
        assert code == 0
        assert elapsed < 5, f"shutdown took {elapsed:.1f}s"
        response = result.get("response")
        assert response is not None and response.status_code == 503, result
        assert response.json() == {"error": "server is shutting down"}
    finally:
        proc.stop()
    assert "Traceback" not in proc.last_log, proc.last_log


@pytest.mark.slow
@pytest.mark.parametrize("engine", ["old", "new"])
def test_an_embedding_does_not_evict_a_warm_chat_slot(engine):
    """Two slots: the second chat turn reuses the first turn's cache although an embedding came
    in between (OpenAI usage reports the reused tokens as cached_tokens)."""
    with ServerProcess({"OLLAMA_NUM_PARALLEL": "2", "OLLAMA_CONTEXT_LENGTH": "2048",
                        "OLLAMA_NEW_ENGINE": "1" if engine == "new" else "0"}) as proc:
        oai = openai.OpenAI(base_url=proc.url + "/v1", api_key="pollama", timeout=120, max_retries=0)
        messages = [{"role": "user", "content": "What is the capital of France?"}]
        first = oai.chat.completions.create(model=SMOL, messages=messages, max_tokens=8, temperature=0)
        oai.embeddings.create(model=SMOL, input=["What is the capital of France?", "a dog barked"])
        messages += [{"role": "assistant", "content": first.choices[0].message.content},
                     {"role": "user", "content": "And of Italy?"}]
        second = oai.chat.completions.create(model=SMOL, messages=messages, max_tokens=8, temperature=0)
        assert second.usage.prompt_tokens_details.cached_tokens >= first.usage.prompt_tokens
