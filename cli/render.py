"""Presentation: the spinner until the first token, streamed text with word wrap, --verbose metrics."""

from __future__ import annotations

import shutil
import sys
from typing import Any, TextIO

from rich.console import Console

from runner.api import Metrics

stderr = Console(stderr=True, highlight=False, soft_wrap=True)


def error(message: str) -> None:
    """One line on stderr, Ollama's style."""
    stderr.print(f"Error: {message}", style="red" if stderr.is_terminal else None, markup=False)


def notice(message: str) -> None:
    """One plain line on stderr (e.g. "Added image './cat.png'")."""
    stderr.print(message, markup=False, highlight=False)


class Spinner:
    """Ollama's braille spinner on stderr (only on a terminal), gone at the first token."""

    def __init__(self, enabled: bool | None = None) -> None:
        self.enabled = stderr.is_terminal if enabled is None else enabled
        self._status = None

    def start(self) -> "Spinner":
        if self.enabled and self._status is None:
            self._status = stderr.status("", spinner="dots", spinner_style="default")
            self._status.start()
        return self

    def stop(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None

    def __enter__(self) -> "Spinner":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


class StreamWriter:
    """Writes streamed text; on a terminal with word wrap on, breaks lines at ``width - 5``.

    A word that would cross the margin is moved to the next line as Ollama does: the cursor goes
    back over the part already printed, clears it, and reprints the word after a newline.
    """

    def __init__(self, out: TextIO | None = None, wordwrap: bool = True) -> None:
        self.out = out or sys.stdout
        is_tty = getattr(self.out, "isatty", lambda: False)()
        self.wrap = wordwrap and is_tty
        self.width = max(shutil.get_terminal_size((80, 24)).columns - 5, 10)
        self.col = 0
        self.word = ""
        self.wrote_any = False
        self.last_char = ""

    def write(self, text: str) -> None:
        if not text:
            return
        self.wrote_any = True
        self.last_char = text[-1]
        if not self.wrap:
            self.out.write(text)
            self.out.flush()
            return
        buf = []
        for ch in text:
            if ch == "\n":
                buf.append(ch)
                self.col, self.word = 0, ""
                continue
            if ch.isspace():
                if self.col >= self.width:
                    buf.append("\n")
                    self.col, self.word = 0, ""
                    continue
                buf.append(ch)
                self.col += 1
                self.word = ""
                continue
            if self.col >= self.width:
                if self.word and len(self.word) < self.width:
                    buf.append(f"\x1b[{len(self.word)}D\x1b[K\n{self.word}")
                    self.col = len(self.word)
                else:
                    buf.append("\n")
                    self.col, self.word = 0, ""
            buf.append(ch)
            self.word += ch
            self.col += 1
        self.out.write("".join(buf))
        self.out.flush()

    def write_dim(self, text: str) -> None:
        """Reasoning: dimmed on a terminal, as Ollama shows it."""
        if not text:
            return
        is_tty = getattr(self.out, "isatty", lambda: False)()
        if is_tty:
            self.out.write("\x1b[2m")
        self.write(text)
        if is_tty:
            self.out.write("\x1b[0m")
            self.out.flush()

    def end(self) -> None:
        """Finish a response: Ollama prints two newlines after it."""
        if self.wrote_any:
            self.out.write("\n" if self.last_char == "\n" else "\n\n")
        self.out.flush()
        self.col, self.word, self.wrote_any, self.last_char = 0, "", False, ""


def go_duration(ns: int) -> str:
    """Go's time.Duration.String(): 1.234567s, 12.345ms, 250µs, 2m3.5s."""
    if ns == 0:
        return "0s"
    sign = "-" if ns < 0 else ""
    ns = abs(ns)
    if ns < 1_000:
        return f"{sign}{ns}ns"
    if ns < 1_000_000:
        return f"{sign}{_trim(ns / 1_000)}µs"
    if ns < 1_000_000_000:
        return f"{sign}{_trim(ns / 1_000_000)}ms"
    seconds = ns / 1e9
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    out = sign
    if hours:
        out += f"{int(hours)}h"
    if hours or minutes:
        out += f"{int(minutes)}m"
    return out + f"{_trim(secs)}s"


def _trim(value: float) -> str:
    text = f"{value:.9f}".rstrip("0").rstrip(".")
    whole, _, frac = text.partition(".")
    return whole + ("." + frac[:6] if frac else "")


def metrics_block(m: Metrics, engine: str, devices: str = "CPU") -> str:
    lines = [
        f"total duration:       {go_duration(m.total_duration)}",
        f"load duration:        {go_duration(m.load_duration)}",
        f"prompt eval count:    {m.prompt_tokens} token(s)",
        f"prompt cache:         {m.prompt_cached_count} token(s)"
        + (f" ({m.prompt_cache_source})" if m.prompt_cached_count and m.prompt_cache_source else ""),
    ]
    if m.prompt_eval_duration > 0:
        # the rate of the work done: tokens taken from the cache cost nothing
        lines.append(f"prompt eval duration: {go_duration(m.prompt_eval_duration)}")
        lines.append(f"prompt eval rate:     {m.prompt_eval_count / (m.prompt_eval_duration / 1e9):.2f} tokens/s")
    lines.append(f"eval count:           {m.eval_count} token(s)")
    if m.eval_duration > 0:
        lines.append(f"eval duration:        {go_duration(m.eval_duration)}")
        lines.append(f"eval rate:            {m.eval_count / (m.eval_duration / 1e9):.2f} tokens/s")
    if m.draft_n:  # speculative decoding drafted: how many of its guesses the model took
        lines.append(f"draft tokens:         {m.draft_n_accepted}/{m.draft_n}")
    lines.append(f"engine:               {engine}")
    lines.append(f"devices:              {devices}")
    return "\n".join(lines)


def print_metrics(m: Metrics, engine: str, devices: str = "CPU") -> None:
    stderr.print(metrics_block(m, engine, devices), markup=False)


class ProgressView:
    """A pull's or create's progress on stderr, Ollama's way: each status on its own line, and a
    bar per layer (``pulling 6a0746a1ec1a: 100% ▕███▏ 1.2 MB/1.2 MB 4.0 MB/s``) on a terminal.
    Off a terminal, one line per status and one per finished layer."""

    def __init__(self) -> None:
        self.live = stderr.is_terminal
        self.status = ""
        self.tasks: dict[str, Any] = {}
        self.done: set[str] = set()
        self.bars = None
        if self.live:
            from rich.progress import (BarColumn, DownloadColumn, Progress, TaskProgressColumn,
                                       TextColumn, TimeRemainingColumn, TransferSpeedColumn)

            self.bars = Progress(TextColumn("{task.description}"), TaskProgressColumn(), BarColumn(),
                                 DownloadColumn(), TransferSpeedColumn(), TimeRemainingColumn(),
                                 console=stderr, transient=False)

    def __enter__(self) -> "ProgressView":
        if self.bars is not None:
            self.bars.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.bars is not None:
            self.bars.stop()

    def update(self, status: str, digest: str = "", total: int = 0, completed: int = 0) -> None:
        if not digest:
            if status != self.status:
                self.status = status
                self._line(status)
            return
        if completed == 0 and digest not in self.tasks:
            return  # the announcement before a download starts (Ollama skips it too)
        label = f"{status}:"
        if self.bars is not None:
            task = self.tasks.get(digest)
            if task is None:
                task = self.tasks[digest] = self.bars.add_task(label, total=total or None)
            self.bars.update(task, completed=completed, total=total or None)
        else:
            self.tasks.setdefault(digest, None)
            if completed >= total and digest not in self.done:
                self.done.add(digest)
                self._line(f"{label} 100% {human_bytes(total)}")
        self.status = status

    def _line(self, text: str) -> None:
        if self.bars is not None:
            self.bars.console.print(text, markup=False, highlight=False)
        else:
            stderr.print(text, markup=False, highlight=False)


def human_bytes(n: int) -> str:
    """Ollama's format.HumanBytes: 1.2 MB, 253 MB, 4.7 GB (powers of 1000)."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            value = n / scale
            return f"{value:.0f} {unit}" if value >= 100 else f"{value:.1f} {unit}"
    return f"{n} B"
