"""The registry protocol Ollama speaks (Docker distribution v2), as a client that trusts no answer.

``GET {scheme}://{host}/v2/{namespace}/{model}/manifests/{tag}`` answers the manifest (config and
layers, Docker's image manifest v2); ``GET .../blobs/{digest}`` answers a layer, usually through
a redirect to a CDN. ``registry.ollama.ai`` and Hugging Face (``hf.co``, ``huggingface.co``) speak
it alike. The scheme is https; ``insecure`` (``--insecure``, ``insecure: true``) uses plain http,
for a local registry. A ``401`` with a ``Bearer`` challenge is answered once with an anonymous
token from the challenge's realm (Docker's token protocol); nothing is signed.

A registry (or whatever it redirects to) may lie, so every answer is bounded:

- a body is read in pieces, ``Content-Encoding`` (gzip, deflate) undone here a bounded piece at a
  time, and the reading stops one byte past what the caller accepts (:data:`MAX_MANIFEST` for a
  manifest, the manifest's size for a blob), so a gzip bomb costs nothing;
- :class:`Watchdog`: a pull that receives less than :data:`PROGRESS_BYTES` in ``stall`` seconds
  (``POLLAMA_PULL_STALL_TIMEOUT``) fails, and one whose caller cancels stops at once: the
  watchdog shuts the socket the read waits on (a read timeout alone would not do: it starts over
  with every byte of a trickle);
- :class:`AddressRule`: a remote registry (one whose host resolves to public addresses only) may
  not send a pull to a loopback, private, link-local or unspecified address, neither by a
  redirect nor by its DNS; it is checked before each request and again for each connection
  (:class:`_Backend`), so a name that re-resolves to 127.0.0.1 is caught too. A registry that is
  itself local or private may send it anywhere;
- redirects are followed here (at most :data:`MAX_REDIRECTS`), the bearer token only ever sent to
  the registry's own host;
- behind a proxy (``HTTPS_PROXY``, ``HTTP_PROXY``, ``ALL_PROXY`` set) httpx's own transports
  connect, honouring ``NO_PROXY``: the check before each request and the bounds on bodies still
  hold, but the per-connection check and the watchdog's shutdown of a waiting read do not (a
  stall or a cancel then ends the pull at the next byte, or at the read timeout, ``stall`` + 5 s);
- errors are one line and never repeat another service's answer: the registry's own JSON error
  (``errors[0].message``, at most :data:`MAX_MESSAGE` characters), else the status and the host.

Errors: the registry's 404 is :class:`ModelNotFound` ``file does not exist`` (the pull says
``pull model manifest: file does not exist``, as Ollama), anything else that goes wrong is
:class:`RegistryError` (502).
"""

from __future__ import annotations

import ipaddress
import json
import logging
import re
import socket
import threading
import time
import urllib.request
import weakref
import zlib
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from http import HTTPStatus
from typing import Any, Iterable, Iterator, Sequence

import httpcore
import httpx

from ..api import Cancelled, InvalidRequest, ModelNotFound, PollamaError
from ..version import pollama_version
from .manifests import MANIFEST_MEDIA_TYPE
from .names import Name

log = logging.getLogger(__name__)

MAX_MANIFEST = 4 << 20  # bytes of a manifest after decoding (Ollama's are about 1 KiB)
MAX_ANSWER = 64 << 10  # bytes of an error's or a token's answer that are read
MAX_MESSAGE = 200  # characters of a registry's error message that are shown
MAX_REDIRECTS = 10
PROGRESS_BYTES = 1024  # what counts as progress for the watchdog
_PIECE = 1 << 20  # the most a body's decoder produces at once
_CONNECT_TIMEOUT = 10.0
_ACCEPT = f"{MANIFEST_MEDIA_TYPE}, application/vnd.oci.image.manifest.v1+json"
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')
_REDIRECTS = (301, 302, 303, 307, 308)


class RegistryError(PollamaError):
    """The registry could not be reached or answered something unusable."""

    status = 502


class RefusedAddress(RegistryError):
    """A remote registry's pull would connect to a local or private address."""


class InsecureProtocol(InvalidRequest):
    """An ``http://`` name without ``insecure``."""


