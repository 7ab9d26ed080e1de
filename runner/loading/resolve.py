"""``resolve(name) -> ResolvedModel``: the model a user named, found once per request.

A name is the default model (None or ``smollm2:135m``), a ``.gguf`` path, or a store name. What
resolving gives is everything known about the model without running it: the store entry, what
its GGUF says about itself (checked so that the engines can load it), its Modelfile defaults
(PARAMETERs, SYSTEM, MESSAGEs, TEMPLATE), the template its prompts are rendered with, and its
vision projector. ``runner.load`` takes the result and never resolves again; the CLI and the
server both start here (the CLI pulls a missing store name first).
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass
from pathlib import Path

from .. import config as _config
from .. import store
from ..api import ChatTemplate, ModelInfo
from ..model import ggufmeta
from ..remote.upstream import RemoteModel
from ..template import features
from ..template.prompt import model_template
from . import ggufcheck

#: the names of GGUF ``general.file_type`` values (llama.cpp's ``LLAMA_FTYPE_MOSTLY_*``); a
#: value not named here shows as "unknown"
_FILE_TYPES = {
    0: "F32", 1: "F16", 2: "Q4_0", 3: "Q4_1", 7: "Q8_0", 8: "Q5_0", 9: "Q5_1", 10: "Q2_K",
    11: "Q3_K_S", 12: "Q3_K_M", 13: "Q3_K_L", 14: "Q4_K_S", 15: "Q4_K_M", 16: "Q5_K_S",
    17: "Q5_K_M", 18: "Q6_K", 19: "IQ2_XXS", 20: "IQ2_XS", 21: "Q2_K_S", 22: "IQ3_XS", 23: "IQ3_XXS",
    24: "IQ1_S", 25: "IQ4_NL", 26: "IQ3_S", 27: "IQ3_M", 28: "IQ2_S", 29: "IQ2_M", 30: "IQ4_XS",
    31: "IQ1_M", 32: "BF16", 36: "TQ1_0", 37: "TQ2_0", 38: "MXFP4_MOE",
}
_INFO_CACHE_SIZE = 64  # headers kept: reading one takes a moment, and names come from the network


@dataclass(frozen=True, eq=False)
class ResolvedModel:
    """A model found: how it was named, its store entry, its GGUF's facts, its Modelfile
    defaults and the template its prompts use when a request names none."""

    name: str  # as the user or the request named it
    stored: store.StoredModel
    info: ModelInfo
    defaults: store.ModelDefaults
    template: ChatTemplate

    @classmethod
    def of(cls, stored: store.StoredModel, name: str | None = None, projector: str | None = None) -> ResolvedModel:
        """The model of a store entry already found (``name``: how it was named, else its own)."""
        defaults = store.model_defaults(stored)
        if stored.remote is not None:
            origin = f"its upstream {stored.remote.upstreams[0]}"
            return cls(name or stored.name, stored, remote_info(stored, stored.remote), defaults,
                       ChatTemplate("remote", "", origin))
        info = _infos.get(stored, projector)
        return cls(name or stored.name, stored, info, defaults, model_template(info, defaults.template))

    @property
    def remote(self) -> RemoteModel | None:
        """The upstream servers that run this model, when it is a remote model."""
        return self.stored.remote

    @property
    def key(self) -> str:
        """The resolved GGUF path: every name of one file shares one loaded runner (a remote
        model: its upstreams and its name there)."""
        if self.stored.remote is not None:
            return "remote:" + " ".join(self.stored.remote.hosts) + " " + self.stored.remote.model
        return str(self.stored.path)

    @property
    def capabilities(self) -> list[str]:
        """Ollama's capability names: what its template allows (a remote model: what its
        upstream said when the model was created)."""
        if self.stored.remote is not None:
            return list(self.stored.remote.capabilities)
        return features.capabilities(self.info, self.template)


def resolve(name: str | None, cfg: _config.Config | None = None, *, projector: str | None = None,
            from_network: bool = False) -> ResolvedModel:
    """The model ``name`` points to; ``projector``: a vision projector GGUF for it (``--mmproj``,
    else the store entry's ``projector`` layer). Raises ModelNotFound or InvalidModel, one line.

    ``from_network``: the name came in a request (:func:`runner.store.lookup` says what changes).
    """
    return ResolvedModel.of(store.lookup(name, cfg or _config.load(), from_network=from_network), name, projector)


def remote_info(stored: store.StoredModel, remote: RemoteModel) -> ModelInfo:
    """What is known of a remote model here: what its upstream said when it was created."""
    return ModelInfo(name=stored.name, path=remote.upstreams[0].url, architecture=remote.family or "remote",
                     size=0, context_length=remote.context_length, embedding_length=remote.embedding_length,
                     parameter_count=0, quantization="remote", chat_template=None,
                     metadata={"general.architecture": remote.family or "remote"})


def model_info(stored: store.StoredModel, projector: str | None = None) -> ModelInfo:
    """Read what a GGUF says about itself (fast: arrays are skipped) and check that the engines
    can load it (:mod:`runner.loading.ggufcheck`). Raises InvalidModel with one line."""
    header = ggufmeta.read_gguf_header(stored.path)
    ggufcheck.check_model(header, stored.path)
    if projector is not None:
        projector = str(store.check_projector(projector))
    elif "projector" in stored.layers:
        projector = str(stored.layers["projector"])
    return ModelInfo(
        name=stored.name,
        path=str(stored.path),
        architecture=header.architecture,
        size=stored.size,
        context_length=int(header.arch_value("context_length", 0) or 0),
        embedding_length=int(header.arch_value("embedding_length", 0) or 0),
        parameter_count=0,  # not in every GGUF; general.size_label says it when present
        quantization=_FILE_TYPES.get(int(header.get("general.file_type", -1)), "unknown"),
        chat_template=header.get("tokenizer.chat_template"),
        metadata=dict(header.metadata),
        projector=projector,
        draft=str(stored.layers["draft"]) if "draft" in stored.layers else None,
    )


class _InfoCache:
    """:func:`model_info` per (file, name, projector), re-read when the file changes; bounded."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.entries: collections.OrderedDict[tuple, tuple[tuple, ModelInfo]] = collections.OrderedDict()
        self.lock = threading.Lock()

    def get(self, stored: store.StoredModel, projector: str | None) -> ModelInfo:
        key = (str(stored.path), stored.name, projector, stored.layers.get("projector"))
        try:
            st = Path(stored.path).stat()
            stamp: tuple = (st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = (stored.size, 0)
        with self.lock:
            entry = self.entries.get(key)
            if entry is not None and entry[0] == stamp:
                self.entries.move_to_end(key)
                return entry[1]
        info = model_info(stored, projector)
        with self.lock:
            self.entries[key] = (stamp, info)
            self.entries.move_to_end(key)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)
        return info


_infos = _InfoCache(_INFO_CACHE_SIZE)
