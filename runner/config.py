"""The OLLAMA_* environment (and pollama's own POLLAMA_*), read in one place (reference §6).

Values are trimmed of spaces and quotes. Booleans accept what Go's ParseBool accepts and an
unparsable value counts as true (Ollama's rule); an invalid number falls back to the default with
a warning. Call :func:`load` each time: the environment is read fresh, nothing is cached.
"""

from __future__ import annotations

import ipaddress
import logging
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

log = logging.getLogger(__name__)

DEFAULT_PORT = 11434
DEFAULT_CONTEXT_LENGTH = 4096  # Ollama's tier for < 23 GiB of VRAM, i.e. any CPU machine
DEFAULT_PULL_STALL_TIMEOUT = 60.0  # seconds a pull may go without progress (runner.store.registry)
# OLLAMA_CACHE_RAM, MiB of host memory for saved prompt states (runner.kvstore.ram):
# 1 GiB, not llama-server's 8 GiB: an 8 GiB cache got Ollama's runners OOM-killed on
# laptops and pods (ollama#18264, #17351), and 1 GiB still holds ~45k tokens of SmolLM2-135M
# (22.5 KiB a token), i.e. twenty 2k-token conversations of a small model; the disk tier
# holds the rest.
DEFAULT_CACHE_RAM = 1024
# POLLAMA_CACHE_DISK, MiB of disk for saved prompt states (runner.kvstore.disk), under
# POLLAMA_CACHE_DIR (~/.pollama/cache). 8 GiB: a laptop's disk spares it easily, and it holds
# ~180 conversations of 2k tokens of SmolLM2 (45 MiB each), ~20 of an 8k-token 1B model.
DEFAULT_CACHE_DISK = 8192
DEFAULT_CACHE_DIR = "~/.pollama/cache"  # POLLAMA_CACHE_DIR (read at each load: the tests point it elsewhere)
# POLLAMA_REMOTE_TIMEOUT, seconds a remote model's upstream may take to send its first byte, and
# then between bytes: 10 minutes, as a long prompt on a busy upstream may take minutes to start
DEFAULT_REMOTE_TIMEOUT = 600.0
# POLLAMA_REMOTE_PARALLEL: requests one replica of a remote model serves at once; more wait
DEFAULT_REMOTE_PARALLEL = 16


class ConfigError(ValueError):
    """An environment variable whose value cannot be used, where a default would be wrong (a
    server address, an API key). The message is one line naming the variable and never holds a
    secret; the CLI prints it and exits."""


@dataclass(frozen=True)
class HostKey:
    """One ``POLLAMA_REMOTE_API_KEYS`` entry: the API key for a host on one port, or on any
    port (``port`` None). ``host`` is lowercase, IDNA-encoded, without brackets or a final dot."""

    host: str
    port: int | None
    key: str = field(repr=False)

    def __str__(self) -> str:  # the entry as a message may name it: never the key
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.port is None else f"{host}:{self.port}"


@dataclass(frozen=True)
class ApiKey:
    """The API key a remote model's upstream gets, and where it came from (for messages)."""

    value: str = field(repr=False)
    source: str  # "POLLAMA_REMOTE_API_KEYS entry gpu-box:8000" or "POLLAMA_REMOTE_API_KEY"


