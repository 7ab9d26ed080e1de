"""What a remote model is: the upstream servers that run it, and how the store records them.

A Modelfile whose ``FROM`` is a URL makes a remote model (``pollama create``):

- ``FROM http://gpu-box:8000/v1``: an OpenAI-compatible server (vLLM, SGLang, llama-server,
  LM Studio): a URL whose path ends in ``/v1``;
- ``FROM http://other-box:11434``: an Ollama-API server (Ollama, pollama): any other URL.

Several ``FROM`` URLs are replicas of one model (:mod:`runner.remote.replicas` routes among them).
The store records them as Ollama records its cloud models, in the manifest's config blob:
``remote_host`` (the first replica's URL) and ``remote_model`` (the model's name upstream), plus
pollama's ``remote_hosts`` (every replica), ``capabilities``, ``context_length`` and
``embedding_length`` as read from the upstream at create time. No credential is ever stored: a
URL with a user or password is refused, and the API key comes from the environment
(``POLLAMA_REMOTE_API_KEYS`` per host, else ``POLLAMA_REMOTE_API_KEY``).
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit, urlunsplit

from ..api import InvalidRequest

if TYPE_CHECKING:
    from .dialect import Dialect

OPENAI = "openai"
OLLAMA = "ollama"
MAX_REPLICAS = 64
MAX_URL = 2048


def is_url(value: str) -> bool:
    """Whether a ``FROM`` value names an upstream server rather than a model or a file."""
    return value.strip().lower().startswith(("http://", "https://"))


@dataclass(frozen=True)
class Upstream:
    """One server of a remote model: its base URL (no trailing ``/``) and the API it speaks."""

    url: str  # "http://gpu-box:8000/v1", "http://other-box:11434"
    api: str  # OPENAI or OLLAMA

    @classmethod
    def parse(cls, text: str) -> Upstream:
        """The upstream a ``FROM`` URL names. Raises InvalidRequest for anything but an
        ``http(s)://host[:port][/path]`` URL without credentials, query or fragment."""
        raw = text.strip()
        if len(raw) > MAX_URL:
            raise InvalidRequest(f"remote URL is longer than {MAX_URL} characters")
        try:
            parts = urlsplit(raw)
            port = parts.port
        except ValueError as err:
            raise InvalidRequest(f"invalid remote URL {raw!r}: {err}") from None
        if parts.scheme.lower() not in ("http", "https") or not parts.hostname:
            raise InvalidRequest(f"invalid remote URL {raw!r}: use http(s)://host[:port][/v1]")
        if parts.username is not None or parts.password is not None:
            raise InvalidRequest(f"remote URL {_without_userinfo(parts)!r} holds credentials: the store never keeps "
                                 "them; put the API key in POLLAMA_REMOTE_API_KEY (or HOST[:PORT]=KEY in "
                                 "POLLAMA_REMOTE_API_KEYS) instead")
        if parts.query or parts.fragment:
            raise InvalidRequest(f"invalid remote URL {raw!r}: no query or fragment, only http(s)://host[:port][/path]")
        if any(c.isspace() or ord(c) < 32 for c in raw):
            raise InvalidRequest(f"invalid remote URL {raw!r}")
        host = _checked_host(parts.hostname.lower(), raw)
        netloc = f"[{host}]" if ":" in host else host
        if port is not None:
            netloc += f":{port}"
        path = parts.path.rstrip("/")
        if any(segment in (".", "..") for segment in path.split("/")):
            raise InvalidRequest(f"invalid remote URL {raw!r}: no . or .. in its path")
        url = urlunsplit((parts.scheme.lower(), netloc, path, "", ""))
        return cls(url, OPENAI if path.endswith("/v1") else OLLAMA)

    def dialect(self) -> Dialect:
        """The wire of the API this upstream speaks (its messages name this upstream)."""
        from .ollama_wire import OllamaDialect
        from .openai_wire import OpenAIDialect

        return OpenAIDialect(self.url) if self.api == OPENAI else OllamaDialect(self.url)

    @property
    def host(self) -> str:
        """The host name, lowercase (what ``OLLAMA_REMOTES`` lists)."""
        return (urlsplit(self.url).hostname or "").lower()

    @property
    def origin(self) -> tuple[str, str, int]:
        """(scheme, host, port): a redirect is followed only within one origin."""
        parts = urlsplit(self.url)
        return parts.scheme, (parts.hostname or "").lower(), parts.port or (443 if parts.scheme == "https" else 80)

    def __str__(self) -> str:
        return self.url


_LABEL = re.compile(r"^(?!-)[a-z0-9-]{1,63}(?<!-)$")


