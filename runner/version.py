"""Version numbers: pollama's own, and the Ollama version the server reports to clients.

``/api/version`` answers with :data:`OLLAMA_API_VERSION`, not pollama's own number: clients
compare it with the Ollama release that introduced a feature (e.g. Open WebUI and other tools
check for a minimum version before they use an endpoint). pollama reproduces the API of Ollama
0.25.0 — the last release with both of Ollama's own engines, whose runner pollama rebuilds
(shared/reference/ollama-runner.md § 0) — so that is the number it reports. ``pollama --version``
prints pollama's own.
"""

from __future__ import annotations

from importlib import metadata

OLLAMA_API_VERSION = "0.25.0"


def pollama_version() -> str:
    try:
        return metadata.version("pollama")
    except metadata.PackageNotFoundError:  # pragma: no cover - running from a bare checkout
        return "0.0.0"
