"""What a remote model's upstream says of itself, asked once when the model is created: which
model it serves (``PARAMETER upstream_model``, or the upstream's only one), and what that model
can do (an Ollama upstream's ``/api/show`` capabilities and context length; an OpenAI upstream's
``/models`` entry, where vLLM puts ``max_model_len`` and llama-server ``meta.n_ctx_train``)."""

from __future__ import annotations

import logging
from typing import Any

from .. import config as _config
from ..api import InvalidRequest, PollamaError, UpstreamError
from .client import Connection
from .upstream import OLLAMA, RemoteModel, RemoteSpec, Upstream

log = logging.getLogger(__name__)

DISCOVER_TIMEOUT = 15.0
MAX_LIST = 4 << 20


def discover(spec: RemoteSpec, cfg: _config.Config) -> tuple[RemoteModel, list[str]]:
    """The remote model ``spec`` names, and notes for the create's progress. The first replica
    that answers is asked; when none does, a model named with ``upstream_model`` is created as
    named (its upstream may be down for now), else the create is refused (InvalidRequest: the
    request named a server that does not answer)."""
    upstreams = spec.upstreams()
    if not upstreams:
        raise InvalidRequest("a remote model needs at least one upstream URL")
    notes: list[str] = []
    failures: list[str] = []
    for upstream in upstreams:
        try:
            return _ask(upstream, upstreams, spec.model, cfg), notes
        except UpstreamError as err:
            if err.status < 500:
                raise
            failures.append(str(err))
    if spec.model:
        notes.append(f"upstream not reachable now ({failures[0]}); using upstream_model {spec.model}")
        return RemoteModel(upstreams, spec.model), notes
    raise InvalidRequest(f"{failures[0]}: cannot ask it which model it serves (or name one with "
                         "PARAMETER upstream_model)")


def _ask(upstream: Upstream, upstreams: tuple[Upstream, ...], wanted: str, cfg: _config.Config) -> RemoteModel:
    conn = Connection(upstream, cfg)
    dialect = upstream.dialect()
    try:
        listing = conn.json("GET", dialect.models_path, limit=MAX_LIST, timeout=DISCOVER_TIMEOUT)
        names = dialect.model_names(listing)
        model = _choose(names, wanted, upstream)
        if upstream.api == OLLAMA:
            return _from_show(conn, upstreams, model)
        entry = next((m for m in listing.get("data", []) if isinstance(m, dict) and m.get("id") == model), {})
        return RemoteModel(upstreams, model, ("completion",), context_length=_openai_context(entry))
    finally:
        conn.close()


def _choose(names: list[str], wanted: str, upstream: Upstream) -> str:
    if wanted:
        if wanted in names or (":" not in wanted and f"{wanted}:latest" in names):
            return wanted if wanted in names else f"{wanted}:latest"
        raise InvalidRequest(f'upstream {upstream} does not serve "{wanted}"; it serves: {_listed(names)}')
    if len(names) == 1:
        return names[0]
    if not names:
        raise InvalidRequest(f"upstream {upstream} serves no model")
    raise InvalidRequest(f"upstream {upstream} serves {len(names)} models: name one with PARAMETER upstream_model "
                         f"({_listed(names)})")


def _listed(names: list[str]) -> str:
    shown = ", ".join(names[:20])
    return shown + (f" and {len(names) - 20} more" if len(names) > 20 else "") if names else "none"


def _from_show(conn: Connection, upstreams: tuple[Upstream, ...], model: str) -> RemoteModel:
    try:
        shown = conn.json("POST", "/api/show", {"model": model}, limit=MAX_LIST, timeout=DISCOVER_TIMEOUT)
    except PollamaError as err:
        log.warning("cannot read %s's capabilities: %s", model, err)
        return RemoteModel(upstreams, model)
    shown = shown if isinstance(shown, dict) else {}
    caps = tuple(str(c) for c in shown.get("capabilities") or ["completion"] if isinstance(c, str))
    info = shown.get("model_info") if isinstance(shown.get("model_info"), dict) else {}
    arch = str(info.get("general.architecture") or "")
    details = shown.get("details") if isinstance(shown.get("details"), dict) else {}
    return RemoteModel(upstreams, model, caps or ("completion",),
                       context_length=_int(info.get(f"{arch}.context_length")),
                       embedding_length=_int(info.get(f"{arch}.embedding_length")),
                       family=str(details.get("family") or arch))


def _openai_context(entry: dict[str, Any]) -> int:
    meta = entry.get("meta") if isinstance(entry.get("meta"), dict) else {}
    for value in (entry.get("max_model_len"), entry.get("context_length"), meta.get("n_ctx_train")):
        if _int(value):
            return _int(value)
    return 0


def _int(value: Any) -> int:
    return value if isinstance(value, int) and not isinstance(value, bool) and 0 < value < 2**31 else 0
