"""``pollama serve``'s browser and network safety, its OpenAI error shape and its /v1 input checks.

Everything runs against a real server subprocess; stories260K (1.2 MB) is the model where one is
needed, and the official ``openai`` client is the witness for the /v1 errors.
"""

from __future__ import annotations

import json
import selectors
import signal
import socket
import time

import httpx
import openai
import pytest

from conftest import STORIES, TINYSTORIES
from runner import config
from runner.server.middleware import Origins
from serverproc import ServerProcess

STORIES_PATH = str(STORIES)
HI = [{"role": "user", "content": "Once upon a time"}]


def _stop(proc: ServerProcess) -> None:
    code = proc.stop()
    assert code == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


@pytest.fixture(scope="module")
def server():
    """Bound to 127.0.0.1, as by default: the Host check applies."""
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "2048"}).start()
    yield proc
    _stop(proc)


@pytest.fixture(scope="module")
def lan_server():
    """Bound to 0.0.0.0 (reachable from the network), with OLLAMA_ORIGINS written carelessly."""
    proc = ServerProcess({"OLLAMA_ORIGINS": " chrome-extension://*, http://example.com:*,HTTPS://Exact.Example ,"})
    proc.env["OLLAMA_HOST"] = f"0.0.0.0:{proc.port}"
    proc.start()
    yield proc
    _stop(proc)


@pytest.fixture(scope="module")
def oai(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.url + "/v1", api_key="pollama", timeout=60, max_retries=0)


def _read_all(sock: socket.socket) -> bytes:
    out = b""
    while chunk := sock.recv(65536):
        out += chunk
    return out


def _names(url: str) -> list[str]:
    return [m["name"] for m in httpx.get(url + "/api/tags").json()["models"]]


# ------------------------------------------------------------------------------------- Host
# Ollama's rule (tests/test_hostrule.py has the whole table): local names, the machine's own
# hostname, loopback, private and unspecified IPs pass; a bracketed IPv6 needs its port.
LOCAL_HOSTS = ["localhost", "localhost:11434", "LocalHost:80", "app.localhost", "a.b.localhost:8080",
               "myhost.local", "MyHost.Local:8080", "db.internal", socket.gethostname(),
               "127.0.0.1", "127.0.0.1:11434", "127.9.8.7:1", "[::1]:11434", "[::ffff:127.0.0.1]:80",
               "192.168.1.10", "10.0.0.1:11434", "0.0.0.0:11434", "[::]:11434"]
OTHER_HOSTS = ["evil.example", "evil.example:11434", "localhost.evil.example", "evillocalhost",
               "127.0.0.1.nip.io", "printer.local.evil.example", "8.8.8.8", "[::1]"]


@pytest.mark.parametrize("host", LOCAL_HOSTS)
def test_loopback_server_answers_local_hosts(server, host):
    r = httpx.get(server.url + "/api/tags", headers={"Host": host})
    assert r.status_code == 200, r.text


@pytest.mark.parametrize("host", OTHER_HOSTS)
def test_loopback_server_refuses_other_hosts(server, host):
    r = httpx.get(server.url + "/api/tags", headers={"Host": host})
    assert r.status_code == 403 and "is not allowed" in r.json()["error"], r.text


def test_host_check_details(server):
    # DNS rebinding: a page on evil.example, its name now resolving to 127.0.0.1, is same-origin
    # with the server as far as the browser knows; only the Host tells.
    rebound = {"Host": f"evil.example:{server.port}", "Origin": f"http://evil.example:{server.port}"}
    r = httpx.post(server.url + "/api/copy", headers=rebound,
                   json={"source": STORIES_PATH, "destination": "rebound:latest"})
    assert r.status_code == 403
    assert "rebound:latest" not in _names(server.url)
    # no Host at all (HTTP/1.0): not a browser
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as sock:
        sock.sendall(b"GET /api/version HTTP/1.0\r\n\r\n")
        assert _read_all(sock).startswith(b"HTTP/1.1 200")
    # an OPTIONS that passes by its name answers 204; by its IP it goes on to the routes, as in Ollama
    r = httpx.options(server.url + "/api/chat", headers={"Host": "localhost"})
    assert r.status_code == 204 and r.content == b""
    r = httpx.options(server.url + "/api/chat", headers={"Host": "127.0.0.1"})
    assert r.status_code == 405
    # /v1 refusals use OpenAI's shape
    r = httpx.get(server.url + "/v1/models", headers={"Host": "evil.example"})
    assert r.status_code == 403 and "is not allowed" in r.json()["error"]["message"]