@dataclass
class Remote:
    """Where a name lives: ``{scheme}://{host}/v2/{namespace}/{model}``."""

    name: Name
    scheme: str = "https"

    @classmethod
    def of(cls, text: str, name: Name, insecure: bool) -> "Remote":
        """``text`` is what the user typed (its ``http://`` prefix, if any, asks for http)."""
        if text.lower().startswith("http://") and not insecure:
            raise InsecureProtocol("insecure protocol http")
        return cls(name, "http" if insecure else "https")

    def url(self, *parts: str) -> str:
        n = self.name
        return "/".join([f"{self.scheme}://{n.host}", "v2", n.namespace, n.model, *parts])


# ----------------------------------------------------------------------------- addresses
def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        ip = ipaddress.ip_address(str(text).split("%", 1)[0])  # no IPv6 zone
    except ValueError:
        return None
    if ip.version == 6 and ip.ipv4_mapped is not None:  # ::ffff:127.0.0.1 is 127.0.0.1
        return ip.ipv4_mapped
    return ip


def is_public(address: str) -> bool:
    """Whether ``address`` is a global unicast address (not loopback, private, link-local,
    unspecified, shared, reserved or multicast). Anything that is not an address is not."""
    ip = _ip(address)
    return ip is not None and ip.is_global and not ip.is_multicast and not ip.is_reserved


def may_follow(registry_ips: Sequence[str], target_ips: Sequence[str]) -> bool:
    """Whether a pull from a registry at ``registry_ips`` may connect to a host at ``target_ips``.

    A registry with any address that is not public is local (this machine, the LAN, a VPN): it
    may send the pull anywhere, as the user chose to trust it. A remote registry may only send it
    to a host whose every address is public (a name that also resolves to 127.0.0.1 is refused,
    as is one that resolves to nothing).
    """
    if any(not is_public(ip) for ip in registry_ips):
        return True
    return bool(target_ips) and all(is_public(ip) for ip in target_ips)


def addresses(host: str, port: int | None = None) -> list[str]:
    """The addresses ``host`` resolves to (an address resolves to itself); [] when it does not."""
    host = host.strip("[]")
    if _ip(host) is not None:
        return [host]
    try:
        infos = socket.getaddrinfo(host, port or 443, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError):
        return []
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


class AddressRule:
    """Which addresses one pull may connect to (:func:`may_follow` for the registry's addresses)."""

    def __init__(self, registry_ips: Sequence[str]) -> None:
        self.registry_ips = list(registry_ips)
        self.local = any(not is_public(ip) for ip in self.registry_ips)

    @classmethod
    def for_host(cls, host: str) -> "AddressRule":
        """The rule for a registry at ``host`` (``name[:port]``, as a model name spells it)."""
        try:
            hostname = httpx.URL(f"http://{host}/").host
        except httpx.InvalidURL:
            hostname = host
        return cls(addresses(hostname))

    def check(self, host: str, port: int | None) -> list[str]:
        """The addresses ``host`` resolves to here, once the rule allows them all. Raises
        RefusedAddress naming one it refuses. A name that does not resolve here is not refused
        by this check (a proxy may resolve it); :class:`_Backend` never connects to one. Under a
        local registry's rule nothing is checked (nor resolved): []."""
        if self.local:
            return []
        ips = addresses(host, port)
        if ips and not may_follow(self.registry_ips, ips):
            bad = next(ip for ip in ips if not is_public(ip))
            shown = host if host == bad else f"{host} ({bad})"
            raise RefusedAddress(f"refused to connect to {shown}: a local or private address, "
                                 "and the registry is not a local one")
        return ips


# ------------------------------------------------------------------------------ watchdog
def _shutdown(sock: socket.socket) -> None:
    with suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)


