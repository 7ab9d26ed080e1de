"""llama.cpp's and libmtmd's log lines into Python loggers (one rule for both libraries)."""

from __future__ import annotations

import logging
from typing import Any

import llama_cpp as L


MAX_LINE = 500  # characters of one message: llama.cpp logs a grammar it cannot parse whole


def log_callback(logger: logging.Logger) -> Any:
    """A llama.cpp log callback that forwards each line to ``logger``, cut to ``MAX_LINE``
    characters: GGML_LOG_LEVEL 4 (error) as an error, the rest as chatter for --debug. Keep it
    alive for the process."""

    def forward(level: int, text: bytes, _user: Any) -> None:
        text = text or b""
        message = text[:MAX_LINE].decode("utf-8", errors="replace").rstrip("\n")
        if len(text) > MAX_LINE:
            message += f" ... ({len(text) - MAX_LINE} more bytes)"
        if message:
            logger.log(logging.ERROR if level == 4 else logging.DEBUG, "%s", message)

    return L.llama_log_callback(forward)