@dataclass(frozen=True)
class Config:
    host: str  # "127.0.0.1"
    port: int  # 11434
    models: Path  # model store
    context_length: int  # default num_ctx
    num_parallel: int
    multiuser_cache: bool
    keep_alive: float  # seconds; < 0 forever, 0 unload after each request
    max_loaded_models: int
    max_queue: int
    flash_attention: bool | None  # None: per-model default
    kv_cache_type: str
    debug: int  # 0 info, 1 debug, 2 trace
    nohistory: bool
    new_engine: bool
    origins: tuple[str, ...] = ()  # OLLAMA_ORIGINS, added to the default allowed origins
    pipeline: bool = False  # POLLAMA_PIPELINE: build the next batch while one decodes (runner.loop.pipeline)
    # POLLAMA_PULL_STALL_TIMEOUT: a pull fails when less than 1 KiB arrives in this many seconds
    pull_stall_timeout: float = DEFAULT_PULL_STALL_TIMEOUT
    cache_ram: int = DEFAULT_CACHE_RAM  # OLLAMA_CACHE_RAM: MiB for saved prompt states; 0: off
    cache_dir: Path = Path("~/.pollama/cache")  # POLLAMA_CACHE_DIR: the prompt store's disk tier
    cache_disk: int = DEFAULT_CACHE_DISK  # POLLAMA_CACHE_DISK: MiB on disk for saved prompt states; 0: off
    # POLLAMA_SPECULATIVE: draft tokens by prompt lookup and verify them in one decode (runner.spec);
    # "off" (or 0/false/no) turns it off for every request, whatever its draft_num_predict
    speculative: bool = True
    # POLLAMA_NGRAM_POOL: draft also from an n-gram pool a model's requests share (runner.spec.pool),
    # so a repeated request is guessed from the first answer; "off" (or 0/false/no) drafts from each
    # request's own text alone. A guessed row's numbers are a lone row's (runner.ml.kernels; README,
    # Speculative decoding, says where not), so guesses, and the requests before, change no answer
    ngram_pool: bool = True
    # POLLAMA_BATCH_INVARIANT: the new engine computes each row of a batch as it would alone
    # (runner.ml.backend.BackendOptions.batch_invariant): guesses never change a greedy answer
    # where the weights' products are row-exact too (SmolLM2's Q4_1), at a cost in speed
    batch_invariant: bool = False
    # POLLAMA_ROW_KERNELS: both engines multiply Q4_1 weights by several rows at a time with our
    # kernels (runner.ml.ggml.q4_1; the old engine through llama.cpp's eval callback,
    # runner.engines.llamacpp.graph_ops), GGML's numbers bit for bit; off: GGML's one-row products
    row_kernels: bool = True
    # OLLAMA_GPU_OVERHEAD: bytes of each GPU's free memory that offload leaves alone (runner.loading.gpu)
    gpu_overhead: int = 0
    # OLLAMA_REMOTES: the hosts (lowercase names, comma-separated) a model pulled from a registry
    # may forward prompts to (runner.remote); none by default. Models created here from a
    # Modelfile are the user's own choice and need no entry.
    remotes: tuple[str, ...] = ()
    # POLLAMA_REMOTE_API_KEY: sent as "Authorization: Bearer ..." to every remote model's
    # upstream that POLLAMA_REMOTE_API_KEYS gives no key of its own; read here, never written to
    # the store, never in a repr (so never in a log line)
    remote_api_key: str = field(default="", repr=False)
    # POLLAMA_REMOTE_API_KEYS: per-host keys, "HOST[:PORT]=KEY,..." (see parse_remote_api_keys)
    remote_api_keys: tuple[HostKey, ...] = field(default=(), repr=False)
    remote_timeout: float = DEFAULT_REMOTE_TIMEOUT  # POLLAMA_REMOTE_TIMEOUT
    remote_parallel: int = DEFAULT_REMOTE_PARALLEL  # POLLAMA_REMOTE_PARALLEL

    def remote_key(self, host: str, port: int) -> ApiKey | None:
        """The API key for an upstream at ``host`` (as in its URL, any case) and ``port`` (the
        URL's, or its scheme's default: 80, 443): the ``POLLAMA_REMOTE_API_KEYS`` entry for that
        host and port, else the entry for that host without a port, else ``POLLAMA_REMOTE_API_KEY``;
        None when none is set."""
        host = _normal_host(host)
        for wanted in (port, None):
            for entry in self.remote_api_keys:
                if entry.host == host and entry.port == wanted:
                    return ApiKey(entry.key, f"POLLAMA_REMOTE_API_KEYS entry {entry}")
        return ApiKey(self.remote_api_key, "POLLAMA_REMOTE_API_KEY") if self.remote_api_key else None

    @property
    def cache_ram_bytes(self) -> int:
        return self.cache_ram * 2**20

    @property
    def cache_disk_bytes(self) -> int:
        return self.cache_disk * 2**20

    @property
    def base_url(self) -> str:
        host = self.host if self.host not in ("0.0.0.0", "::") else "127.0.0.1"
        if ":" in host:
            host = f"[{host}]"
        return f"http://{host}:{self.port}"


def _clean(env: Mapping[str, str], name: str) -> str:
    return env.get(name, "").strip().strip("\"'").strip()


def parse_bool(value: str) -> bool:
    """Go's strconv.ParseBool, with Ollama's twist: anything unparsable (but set) is true."""
    if value == "":
        return False
    return value.lower() not in ("0", "f", "false")


def _on_unless_off(env: Mapping[str, str], name: str) -> bool:
    """A switch that is on by default: off only for "off", "0", "false", "f" or "no"."""
    return _clean(env, name).lower() not in ("off", "0", "false", "f", "no")


