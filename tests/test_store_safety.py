"""No model name reaches outside the model store (issue: safe drop-in, §1).

Canary files sit beside the store; every store operation of the API is called with a table of
traversal names and with names from a small grammar fuzzer, and the canaries must survive
untouched, nothing new may appear outside the store, and no file outside it may be imported.
"""

from __future__ import annotations

import hashlib
import os
import random
from urllib.parse import quote
from pathlib import Path

import httpx
import pytest

from runner import config, store
from runner.api import InvalidRequest, ModelNotFound, PollamaError
from runner.store import Layout, OutsideStore, parse_name
from runner.store.names import InvalidName, Name
from conftest import STORIES
from serverproc import ServerProcess

STORIES_PATH = str(STORIES)

TRAVERSAL = [
    "registry.ollama.ai/../../../victim/dir:file",
    "registry.ollama.ai/../../../victim/dir/file",
    "registry.ollama.ai/library/../../../../victim:file",
    "../../../victim/dir:file",
    "../victim:file",
    "..", "../..", ".:x", "x/..", "x/../..:y", "..:latest", "library/..:x",
    "registry.ollama.ai/library/..:latest",
    "host/ns/model:../../../victim",
    "host/ns/model:..",
    "a/b/c/d/e", "a/b/c/d:e",
    "victim/dir/file:..",
    "..%2f..%2fvictim",
    "x\\..\\..\\victim",
    "x:..", "library/.hidden", ".hidden",
    "~/victim", "~root/x",
    "x" * 81, "h" * 351 + "/n/m:t", "m:" + "t" * 81,
    "x\x00y", "a b", "ünïcode", " ", ":", "/", "//", "a//b", "a/:b", ":tag", "ns/:t", "/:t",
    "http://../victim/x", "https://host/../x",
]


def canary_tree(base: Path) -> dict[Path, bytes]:
    """Files outside the store that a traversal would hit, plus a decoy manifest-shaped file."""
    files = {
        base / "victim" / "dir" / "file": b"canary: dir/file\n",
        base / "victim" / "file": b"canary: file\n",
        base / "victim" / "x": b"canary: x\n",
        base / "victim:file": b"canary: colon\n",
        base / "secret.txt": b"canary: a secret\n",
    }
    for path, data in files.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    return files


def snapshot_outside(base: Path, models: Path, ignore: tuple[str, ...] = (),
                     allowed: tuple[Path, ...] = ()) -> dict[str, tuple[int, str]]:
    """Every file under ``base`` but outside ``models`` and the ``allowed`` folders (and not named
    in ``ignore``): mtime, hash."""
    out = {}
    for path in base.rglob("*"):
        if any(root == path or root in path.parents for root in (models, *allowed)) or path.is_dir() \
                or path.name in ignore:
            continue
        out[str(path)] = (path.stat().st_mtime_ns, hashlib.sha256(path.read_bytes()).hexdigest())
    return out


def blob_contents(models: Path) -> set[bytes]:
    blobs = models / "blobs"
    return {p.read_bytes() for p in blobs.iterdir() if p.is_file()} if blobs.is_dir() else set()


# ------------------------------------------------------------------------------------ names
@pytest.mark.parametrize("text, parts", [
    ("llama3.2", ("registry.ollama.ai", "library", "llama3.2", "latest")),
    ("llama3.2:1b", ("registry.ollama.ai", "library", "llama3.2", "1b")),
    ("me/tiny:v1", ("registry.ollama.ai", "me", "tiny", "v1")),
    ("example.com/me/tiny:v1", ("example.com", "me", "tiny", "v1")),
    ("127.0.0.1:5000/library/x:latest", ("127.0.0.1:5000", "library", "x", "latest")),
    ("127.0.0.1:5000/library/x", ("127.0.0.1:5000", "library", "x", "latest")),
    ("https://example.com/me/tiny", ("example.com", "me", "tiny", "latest")),
    ("hf.co/user/Repo-GGUF:Q4_K_M", ("hf.co", "user", "Repo-GGUF", "Q4_K_M")),
    ("_x:_y", ("registry.ollama.ai", "library", "_x", "_y")),
    ("n..:x", ("registry.ollama.ai", "library", "n..", "x")),
])
def test_parse_name_like_ollama(text, parts):
    assert parse_name(text).parts() == parts


@pytest.mark.parametrize("text", TRAVERSAL + [
    "", "-x", ".x", "x/y.z/w", "ns.dot/m", "m:t:u", "m/", "/m", "m:", "x@sha256:00",
])
def test_parse_name_refuses(text):
    with pytest.raises(InvalidName):
        parse_name(text)


def test_display_shortest():
    assert parse_name("x").display() == "x:latest"
    assert parse_name("me/x").display() == "me/x:latest"
    assert parse_name("h.io/library/x:t").display() == "h.io/library/x:t"