def _checked_host(host: str, raw: str) -> str:
    """``host`` when it is an IP address or a DNS name (IDNA names in their ASCII form); else
    InvalidRequest (``..``, empty labels, stray characters)."""
    try:
        ipaddress.ip_address(host)
        return host
    except ValueError:
        pass
    try:
        ascii_host = host.encode("idna").decode("ascii")
    except UnicodeError:
        raise InvalidRequest(f"invalid remote URL {raw!r}: {host!r} is not a host name") from None
    if len(ascii_host) > 253 or not all(_LABEL.match(label) for label in ascii_host.rstrip(".").split(".")):
        raise InvalidRequest(f"invalid remote URL {raw!r}: {host!r} is not a host name")
    return ascii_host


def _without_userinfo(parts: Any) -> str:
    host = parts.hostname or ""
    return f"{parts.scheme}://{host}{':' + str(parts.port) if parts.port else ''}{parts.path}"


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return host == "localhost"


@dataclass(frozen=True)
class RemoteModel:
    """A remote model as the store records it (its config blob's remote fields)."""

    upstreams: tuple[Upstream, ...]
    model: str  # the model's name upstream
    capabilities: tuple[str, ...] = ("completion",)
    context_length: int = 0  # as the upstream reports it; 0 when it does not
    embedding_length: int = 0
    family: str = ""  # the upstream's model family, when it says

    def __post_init__(self) -> None:
        if not self.upstreams:
            raise InvalidRequest("a remote model needs at least one upstream URL")
        if len(self.upstreams) > MAX_REPLICAS:
            raise InvalidRequest(f"a remote model has at most {MAX_REPLICAS} replicas")
        if len({u.api for u in self.upstreams}) > 1:
            raise InvalidRequest("the replicas of a remote model must all speak one API: all OpenAI "
                                 "(URLs ending in /v1) or all Ollama")
        if len({u.url for u in self.upstreams}) != len(self.upstreams):
            raise InvalidRequest("a remote model names one upstream URL twice")

    @property
    def api(self) -> str:
        return self.upstreams[0].api

    @property
    def hosts(self) -> list[str]:
        return [u.url for u in self.upstreams]

    def config(self) -> dict[str, Any]:
        """The fields this model adds to its config blob (Ollama's names first)."""
        out: dict[str, Any] = {"remote_host": self.upstreams[0].url, "remote_model": self.model,
                               "remote_hosts": self.hosts, "capabilities": list(self.capabilities)}
        if self.context_length:
            out["context_length"] = self.context_length
        if self.embedding_length:
            out["embedding_length"] = self.embedding_length
        if self.family:
            out["model_family"] = self.family
        return out

    @classmethod
    def from_config(cls, config: Any) -> RemoteModel | None:
        """The remote model a config blob records, or None when it records none (a local
        model). Raises InvalidRequest when its remote fields are malformed."""
        if not isinstance(config, dict) or not config.get("remote_host"):
            return None
        hosts = config.get("remote_hosts") or [config.get("remote_host")]
        model = config.get("remote_model")
        if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts) or not isinstance(model, str) \
                or not model:
            raise InvalidRequest("its remote_host, remote_hosts or remote_model is malformed")
        caps = config.get("capabilities") or ["completion"]
        if not isinstance(caps, list):
            caps = ["completion"]
        return cls(tuple(Upstream.parse(h) for h in hosts), model,
                   tuple(str(c) for c in caps if isinstance(c, str))[:16],
                   _count(config.get("context_length")), _count(config.get("embedding_length")),
                   str(config.get("model_family") or "")[:64])

    def refusal(self, allowed: tuple[str, ...]) -> str | None:
        """Why a model pulled from a registry may not forward to these upstreams (their hosts
        must each be in ``OLLAMA_REMOTES``, ``allowed``), or None when it may."""
        denied = sorted({u.host for u in self.upstreams if u.host not in allowed})
        if not denied:
            return None
        return (f"this model forwards prompts to {', '.join(denied)}, which OLLAMA_REMOTES does not allow "
                f"(set OLLAMA_REMOTES={','.join(denied)} to trust it)")


def _count(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31 else 0


@dataclass
class RemoteSpec:
    """What a create request says of a remote model before its upstream is asked: the URLs and,
    when given, the model's name upstream (``PARAMETER upstream_model``)."""

    urls: list[str] = field(default_factory=list)
    model: str = ""

    def upstreams(self) -> tuple[Upstream, ...]:
        if len(self.urls) > MAX_REPLICAS:
            raise InvalidRequest(f"a remote model has at most {MAX_REPLICAS} replicas")
        return tuple(Upstream.parse(u) for u in self.urls)
