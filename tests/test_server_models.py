"""Model management through a real ``pollama serve`` (issue 9): /api/pull, /api/create,
/api/blobs/:digest, /api/copy, /api/delete, /api/show, /api/push, with the official ``ollama``
Python client and raw HTTP, against a registry of our own on 127.0.0.1 (tests/registry.py)."""

from __future__ import annotations

import hashlib
import json
import threading
import time

import httpx
import pytest

from conftest import STORIES, TINYSTORIES
from registry import LocalRegistry
from serverproc import ServerProcess


@pytest.fixture(scope="module")
def registry():
    reg = LocalRegistry().start()
    reg.add_model("library", "stories", "latest", STORIES,
                  extra={"system": b"You tell tiny stories.", "license": b"MIT, for the test"})
    reg.add_model("library", "tiny", "latest", TINYSTORIES)
    yield reg
    reg.stop()


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "256"}).start()
    yield proc
    assert proc.stop() == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def lines(resp: httpx.Response) -> list[dict]:
    return [json.loads(line) for line in resp.text.splitlines() if line.strip()]


def names(server) -> set[str]:
    return {m["name"] for m in httpx.get(server.url + "/api/tags").json()["models"]}


def test_ollama_client_pull_show_copy_delete(server, registry):
    import ollama

    client = ollama.Client(host=server.url)
    name = registry.name("library", "stories", "latest")
    events = list(client.pull(name, insecure=True, stream=True))
    statuses = [e.status for e in events]
    assert statuses[0] == "pulling manifest"
    assert statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    layer = [e for e in events if e.digest and e.completed == e.total and e.total == STORIES.stat().st_size]
    assert layer and layer[0].status.startswith("pulling ")
    assert client.pull(registry.name("library", "tiny", "latest"), insecure=True).status == "success"
    assert {name, registry.name("library", "tiny", "latest")} <= names(server)

    shown = client.show(name)
    assert shown.details.family == "llama"
    assert shown.license == "MIT, for the test"
    assert 'SYSTEM """You tell tiny stories."""' in shown.modelfile

    assert client.copy(name, "mystories").status == "success"
    assert "mystories:latest" in names(server)
    reply = client.generate(model="mystories", prompt="Once upon a time", options={"num_predict": 4, "temperature": 0})
    assert reply.response and reply.done

    assert client.delete("mystories").status == "success"
    assert "mystories:latest" not in names(server)
    assert server.models.joinpath("blobs").is_dir()
    stored = httpx.post(server.url + "/api/show", json={"model": name})
    assert stored.status_code == 200  # the shared blobs are still there for the original
    with pytest.raises(ollama.ResponseError) as err:
        client.delete("mystories")
    assert err.value.status_code == 404


def test_ollama_client_create_from_a_store_model_and_from_a_local_gguf(server, registry, tmp_path):
    import ollama

    client = ollama.Client(host=server.url)
    client.pull(registry.name("library", "tiny", "latest"), insecure=True)
    created = client.create(model="pirate", from_=registry.name("library", "tiny", "latest"),
                            system="Talk like a pirate.", parameters={"temperature": 0.1, "stop": ["<end>"]},
                            messages=[{"role": "user", "content": "Ahoy?"}, {"role": "assistant", "content": "Arr."}],
                            template="{{ .Prompt }}", license="Pirate license")
    assert created.status == "success"
    shown = client.show("pirate")
    assert shown.template == "{{ .Prompt }}"
    assert "temperature" in shown.parameters and '"<end>"' in shown.parameters
    assert 'MESSAGE user """Ahoy?"""' in shown.modelfile and "Pirate license" in shown.license
    raw = httpx.post(server.url + "/api/show", json={"model": "pirate"}).json()
    assert raw["system"] == "Talk like a pirate."
    assert raw["messages"] == [{"role": "user", "content": "Ahoy?"}, {"role": "assistant", "content": "Arr."}]

    # a local GGUF: the client uploads it to /api/blobs/:digest, then names it in `files`
    local = tmp_path / "local.gguf"
    local.write_bytes(STORIES.read_bytes())
    digest = client.create_blob(local)
    assert httpx.head(f"{server.url}/api/blobs/{digest}").status_code == 200
    events = list(client.create(model="fromfile", files={"local.gguf": digest}, system="Be brief.", stream=True))
    assert [e.status for e in events][-2:] == ["writing manifest", "success"]
    assert "fromfile:latest" in names(server)
    reply = client.generate(model="fromfile", prompt="Once", options={"num_predict": 3, "temperature": 0})
    assert reply.done