def test_layout_inside_refuses_escapes_and_links(tmp_path):
    models = tmp_path / "models"
    (models / "manifests").mkdir(parents=True)
    layout = Layout(models)
    assert layout.manifest(Name("h", "n", "m", "t")) == models.resolve() / "manifests/h/n/m/t"
    for parts in (("..",), ("manifests", ".."), ("a/b",), ("",), (".",), ("x\x00",), ("/etc",)):
        with pytest.raises(OutsideStore):
            layout.inside(*parts)
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", models / "manifests" / "evil")
    with pytest.raises(OutsideStore):
        layout.inside("manifests", "evil", "ns", "m", "t")
    with pytest.raises(OutsideStore):
        layout.blob("sha256:" + "0" * 63)
    with pytest.raises(OutsideStore):
        layout.recheck(tmp_path / "outside" / "x")


def test_layout_entries_check_the_folder_once_and_every_name(tmp_path):
    """Many files of one folder (the prompt store's pages): the folder proven inside, each name one
    plain component; a name's own link is not followed by the callers (``utime`` without it)."""
    cache = tmp_path / "cache"
    (cache / "kv").mkdir(parents=True)
    layout = Layout(cache, "prompt cache")
    assert layout.entries(("kv",), ["a.kv", "b.kv"]) == [cache.resolve() / "kv" / "a.kv", cache.resolve() / "kv" / "b.kv"]
    for bad in ("..", ".", "", "a/b", "x\x00", "/etc"):
        with pytest.raises(OutsideStore):
            layout.entries(("kv",), ["a.kv", bad])
    (tmp_path / "outside").mkdir()
    os.symlink(tmp_path / "outside", cache / "evil")
    with pytest.raises(OutsideStore):
        layout.entries(("evil",), ["a.kv"])  # the folder itself is checked, links resolved
    target = tmp_path / "outside" / "victim"
    target.write_bytes(b"x")
    os.utime(target, ns=(1, 1))
    os.symlink(target, cache / "kv" / "page.kv")
    (path,) = layout.entries(("kv",), ["page.kv"])
    os.utime(path, ns=(2, 2), follow_symlinks=False)  # as the disk tier renews: the link, not its target
    assert target.stat().st_mtime_ns == 1


# ------------------------------------------------------------------------- in-process fuzzing
_TOKENS = ["..", ".", "/", "//", ":", "\\", "~", "victim", "dir", "file", "x", "registry.ollama.ai",
           "library", "%2e%2e", "\x00", " ", "@", "+", "sha256-", "-", "_", "ü"]


def fuzz_names(count: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return ["".join(rng.choice(_TOKENS) for _ in range(rng.randint(1, 9))) for _ in range(count)]


def test_fuzzed_names_never_leave_the_store(tmp_path):
    base = tmp_path
    models = base / "models"
    canaries = canary_tree(base)
    cfg = config.load({"OLLAMA_MODELS": str(models)})
    store.copy(cfg, STORIES_PATH, "tiny:src")
    before = snapshot_outside(base, models)
    for name in TRAVERSAL + fuzz_names(3000, seed=8):
        for call in (lambda: store.delete(cfg, name), lambda: store.copy(cfg, "tiny:src", name),
                     lambda: store.copy(cfg, name, "tiny:dst"),
                     lambda: store.lookup(name, cfg, from_network=True)):
            try:
                call()
            except (PollamaError, InvalidName):
                pass
    assert snapshot_outside(base, models) == before
    for path, data in canaries.items():
        assert path.read_bytes() == data
    assert not any(b"canary" in blob for blob in blob_contents(models))


# ----------------------------------------------------------------------------- through the API
@pytest.fixture(scope="module")
def sandbox(tmp_path_factory):
    base = tmp_path_factory.mktemp("sandbox")
    models = base / "models"
    canaries = canary_tree(base)
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "256"}, models_dir=str(models)).start()
    proc.base, proc.canaries = base, canaries
    yield proc
    assert proc.stop() == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def _api_calls(url: str, name: str) -> list[httpx.Response]:
    with httpx.Client(base_url=url, timeout=60) as c:
        return [
            c.request("DELETE", "/api/delete", json={"model": name}),
            c.request("DELETE", "/api/delete", json={"name": name}),
            c.post("/api/copy", json={"source": STORIES_PATH, "destination": name}),
            c.post("/api/copy", json={"source": "tiny:src", "destination": name}),
            c.post("/api/copy", json={"source": name, "destination": "tiny:dst"}),
            c.post("/api/show", json={"model": name}),
            c.post("/api/generate", json={"model": name, "prompt": "x", "stream": False,
                                          "options": {"num_predict": 1}}),
            c.get("/v1/models/" + name.replace("\x00", "%00")),
        ]


