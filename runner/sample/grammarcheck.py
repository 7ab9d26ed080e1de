"""Schemas become grammars, and grammars are proven to compile, in a child process
(:mod:`runner.sample.grammarchild`) before the batch loop compiles them for a sequence.

A request's schema is first held to :mod:`runner.sample.schemabounds`; what passes is converted
and compiled in the child. A child that crashes, runs out of its memory or takes longer than
``timeout`` seconds is killed and the request refused with a 400; the server, its other requests
and its event loop do not notice (the work is in another process, so it holds neither the GIL
nor the loop). A request whose client leaves while its grammar is built kills that child too.
The batch loop then compiles only grammars a child compiled, within the same bounds: a few ms.

Children are kept for the next job (up to ``idle``), started on first use (~0.15 s); answers are
remembered by their input, so a client that sends the same schema every turn pays once.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import select
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from ..api import Cancelled, InvalidRequest
from . import schemabounds

log = logging.getLogger(__name__)

_CHILD = Path(__file__).with_name("grammarchild.py")
MAX_GBNF = 1 << 20  # characters of a grammar
_REMEMBERED = 128  # answers kept


class GrammarCheck:
    """Converts schemas and checks grammars in child processes. Thread-safe; :meth:`close` ends
    the children."""

    def __init__(self, timeout: float = 10.0, idle: int = 2) -> None:
        self.timeout = timeout
        self._idle_max = idle
        self._idle: list[subprocess.Popen] = []
        self._lock = threading.Lock()
        self._known: collections.OrderedDict[str, str] = collections.OrderedDict()
        self._closed = False

    def schema_gbnf(self, schema: Any, where: str, cancel: threading.Event | None = None) -> str:
        """The GBNF for a JSON schema (bounded, converted and compiled in a child). Raises
        InvalidRequest naming ``where`` (``format``, ``tool "x" parameters``) and the reason."""
        schemabounds.check(schema, where)
        return self._job({"schema": schema}, where, cancel)

    def compiled(self, gbnf: str, where: str, cancel: threading.Event | None = None) -> str:
        """``gbnf`` once a child has compiled it. Raises InvalidRequest."""
        return self._job({"gbnf": gbnf}, where, cancel)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            idle, self._idle = self._idle, []
        for child in idle:
            _end(child)

    # ------------------------------------------------------------------------------ jobs
    def _job(self, job: dict[str, Any], where: str, cancel: threading.Event | None) -> str:
        job["max_chars"] = MAX_GBNF
        line = json.dumps(job) + "\n"  # key order kept: it is the order of the JSON the grammar writes
        with self._lock:
            if line in self._known:
                self._known.move_to_end(line)
                return self._known[line]
        answer = self._ask(line, where, cancel)
        if "error" in answer:
            raise InvalidRequest(f"invalid JSON schema in {where}: {answer['error']}"
                                 if "schema" in job else f"the grammar for {where} does not compile: {answer['error']}")
        with self._lock:
            self._known[line] = answer["gbnf"]
            while len(self._known) > _REMEMBERED:
                self._known.popitem(last=False)
        return answer["gbnf"]

    def _ask(self, line: str, where: str, cancel: threading.Event | None) -> dict[str, Any]:
        child = self._take()
        try:
            assert child.stdin is not None and child.stdout is not None
            child.stdin.write(line.encode())
            child.stdin.flush()
            reply = self._read(child, where, cancel)
        except OSError:
            reply = b""
        except BaseException:
            _end(child)
            raise
        if not reply:
            code = _end(child)
            how = f"signal {-code}" if code is not None and code < 0 else f"exit status {code}"
            log.warning("the grammar child for %s ended (%s)", where, how)
            return {"error": f"the grammar compiler failed on it ({how})"}
        self._give_back(child)
        return json.loads(reply)

    def _read(self, child: subprocess.Popen, where: str, cancel: threading.Event | None) -> bytes:
        """The child's answer line; b"" if it ended. Raises Cancelled, or InvalidRequest past the
        time limit (the child is then killed by the caller)."""
        assert child.stdout is not None
        fd = child.stdout.fileno()
        deadline = time.monotonic() + self.timeout
        chunks: list[bytes] = []
        while True:
            if cancel is not None and cancel.is_set():
                raise Cancelled("the request was cancelled while its grammar was built")
            left = deadline - time.monotonic()
            if left <= 0:
                raise InvalidRequest(f"the grammar for {where} took longer than {self.timeout:g} s to build")
            ready, _, _ = select.select([fd], [], [], min(left, 0.05))
            if not ready:
                continue
            data = os.read(fd, 1 << 16)
            if not data:
                return b""
            chunks.append(data)
            if data.endswith(b"\n"):
                return b"".join(chunks)

    # --------------------------------------------------------------------------- children
    def _take(self) -> subprocess.Popen:
        with self._lock:
            if self._closed:
                raise InvalidRequest("the model is unloading")
            if self._idle:
                return self._idle.pop()
        return subprocess.Popen([sys.executable, "-I", str(_CHILD)], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, bufsize=0)

    def _give_back(self, child: subprocess.Popen) -> None:
        with self._lock:
            if not self._closed and len(self._idle) < self._idle_max:
                self._idle.append(child)
                return
        _end(child)


def _end(child: subprocess.Popen) -> int | None:
    """Kill ``child`` (if it still runs) and reap it; its exit status."""
    if child.poll() is None:
        child.kill()
    try:
        return child.wait(5)
    except subprocess.TimeoutExpired:
        return None
