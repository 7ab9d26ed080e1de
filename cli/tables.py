"""Ollama's table layouts for ``list``, ``show`` and ``ps`` (reference §4.1)."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Iterable, Sequence

from runner import ResolvedModel
from runner.api import PollamaError
from runner.model.ggufmeta import read_gguf_header
from runner.store import StoredModel


def human_size(n: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= scale:
            return f"{n / scale:.0f} {unit}" if n / scale >= 100 else f"{n / scale:.1f} {unit}".replace(".0 ", " ")
    return f"{n} B"


def human_ago(when: datetime, now: datetime | None = None) -> str:
    now = now or datetime.now(timezone.utc)
    seconds = int((now - when).total_seconds())
    if seconds < 1:
        return "Less than a second ago"
    for unit, size in (("year", 31536000), ("month", 2592000), ("week", 604800), ("day", 86400),
                       ("hour", 3600), ("minute", 60), ("second", 1)):
        if seconds >= size:
            count = seconds // size
            if count == 1:
                return f"{'An' if unit == 'hour' else 'A'} {unit} ago" if unit != "second" else "1 second ago"
            return f"{count} {unit}s ago"
    return "Less than a second ago"


def format_table(headers: Sequence[str], rows: Iterable[Sequence[Any]]) -> str:
    """Left-aligned columns separated by at least three spaces, like Ollama's tabwriter."""
    rows = [[str(c) for c in r] for r in rows]
    widths = [len(h) for h in headers]
    for r in rows:
        widths = [max(w, len(c)) for w, c in zip(widths, r)]
    lines = []
    for r in [list(headers)] + rows:
        lines.append("".join(c.ljust(w + 4) for c, w in zip(r, widths)).rstrip())
    return "\n".join(lines)


def list_table(models: Sequence[StoredModel]) -> str:
    return format_table(
        ["NAME", "ID", "SIZE", "MODIFIED"],
        [[m.name, (m.digest or "-")[:12], "-" if m.remote else human_size(m.size), human_ago(m.modified)]
         for m in models],
    )


def _projector_rows(path: str) -> list[tuple[str, object]]:
    """Ollama's "Projector" block: what the projector GGUF says of itself."""
    try:
        header = read_gguf_header(path)
    except PollamaError:
        return [("architecture", "unreadable")]
    meta = header.metadata
    return [("architecture", header.architecture),
            ("embedding length", meta.get("clip.vision.embedding_length", "unknown")),
            ("dimensions", meta.get("clip.vision.projection_dim", "unknown"))]


def _remote_text(model: ResolvedModel) -> str:
    """``pollama show`` of a remote model: where it runs and what its upstream said."""
    remote = model.remote
    assert remote is not None
    rows: list[tuple[str, object]] = [("remote model", remote.model), ("api", remote.api)]
    rows += [("upstream" if len(remote.hosts) == 1 else f"replica {i + 1}", url) for i, url in enumerate(remote.hosts)]
    rows.append(("context length", remote.context_length or "unknown (the upstream's)"))
    out = ["  Model"] + [f"    {k:<20}{v}" for k, v in rows]
    out += ["", "  Capabilities"] + [f"    {c}" for c in model.capabilities]
    return "\n".join(out) + "\n"


def show_text(model: ResolvedModel, verbose: bool = False, devices: str = "") -> str:
    """``pollama show``'s text; ``devices``: where a load would put the model's layers now."""
    if model.remote is not None:
        return _remote_text(model)
    info = model.info
    rows = [
        ("architecture", info.architecture),
        ("parameters", info.metadata.get("general.size_label") or "unknown"),
        ("context length", info.context_length),
        ("embedding length", info.embedding_length),
        ("quantization", info.quantization),
        ("template", model.template.describe()),
    ]
    out = ["  Model"] + [f"    {k:<20}{v}" for k, v in rows]
    if info.projector:
        out += ["", "  Projector"] + [f"    {k:<20}{v}" for k, v in _projector_rows(info.projector)]
    out += ["", "  Capabilities"] + [f"    {c}" for c in model.capabilities]
    if devices:
        out += ["", "  Devices", f"    {devices}"]
    if info.metadata.get("general.license"):
        out += ["", "  License", f"    {info.metadata['general.license']}"]
    if verbose:
        out += ["", "  Metadata"]
        for key, value in sorted(info.metadata.items()):
            if key == "tokenizer.chat_template":
                continue
            out.append(f"    {key:<40}{str(value)[:80]}")
    return "\n".join(out) + "\n"
