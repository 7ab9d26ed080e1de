"""A registry that lies must not hurt ``pollama pull`` or ``POST /api/pull``.

Each hostile answer comes from the real test registry on 127.0.0.1 (tests/registry.py,
``LocalRegistry.routes``) and goes to a real ``pollama pull`` subprocess or a real ``pollama
serve``: a gzip-bombed or oversized manifest, manifests that are not manifests, blobs of the
wrong size (empty, too long, endless, gzip-bombed), a registry that trickles or hangs, a client
of ``/api/pull`` that leaves, and a redirect to another service on this machine. The rules: the
manifest is read to at most 4 MiB and must be a valid one; a blob is read to at most its size
(+1 byte); no progress for ``POLLAMA_PULL_STALL_TIMEOUT`` fails the pull; nothing of a failed
pull stays in the store but a partial file whose bytes may still be a prefix of the blob; no
other service's answer is echoed in an error; a remote registry may not send a pull to a local
or private address.
"""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from runner import config, store
from runner.store.pull import pull
from runner.store.registry import Registry, RegistryError, Remote
from runner.store.names import parse_name
from conftest import STORIES
from registry import (MANIFEST, LocalRegistry, OtherService, answer, filler, gzip_bomb, hang,
                      redirect, stream, trickle)
from serverproc import ServerProcess
from test_cli import cli_env

MiB = 1 << 20


@pytest.fixture
def registry():
    reg = LocalRegistry().start()
    yield reg
    reg.stop()


@pytest.fixture
def other():
    service = OtherService()
    yield service
    service.close()


@pytest.fixture
def cfg(tmp_path):
    return config.load({"OLLAMA_MODELS": str(tmp_path / "models")})


# Runs a command and prints, last on stdout, the most memory (KiB) it held: the wrapper's only
# child is the command, so RUSAGE_CHILDREN is the pull's own peak.
_MEASURED = (
    "import resource, subprocess, sys\n"
    "r = subprocess.run(sys.argv[1:], capture_output=True, text=True, timeout=120)\n"
    "sys.stderr.write(r.stderr)\n"
    "sys.stdout.write(r.stdout + '\\nmaxrss_kib=%d\\n' % resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
    "sys.exit(r.returncode)\n"
)


def pull_cli(name: str, home: Path, timeout: float = 60, measure: bool = False, **env: str):
    """``pollama pull --insecure NAME`` with OLLAMA_MODELS=home/models; (result, peak RSS in bytes)."""
    command = [sys.executable, "-m", "cli.main", "pull", "--insecure", name]
    if measure:
        command = [sys.executable, "-c", _MEASURED, *command]
    home.mkdir(parents=True, exist_ok=True)
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout,
                            env=cli_env(home, OLLAMA_MODELS=str(home / "models"), **env))
    rss = 0
    if measure:
        head, _, tail = result.stdout.rpartition("maxrss_kib=")
        rss = int(tail.strip()) * 1024
        result.stdout = head
    return result, rss


