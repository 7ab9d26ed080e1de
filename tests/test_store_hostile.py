"""The store under hostile or simply concurrent use, through a real ``pollama serve`` and the
real CLI: blob uploads cut short or malformed, the same blob uploaded by several clients at once,
clients racing ``/api/copy`` and ``/api/delete`` on the same names, and ``pollama create -f`` of
something that is not a regular file. The server's log must hold no traceback afterwards."""

from __future__ import annotations

import hashlib
import json
import os
import random
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import STORIES
from serverproc import ServerProcess
from test_cli import cli_env


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "256"}).start()
    yield proc
    assert proc.stop() == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def no_traceback(server) -> None:
    log = server.log()
    assert "Traceback" not in log and "Exception in ASGI" not in log, log


def store_files(models: Path) -> list[Path]:
    return [p for p in models.rglob("*") if p.is_file()] if models.is_dir() else []


def stray_files(models: Path) -> list[str]:
    """Files in blobs/ or manifests/ that are neither a blob nor a manifest (temp files, partials)."""
    out = []
    for path in store_files(models):
        rel = path.relative_to(models)
        if rel.parts[0] == "blobs":
            name = rel.parts[-1]
            if not (name.startswith("sha256-") and len(name) == 7 + 64):
                out.append(str(rel))
        elif rel.parts[0] == "manifests":
            if path.name.startswith("."):
                out.append(str(rel))
    return out


