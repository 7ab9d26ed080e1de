"""Commands that talk to a running ``pollama serve`` (serve, ps, stop), registered on the app."""

from __future__ import annotations

import faulthandler
import logging
import math
import signal
import sys
from datetime import datetime, timezone
from typing import Any

import typer

from runner import config

from . import render
from .app import app
from .tables import format_table, human_size

_NO_SERVER = "could not connect to pollama server, run 'pollama serve' to start it"

_SERVE_HELP = """Start the server: Ollama's API (/api/*) and OpenAI's (/v1/*).

\b
Environment variables:
  OLLAMA_HOST               IP address and port to listen on (default 127.0.0.1:11434)
  OLLAMA_MODELS             The path to the models directory (default ~/.ollama/models)
  OLLAMA_CONTEXT_LENGTH     Context length to use unless otherwise specified (default 4096)
  OLLAMA_KEEP_ALIVE         The duration that models stay loaded in memory (default "5m")
  OLLAMA_MAX_LOADED_MODELS  Maximum number of loaded models (default 3)
  OLLAMA_MAX_QUEUE          Maximum number of queued requests (default 512)
  OLLAMA_NUM_PARALLEL       Maximum number of parallel requests per model (default 1)
  OLLAMA_ORIGINS            A comma separated list of allowed origins
  OLLAMA_NEW_ENGINE         Run supported models on the new engine
  OLLAMA_FLASH_ATTENTION    Enable flash attention
  OLLAMA_KV_CACHE_TYPE      Quantization type for the K/V cache (default f16)
  OLLAMA_MULTIUSER_CACHE    Optimize prompt caching for multi-user scenarios
  OLLAMA_DEBUG              Show additional debug information (e.g. OLLAMA_DEBUG=1)
"""


def _fail(message: str, code: int = 1) -> typer.Exit:
    render.error(message)
    return typer.Exit(code)


def _setup_server_logging(cfg: config.Config) -> None:
    level = logging.DEBUG if cfg.debug else logging.INFO
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("runner").setLevel(logging.DEBUG if cfg.debug else logging.WARNING)
    logging.getLogger("runner.server").setLevel(level)
    logging.getLogger("uvicorn.error").setLevel(logging.INFO if cfg.debug else logging.WARNING)
    if cfg.debug < 2:  # the native libraries' chatter only at OLLAMA_DEBUG=2
        for native in ("llama.cpp", "ggml"):
            logging.getLogger(native).setLevel(logging.WARNING)


@app.command(help=_SERVE_HELP, short_help="Start the server")
def serve() -> None:
    from runner.server.app import serve as run_server

    try:
        cfg = config.load()
    except ValueError as err:
        raise _fail(str(err))
    _setup_server_logging(cfg)
    # a native crash (llama.cpp, GGML, a GPU driver) ends the process without a Python error: the
    # log then at least shows which Python code called into the library (Ollama logs a stack too)
    faulthandler.enable()
    # and a hung one (a load stuck in a driver) is told from a dead one: SIGUSR1 logs every
    # thread's Python stack and the server goes on (tests/serverproc.py sends it before a kill)
    if hasattr(signal, "SIGUSR1"):
        faulthandler.register(signal.SIGUSR1, all_threads=True)
    try:
        run_server(cfg)
    except OSError as err:
        raise _fail(err.strerror or str(err))
    except KeyboardInterrupt:
        pass


# ------------------------------------------------------------------------------------ client
def _client_request(method: str, path: str, body: dict[str, Any] | None = None) -> Any:
    """One request to the server at OLLAMA_HOST; returns the parsed JSON, raises typer.Exit."""
    import httpx

    try:
        cfg = config.load()
    except ValueError as err:
        raise _fail(str(err))
    try:
        with httpx.Client(base_url=cfg.base_url, timeout=httpx.Timeout(None, connect=5)) as client:
            resp = client.request(method, path, json=body)
    except httpx.ConnectError:
        raise _fail(_NO_SERVER)
    except httpx.HTTPError as err:
        raise _fail(f"request to the server failed: {err}")
    try:
        data = resp.json()
    except ValueError:
        data = None
    if resp.status_code >= 400:
        message = data.get("error") if isinstance(data, dict) else None
        raise _StatusError(resp.status_code, str(message or resp.text or resp.reason_phrase))
    return data


