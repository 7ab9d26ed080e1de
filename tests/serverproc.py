"""A real ``pollama serve`` subprocess on a free port, for the server tests and the benchmark."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_until_up(proc: subprocess.Popen, url: str, timeout: float, name: str, log) -> None:
    """Poll ``url`` until it answers 200; RuntimeError with ``log()`` if ``proc`` exits or time runs out."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{name} exited with {proc.returncode}:\n{log()}")
        try:
            if httpx.get(url, timeout=1).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{name} did not start:\n{log()}")


class ServerProcess:
    """Start with :meth:`start`, stop with :meth:`stop` (SIGTERM, then the exit status)."""

    def __init__(self, env: dict[str, str] | None = None, models_dir: str | None = None) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._tmp = tempfile.TemporaryDirectory(prefix="pollama-serve-")
        home = Path(self._tmp.name)
        self.models = Path(models_dir) if models_dir else home / "models"
        self.env = {
            k: v for k, v in os.environ.items()
            if not k.startswith("OLLAMA_")
        }
        self.env.update({
            "HOME": str(home),
            "OLLAMA_HOST": f"127.0.0.1:{self.port}",
            "OLLAMA_MODELS": str(self.models),
            "PYTHONUNBUFFERED": "1",
        })
        self.env.update(env or {})
        self.log_path = home / "serve.log"
        self.proc: subprocess.Popen | None = None
        self.last_log = ""

    def start(self, timeout: float = 60.0) -> "ServerProcess":
        self._log = open(self.log_path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-c", "from cli.main import app; app()", "serve"],
            cwd=ROOT, env=self.env, stdout=self._log, stderr=subprocess.STDOUT,
        )
        try:
            wait_until_up(self.proc, self.url + "/", timeout, "pollama serve", self.log)
        except RuntimeError:
            self.stop()
            raise
        return self

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def dump_stacks(self) -> None:
        """Have a running server log every thread's Python stack (``pollama serve`` registers
        faulthandler for SIGUSR1): what a hung server was doing, before it is killed."""
        if self.proc is not None and self.proc.poll() is None and hasattr(signal, "SIGUSR1"):
            self.proc.send_signal(signal.SIGUSR1)
            time.sleep(1)

    def stop(self, timeout: float = 30.0) -> int | None:
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.dump_stacks()
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        code = self.proc.returncode
        self.last_log = self.log()
        self._tmp.cleanup()
        return code

    def __enter__(self) -> "ServerProcess":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
