"""Remote models against real upstreams: a ``pollama serve`` on 127.0.0.1 serving SmolLM2 is
the upstream twice over, as an Ollama-API server (``FROM http://127.0.0.1:PORT``) and as an
OpenAI-compatible one (``FROM http://127.0.0.1:PORT/v1``), behind a second ``pollama serve``.
Greedy answers through either remote model equal the upstream's own; the official clients,
embeddings, the listings and ``pollama run`` work on them."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import anthropic
import httpx
import ollama
import openai
import pytest

from serverproc import ROOT, ServerProcess

UPSTREAM_MODEL = "smollm2:135m"
GREEDY = {"temperature": 0, "num_predict": 6, "seed": 1}
SECRET = "sk-remote27-secret"
QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def upstream():
    with ServerProcess(env={"OLLAMA_KEEP_ALIVE": "-1"}) as server:
        yield server


@pytest.fixture(scope="module")
def front(upstream, tmp_path_factory):
    with ServerProcess(env={"POLLAMA_REMOTE_TIMEOUT": "300", "POLLAMA_REMOTE_API_KEY": SECRET}) as server:
        folder = tmp_path_factory.mktemp("modelfile")
        modelfile = folder / "Modelfile"
        modelfile.write_text(f"FROM {upstream.url}\nPARAMETER temperature 0\nSYSTEM You answer in one short sentence.\n")
        created = cli(server, "create", "rem-ollama", "-f", str(modelfile))
        assert created.returncode == 0, created.stderr
        r = httpx.post(server.url + "/api/create", timeout=60, json={
            "model": "rem-openai", "from": upstream.url + "/v1", "system": "You answer in one short sentence.",
            "parameters": {"temperature": 0}, "stream": False})
        assert r.status_code == 200, r.text
        yield server


def cli(server: ServerProcess, *args: str) -> subprocess.CompletedProcess:
    env = dict(server.env, PYTHONPATH=str(ROOT))
    return subprocess.run([sys.executable, "-c", "from cli.main import main; main()", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600, stdin=subprocess.DEVNULL)


def chat(url: str, model: str, messages=QUESTION, **extra) -> httpx.Response:
    return httpx.post(url + "/api/chat", timeout=600, json={
        "model": model, "messages": messages, "stream": False, "options": GREEDY, **extra})


@pytest.fixture(scope="module")
def direct(upstream) -> str:
    system = [{"role": "system", "content": "You answer in one short sentence."}]
    r = chat(upstream.url, UPSTREAM_MODEL, system + QUESTION)
    assert r.status_code == 200, r.text
    return r.json()["message"]["content"]


@pytest.mark.parametrize("model", ["rem-ollama", "rem-openai"])
def test_greedy_answer_through_the_remote_model_equals_the_upstreams(front, direct, model):
    r = chat(front.url, model)
    assert r.status_code == 200, r.text
    body = r.json()
    assert body["message"]["content"] == direct and direct
    assert body["model"] == model and body["done_reason"] == "length"
    assert body["prompt_eval_count"] > 10 and body["eval_count"] == GREEDY["num_predict"]


def test_listings_show_the_remote_models(front, upstream):
    tags = {m["name"]: m for m in httpx.get(front.url + "/api/tags").json()["models"]}
    assert tags["rem-ollama:latest"]["remote_host"] == upstream.url
    assert tags["rem-openai:latest"]["remote_host"] == upstream.url + "/v1"
    assert tags["rem-openai:latest"]["remote_model"] == UPSTREAM_MODEL
    shown = httpx.post(front.url + "/api/show", json={"model": "rem-ollama"}).json()
    assert shown["remote_model"] == UPSTREAM_MODEL and shown["capabilities"] == ["completion"]
    assert f"FROM {upstream.url}\n" in shown["modelfile"] and shown["system"] == "You answer in one short sentence."
    listed = cli(front, "list")
    assert "rem-openai:latest" in listed.stdout
    shown_cli = cli(front, "show", "rem-openai")
    assert f"{upstream.url}/v1" in shown_cli.stdout and UPSTREAM_MODEL in shown_cli.stdout


def test_official_clients_stream_through_a_remote_model(front, direct):
    pieces = [part["message"]["content"] for part in ollama.Client(host=front.url).chat(
        model="rem-openai", messages=QUESTION, stream=True, options=GREEDY)]
    assert "".join(pieces) == direct and len([p for p in pieces if p]) > 1  # passed on as they came
    client = openai.OpenAI(base_url=front.url + "/v1", api_key="unused")
    stream = client.chat.completions.create(model="rem-ollama", messages=QUESTION, stream=True, temperature=0,
                                            max_tokens=GREEDY["num_predict"], seed=1,
                                            stream_options={"include_usage": True})
    events = list(stream)
    assert "".join(e.choices[0].delta.content or "" for e in events if e.choices) == direct
    assert events[-1].usage.completion_tokens == GREEDY["num_predict"]
    message = anthropic.Anthropic(base_url=front.url, api_key="unused").messages.create(
        model="rem-ollama", max_tokens=GREEDY["num_predict"], messages=QUESTION)  # temperature 0: its PARAMETER
    assert message.content[0].text == direct and message.stop_reason == "max_tokens"


def test_the_upstreams_refusal_is_passed_on(front, upstream):
    tools = [{"type": "function", "function": {"name": "weather", "parameters": {"type": "object"}}}]
    r = chat(front.url, "rem-ollama", tools=tools)
    assert r.status_code == 400 and upstream.url in r.json()["error"] and "tools" in r.json()["error"]
    r = httpx.post(front.url + "/v1/chat/completions", timeout=60, json={
        "model": "rem-openai", "messages": QUESTION, "tools": tools})
    assert r.status_code == 400 and "tools" in r.json()["error"]["message"]


def test_embeddings_through_a_remote_model_equal_the_upstreams(front, upstream):
    direct = httpx.post(upstream.url + "/api/embed", timeout=300, json={"model": UPSTREAM_MODEL,
                                                                        "input": ["hello", "world"]}).json()
    via = httpx.post(front.url + "/api/embed", timeout=300, json={"model": "rem-ollama",
                                                                  "input": ["hello", "world"]}).json()
    assert via["embeddings"] == direct["embeddings"] and via["prompt_eval_count"] == direct["prompt_eval_count"]
    result = openai.OpenAI(base_url=front.url + "/v1", api_key="unused").embeddings.create(
        model="rem-openai", input=["hello", "world"])
    assert len(result.data) == 2
    for got, want in zip(result.data, direct["embeddings"]):
        assert got.embedding == pytest.approx(want, abs=1e-6)


def test_pollama_run_one_shot_on_a_remote_model(front, upstream):
    direct = chat(upstream.url, UPSTREAM_MODEL, [{"role": "user", "content": "Name a colour."}]).json()
    ran = cli(front, "run", "rem-ollama", "Name a colour.", "-o", "temperature=0", "-o", "num_predict=6",
              "-o", "seed=1")
    assert ran.returncode == 0, ran.stderr
    # the remote model's SYSTEM is sent, so compare with the upstream asked the same way
    with_system = chat(upstream.url, UPSTREAM_MODEL, [{"role": "system", "content": "You answer in one short sentence."},
                                                      {"role": "user", "content": "Name a colour."}]).json()
    assert ran.stdout.strip() == with_system["message"]["content"].strip()
    assert direct["message"]["content"]  # the upstream answers the bare question too


@pytest.mark.slow
def test_conversation_turns_stay_on_their_replica(tmp_path_factory, upstream):
    """Two real replicas: each conversation's later turns go where its first went."""
    with ServerProcess(env={"OLLAMA_KEEP_ALIVE": "-1"}) as second, \
            ServerProcess(env={"POLLAMA_REMOTE_TIMEOUT": "300"}) as server:
        r = httpx.post(server.url + "/api/create", timeout=60, json={
            "model": "pair", "remote_hosts": [upstream.url + "/v1", second.url + "/v1"],
            "parameters": {"upstream_model": UPSTREAM_MODEL}, "stream": False})
        assert r.status_code == 200, r.text
        served: dict[str, set[str]] = {}
        seen: dict[str, int] = {}
        _busy(seen, upstream, second)  # what their logs held before (the module's other tests)
        for topic in ("cats", "dogs"):
            history = [{"role": "user", "content": f"Tell me about {topic}."}]
            for _ in range(2):
                body = chat(server.url, "pair", history, options={"num_predict": 3, "temperature": 0}).json()
                assert "message" in body, body
                history += [body["message"], {"role": "user", "content": "More."}]
                served.setdefault(topic, set()).update(_busy(seen, upstream, second))
        assert all(len(where) == 1 for where in served.values()), served
        assert served["cats"] != served["dogs"]  # two conversations spread over the two replicas


def _busy(seen: dict[str, int], *servers: ServerProcess) -> set[str]:
    """The upstreams whose access log grew a chat request since ``seen`` was updated. A server
    logs a request once it has answered, which may be after our client had the answer: when
    ``seen`` holds counts, this waits (up to 10 s) for one request more in all."""
    def counts() -> dict[str, int]:
        return {server.url: server.log().count('"/v1/chat/completions"') for server in servers}

    now, deadline = counts(), time.monotonic() + 10
    while seen and sum(now.values()) <= sum(seen.values()) and time.monotonic() < deadline:
        time.sleep(0.05)
        now = counts()
    out = {url for url, n in now.items() if n > seen.get(url, 0)}
    seen.update(now)
    return out


def test_the_api_key_is_never_stored(front):
    store_files = [p for p in front.models.rglob("*") if p.is_file()]
    configs = [json.loads(p.read_bytes()) for p in store_files if p.read_bytes().startswith(b'{"model_format"')]
    assert any(c.get("remote_host") for c in configs)  # the remote models are there
    assert not [p for p in store_files if SECRET.encode() in p.read_bytes()]