class _StatusError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def human_duration(seconds: float) -> str:
    """Go's format.HumanDuration."""
    s = int(seconds)
    if s < 1:
        return "Less than a second"
    if s == 1:
        return "1 second"
    if s < 60:
        return f"{s} seconds"
    minutes = s // 60
    if minutes == 1:
        return "About a minute"
    if minutes < 60:
        return f"{minutes} minutes"
    hours = round(seconds / 3600)
    if hours == 1:
        return "About an hour"
    if hours < 48:
        return f"{hours} hours"
    if hours < 24 * 7 * 2:
        return f"{hours // 24} days"
    if hours < 24 * 30 * 2:
        return f"{hours // 24 // 7} weeks"
    if hours < 24 * 365 * 2:
        return f"{hours // 24 // 30} months"
    return f"{int(seconds / 3600 / 24 / 365)} years"


def human_until(expires_at: str | None, now: datetime | None = None) -> str:
    """The UNTIL column: "Stopping..." once past, "Forever" for keep_alive < 0, "Never" when unset."""
    if not expires_at or expires_at.startswith("0001-"):
        return "Never"
    try:
        when = datetime.fromisoformat(expires_at.replace("Z", "+00:00"))
    except ValueError:
        return "Never"
    now = now or datetime.now(timezone.utc)
    delta = (when - now).total_seconds()
    if delta <= 0:
        return "Stopping..."
    if delta > 20 * 365 * 24 * 3600:
        return "Forever"
    if delta < 1:
        return "Less than a second from now"
    return f"{human_duration(delta)} from now"


def processor(size: int, size_vram: int) -> str:
    """The PROCESSOR column as Ollama's ``cmd/cmd.go`` writes it: the CPU's share rounded half
    away from zero (Go's math.Round), the GPU's the rest; "Unknown" when more is on the GPU
    than there is."""
    if size_vram <= 0:
        return "100% CPU"
    if size_vram == size:
        return "100% GPU"
    if size_vram > size or size == 0:
        return "Unknown"
    cpu = math.floor((size - size_vram) / size * 100 + 0.5)
    return f"{cpu}%/{100 - cpu}% CPU/GPU"


def ps_table(models: list[dict[str, Any]]) -> str:
    rows = []
    for m in models:
        size = int(m.get("size") or 0)
        remote = m.get("remote_host")  # a remote model: where it runs, not a size or a processor
        rows.append([
            m.get("name", ""),
            (m.get("digest") or "-")[:12],
            "-" if remote else human_size(size),
            f"remote: {remote}" if remote else processor(size, int(m.get("size_vram") or 0)),
            m.get("context_length") or ("-" if remote else ""),
            human_until(m.get("expires_at")),
        ])
    return format_table(["NAME", "ID", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"], rows)


@app.command()
def ps() -> None:
    """List running models (asks the server at OLLAMA_HOST)."""
    try:
        data = _client_request("GET", "/api/ps")
    except _StatusError as err:
        raise _fail(str(err))
    print(ps_table(list((data or {}).get("models") or [])))
    usage = (data or {}).get("prompt_cache")
    if isinstance(usage, dict):
        print(prompt_cache_line(usage))


def prompt_cache_line(usage: dict[str, Any]) -> str:
    """The prompt store's use of its bounds, from ``/api/ps``'s ``prompt_cache``."""
    parts = []
    for tier, name in (("ram", "RAM"), ("disk", "disk")):
        limit = int(usage.get(f"{tier}_limit") or 0)
        parts.append(f"{human_size(int(usage.get(tier) or 0))} of {human_size(limit)} {name}" if limit
                     else f"{name} off")
    return "prompt cache: " + ", ".join(parts)


@app.command()
def stop(model: str = typer.Argument(..., help="Model to unload")) -> None:
    """Stop a running model (unload it from the server at OLLAMA_HOST)."""
    try:
        _client_request("POST", "/api/generate", {"model": model, "keep_alive": 0})
    except _StatusError as err:
        if err.status == 404:
            raise _fail(f'couldn\'t find model "{model}" to stop')
        raise _fail(str(err))