def test_server_on_the_network_has_no_host_check(lan_server):
    r = httpx.get(lan_server.url + "/api/tags", headers={"Host": "evil.example"})
    assert r.status_code == 200


def test_myhost_local_is_answered(server):
    # issue 24: a loopback server reached as myhost.local (mDNS, /etc/hosts) answers, as Ollama's does
    r = httpx.get(server.url + "/api/version", headers={"Host": "myhost.local"})
    assert r.status_code == 200 and r.json()["version"]


# ------------------------------------------------------------------------------------- CORS
DEFAULT_ORIGINS = ["http://localhost", "https://localhost", "http://localhost:3000", "https://127.0.0.1:8443",
                   "http://127.0.0.1", "http://0.0.0.0:8080", "app://obsidian.md", "file://",
                   "tauri://localhost", "vscode-webview://1234abcd", "vscode-file://vscode-app"]
FOREIGN_ORIGINS = ["http://evil.example", "https://localhost.evil.example", "http://127.0.0.1.nip.io",
                   "null", "chrome-extension://abcdef", "http://192.168.1.10:3000", "http://[::1]:3000"]
PREFLIGHT = {"Access-Control-Request-Method": "POST",
             "Access-Control-Request-Headers": "content-type,authorization,x-stainless-os"}


@pytest.mark.parametrize("origin", DEFAULT_ORIGINS)
def test_default_origins_are_allowed(server, origin):
    r = httpx.get(server.url + "/api/version", headers={"Origin": origin})
    assert r.status_code == 200
    assert r.headers["access-control-allow-origin"] == origin and r.headers["vary"] == "Origin"
    r = httpx.options(server.url + "/v1/chat/completions", headers={"Origin": origin, **PREFLIGHT})
    assert r.status_code == 204 and r.content == b""
    assert r.headers["access-control-allow-origin"] == origin
    assert r.headers["access-control-allow-methods"] == "GET,POST,PUT,PATCH,DELETE,HEAD,OPTIONS"
    allowed = r.headers["access-control-allow-headers"].lower().split(",")
    assert {"content-type", "authorization", "x-stainless-os", "x-stainless-retry-count", "openai-beta"} <= set(allowed)
    assert r.headers["access-control-max-age"] == "43200"


@pytest.mark.parametrize("origin", FOREIGN_ORIGINS)
def test_other_origins_are_refused(server, origin):
    for r in (httpx.get(server.url + "/api/version", headers={"Origin": origin}),
              httpx.options(server.url + "/api/chat", headers={"Origin": origin, **PREFLIGHT})):
        assert r.status_code == 403 and "access-control-allow-origin" not in r.headers
        assert "OLLAMA_ORIGINS" in r.json()["error"]


def test_refused_simple_requests_do_nothing(server):
    """A page may POST text/plain cross-origin with no preflight; the server must refuse it before
    it acts. The same requests from an allowed origin do act, so the check below can fail."""
    copy = json.dumps({"source": STORIES_PATH, "destination": "stolen:latest"})
    load = json.dumps({"model": str(TINYSTORIES), "keep_alive": "5m"})
    evil = {"Origin": "http://evil.example", "Content-Type": "text/plain"}
    assert httpx.post(server.url + "/api/copy", headers=evil, content=copy).status_code == 403
    assert httpx.post(server.url + "/api/generate", headers=evil, content=load, timeout=60).status_code == 403
    assert "stolen:latest" not in _names(server.url)
    assert str(TINYSTORIES) not in [m["name"] for m in httpx.get(server.url + "/api/ps").json()["models"]]

    local = {"Origin": "http://localhost:5173", "Content-Type": "text/plain"}
    r = httpx.post(server.url + "/api/copy", headers=local, content=copy)
    assert r.status_code == 200 and r.headers["access-control-allow-origin"] == "http://localhost:5173"
    assert "stolen:latest" in _names(server.url)
    httpx.request("DELETE", server.url + "/api/delete", json={"model": "stolen:latest"})


@pytest.mark.parametrize("origin, allowed", [
    ("chrome-extension://abcdef", True), ("http://example.com:8080", True), ("http://example.com", False),
    ("https://exact.example", True), ("https://exact.example.evil", False),
    ("http://localhost:5173", True), ("http://evil.example", False),
])
def test_ollama_origins_adds_to_the_defaults(lan_server, origin, allowed):
    r = httpx.get(lan_server.url + "/api/version", headers={"Origin": origin})
    assert r.status_code == (200 if allowed else 403)
    assert r.headers.get("access-control-allow-origin") == (origin if allowed else None)


