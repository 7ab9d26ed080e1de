"""Pull from a registry (issue 9): a real registry of our own on 127.0.0.1 (tests/registry.py)
serving the test GGUFs; the store's pull, in-process, then a real model load of what it wrote."""

from __future__ import annotations

import json

import pytest

import runner
from runner import config, store
from runner.api import InvalidRequest, ModelNotFound, Options, Request
from runner.store.pull import DigestMismatch, pull
from runner.store.registry import RegistryError
from conftest import STORIES, TINYSTORIES
from registry import LocalRegistry


@pytest.fixture
def registry():
    reg = LocalRegistry().start()
    yield reg
    reg.stop()


@pytest.fixture
def cfg(tmp_path):
    return config.load({"OLLAMA_MODELS": str(tmp_path / "models")})


def statuses(events) -> list[str]:
    return [e.status for e in events]


def test_pull_writes_blobs_and_manifest_then_the_model_runs(registry, cfg):
    manifest = registry.add_model("library", "stories", "latest", STORIES,
                                  extra={"system": b"You tell tiny stories.",
                                         "params": json.dumps({"temperature": 0.25}).encode()})
    name = registry.name("library", "stories", "latest")
    events = list(pull(cfg, name, insecure=True))
    seen = statuses(events)
    assert seen[0] == "pulling manifest"
    assert seen[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    model_digest = manifest["layers"][0]["digest"]
    layer_events = [e for e in events if e.digest == model_digest]
    assert layer_events[0].status == f"pulling {model_digest[7:19]}"
    assert layer_events[-1].completed == layer_events[-1].total == STORIES.stat().st_size
    assert events[1].wire() == {"status": events[1].status, "digest": events[1].digest,
                                "total": events[1].total, "completed": events[1].completed}
    stored = store.lookup(name, cfg)
    assert stored.path.read_bytes() == STORIES.read_bytes()
    assert not list((cfg.models / "blobs").glob("*partial*"))
    defaults = store.model_defaults(stored)
    assert defaults.system == "You tell tiny stories." and defaults.params == {"temperature": 0.25}
    options = Options(num_ctx=256, temperature=0, num_predict=4)
    loaded = runner.load(runner.resolve(name, cfg), options, cfg)
    try:
        assert "".join(c.text for c in loaded.stream(Request(prompt="Once upon", options=options)))
    finally:
        loaded.close()
    # the blob came through the registry's redirect, as registry.ollama.ai sends it
    assert any(path.startswith("/cdn/") for path, _ in registry.requests)


def test_resumed_pull_after_a_dropped_connection(registry, cfg):
    manifest = registry.add_model("library", "stories", "latest", STORIES)
    digest = manifest["layers"][0]["digest"]
    size = STORIES.stat().st_size
    registry.drop_after[digest] = size // 3
    name = registry.name("library", "stories", "latest")
    with pytest.raises(RegistryError) as err:
        list(pull(cfg, name, insecure=True))
    assert "pull again to resume" in str(err.value) and "\n" not in str(err.value)
    partial = cfg.models / "blobs" / f"sha256-{digest[7:]}-partial"
    assert partial.stat().st_size == size // 3  # kept for the resume
    assert store.list_models(cfg) == []  # no manifest until every blob is whole
    registry.requests.clear()
    events = list(pull(cfg, name, insecure=True))
    assert events[-1].status == "success"
    ranges = [r for path, r in registry.requests if path.startswith("/cdn/") and r]
    assert ranges == [f"bytes={size // 3}-"]
    resumed = [e for e in events if e.digest == digest]
    assert resumed[1].completed == size // 3  # progress starts where the partial file ended
    assert store.lookup(name, cfg).path.read_bytes() == STORIES.read_bytes()
    assert not partial.exists()


def test_corrupted_blob_is_deleted_and_the_pull_fails(registry, cfg):
    manifest = registry.add_model("library", "stories", "latest", STORIES)
    digest = manifest["layers"][0]["digest"]
    registry.corrupt.add(digest)
    name = registry.name("library", "stories", "latest")
    with pytest.raises(DigestMismatch, match="digest mismatch"):
        list(pull(cfg, name, insecure=True))
    blobs = {p.name for p in (cfg.models / "blobs").iterdir()}
    assert not any(digest[7:] in b for b in blobs)  # neither the blob nor its partial file
    assert store.list_models(cfg) == []
    registry.corrupt.clear()
    assert list(pull(cfg, name, insecure=True))[-1].status == "success"


def test_missing_tag_and_missing_model(registry, cfg):
    registry.add_model("library", "stories", "latest", STORIES)
    for name in (registry.name("library", "stories", "nope"), registry.name("library", "nope", "latest")):
        events = pull(cfg, name, insecure=True)
        assert next(events).status == "pulling manifest"
        with pytest.raises(ModelNotFound) as err:
            next(events)
        assert str(err.value) == "pull model manifest: file does not exist"


def test_network_failure_is_one_line(cfg):
    from serverproc import free_port

    with pytest.raises(RegistryError) as err:
        list(pull(cfg, f"127.0.0.1:{free_port()}/library/x:latest", insecure=True))
    assert str(err.value).startswith("pull model manifest: could not connect") and "\n" not in str(err.value)


def test_shared_blob_is_fetched_once(registry, cfg):
    registry.add_model("library", "stories", "latest", STORIES)
    manifest = registry.add_model("library", "stories", "v2", STORIES, extra={"system": b"Be brief."})
    digest = manifest["layers"][0]["digest"]
    list(pull(cfg, registry.name("library", "stories", "latest"), insecure=True))
    registry.requests.clear()
    events = list(pull(cfg, registry.name("library", "stories", "v2"), insecure=True))
    assert not any(digest in path for path, _ in registry.requests)  # not fetched again
    cached = [e for e in events if e.digest == digest]
    assert len(cached) == 1 and cached[0].completed == cached[0].total  # shown as done at once
    assert len(store.list_models(cfg)) == 2
    blobs = [p for p in (cfg.models / "blobs").iterdir() if p.stat().st_size == STORIES.stat().st_size]
    assert len(blobs) == 1


def test_pull_of_a_new_version_prunes_the_old_blobs(registry, cfg):
    registry.add_model("library", "m", "latest", STORIES)
    name = registry.name("library", "m", "latest")
    list(pull(cfg, name, insecure=True))
    old = store.lookup(name, cfg).path
    registry.add_model("library", "m", "latest", TINYSTORIES)
    list(pull(cfg, name, insecure=True))
    assert store.lookup(name, cfg).path.read_bytes() == TINYSTORIES.read_bytes()
    assert not old.exists()


def test_https_is_the_default_and_http_needs_insecure(registry, cfg):
    registry.add_model("library", "stories", "latest", STORIES)
    with pytest.raises(RegistryError):  # our registry speaks plain http: https fails to connect
        list(pull(cfg, registry.name("library", "stories", "latest")))
    with pytest.raises(InvalidRequest, match="insecure protocol http"):
        list(pull(cfg, "http://" + registry.name("library", "stories", "latest")))
    events = list(pull(cfg, "http://" + registry.name("library", "stories", "latest"), insecure=True))
    assert events[-1].status == "success"


@pytest.mark.parametrize("name", ["", "a b", "../x", "x:..", "h/n/m/extra:t"])
def test_bad_names_are_refused_before_any_request(registry, cfg, name):
    with pytest.raises(InvalidRequest):
        list(pull(cfg, name, insecure=True))
    assert registry.requests == []


def test_bad_manifest_digest_cannot_reach_outside_the_store(registry, cfg, tmp_path):
    evil = {"schemaVersion": 2, "config": {"digest": "sha256:" + "0" * 64, "size": 2},
            "layers": [{"mediaType": "application/vnd.ollama.image.model",
                        "digest": "sha256:../../../../victim", "size": 5}]}
    registry.manifests[("library", "evil", "latest")] = json.dumps(evil).encode()
    with pytest.raises(RegistryError, match="bad layer"):
        list(pull(cfg, registry.name("library", "evil", "latest"), insecure=True))
    assert not (tmp_path / "victim").exists()


@pytest.mark.parametrize("text, url", [
    ("llama3.2", "https://registry.ollama.ai/v2/library/llama3.2/manifests/latest"),
    ("hf.co/bartowski/Llama-3.2-1B-Instruct-GGUF:Q4_K_M",
     "https://hf.co/v2/bartowski/Llama-3.2-1B-Instruct-GGUF/manifests/Q4_K_M"),
    ("huggingface.co/unsloth/gemma-3-270m-it-GGUF", "https://huggingface.co/v2/unsloth/gemma-3-270m-it-GGUF/manifests/latest"),
    ("127.0.0.1:5000/me/m:t", "https://127.0.0.1:5000/v2/me/m/manifests/t"),
])
def test_registry_urls(text, url):
    """Hugging Face repos are the same protocol on their own host (a quant is the tag)."""
    from runner.store.pull import parse_pull_name
    from runner.store.registry import Remote

    name = parse_pull_name(text)
    remote = Remote.of(text, name, insecure=False)
    assert remote.url("manifests", name.tag) == url
    assert Remote.of(text, name, insecure=True).url("manifests", name.tag) == url.replace("https:", "http:")