def error_line(result: subprocess.CompletedProcess) -> str:
    """The CLI's failure: exit 1, one line on stderr (``Error: ...``), no traceback."""
    assert result.returncode == 1, (result.returncode, result.stdout[-2000:], result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error: ")]
    assert len(lines) == 1, result.stderr
    return lines[0]


def leftovers(models: Path) -> list[str]:
    """What a failed pull left: any file in blobs/ that is not a whole blob, and every manifest."""
    out = []
    blobs = models / "blobs"
    if blobs.is_dir():
        out += [p.name for p in blobs.iterdir() if p.name.endswith("-partial") or p.name.startswith(".")]
    manifests = models / "manifests"
    if manifests.is_dir():
        out += [str(p.relative_to(models)) for p in manifests.rglob("*") if p.is_file()]
    return out


def model_blob(registry: LocalRegistry, model: str) -> tuple[str, bytes]:
    manifest = registry.add_model("library", model, "latest", STORIES)
    digest = manifest["layers"][0]["digest"]
    return digest, registry.blobs[digest]


# ------------------------------------------------------------------------------- manifests
def test_gzip_bomb_manifest_is_refused_in_bounded_memory(registry, tmp_path):
    """A 256 MiB manifest sent as 250 KiB of gzip: refused at 4 MiB, never inflated whole."""
    registry.add_model("library", "good", "latest", STORIES)
    raw = registry.manifests[("library", "good", "latest")]
    registry.routes[registry.manifest_path("library", "bomb", "latest")] = gzip_bomb(
        raw, 256 * MiB, {"Content-Type": MANIFEST})
    ok, ok_rss = pull_cli(registry.name("library", "good", "latest"), tmp_path / "good", measure=True)
    assert ok.returncode == 0, ok.stderr
    result, rss = pull_cli(registry.name("library", "bomb", "latest"), tmp_path / "bomb", measure=True)
    line = error_line(result)
    assert "pull model manifest" in line and "4 MiB" in line, line
    assert rss < ok_rss + 48 * MiB, (rss, ok_rss)
    assert leftovers(tmp_path / "bomb" / "models") == []


@pytest.mark.parametrize("announced", [True, False], ids=["content-length", "no-length"])
def test_oversized_plain_manifest_is_refused(registry, tmp_path, announced):
    """64 MiB of manifest: refused by its Content-Length before the body is read, or by count."""
    registry.add_model("library", "good", "latest", STORIES)
    raw = registry.manifests[("library", "good", "latest")]
    total = len(raw) + 64 * MiB
    path = registry.manifest_path("library", "big", "latest")
    registry.routes[path] = stream(filler(raw, total, b" "), total if announced else None,
                                   {"Content-Type": MANIFEST})
    result, rss = pull_cli(registry.name("library", "big", "latest"), tmp_path, measure=True)
    line = error_line(result)
    assert "pull model manifest" in line and "4 MiB" in line, line
    assert rss < 200 * MiB, rss
    assert leftovers(tmp_path / "models") == []


def _manifest(**changes):
    base = {"schemaVersion": 2, "mediaType": MANIFEST,
            "config": {"mediaType": "application/vnd.docker.container.image.v1+json",
                       "digest": "sha256:" + "a" * 64, "size": 10},
            "layers": [{"mediaType": "application/vnd.ollama.image.model",
                        "digest": "sha256:" + "b" * 64, "size": 20}]}
    base.update(changes)
    return json.dumps({k: v for k, v in base.items() if v is not ...}).encode()


LAYER = {"mediaType": "application/vnd.ollama.image.model", "digest": "sha256:" + "b" * 64, "size": 20}


@pytest.mark.parametrize("body", [
    b"[]", b"null", b"42", b'"text"', b"{}", b"\xff\xfe not utf-8", b"[" * 200_000 + b"]" * 200_000,
    _manifest(schemaVersion=1), _manifest(schemaVersion="2"), _manifest(schemaVersion=...),
    _manifest(layers=...), _manifest(layers={}), _manifest(layers=[]), _manifest(layers=["x"]),
    _manifest(layers=[{**LAYER, "size": -1}]), _manifest(layers=[{**LAYER, "size": True}]),
    _manifest(layers=[{**LAYER, "size": 1.5}]), _manifest(layers=[{**LAYER, "size": "20"}]),
    _manifest(layers=[{**LAYER, "digest": "sha256:../../x"}]), _manifest(layers=[{**LAYER, "digest": 5}]),
    _manifest(layers=[{k: v for k, v in LAYER.items() if k != "size"}]),
    _manifest(layers=[{**LAYER, "mediaType": 7}]),
    _manifest(config=...), _manifest(config=None), _manifest(config="x"),
    _manifest(config={"digest": "sha256:xyz", "size": 10}), _manifest(config={"digest": "sha256:" + "a" * 64}),
], ids=lambda b: b[:40].decode("latin-1"))
def test_what_is_not_a_manifest_is_refused(registry, cfg, body):
    registry.routes[registry.manifest_path("library", "bad", "latest")] = answer(200, body, {"Content-Type": MANIFEST})
    with pytest.raises(RegistryError) as err:
        list(pull(cfg, registry.name("library", "bad", "latest"), insecure=True))
    message = str(err.value)
    assert message.startswith("pull model manifest: ") and "\n" not in message and len(message) < 300
    assert [path for path, _ in registry.requests if "/blobs/" in path] == []
    assert leftovers(cfg.models) == []


def test_an_invalid_manifest_fails_the_cli_in_one_line(registry, tmp_path):
    registry.routes[registry.manifest_path("library", "bad", "latest")] = answer(
        200, _manifest(layers=[{**LAYER, "size": -5}]), {"Content-Type": MANIFEST})
    line = error_line(pull_cli(registry.name("library", "bad", "latest"), tmp_path)[0])
    assert "pull model manifest" in line and "size" in line, line


# ----------------------------------------------------------------------------------- blobs
def _lying_blob(kind: str, data: bytes):
    return {
        "empty": lambda: answer(200, b""),
        "longer": lambda: answer(200, data + b"more than the manifest says"),
        "shorter-announced-longer": lambda: stream(filler(data, len(data) + 1000), len(data) + 1000),
        "endless": lambda: stream(filler(data, None)),
        "gzip-bomb": lambda: gzip_bomb(data, 256 * MiB),
        "server-error": lambda: answer(500, b"internal"),
    }[kind]()


@pytest.mark.parametrize("kind", ["empty", "longer", "shorter-announced-longer", "endless", "gzip-bomb",
                                  "server-error"])
def test_a_blob_of_the_wrong_size_fails_and_leaves_nothing(registry, tmp_path, kind):
    digest, data = model_blob(registry, "m")
    registry.routes[registry.blob_path("library", "m", digest)] = _lying_blob(kind, data)
    started = time.monotonic()
    result, rss = pull_cli(registry.name("library", "m", "latest"), tmp_path, measure=True)
    line = error_line(result)
    assert digest[7:19] in line or digest in line or "500" in line, line
    assert time.monotonic() - started < 60
    assert rss < 200 * MiB, rss
    assert leftovers(tmp_path / "models") == []  # no partial file, no manifest
    assert not (tmp_path / "models" / "blobs" / f"sha256-{digest[7:]}").exists()


def test_a_blob_cut_short_keeps_its_prefix_for_the_resume(registry, tmp_path):
    """The one thing a failed pull keeps: a partial file that may still be a prefix of the blob."""
    digest, data = model_blob(registry, "m")
    registry.drop_after[digest] = len(data) // 2
    line = error_line(pull_cli(registry.name("library", "m", "latest"), tmp_path)[0])
    assert "pull again to resume" in line
    assert leftovers(tmp_path / "models") == [f"sha256-{digest[7:]}-partial"]
    assert pull_cli(registry.name("library", "m", "latest"), tmp_path)[0].returncode == 0
    assert leftovers(tmp_path / "models") == ["manifests/127.0.0.1:%s/library/m/latest" % registry.host.split(":")[1]]


# ------------------------------------------------------------------------- stalls and hangs
def test_a_trickled_manifest_stalls_out(registry, tmp_path):
    registry.add_model("library", "good", "latest", STORIES)
    raw = registry.manifests[("library", "good", "latest")]
    registry.routes[registry.manifest_path("library", "slow", "latest")] = trickle(raw, 0.3, {"Content-Type": MANIFEST})
    started = time.monotonic()
    result, _ = pull_cli(registry.name("library", "slow", "latest"), tmp_path, timeout=40,
                         POLLAMA_PULL_STALL_TIMEOUT="2")
    line = error_line(result)
    assert f"no progress for 2s from {registry.host}" in line, line
    assert time.monotonic() - started < 20
    assert leftovers(tmp_path / "models") == []


def test_a_hanging_blob_stalls_out_and_keeps_its_prefix(registry, tmp_path):
    digest, data = model_blob(registry, "m")
    path = registry.blob_path("library", "m", digest)
    registry.routes[path] = hang(data[:1000], len(data))
    started = time.monotonic()
    result, _ = pull_cli(registry.name("library", "m", "latest"), tmp_path, timeout=40,
                         POLLAMA_PULL_STALL_TIMEOUT="2")
    line = error_line(result)
    assert f"no progress for 2s from {registry.host}" in line and "pull again to resume" in line, line
    assert time.monotonic() - started < 20
    partial = tmp_path / "models" / "blobs" / f"sha256-{digest[7:]}-partial"
    assert partial.read_bytes() == data[:1000]
    del registry.routes[path]
    registry.requests.clear()
    assert pull_cli(registry.name("library", "m", "latest"), tmp_path)[0].returncode == 0
    assert ("/cdn/" + digest, "bytes=1000-") in registry.requests


def test_a_slow_pull_that_progresses_is_no_stall(registry, tmp_path):
    """The watchdog counts progress, not time: a blob that takes 5 s at 200 KiB/s passes a 1 s
    stall timeout (and hashing a partial file between requests is no stall either)."""
    digest, data = model_blob(registry, "m")
    registry.delay[digest] = 0.3  # per 64 KiB
    registry.drop_after[digest] = len(data) // 2
    cfg = config.load({"OLLAMA_MODELS": str(tmp_path / "models"), "POLLAMA_PULL_STALL_TIMEOUT": "1"})
    with pytest.raises(RegistryError, match="pull again to resume"):
        list(pull(cfg, registry.name("library", "m", "latest"), insecure=True))
    started = time.monotonic()
    assert list(pull(cfg, registry.name("library", "m", "latest"), insecure=True))[-1].status == "success"
    assert time.monotonic() - started > 1.5


@pytest.mark.parametrize("raw, seconds", [("", 60.0), ("2", 2.0), ("2s", 2.0), ("1m", 60.0), ("250ms", 0.25),
                                           ("0", 60.0), ("-3", 60.0), ("soon", 60.0), ("inf", 60.0),
                                           ("nan", 60.0)])
def test_the_stall_timeout_setting(raw, seconds):
    assert config.load({"POLLAMA_PULL_STALL_TIMEOUT": raw}).pull_stall_timeout == seconds


def test_a_client_that_leaves_api_pull_stops_the_download(registry):
    """The server's download stops and its registry connection closes when the client goes."""
    digest, data = model_blob(registry, "m")
    path = registry.blob_path("library", "m", digest)
    registry.routes[path] = hang(data[:1000], len(data))
    with ServerProcess() as server:
        with httpx.Client(timeout=30) as client:
            with client.stream("POST", server.url + "/api/pull",
                               json={"model": registry.name("library", "m", "latest"), "insecure": True}) as resp:
                assert resp.status_code == 200
                lines = resp.iter_lines()
                assert json.loads(next(lines))["status"] == "pulling manifest"
                assert json.loads(next(lines))["digest"] == digest
                deadline = time.monotonic() + 20
                while not any(p == path for p, _ in registry.requests) and time.monotonic() < deadline:
                    time.sleep(0.05)
                time.sleep(1.0)  # the blob's first bytes are in (written, not yet flushed)
                assert registry.hangups == []
                left = time.monotonic()
        deadline = left + 10
        while not registry.hangups and time.monotonic() < deadline:
            time.sleep(0.05)
        assert registry.hangups and registry.hangups[0][0] == path
        assert registry.hangups[0][1] - left < 5, registry.hangups[0][1] - left
        partial = server.models / "blobs" / f"sha256-{digest[7:]}-partial"
        deadline = time.monotonic() + 5
        while not (partial.exists() and partial.stat().st_size >= 1000) and time.monotonic() < deadline:
            time.sleep(0.05)
        assert partial.read_bytes() == data[:1000]  # a cancelled pull keeps its prefix
        log = server.log()
    assert "Traceback" not in log, log


# ------------------------------------------------------------------------------- redirects
def test_a_redirect_to_another_local_service_echoes_nothing_of_it(registry, other, tmp_path):
    """A local registry may send the pull to another local port (it is local itself), but that
    service's answer is never repeated: the error says its status and host only."""
    registry.routes[registry.manifest_path("library", "m", "latest")] = redirect(f"http://{other.host}/admin")
    line = error_line(pull_cli(registry.name("library", "m", "latest"), tmp_path)[0])
    assert other.requests == ["/admin"]
    assert "SECRET" not in line and "hunter2" not in line, line
    assert "500" in line and other.host in line, line


def test_a_blob_redirect_to_another_service_echoes_nothing_through_the_server(registry, other):
    digest, _ = model_blob(registry, "m")
    registry.routes[registry.blob_path("library", "m", digest)] = redirect(f"http://{other.host}/secret")
    with ServerProcess() as server:
        resp = httpx.post(server.url + "/api/pull", json={"model": registry.name("library", "m", "latest"),
                                                          "insecure": True}, timeout=60)
        last = json.loads(resp.text.strip().splitlines()[-1])
        assert "error" in last, resp.text
        assert "SECRET" not in resp.text and "hunter2" not in resp.text
        assert "500" in last["error"] and other.host in last["error"]
        assert leftovers(server.models) == []


def test_the_registrys_own_error_is_shown_bounded_on_one_line(registry, tmp_path):
    message = "you may not pull this\nsecond line " + "x" * 1000
    body = json.dumps({"errors": [{"code": "DENIED", "message": message}]}).encode()
    registry.routes[registry.manifest_path("library", "m", "latest")] = answer(403, body, {"Content-Type": "application/json"})
    line = error_line(pull_cli(registry.name("library", "m", "latest"), tmp_path)[0])
    assert "403" in line and "you may not pull this" in line, line
    assert len(line) < 320, line


def test_the_registrys_own_plain_body_is_not_echoed(registry, tmp_path):
    """A body that is not a registry's JSON error could be anything (another service answering
    on that port): its status and host only."""
    registry.routes[registry.manifest_path("library", "m", "latest")] = answer(
        500, b"<html>SECRET admin page</html>", {"Content-Type": "text/html"})
    line = error_line(pull_cli(registry.name("library", "m", "latest"), tmp_path)[0])
    assert "SECRET" not in line and "500" in line and registry.host in line, line


PUBLIC, CDN = "151.101.0.1", "104.16.0.1"


@pytest.mark.parametrize("registry_ips, target_ips, allowed", [
    ([PUBLIC], [CDN], True),  # a remote registry to its CDN
    ([PUBLIC], ["2606:4700::6810:1"], True),
    ([PUBLIC], ["127.0.0.1"], False),  # loopback
    ([PUBLIC], ["127.1.2.3"], False),
    ([PUBLIC], ["::1"], False),
    ([PUBLIC], ["::ffff:127.0.0.1"], False),  # loopback behind an IPv4-mapped IPv6 address
    ([PUBLIC], ["0.0.0.0"], False),  # unspecified
    ([PUBLIC], ["::"], False),
    ([PUBLIC], ["10.0.0.8"], False),  # private
    ([PUBLIC], ["172.16.5.4"], False),
    ([PUBLIC], ["192.168.1.1"], False),
    ([PUBLIC], ["fd00::1"], False),
    ([PUBLIC], ["169.254.169.254"], False),  # link-local (cloud metadata)
    ([PUBLIC], ["fe80::1"], False),
    ([PUBLIC], ["100.64.0.1"], False),  # shared address space (carrier NAT)
    ([PUBLIC], ["224.0.0.1"], False),  # multicast
    ([PUBLIC], [CDN, "127.0.0.1"], False),  # a name that also resolves to loopback
    ([PUBLIC], [], False),  # a name that resolves to nothing
    ([PUBLIC], ["not an address"], False),
    (["127.0.0.1"], ["127.0.0.1"], True),  # a local registry may go anywhere
    (["127.0.0.1"], ["10.0.0.8"], True),
    (["192.168.1.10"], ["127.0.0.1"], True),  # so may one on the LAN
    (["::1"], [CDN], True),
    ([PUBLIC, "10.0.0.1"], ["127.0.0.1"], True),  # a name that resolves to a private address is local
])
def test_may_follow(registry_ips, target_ips, allowed):
    from runner.store.registry import may_follow

    assert may_follow(registry_ips, target_ips) is allowed


def test_a_remote_registry_never_reaches_a_local_address(registry):
    """The rule holds for every connection a pull makes (not only redirects): under a remote
    registry's rule, 127.0.0.1 is refused before a byte is sent."""
    from runner.store.registry import AddressRule

    registry.add_model("library", "m", "latest", STORIES)
    text = registry.name("library", "m", "latest")
    remote = Remote.of(text, parse_name(text), insecure=True)
    rule = AddressRule(registry_ips=[PUBLIC])
    with Registry(remote, rule=rule) as client:
        with pytest.raises(RegistryError) as err:
            client.manifest()
    assert "127.0.0.1" in str(err.value) and "local" in str(err.value), err.value
    assert registry.requests == []


def test_every_connection_is_checked_not_only_each_request(registry):
    """The second line, for a name that resolves elsewhere by the time it is connected to (DNS
    rebinding): the connection itself refuses a local address under a remote registry's rule."""
    from runner.store.registry import AddressRule, RefusedAddress, Watchdog, _Backend

    watchdog = Watchdog(5.0)
    try:
        host, port = registry.host.split(":")
        with pytest.raises(RefusedAddress, match="local or private"):
            _Backend(AddressRule(registry_ips=[PUBLIC]), watchdog).connect_tcp(host, int(port))
        stream = _Backend(AddressRule.for_host(registry.host), watchdog).connect_tcp(host, int(port))
        stream.close()  # a local registry's rule connects
    finally:
        watchdog.close()
    assert registry.requests == []


def test_a_local_registry_rule_is_local():
    from runner.store.registry import AddressRule

    assert AddressRule.for_host("127.0.0.1:5000").local
    assert AddressRule.for_host("localhost").local
    assert not AddressRule(registry_ips=[PUBLIC]).local


def test_a_pull_that_worked_still_works(registry, tmp_path):
    """The bounds leave an honest pull alone: redirected blobs, a gzip-encoded manifest."""
    registry.add_model("library", "good", "latest", STORIES)
    raw = registry.manifests[("library", "good", "latest")]
    registry.routes[registry.manifest_path("library", "gz", "latest")] = answer(
        200, gzip.compress(raw), {"Content-Encoding": "gzip", "Content-Type": MANIFEST})
    result, _ = pull_cli(registry.name("library", "gz", "latest"), tmp_path)
    assert result.returncode == 0, result.stderr
    cfg = config.load({"OLLAMA_MODELS": str(tmp_path / "models")})
    assert store.lookup(registry.name("library", "gz", "latest"), cfg).path.read_bytes() == STORIES.read_bytes()