def test_traversal_names_through_the_api(sandbox):
    base, models = sandbox.base, sandbox.models
    assert httpx.post(sandbox.url + "/api/copy", json={"source": STORIES_PATH, "destination": "tiny:src"},
                      timeout=60).status_code == 200
    before = snapshot_outside(base, models)
    names = TRAVERSAL + fuzz_names(60, seed=3) + [str(p) for p in sandbox.canaries] + [
        str(base / "victim"), "/etc/passwd", "/etc/shadow", "/", "/dev/zero"]
    for name in names:
        for response in _api_calls(sandbox.url, name):
            assert response.status_code < 500, (name, response.request.url, response.text)
    assert snapshot_outside(base, models) == before
    for path, data in sandbox.canaries.items():
        assert path.read_bytes() == data, path
    assert not any(b"canary" in blob for blob in blob_contents(models))
    # the store still works
    tags = httpx.get(sandbox.url + "/api/tags").json()["models"]
    assert "tiny:src" in [m["name"] for m in tags]


def test_files_that_are_not_models_are_not_found(sandbox):
    """A path that is not a GGUF says nothing about the file: 404, no mtime, no import."""
    secret = str(sandbox.base / "secret.txt")
    for path in (secret, "/etc/shadow", "/etc/passwd", str(sandbox.base / "missing.gguf")):
        r = httpx.get(sandbox.url + "/v1/models/" + path)
        assert r.status_code == 404, (path, r.text)
        assert "created" not in r.text
        r = httpx.post(sandbox.url + "/api/copy", json={"source": path, "destination": "stolen:x"})
        assert r.status_code == 404, (path, r.text)
        r = httpx.post(sandbox.url + "/api/show", json={"model": path})
        assert r.status_code == 404, (path, r.text)
    assert not (sandbox.models / "manifests" / "registry.ollama.ai" / "library" / "stolen").exists()


def test_import_copies_a_gguf_never_links_it(sandbox, tmp_path):
    source = tmp_path / "mine.gguf"
    source.write_bytes(STORIES.read_bytes())
    r = httpx.post(sandbox.url + "/api/copy", json={"source": str(source), "destination": "mine:v1"}, timeout=60)
    assert r.status_code == 200, r.text
    digest = hashlib.sha256(source.read_bytes()).hexdigest()
    blob = sandbox.models / "blobs" / f"sha256-{digest}"
    assert blob.is_file() and blob.stat().st_ino != source.stat().st_ino
    source.write_bytes(b"changed after the import")
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest
    r = httpx.post(sandbox.url + "/api/generate", timeout=60, json={
        "model": "mine:v1", "prompt": "Once", "stream": False, "options": {"num_predict": 2}})
    assert r.status_code == 200 and r.json()["eval_count"] == 2
    assert httpx.request("DELETE", sandbox.url + "/api/delete", json={"model": "mine:v1"}).status_code == 200


def test_invalid_names_in_store_changes_are_400(sandbox):
    for body in ({"source": STORIES_PATH, "destination": "registry.ollama.ai/../../x:y"},
                 {"source": STORIES_PATH, "destination": "/tmp/x"}):
        r = httpx.post(sandbox.url + "/api/copy", json=body)
        assert r.status_code == 400 and "invalid" in r.json()["error"], r.text
    r = httpx.request("DELETE", sandbox.url + "/api/delete", json={"model": "registry.ollama.ai/../../../victim/dir:file"})
    assert r.status_code == 400 and "invalid" in r.json()["error"], r.text
    r = httpx.request("DELETE", sandbox.url + "/api/delete", json={"model": "nosuch:tag"})
    assert r.status_code == 404


def test_cli_refuses_traversal_in_show(tmp_path):
    with pytest.raises(ModelNotFound):
        store.lookup("registry.ollama.ai/../../../etc/passwd:x", config.load({"OLLAMA_MODELS": str(tmp_path)}))
    with pytest.raises(InvalidRequest):
        store.delete(config.load({"OLLAMA_MODELS": str(tmp_path)}), "x/../../y:z")