def _uint(env: Mapping[str, str], name: str, default: int) -> int:
    raw = _clean(env, name)
    if not raw:
        return default
    try:
        value = int(raw)
        if value < 0:
            raise ValueError
        return value
    except ValueError:
        log.warning("invalid %s=%r, using the default %d", name, raw, default)
        return default


def parse_duration(value: str | int | float) -> float:
    """Seconds from a Go duration ("5m", "1h30m", "250ms"), a number of seconds, or "-1"."""
    if isinstance(value, bool):
        raise ValueError(f"invalid duration {value!r}")
    if isinstance(value, (int, float)):
        return float(value)
    text = value.strip()
    try:
        return float(text)
    except ValueError:
        pass
    units = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
    sign = -1.0 if text.startswith("-") else 1.0
    rest = text.lstrip("+-")
    total, number = 0.0, ""
    i = 0
    if not rest:
        raise ValueError(f"invalid duration {value!r}")
    while i < len(rest):
        ch = rest[i]
        if ch.isdigit() or ch == ".":
            number += ch
            i += 1
            continue
        unit = next((u for u in ("ns", "us", "µs", "ms", "h", "m", "s") if rest.startswith(u, i)), None)
        if unit is None or not number:
            raise ValueError(f"invalid duration {value!r}")
        total += float(number) * units[unit]
        number = ""
        i += len(unit)
    if number:
        raise ValueError(f"invalid duration {value!r} (missing unit)")
    return sign * total


def parse_host(raw: str) -> tuple[str, int]:
    """OLLAMA_HOST: ``[scheme://]host[:port]``; an empty host is 127.0.0.1, the port 11434."""
    text = raw.strip() or "127.0.0.1"
    default_port = DEFAULT_PORT
    if "://" in text:
        scheme, text = text.split("://", 1)
        default_port = {"http": 80, "https": 443}.get(scheme.lower(), DEFAULT_PORT)
    text = text.split("/", 1)[0]
    if text.startswith("["):  # [::1]:port
        host, _, rest = text[1:].partition("]")
        port_text = rest.lstrip(":")
    elif text.count(":") == 1:
        host, port_text = text.split(":")
    else:
        host, port_text = text, ""
    host = host or "127.0.0.1"
    try:
        port = int(port_text) if port_text else default_port
    except ValueError:
        raise ConfigError(f"invalid OLLAMA_HOST {raw!r}") from None
    return host, port


# The schemes an OLLAMA_ORIGINS entry without a "*" must start with (gin-contrib/cors with
# Ollama's settings: the web schemes plus the browser extensions').
ORIGIN_SCHEMES = ("http://", "https://", "chrome-extension://", "safari-extension://", "moz-extension://",
                  "ms-browser-extension://")


def parse_origins(raw: str) -> tuple[str, ...]:
    """OLLAMA_ORIGINS: comma-separated origins, each exact (``https://example.com``) or with one
    ``*`` standing for any text (``*``, ``chrome-extension://*``, ``http://example.com:*``).

    Entries are trimmed and lowercased. An entry Ollama refuses (its server panics at start) is
    skipped with a warning: more than one ``*``, or no ``*`` and none of :data:`ORIGIN_SCHEMES`.
    """
    out: list[str] = []
    for entry in raw.split(","):
        origin = entry.strip().lower()
        if not origin:
            continue
        if origin.count("*") > 1:
            log.warning("OLLAMA_ORIGINS: ignoring %r: only one * is allowed", origin)
        elif "*" not in origin and not origin.startswith(ORIGIN_SCHEMES):
            log.warning("OLLAMA_ORIGINS: ignoring %r: an origin must contain * or start with %s",
                        origin, ", ".join(ORIGIN_SCHEMES))
        elif origin not in out:
            out.append(origin)
    return tuple(out)


def parse_remotes(raw: str) -> tuple[str, ...]:
    """OLLAMA_REMOTES: comma-separated host names (``gpu-box``, ``10.0.0.7``, ``[::1]`` or
    ``::1``), trimmed and lowercased; a ``scheme://`` or ``:port`` given with one is dropped
    (the rule is about hosts)."""
    out: list[str] = []
    for entry in raw.split(","):
        host = entry.strip().lower()
        if "://" in host:
            host = host.split("://", 1)[1]
        host = host.split("/", 1)[0]
        if host.startswith("["):
            host = host[1:].partition("]")[0]
        elif host.count(":") == 1:
            host = host.partition(":")[0]
        if host and host not in out:
            out.append(host)
    return tuple(out)