def test_chat_starts_from_the_models_messages(server):
    """A model's MESSAGEs are the conversation's start in /api/chat (after any system)."""
    body = {"model": str(STORIES), "stream": False, "options": {"num_predict": 1, "temperature": 0}}
    r = httpx.post(server.url + "/api/create",
                   json={"model": "withhistory", "from": str(STORIES), "stream": False,
                         "messages": [{"role": "user", "content": "one two three four five six"},
                                      {"role": "assistant", "content": "seven eight nine ten"}]})
    assert r.status_code == 200, r.text
    plain = httpx.post(server.url + "/api/chat", json={**body, "messages": [{"role": "user", "content": "hi"}]}).json()
    body["model"] = "withhistory"
    primed = httpx.post(server.url + "/api/chat", json={**body, "messages": [{"role": "user", "content": "hi"}]}).json()
    assert primed["prompt_eval_count"] > plain["prompt_eval_count"] + 8


def test_blob_upload_checks_the_digest(server):
    data = b"not the bytes you named"
    wrong = "sha256:" + hashlib.sha256(b"other").hexdigest()
    r = httpx.post(f"{server.url}/api/blobs/{wrong}", content=data)
    assert r.status_code == 400 and "digest mismatch" in r.json()["error"]
    assert httpx.head(f"{server.url}/api/blobs/{wrong}").status_code == 404
    right = "sha256:" + hashlib.sha256(data).hexdigest()
    assert httpx.post(f"{server.url}/api/blobs/{right}", content=data).status_code == 201
    assert httpx.post(f"{server.url}/api/blobs/{right}", content=data).status_code == 200
    # a blob that is not a GGUF is refused as a model, with a 400
    r = httpx.post(server.url + "/api/create", json={"model": "notgguf", "files": {"x.gguf": right}, "stream": False})
    assert r.status_code == 400 and "GGUF" in r.json()["error"]
    assert not list(server.models.glob("blobs/*partial*"))


def test_pull_errors(server, registry):
    r = httpx.post(server.url + "/api/pull", json={"model": registry.name("library", "stories", "nope"), "insecure": True})
    assert r.status_code == 404 and r.json() == {"error": "pull model manifest: file does not exist"}
    r = httpx.post(server.url + "/api/pull", json={"model": registry.name("library", "nope", "latest"),
                                                   "insecure": True, "stream": False})
    assert r.status_code == 404
    r = httpx.post(server.url + "/api/pull", json={"model": "../../etc/passwd"})
    assert r.status_code == 400
    r = httpx.post(server.url + "/api/pull", json={})
    assert r.status_code == 400 and r.json() == {"error": "model is required"}


def test_push_is_refused_in_one_line(server):
    import ollama

    with pytest.raises(ollama.ResponseError) as err:
        ollama.Client(host=server.url).push("stories")
    assert err.value.status_code == 400 and "not supported" in str(err.value)


def test_create_refusals(server):
    def create(body: dict) -> httpx.Response:
        return httpx.post(server.url + "/api/create", json={"stream": False, **body})

    assert create({"model": "q", "from": str(STORIES), "quantize": "q4_K_M"}).json()["error"].startswith("quantize")
    assert "adapters" in create({"model": "a", "from": str(STORIES), "adapters": {"x": "sha256:" + "0" * 64}}).json()["error"]
    assert create({"model": "x"}).json() == {"error": "neither 'from' or 'files' was specified"}
    r = create({"model": "x", "from": "nosuchmodel"})
    assert r.status_code == 404 and "nosuchmodel" in r.json()["error"]
    r = create({"model": "x", "from": str(STORIES), "parameters": {"temperature": "hot"}})
    assert r.status_code == 400
    r = create({"model": "x", "files": {"m.gguf": "sha256:" + "1" * 64}})
    assert r.status_code == 400 and "was not uploaded" in r.json()["error"]