class Watchdog:
    """Fails a pull that makes no progress and stops one that is cancelled, at once.

    Between :meth:`begin` and :meth:`end` (one request, its redirects and its body) at least
    :data:`PROGRESS_BYTES` must arrive every ``stall`` seconds; when they do not, or when
    ``cancel`` is set, a thread shuts down every socket the pull opened, so the read that waits
    fails now, and :meth:`check` says why.
    """

    def __init__(self, stall: float, cancel: threading.Event | None = None) -> None:
        self.stall = stall
        self.cancel = cancel or threading.Event()
        self.host = ""
        self.stalled = False
        self._lock = threading.Lock()
        self._sockets: weakref.WeakSet[socket.socket] = weakref.WeakSet()
        self._armed = False
        self._mark = time.monotonic()
        self._count = 0
        self._closed = threading.Event()
        self._thread = threading.Thread(target=self._run, name="pull-watchdog", daemon=True)
        self._thread.start()

    def begin(self, host: str) -> None:
        """A request to ``host`` starts (or a redirect moves on to it)."""
        self.check()
        with self._lock:
            self.host, self._armed, self._mark, self._count = host, True, time.monotonic(), 0

    def end(self) -> None:
        with self._lock:
            self._armed = False

    def arrived(self, n: int) -> None:
        """``n`` more bytes came from the network."""
        self._count += n
        if self._count >= PROGRESS_BYTES:
            self._mark, self._count = time.monotonic(), 0

    def watch(self, sock: Any) -> None:
        """A socket of this pull: shut down when the watchdog fires (at once if it has)."""
        if not isinstance(sock, socket.socket):
            return
        with self._lock:
            self._sockets.add(sock)
            fired = self.stalled or self.cancel.is_set()
        if fired:
            _shutdown(sock)

    def check(self) -> None:
        """Raise Cancelled or RegistryError (``no progress for 60s from HOST``) if it fired."""
        if self.cancel.is_set():
            raise Cancelled("the pull was cancelled")
        if self.stalled:
            raise RegistryError(f"no progress for {self.stall:g}s from {self.host}")

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        tick = max(0.01, min(0.25, self.stall / 8))
        while not self._closed.is_set():
            if self.cancel.wait(tick):
                self._fire()
                return
            with self._lock:
                stalled = self._armed and time.monotonic() - self._mark > self.stall
                if stalled:
                    self.stalled = True
            if stalled:
                log.info("pull: no progress for %gs from %s", self.stall, self.host)
                self._fire()
                return

    def _fire(self) -> None:
        with self._lock:
            sockets = list(self._sockets)
        for sock in sockets:
            _shutdown(sock)


# ----------------------------------------------------------------------------- transport
class _Stream(httpcore.NetworkStream):
    """A connection whose sockets the watchdog knows and whose bytes it counts."""

    def __init__(self, inner: httpcore.NetworkStream, watchdog: Watchdog) -> None:
        self._inner, self._watchdog = inner, watchdog
        watchdog.watch(inner.get_extra_info("socket"))

    def read(self, max_bytes: int, timeout: float | None = None) -> bytes:
        data = self._inner.read(max_bytes, timeout)
        self._watchdog.arrived(len(data))
        return data

    def write(self, buffer: bytes, timeout: float | None = None) -> None:
        self._inner.write(buffer, timeout)

    def close(self) -> None:
        self._inner.close()

    def start_tls(self, ssl_context: Any, server_hostname: str | None = None,
                  timeout: float | None = None) -> httpcore.NetworkStream:
        return _Stream(self._inner.start_tls(ssl_context, server_hostname, timeout), self._watchdog)

    def get_extra_info(self, info: str) -> Any:
        return self._inner.get_extra_info(info)


class _Backend(httpcore.NetworkBackend):
    """TCP connections for one pull: only to addresses its rule allows (resolved here, then
    connected to by address: TLS still checks the name), each watched by its watchdog."""

    def __init__(self, rule: AddressRule, watchdog: Watchdog) -> None:
        self._inner = httpcore.SyncBackend()
        self._rule, self._watchdog = rule, watchdog

    def connect_tcp(self, host: str, port: int, timeout: float | None = None,
                    local_address: str | None = None, socket_options: Iterable[Any] | None = None
                    ) -> httpcore.NetworkStream:
        self._watchdog.check()
        if self._rule.local:
            ips = [host]
        else:  # by address, each one checked: a name that re-resolves elsewhere cannot slip by
            ips = self._rule.check(host, port)
            if not ips:
                raise httpcore.ConnectError(f"could not resolve {host}")
        error: Exception | None = None
        for address in ips:
            try:
                stream = self._inner.connect_tcp(address, port, timeout, local_address, socket_options)
            except (httpcore.ConnectError, httpcore.ConnectTimeout) as err:
                error = err
                continue
            return _Stream(stream, self._watchdog)
        assert error is not None
        raise error

    def connect_unix_socket(self, path: str, timeout: float | None = None,
                            socket_options: Iterable[Any] | None = None) -> httpcore.NetworkStream:
        raise httpcore.ConnectError("a pull does not use unix sockets")

    def sleep(self, seconds: float) -> None:
        self._inner.sleep(seconds)