def test_ps_hashes_a_path_model_off_the_event_loop_and_once(sandbox, tmp_path):
    """A model loaded by path has no stored digest: /api/ps hashes it, without freezing the server
    meanwhile, and only the first time."""
    big = tmp_path / "big.gguf"
    with open(big, "wb") as fh:
        fh.write(STORIES.read_bytes())
        fh.truncate(1536 << 20)  # sparse: 1.5 GiB to hash, nothing to store
    r = httpx.post(sandbox.url + "/api/generate", json={"model": str(big), "prompt": ""}, timeout=60)
    assert r.status_code == 200, r.text
    with httpx.Client(base_url=sandbox.url, timeout=120) as c:
        from concurrent.futures import ThreadPoolExecutor
        import time

        with ThreadPoolExecutor(1) as pool:
            t0 = time.monotonic()
            ps = pool.submit(c.get, "/api/ps")
            time.sleep(0.05)
            latencies = []
            while not ps.done():
                t = time.monotonic()
                assert c.get("/").status_code == 200
                latencies.append(time.monotonic() - t)
            first = time.monotonic() - t0
            entries = ps.result().json()["models"]
        assert latencies and max(latencies) < 0.5, (first, latencies)
        digest = next(m["digest"] for m in entries if m["model"] == str(big))
        assert len(digest) == 64
        t = time.monotonic()
        again = c.get("/api/ps").json()["models"]
        assert time.monotonic() - t < first / 4 and again == entries
    httpx.post(sandbox.url + "/api/generate", json={"model": str(big), "prompt": "", "keep_alive": 0}, timeout=60)


def test_a_broken_gguf_file_says_what_is_wrong(sandbox, tmp_path):
    """A path named .gguf is the user's model file: a broken one is a 400 with the reason."""
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(STORIES.read_bytes()[:5000])
    for r in (httpx.get(sandbox.url + "/v1/models/" + str(bad)),
              httpx.post(sandbox.url + "/api/show", json={"model": str(bad)}),
              httpx.post(sandbox.url + "/api/generate", json={"model": str(bad), "prompt": "x"})):
        assert r.status_code == 400 and "truncated" in r.text, r.text


def _store_change_calls(url: str, name: str) -> list[httpx.Response]:
    """The calls of issue 9 that take a name, a path or a digest from the request."""
    quoted = quote(name, safe="")
    with httpx.Client(base_url=url, timeout=60) as c:
        return [
            c.post("/api/pull", json={"model": name, "insecure": True, "stream": False}),
            c.post("/api/create", json={"model": name, "from": STORIES_PATH, "stream": False}),
            c.post("/api/create", json={"model": "safe:x", "from": name, "stream": False}),
            c.post("/api/create", json={"model": "safe:x", "files": {name: name}, "stream": False}),
            c.post("/api/create", json={"model": "safe:x", "files": {name: "sha256:" + "a" * 64}, "stream": False}),
            c.head("/api/blobs/" + quoted),
            c.post("/api/blobs/" + quoted, content=b"canary: uploaded"),
            c.post("/api/push", json={"model": name}),
        ]


def test_traversal_in_pull_create_and_blobs(sandbox):
    base, models = sandbox.base, sandbox.models
    before = snapshot_outside(base, models)
    names = TRAVERSAL + [str(p) for p in sandbox.canaries] + [
        str(base / "victim"), "/etc/passwd", "/", "sha256:../../victim", "sha256-" + "0" * 63 + "/",
        "sha256:" + "0" * 64 + "/../../../victim"]
    for name in names:
        for response in _store_change_calls(sandbox.url, name):
            assert response.status_code < 500, (name, response.request.url, response.text)
    assert snapshot_outside(base, models) == before
    for path, data in sandbox.canaries.items():
        assert path.read_bytes() == data, path
    assert not any(b"canary" in blob for blob in blob_contents(models))
    assert "safe:x" not in [m["name"] for m in httpx.get(sandbox.url + "/api/tags").json()["models"]]


def test_bad_digests_are_400(sandbox):
    for digest in ("sha256:xyz", "sha256:" + "0" * 63, "md5:" + "0" * 32, "sha256-" + "0" * 65, "..", "%2e%2e"):
        assert httpx.head(f"{sandbox.url}/api/blobs/{digest}").status_code in (400, 404), digest
        r = httpx.post(f"{sandbox.url}/api/blobs/{digest}", content=b"x")
        assert r.status_code in (400, 404) and "error" in r.json(), (digest, r.text)
    r = httpx.post(f"{sandbox.url}/api/blobs/sha256:xyz", content=b"x")
    assert r.status_code == 400 and "invalid blob digest" in r.json()["error"]


def test_create_from_a_file_that_is_not_a_model_says_nothing(sandbox):
    """``from`` a path follows resolve()'s rule for network names: a non-GGUF file is not found."""
    for path in (str(sandbox.base / "secret.txt"), "/etc/passwd", "/etc/shadow"):
        r = httpx.post(sandbox.url + "/api/create", json={"model": "stolen:x", "from": path, "stream": False})
        assert r.status_code == 404 and "canary" not in r.text and "root:" not in r.text, (path, r.text)
        assert r.json() == {"error": f'base model "{path}" not found'}
    assert not (sandbox.models / "manifests" / "registry.ollama.ai" / "library" / "stolen").exists()