@pytest.mark.slow
def test_pulling_while_the_server_answers_other_requests(server, registry, tmp_path):
    """A slow pull streams its progress while generate, tags and show keep answering."""
    reg = LocalRegistry().start()
    try:
        unique = tmp_path / "unique.gguf"  # bytes no other test pulled, so they really travel
        unique.write_bytes(STORIES.read_bytes() + b"slow" * 16)
        manifest = reg.add_model("library", "slow", "latest", unique)
        reg.delay[manifest["layers"][0]["digest"]] = 0.15  # ~1.2 MB at 64 KiB per 150 ms: about 3 s
        generate = {"model": str(STORIES), "prompt": "Once", "stream": False,
                    "options": {"num_predict": 2, "temperature": 0}}
        assert httpx.post(server.url + "/api/generate", timeout=60, json=generate).status_code == 200
        assert httpx.get(server.url + "/api/tags", timeout=60).status_code == 200  # digests hashed once
        progress: list[dict] = []

        def pull() -> None:
            with httpx.stream("POST", server.url + "/api/pull", timeout=60,
                              json={"model": reg.name("library", "slow", "latest"), "insecure": True}) as resp:
                for line in resp.iter_lines():
                    progress.append(json.loads(line))

        thread = threading.Thread(target=pull)
        thread.start()
        answered, generated, slowest = 0, 0, 0.0
        while thread.is_alive():
            if not generated:
                assert httpx.post(server.url + "/api/generate", timeout=60, json=generate).status_code == 200
                generated += 1
            t0 = time.monotonic()
            assert httpx.get(server.url + "/api/tags", timeout=60).status_code == 200
            assert httpx.post(server.url + "/api/show", json={"model": str(STORIES)}).status_code == 200
            slowest = max(slowest, time.monotonic() - t0)
            answered += 1
        thread.join()
        assert generated >= 1 and answered >= 3 and slowest < 1.0, (generated, answered, slowest)
        assert progress[-1] == {"status": "success"}
        partials = [p for p in progress if p.get("digest") and 0 < p["completed"] < p["total"]]
        assert len(partials) >= 3  # progress streamed as the bytes came
    finally:
        reg.stop()


def test_a_client_that_leaves_stops_the_pull_and_the_next_one_resumes(server, tmp_path):
    reg = LocalRegistry().start()
    try:
        unique = tmp_path / "leaving.gguf"
        unique.write_bytes(STORIES.read_bytes() + b"left" * 16)
        manifest = reg.add_model("library", "leaving", "latest", unique)
        digest = manifest["layers"][0]["digest"]
        reg.delay[digest] = 0.05
        body = {"model": reg.name("library", "leaving", "latest"), "insecure": True}
        with httpx.stream("POST", server.url + "/api/pull", json=body, timeout=60) as resp:
            for line in resp.iter_lines():
                event = json.loads(line)
                if event.get("digest") == digest and event["completed"] > 0:
                    break  # leave mid-download
        partial = server.models / "blobs" / f"sha256-{digest[7:]}-partial"
        deadline = time.monotonic() + 10
        sizes = []
        while time.monotonic() < deadline:  # the download stops soon after the client left
            sizes.append(partial.stat().st_size)
            if len(sizes) >= 4 and sizes[-1] == sizes[-4]:
                break
            time.sleep(0.2)
        kept = sizes[-1]
        assert 0 < kept < unique.stat().st_size and sizes[-1] == sizes[-4]
        reg.delay.clear()
        reg.requests.clear()
        r = httpx.post(server.url + "/api/pull", json={**body, "stream": False}, timeout=60)
        assert r.json() == {"status": "success"}
        assert [rng for path, rng in reg.requests if path == f"/cdn/{digest}"] == [f"bytes={kept}-"]
    finally:
        reg.stop()