_HOST_NAME = re.compile(r"[a-z0-9]([a-z0-9-]*[a-z0-9])?(\.[a-z0-9]([a-z0-9-]*[a-z0-9])?)*")
# What an Authorization header can carry of a key: visible ASCII, no space. (A key in
# POLLAMA_REMOTE_API_KEYS cannot hold a comma either: the comma ends its entry.)
_KEY = re.compile(r"[\x21-\x7e]+")


def _normal_host(host: str) -> str:
    """A host as keys are matched: lowercase, IDNA-encoded, an IP address in its short form, no
    brackets or final dot; "" when it is neither a host name nor an IP address."""
    host = host.strip().lower()
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    try:
        return ipaddress.ip_address(host).compressed
    except ValueError:
        pass
    host = host.rstrip(".")
    try:
        host = host.encode("idna").decode("ascii")
    except UnicodeError:
        return ""
    return host if len(host) <= 253 and _HOST_NAME.fullmatch(host) else ""


def check_api_key(key: str, name: str) -> str:
    """``key`` when an Authorization header can carry it; else a ConfigError naming ``name``
    (the variable or entry), never the key."""
    if key and not _KEY.fullmatch(key):
        raise ConfigError(f"{name}: the key holds a space or a character other than visible ASCII")
    return key


def _split_host_port(where: str) -> tuple[str, str | None]:
    """``host:port``, ``[v6]:port``, ``[v6]``, a bare IPv6 address or a host: (host, the port's
    text or None when there is none)."""
    if where.startswith("["):
        host, bracket, rest = where[1:].partition("]")
        if not bracket or (rest and not rest.startswith(":")):
            return "", None
        return host, (rest[1:] if rest else None)
    if where.count(":") == 1:
        host, _, port = where.partition(":")
        return host, port
    return where, None


def parse_remote_api_keys(raw: str) -> tuple[HostKey, ...]:
    """``POLLAMA_REMOTE_API_KEYS``: per-host API keys for remote models' upstreams, as
    ``HOST[:PORT]=KEY`` entries separated by commas (``gpu-box:8000=sk-abc,api.example.com=sk-def``).

    ``HOST`` is written as in the ``FROM`` URL (a name, an IPv4 address, or an IPv6 one in
    brackets, ``[::1]:8000``) and matched without regard to case. ``HOST:PORT`` is the key for
    that port (a URL without a port has its scheme's: 80 for http, 443 for https); ``HOST``
    alone, for any port of that host where no ``HOST:PORT`` entry says otherwise. The key is
    everything after the first ``=``. Raises ConfigError for a malformed entry, naming it by its
    place and host, never by its key.
    """
    out: list[HostKey] = []
    name = "POLLAMA_REMOTE_API_KEYS"
    entries = [e.strip() for e in raw.split(",")]
    for i, entry in enumerate((e for e in entries if e), start=1):
        where, sep, key = entry.partition("=")
        where, key = where.strip(), key.strip()
        if not sep:
            raise ConfigError(f"{name}: entry {i} has no '=': use HOST[:PORT]=KEY, comma-separated")
        if not where:
            raise ConfigError(f"{name}: entry {i} names no host: use HOST[:PORT]=KEY")
        if "://" in where or "/" in where:
            raise ConfigError(f"{name}: entry {i}: {where!r} is not HOST[:PORT] (no scheme or path)")
        host, port_text = _split_host_port(where)
        port = None
        if port_text is not None:
            if not (port_text.isascii() and port_text.isdigit() and 0 < int(port_text) < 65536):
                raise ConfigError(f"{name}: entry {i}: {where!r} has no port 1-65535 after its ':'")
            port = int(port_text)
        normal = _normal_host(host)
        if not normal:
            raise ConfigError(f"{name}: entry {i}: {where!r} is not HOST[:PORT] (a host name or IP address)")
        if not key:
            raise ConfigError(f"{name}: entry {i} ({where}) has an empty key")
        check_api_key(key, f"{name} entry {i} ({where})")
        if any(e.host == normal and e.port == port for e in out):
            raise ConfigError(f"{name}: entry {i} ({where}) names the host and port of an earlier entry")
        out.append(HostKey(normal, port, key))
    return tuple(out)


def _positive_duration(env: Mapping[str, str], name: str, default: float) -> float:
    """A duration (``60``, ``90s``, ``2m``) that must be finite and more than zero; else the default."""
    raw = _clean(env, name)
    if not raw:
        return default
    try:
        value = parse_duration(raw)
        if not math.isfinite(value) or value <= 0:
            raise ValueError
        return value
    except ValueError:
        log.warning("invalid %s=%r, using the default %gs", name, raw, default)
        return default