@contextmanager
def _as_httpx(request: httpx.Request) -> Iterator[None]:
    """httpcore's exceptions as httpx's (the same names), as httpx's own transport does."""
    try:
        yield
    except Exception as err:
        kind = getattr(httpx, type(err).__name__, None) if type(err).__module__.startswith("httpcore") else None
        if isinstance(kind, type) and issubclass(kind, httpx.TransportError):
            raise kind(str(err), request=request) from err
        raise


class _Body(httpx.SyncByteStream):
    def __init__(self, response: httpcore.Response, request: httpx.Request) -> None:
        self._response, self._request = response, request

    def __iter__(self) -> Iterator[bytes]:
        with _as_httpx(self._request):
            for part in self._response.iter_stream():
                yield part

    def close(self) -> None:
        with _as_httpx(self._request):
            self._response.close()


class _Transport(httpx.BaseTransport):
    """httpx over httpcore's connection pool with the pull's own network backend."""

    def __init__(self, backend: _Backend) -> None:
        self._pool = httpcore.ConnectionPool(ssl_context=httpx.create_ssl_context(),
                                             network_backend=backend)

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        core = httpcore.Request(
            method=request.method,
            url=httpcore.URL(scheme=url.raw_scheme, host=url.raw_host, port=url.port, target=url.raw_path),
            headers=request.headers.raw, content=request.stream, extensions=request.extensions,
        )
        with _as_httpx(request):
            response = self._pool.handle_request(core)
        return httpx.Response(response.status, headers=response.headers,
                              stream=_Body(response, request), extensions=response.extensions)

    def close(self) -> None:
        self._pool.close()


# ------------------------------------------------------------------------------- bodies
class _Decoder:
    """Undoes a Content-Encoding (none, gzip, deflate) a bounded piece at a time."""

    def __init__(self, header: str) -> None:
        codings = [c.strip().lower() for c in header.split(",") if c.strip().lower() not in ("", "identity")]
        self._z: Any = None
        if not codings:
            return
        if len(codings) > 1 or codings[0] not in ("gzip", "x-gzip", "deflate"):
            raise RegistryError(f"unsupported Content-Encoding {header[:40]!r}")
        self._z = zlib.decompressobj(32 + zlib.MAX_WBITS)  # a gzip or a zlib header

    def pieces(self, data: bytes, room: int) -> Iterator[bytes]:
        """``data`` decoded, in pieces; ``room`` bounds the first (the caller asks again)."""
        if self._z is None:
            yield data
            return
        while data and not self._z.eof:
            try:
                piece = self._z.decompress(data, max(1, min(room, _PIECE)))
            except zlib.error:
                raise RegistryError("the registry sent a body that does not decode") from None
            data = self._z.unconsumed_tail
            if piece:
                yield piece
            elif not data:
                return


def _where(url: httpx.URL) -> str:
    """``host[:port]`` of a URL, for messages."""
    host = url.host if ":" not in url.host else f"[{url.host}]"
    return f"{host}:{url.port}" if url.port else host


def _one_line(text: str, limit: int = MAX_MESSAGE) -> str:
    text = " ".join("".join(ch if ch.isprintable() else " " for ch in text).split())
    return text if len(text) <= limit else text[:limit - 1] + "…"


def _status(code: int) -> str:
    try:
        return f"{code} {HTTPStatus(code).phrase}"
    except ValueError:
        return str(code)