def test_same_origin_requests_are_not_cross_origin(lan_server):
    r = httpx.get(lan_server.url + "/api/version",
                  headers={"Host": "box.lan:1234", "Origin": "http://box.lan:1234"})
    assert r.status_code == 200 and "access-control-allow-origin" not in r.headers


def test_origin_rules_table(caplog):
    assert config.parse_origins("a.example, http://x.example, http://*.y.example:*, , HTTP://Z.example,*") == (
        "http://x.example", "http://z.example", "*")
    assert "a.example" in caplog.text and "only one *" in caplog.text
    every = Origins.of(("*",))
    assert every.allows("http://anything.example") and every.allows("null")
    assert every.response_headers("http://a.example", False) == [(b"access-control-allow-origin", b"*")]
    some = Origins.of(("https://*.example.org",))
    assert some.allows("https://docs.example.org") and not some.allows("https://example.org.evil")


# ------------------------------------------------------------------------------------- docs
def test_docs_are_off(server):
    for path in ("/docs", "/redoc", "/openapi.json", "/docs/oauth2-redirect"):
        assert httpx.get(server.url + path).status_code == 404, path
    from runner.server.app import create_app

    assert "/api/generate" in create_app().openapi()["paths"]  # what the fuzz test reads


# -------------------------------------------------------------------------------- timeouts
def test_idle_and_half_sent_connections_are_closed(server):
    """300 connections that send nothing or stop halfway, a few that trickle their headers a byte
    a second, and kept-alive ones that begin a second request: the server keeps answering, and
    closes every one of them once its deadline passes."""
    from runner.server.protocol import BODY_IDLE_TIMEOUT, HEAD_TIMEOUT

    starts = [
        b"",
        b"POST /api/gen",
        b"POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Ty",
        b'POST /api/generate HTTP/1.1\r\nHost: localhost\r\nContent-Length: 1000\r\n\r\n{"model": ',
    ]
    t0 = time.monotonic()
    socks = []
    for i in range(300):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(starts[i % len(starts)])
        socks.append(sock)
    trickling = []
    for _ in range(5):
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"GET /api/version HTTP/1.1\r\nHost: localhost\r\nX-Slow: ")
        trickling.append(sock)
    for _ in range(5):  # kept alive after one request, then half of the next
        sock = socket.create_connection(("127.0.0.1", server.port))
        sock.sendall(b"GET /api/version HTTP/1.1\r\nHost: localhost\r\n\r\n")
        reply = b""
        while not reply.endswith(b"}"):
            reply += sock.recv(65536)
        sock.sendall(b"GET /api/ver")
        socks.append(sock)
    socks += trickling

    for _ in range(3):  # the server answers others meanwhile
        t = time.monotonic()
        assert httpx.get(server.url + "/api/version", timeout=5).status_code == 200
        assert time.monotonic() - t < 2

    limit = max(HEAD_TIMEOUT, BODY_IDLE_TIMEOUT)
    closed: dict[socket.socket, float] = {}
    sel = selectors.DefaultSelector()
    for sock in socks:
        sel.register(sock, selectors.EVENT_READ)
    last_trickle = time.monotonic()
    while len(closed) < len(socks) and time.monotonic() < t0 + limit + 8:
        for key, _ in sel.select(timeout=0.2):
            try:
                data = key.fileobj.recv(65536)
            except ConnectionError:
                data = b""
            if not data:
                closed[key.fileobj] = time.monotonic() - t0
                sel.unregister(key.fileobj)
        if time.monotonic() - last_trickle >= 1:
            last_trickle = time.monotonic()
            for sock in trickling:
                if sock not in closed:
                    try:
                        sock.sendall(b"a")
                    except OSError:
                        pass
    for sock in socks:
        sock.close()
    assert len(closed) == len(socks), f"{len(socks) - len(closed)} of {len(socks)} still open after {limit + 8:.0f}s"
    assert min(closed.values()) >= min(HEAD_TIMEOUT, BODY_IDLE_TIMEOUT) - 1  # closed by the deadline
    assert all(closed[s] < HEAD_TIMEOUT + 5 for s in trickling)  # trickling did not extend it
    assert httpx.get(server.url + "/api/version", timeout=5).status_code == 200


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