def raw_request(server, head: bytes, body: bytes, *, half_close: bool, wait: float) -> bytes:
    """Send ``head`` + ``body`` on a raw socket, maybe half-close, and read what comes back."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=wait) as sock:
        sock.sendall(head + body)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
        got = b""
        try:
            while True:
                piece = sock.recv(65536)
                if not piece:
                    break
                got += piece
        except (socket.timeout, ConnectionResetError):
            pass
        return got


def upload_head(server, digest: str, extra: str) -> bytes:
    return (f"POST /api/blobs/{digest} HTTP/1.1\r\nHost: 127.0.0.1:{server.port}\r\n"
            f"{extra}\r\n").encode()


def settle(server, digest: str) -> None:
    """Give the server a moment to finish with a cut-off request, then check it still answers."""
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not stray_files(server.models):
            break
        time.sleep(0.1)
    assert httpx.head(f"{server.url}/api/blobs/{digest}").status_code == 404


# ------------------------------------------------------------------------- partial bodies
def test_an_upload_whose_body_ends_early_is_refused_and_leaves_nothing(server):
    data = os.urandom(100_000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    head = upload_head(server, digest, f"Content-Length: {len(data)}\r\n")
    got = raw_request(server, head, data[:30_000], half_close=True, wait=30)
    assert got == b"" or got.startswith(b"HTTP/1.1 400"), got[:200]
    settle(server, digest)
    assert stray_files(server.models) == []
    no_traceback(server)


def test_an_upload_with_malformed_chunks_is_refused_and_leaves_nothing(server):
    data = os.urandom(5000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    head = upload_head(server, digest, "Transfer-Encoding: chunked\r\n")
    body = b"1000\r\n" + data[:4096] + b"\r\nzz-not-hex\r\n" + data[4096:] + b"\r\n0\r\n\r\n"
    got = raw_request(server, head, body, half_close=False, wait=30)
    assert got == b"" or got.startswith(b"HTTP/1.1 400"), got[:200]
    settle(server, digest)
    assert stray_files(server.models) == []
    no_traceback(server)


def test_an_upload_that_stalls_is_closed_after_the_body_timeout(server):
    data = os.urandom(50_000)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    head = upload_head(server, digest, f"Content-Length: {len(data)}\r\n")
    t0 = time.monotonic()
    got = raw_request(server, head, data[:1000], half_close=False, wait=40)  # then says nothing
    assert got == b"" or got.startswith(b"HTTP/1.1 400"), got[:200]
    assert time.monotonic() - t0 < 35  # the server's 10 s body pause closed it
    settle(server, digest)
    assert stray_files(server.models) == []
    no_traceback(server)


# ---------------------------------------------------------------------- concurrent uploads
def slow_body(data: bytes, pieces: int = 16, pause: float = 0.02):
    step = -(-len(data) // pieces)
    for i in range(0, len(data), step):
        time.sleep(pause)
        yield data[i:i + step]


def test_concurrent_uploads_of_one_blob_all_succeed_and_the_blob_is_whole(server):
    data = os.urandom(3 << 20)
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    wrong = "sha256:" + hashlib.sha256(b"something else").hexdigest()
    statuses: list[int] = []
    wrong_statuses: list[int] = []
    start = threading.Barrier(9)

    def upload(target: str, out: list[int]) -> None:
        start.wait()
        with httpx.Client(timeout=60) as client:
            out.append(client.post(f"{server.url}/api/blobs/{target}", content=slow_body(data)).status_code)

    threads = [threading.Thread(target=upload, args=(digest, statuses)) for _ in range(8)]
    threads.append(threading.Thread(target=upload, args=(wrong, wrong_statuses)))
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert len(statuses) == 8 and set(statuses) <= {200, 201} and 201 in statuses, statuses
    assert wrong_statuses == [400]
    blob = server.models / "blobs" / f"sha256-{digest[7:]}"
    assert hashlib.sha256(blob.read_bytes()).hexdigest() == digest[7:]
    assert httpx.head(f"{server.url}/api/blobs/{wrong}").status_code == 404
    assert stray_files(server.models) == []
    no_traceback(server)


# ------------------------------------------------------------------ copy and delete racing
def blob_names(models: Path) -> set[str]:
    return {p.name for p in (models / "blobs").iterdir()} if (models / "blobs").is_dir() else set()


def check_consistent(models: Path, unnamed: set[str]) -> None:
    """Every manifest parses and its blobs exist; every blob but ``unnamed`` (uploads no model
    names yet) is named by some manifest."""
    named: set[str] = set()
    manifests = models / "manifests"
    for path in (p for p in manifests.rglob("*") if p.is_file()) if manifests.is_dir() else []:
        manifest = json.loads(path.read_text())
        for item in [manifest["config"], *manifest["layers"]]:
            blob = models / "blobs" / item["digest"].replace(":", "-")
            assert blob.is_file(), f"{path} names a missing blob {blob.name}"
            named.add(blob.name)
    orphans = blob_names(models) - named - unnamed
    assert not orphans, f"orphan blobs: {orphans}"
    assert stray_files(models) == []


def test_copy_and_delete_racing_on_the_same_names_keep_the_store_consistent(server):
    names = ["race0", "race1", "race2"]
    uploaded = blob_names(server.models)  # by the tests before, named by no model
    r = httpx.post(server.url + "/api/copy", json={"source": str(STORIES), "destination": names[0]})
    assert r.status_code == 200
    statuses: list[tuple[str, int, str]] = []
    start = threading.Barrier(20)

    def client(seed: int) -> None:
        rnd = random.Random(seed)
        start.wait()
        with httpx.Client(base_url=server.url, timeout=60) as http:
            for _ in range(10):
                action = rnd.random()
                if action < 0.4:
                    src, dst = rnd.choice(names), rnd.choice(names)
                    r = http.post("/api/copy", json={"source": src, "destination": dst})
                elif action < 0.5:  # an import: the blob comes back after every delete pruned it
                    r = http.post("/api/copy", json={"source": str(STORIES), "destination": rnd.choice(names)})
                else:
                    r = http.request("DELETE", "/api/delete", json={"model": rnd.choice(names)})
                statuses.append((action < 0.5 and "copy" or "delete", r.status_code, r.text))

    threads = [threading.Thread(target=client, args=(i,)) for i in range(20)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(180)
    bad = [s for s in statuses if s[1] not in (200, 404)]
    assert len(statuses) == 200 and not bad, bad
    check_consistent(server.models, uploaded)
    for m in httpx.get(server.url + "/api/tags").json()["models"]:  # every listed model shows
        assert httpx.post(server.url + "/api/show", json={"model": m["name"]}).status_code == 200
    no_traceback(server)


# ---------------------------------------------------------------- create -f of a non-file
def run_create(home: Path, modelfile: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "cli.main", "create", "x", "-f", modelfile],
                          capture_output=True, text=True, timeout=timeout, env=cli_env(home),
                          cwd=Path(__file__).resolve().parents[1], stdin=subprocess.DEVNULL)


def one_error_line(out: subprocess.CompletedProcess) -> str:
    assert out.returncode == 1, (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and out.stderr.count("\n") == 1, out.stderr
    assert out.stderr.startswith("Error: "), out.stderr
    return out.stderr.strip()


def test_create_from_dev_zero_is_refused(_isolated_home):
    line = one_error_line(run_create(_isolated_home, "/dev/zero"))
    assert "not a regular file" in line, line


def test_create_from_a_fifo_is_refused_without_waiting(_isolated_home, tmp_path):
    fifo = tmp_path / "Modelfile"
    os.mkfifo(fifo)
    line = one_error_line(run_create(_isolated_home, str(fifo), timeout=30))
    assert "not a regular file" in line, line


def test_create_from_an_oversized_modelfile_is_refused(_isolated_home, tmp_path):
    big = tmp_path / "Modelfile"
    big.write_text(f"FROM {STORIES}\nSYSTEM \"\"\"" + "x" * (1 << 20) + "\"\"\"\n")
    line = one_error_line(run_create(_isolated_home, str(big)))
    assert "larger than 1 MiB" in line, line
    assert not store_files(_isolated_home / ".ollama" / "models")


def test_a_long_modelfile_within_the_bound_is_created(_isolated_home, tmp_path):
    path = tmp_path / "Modelfile"
    system = "You are a careful assistant. " * 8000  # about 230 KB: a long SYSTEM
    path.write_text(f"FROM {STORIES}\nSYSTEM \"\"\"{system}\"\"\"\n")
    out = run_create(_isolated_home, str(path))
    assert out.returncode == 0, out.stderr


def test_api_create_from_a_fifo_or_a_device_answers_at_once(server, tmp_path):
    fifo = tmp_path / "weights"
    os.mkfifo(fifo)
    gguf_fifo = tmp_path / "weights.gguf"
    os.mkfifo(gguf_fifo)
    for source in (str(fifo), str(gguf_fifo), "/dev/zero"):
        r = httpx.post(server.url + "/api/create", timeout=20,
                       json={"model": "fromfifo", "from": source, "stream": False})
        assert r.status_code in (400, 404), (source, r.status_code, r.text)
        r = httpx.post(server.url + "/api/copy", timeout=20, json={"source": source, "destination": "fromfifo"})
        assert r.status_code in (400, 404), (source, r.status_code, r.text)
    no_traceback(server)
