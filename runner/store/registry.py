"""The registry protocol Ollama speaks (Docker distribution v2), as a client.

``GET {scheme}://{host}/v2/{namespace}/{model}/manifests/{tag}`` answers the manifest (config and
layers, Docker's image manifest v2); ``GET .../blobs/{digest}`` answers a layer, usually through
a redirect to a CDN. ``registry.ollama.ai`` and Hugging Face (``hf.co``, ``huggingface.co``) speak
it alike. The scheme is https; ``insecure`` (``--insecure``, ``insecure: true``) uses plain http,
for a local registry. A ``401`` with a ``Bearer`` challenge is answered once with an anonymous
token from the challenge's realm (Docker's token protocol); nothing is signed.

Errors are one line: the registry's 404 is :class:`ModelNotFound` ``file does not exist`` (the
pull says ``pull model manifest: file does not exist``, as Ollama), anything else that goes wrong
on the network is :class:`RegistryError` (502).
"""

from __future__ import annotations

import json
import logging
import re
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator

import httpx

from ..api import InvalidRequest, ModelNotFound, PollamaError
from ..version import pollama_version
from .manifests import MANIFEST_MEDIA_TYPE
from .names import Name

log = logging.getLogger(__name__)

_TIMEOUT = httpx.Timeout(30.0, connect=10.0)
_ACCEPT = f"{MANIFEST_MEDIA_TYPE}, application/vnd.oci.image.manifest.v1+json"
_CHALLENGE = re.compile(r'(\w+)="([^"]*)"')


class RegistryError(PollamaError):
    """The registry could not be reached or answered something unusable."""

    status = 502


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


class Registry:
    """One HTTP client for one pull: redirects followed, one anonymous-token retry on 401."""

    def __init__(self, remote: Remote) -> None:
        self.remote = remote
        self._token = ""
        self._client = httpx.Client(
            timeout=_TIMEOUT, follow_redirects=True,
            headers={"User-Agent": f"pollama/{pollama_version()}"},
        )

    def close(self) -> None:
        self._client.close()

    def __enter__(self) -> "Registry":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ------------------------------------------------------------------------------- requests
    def manifest(self) -> tuple[dict[str, Any], bytes]:
        """The manifest (parsed) and its bytes as the registry sent them."""
        with self._get(self.remote.url("manifests", self.remote.name.tag), {"Accept": _ACCEPT}) as resp:
            try:
                data = resp.read()
            except httpx.HTTPError as err:
                raise RegistryError(f"pull model manifest: {reason(err)}") from None
        try:
            manifest = json.loads(data)
        except ValueError:
            raise RegistryError("pull model manifest: the registry sent something that is not JSON") from None
        if not isinstance(manifest, dict) or not isinstance(manifest.get("layers"), list):
            raise RegistryError("pull model manifest: the registry sent no layers")
        return manifest, data

    @contextmanager
    def blob(self, digest: str, start: int = 0) -> Iterator[httpx.Response]:
        """The blob's response, from byte ``start`` (a Range request; 206 means the range was
        honoured, 200 that the whole blob comes)."""
        headers = {"Range": f"bytes={start}-"} if start else {}
        with self._get(self.remote.url("blobs", digest), headers) as resp:
            yield resp

    @contextmanager
    def _get(self, url: str, headers: dict[str, str]) -> Iterator[httpx.Response]:
        for attempt in range(2):
            if self._token:
                headers = {**headers, "Authorization": f"Bearer {self._token}"}
            try:
                request = self._client.build_request("GET", url, headers=headers)
                resp = self._client.send(request, stream=True)
            except httpx.HTTPError as err:
                raise RegistryError(f"{reason(err)}") from None
            try:
                if resp.status_code == 401 and attempt == 0 and self._authorize(resp):
                    continue
                if resp.status_code == 404:
                    raise ModelNotFound("file does not exist")
                if resp.status_code == 416:
                    yield resp  # the range is past the end: the caller starts over
                    return
                if resp.status_code >= 400:
                    raise RegistryError(f"{resp.status_code}: {_body(resp)}")
                yield resp
                return
            finally:
                resp.close()
        raise RegistryError("401: unauthorized: access denied")

    def _authorize(self, resp: httpx.Response) -> bool:
        """Docker's token protocol, anonymously: GET the challenge's realm for a bearer token."""
        challenge = resp.headers.get("www-authenticate", "")
        if not challenge.lower().startswith("bearer "):
            return False
        params = dict(_CHALLENGE.findall(challenge))
        realm = params.pop("realm", "")
        if not realm.startswith(("https://", "http://")):
            return False
        try:
            answer = self._client.get(realm, params=params)
            token = answer.json().get("token") or answer.json().get("access_token") or ""
        except (httpx.HTTPError, ValueError, AttributeError):
            return False
        self._token = str(token)
        return bool(self._token)


def _body(resp: httpx.Response) -> str:
    try:
        text = resp.read()[:300].decode("utf-8", errors="replace").strip()
    except httpx.HTTPError:
        text = ""
    return text or resp.reason_phrase


def reason(err: httpx.HTTPError) -> str:
    """One line for a network failure: what failed and where."""
    kind = {
        httpx.ConnectError: "could not connect",
        httpx.ConnectTimeout: "connection timed out",
        httpx.ReadTimeout: "the registry stopped sending",
        httpx.RemoteProtocolError: "the connection was dropped",
        httpx.ReadError: "the connection was dropped",
    }.get(type(err), type(err).__name__)
    where = ""
    try:
        where = f" ({err.request.url.host}:{err.request.url.port or ''})".replace(":)", ")")
    except RuntimeError:
        pass
    detail = str(err).splitlines()[0] if str(err) else ""
    return f"{kind}{where}" + (f": {detail}" if detail and detail not in kind else "")