# ------------------------------------------------------------------------------ registry
class Registry:
    """One HTTP client for one pull: redirects followed by the rules above, one anonymous-token
    retry on 401, every body bounded, a watchdog over every request."""

    def __init__(self, remote: Remote, *, stall: float = 60.0, cancel: threading.Event | None = None,
                 rule: AddressRule | None = None) -> None:
        self.remote = remote
        self._token = ""
        self._origin = httpx.URL(remote.url())
        self.rule = rule if rule is not None else AddressRule.for_host(remote.name.host)
        self.watchdog = Watchdog(stall, cancel)
        # Behind a proxy httpx's own transports (which honour *_PROXY and NO_PROXY) connect.
        proxied = any(key in urllib.request.getproxies() for key in ("http", "https", "all"))
        self._client = httpx.Client(
            transport=None if proxied else _Transport(_Backend(self.rule, self.watchdog)),
            timeout=httpx.Timeout(stall + 5.0, connect=min(_CONNECT_TIMEOUT, stall + 5.0)),
            follow_redirects=False,
            headers={"User-Agent": f"pollama/{pollama_version()}", "Accept-Encoding": "gzip"},
        )

    def close(self) -> None:
        self.watchdog.close()
        self._client.close()

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------ requests
    def manifest(self) -> tuple[dict[str, Any], bytes]:
        """The manifest (a JSON object, not yet checked further) and its bytes as the registry
        sent them (decoded). Refused beyond :data:`MAX_MANIFEST` bytes, announced or counted."""
        too_big = f"the manifest is larger than {MAX_MANIFEST >> 20} MiB"
        with self._get(self.remote.url("manifests", self.remote.name.tag), {"Accept": _ACCEPT}) as resp:
            if resp.status_code != 200:
                raise RegistryError(f"{_status(resp.status_code)} from {_where(resp.url)}: no manifest")
            announced = self.length(resp, decoded=False)
            if announced is not None and announced > MAX_MANIFEST:
                raise RegistryError(too_big)
            data = bytearray()
            for piece in self.body(resp, MAX_MANIFEST):
                data += piece
                if len(data) > MAX_MANIFEST:
                    raise RegistryError(too_big)
        try:
            manifest = json.loads(bytes(data))
        except (ValueError, RecursionError):
            raise RegistryError("the registry sent something that is not JSON") from None
        if not isinstance(manifest, dict):
            raise RegistryError("the registry sent JSON that is not a manifest")
        return manifest, bytes(data)

    @contextmanager
    def blob(self, digest: str, start: int = 0) -> Iterator[httpx.Response]:
        """The blob's response (200 or 206), from byte ``start`` (a Range request; 206 means the
        range was honoured, 200 that the whole blob comes; 416 that it was refused). Read it
        with :meth:`body`; asked for without Content-Encoding."""
        headers = {"Accept-Encoding": "identity"}
        if start:
            headers["Range"] = f"bytes={start}-"
        with self._get(self.remote.url("blobs", digest), headers) as resp:
            if resp.status_code not in (200, 206, 416):
                raise RegistryError(f"{_status(resp.status_code)} from {_where(resp.url)}: no blob")
            yield resp

    def body(self, resp: httpx.Response, limit: int) -> Iterator[bytes]:
        """``resp``'s body, decoded, in pieces; at most ``limit`` + 1 bytes are ever decoded (the
        caller sees that it was too long). A network failure, a stall or a cancel raises
        RegistryError or Cancelled."""
        decoder = _Decoder(resp.headers.get("content-encoding", ""))
        total = 0
        try:
            for raw in resp.iter_raw():
                self.watchdog.check()
                for piece in decoder.pieces(raw, limit + 1 - total):
                    piece = piece[:limit + 1 - total]
                    total += len(piece)
                    yield piece
                    if total > limit:
                        return
        except httpx.HTTPError as err:
            self.watchdog.check()  # a stall or a cancel closed the connection: say so
            raise RegistryError(reason(err)) from None
        self.watchdog.check()  # a body cut short by the watchdog is no body

    @staticmethod
    def length(resp: httpx.Response, decoded: bool = True) -> int | None:
        """The announced Content-Length (None when absent, unreadable, or — ``decoded`` — when
        it counts encoded bytes)."""
        if decoded and resp.headers.get("content-encoding", "identity").strip().lower() != "identity":
            return None
        try:
            return int(resp.headers["content-length"])
        except (KeyError, ValueError):
            return None

    @contextmanager
    def _get(self, url: str, headers: dict[str, str]) -> Iterator[httpx.Response]:
        """GET ``url`` with redirects and the token retry; the final response, open. 404 is
        ModelNotFound; another status >= 400 (but 416) is RegistryError."""
        try:
            resp = self._open(httpx.URL(url), headers)
            try:
                yield resp
            finally:
                resp.close()
        finally:
            self.watchdog.end()

    def _own(self, url: httpx.URL) -> bool:
        o = self._origin
        return (url.scheme, url.host, url.port) == (o.scheme, o.host, o.port)

    def _send(self, url: httpx.URL, headers: dict[str, str]) -> httpx.Response:
        if url.scheme not in ("http", "https"):
            raise RegistryError(f"refused to follow a redirect to a {url.scheme or 'relative'} URL")
        self.watchdog.begin(_where(url))
        self.rule.check(url.host, url.port)  # RefusedAddress, naming the host
        if self._token and self._own(url):
            headers = {**headers, "Authorization": f"Bearer {self._token}"}
        try:
            return self._client.send(self._client.build_request("GET", url, headers=headers), stream=True)
        except httpx.HTTPError as err:
            self.watchdog.check()
            raise RegistryError(reason(err)) from None

    def _open(self, url: httpx.URL, headers: dict[str, str]) -> httpx.Response:
        asked_token = False
        for _ in range(MAX_REDIRECTS + 1):
            resp = self._send(url, headers)
            code = resp.status_code
            if code in _REDIRECTS and "location" in resp.headers:
                try:
                    url = resp.url.join(resp.headers["location"])
                except (httpx.InvalidURL, ValueError):
                    resp.close()
                    raise RegistryError(f"{_where(resp.url)} redirected to an invalid URL") from None
                resp.close()
                log.debug("redirected to %s", _where(url))
                continue
            if code == 401 and not asked_token and self._own(resp.url):
                asked_token = True
                challenge = resp.headers.get("www-authenticate", "")
                resp.close()
                if self._authorize(challenge):
                    continue
                raise RegistryError("401: unauthorized: access denied")
            if code == 404:
                resp.close()
                raise ModelNotFound("file does not exist")
            if code >= 400 and code != 416:
                message = self._error(resp)
                resp.close()
                raise RegistryError(message)
            return resp
        raise RegistryError(f"more than {MAX_REDIRECTS} redirects (last to {_where(url)})")

    def _error(self, resp: httpx.Response) -> str:
        """One line for an error answer: the registry's own JSON ``errors[0].message`` (bounded),
        else the status and the host (the body of another service is never repeated)."""
        if self._own(resp.url):
            message = ""
            with suppress(RegistryError, Cancelled, ValueError, RecursionError, AttributeError,
                          IndexError, KeyError, TypeError):
                data = b"".join(self.body(resp, MAX_ANSWER))
                message = json.loads(data)["errors"][0]["message"]
            if isinstance(message, str) and message.strip():
                return f"{resp.status_code}: {_one_line(message)}"
        hint = " (the model may need a newer version of Ollama)" if resp.status_code == 412 else ""
        return f"{_status(resp.status_code)} from {_where(resp.url)}{hint}"

    def _authorize(self, challenge: str) -> bool:
        """Docker's token protocol, anonymously: GET the challenge's realm for a bearer token
        (under the same address rule; its answer bounded)."""
        if not challenge.lower().startswith("bearer "):
            return False
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            return False
        try:
            url = httpx.URL(realm, params=params)
            resp = self._send(url, {"Accept": "application/json"})
        except (RegistryError, httpx.InvalidURL, ValueError) as err:
            log.info("no token from the registry's realm: %s", _one_line(str(err)))
            return False
        try:
            if resp.status_code != 200:
                return False
            answer = json.loads(b"".join(self.body(resp, MAX_ANSWER)))
            token = answer.get("token") or answer.get("access_token") or ""
        except (RegistryError, ValueError, RecursionError, AttributeError):
            return False
        finally:
            resp.close()
        if not isinstance(token, str) or len(token) > MAX_ANSWER:
            return False
        self._token = token
        return bool(token)


def reason(err: httpx.HTTPError) -> str:
    """One line for a network failure: what failed and where (never a body)."""
    kind = {
        httpx.ConnectError: "could not connect",
        httpx.ConnectTimeout: "connection timed out",
        httpx.ReadTimeout: "the registry stopped sending",
        httpx.RemoteProtocolError: "the connection was dropped",
        httpx.ReadError: "the connection was dropped",
    }.get(type(err), type(err).__name__)
    where = ""
    try:
        where = f" ({_where(err.request.url)})"
    except RuntimeError:
        pass
    detail = _one_line(str(err), 120) if str(err) else ""
    return f"{kind}{where}" + (f": {detail}" if detail and detail not in kind else "")