def load(env: Mapping[str, str] | None = None) -> Config:
    env = os.environ if env is None else env
    host, port = parse_host(_clean(env, "OLLAMA_HOST"))
    models = _clean(env, "OLLAMA_MODELS")
    keep_alive_raw = _clean(env, "OLLAMA_KEEP_ALIVE") or "5m"
    try:
        keep_alive = parse_duration(keep_alive_raw)
    except ValueError:
        log.warning("invalid OLLAMA_KEEP_ALIVE=%r, using 5m", keep_alive_raw)
        keep_alive = 300.0
    fa = _clean(env, "OLLAMA_FLASH_ATTENTION")
    debug_raw = _clean(env, "OLLAMA_DEBUG")
    if debug_raw.isdigit():
        debug = int(debug_raw)
    else:
        debug = 1 if parse_bool(debug_raw) else 0
    return Config(
        host=host,
        port=port,
        models=Path(models).expanduser() if models else Path.home() / ".ollama" / "models",
        context_length=_uint(env, "OLLAMA_CONTEXT_LENGTH", 0) or DEFAULT_CONTEXT_LENGTH,
        num_parallel=max(_uint(env, "OLLAMA_NUM_PARALLEL", 1), 1),
        multiuser_cache=parse_bool(_clean(env, "OLLAMA_MULTIUSER_CACHE")),
        keep_alive=keep_alive,
        max_loaded_models=_uint(env, "OLLAMA_MAX_LOADED_MODELS", 0) or 3,
        max_queue=_uint(env, "OLLAMA_MAX_QUEUE", 512),
        flash_attention=parse_bool(fa) if fa else None,
        kv_cache_type=_clean(env, "OLLAMA_KV_CACHE_TYPE").lower() or "f16",
        debug=debug,
        nohistory=parse_bool(_clean(env, "OLLAMA_NOHISTORY")),
        new_engine=parse_bool(_clean(env, "OLLAMA_NEW_ENGINE")),
        origins=parse_origins(_clean(env, "OLLAMA_ORIGINS")),
        pipeline=parse_bool(_clean(env, "POLLAMA_PIPELINE")),
        pull_stall_timeout=_positive_duration(env, "POLLAMA_PULL_STALL_TIMEOUT", DEFAULT_PULL_STALL_TIMEOUT),
        cache_ram=_uint(env, "OLLAMA_CACHE_RAM", DEFAULT_CACHE_RAM),
        cache_dir=Path(_clean(env, "POLLAMA_CACHE_DIR") or DEFAULT_CACHE_DIR).expanduser(),
        cache_disk=_uint(env, "POLLAMA_CACHE_DISK", DEFAULT_CACHE_DISK),
        speculative=_on_unless_off(env, "POLLAMA_SPECULATIVE"),
        ngram_pool=_on_unless_off(env, "POLLAMA_NGRAM_POOL"),
        batch_invariant=parse_bool(_clean(env, "POLLAMA_BATCH_INVARIANT")),
        row_kernels=_on_unless_off(env, "POLLAMA_ROW_KERNELS"),
        gpu_overhead=_uint(env, "OLLAMA_GPU_OVERHEAD", 0),
        remotes=parse_remotes(_clean(env, "OLLAMA_REMOTES")),
        remote_api_key=check_api_key(_clean(env, "POLLAMA_REMOTE_API_KEY"), "POLLAMA_REMOTE_API_KEY"),
        remote_api_keys=parse_remote_api_keys(_clean(env, "POLLAMA_REMOTE_API_KEYS")),
        remote_timeout=_positive_duration(env, "POLLAMA_REMOTE_TIMEOUT", DEFAULT_REMOTE_TIMEOUT),
        remote_parallel=_uint(env, "POLLAMA_REMOTE_PARALLEL", DEFAULT_REMOTE_PARALLEL) or DEFAULT_REMOTE_PARALLEL,
    )


def llama_cpp_lib_path(env: Mapping[str, str] | None = None) -> Path | None:
    """``LLAMA_CPP_LIB_PATH``: the folder llama-cpp-python loads ``libllama`` (and with it
    ``libggml*``) from instead of its own ``llama_cpp/lib``, read exactly as llama-cpp-python
    reads it (``llama_cpp.py``: set, even to "", means that folder) so that the new engine's
    GGML bindings load the very same files. None: unset."""
    env = os.environ if env is None else env
    raw = env.get("LLAMA_CPP_LIB_PATH")
    return None if raw is None else Path(raw)
