"""The Engine protocol: what the batch loop (:mod:`runner.loop.runner`) needs from a model.

Two engines implement it: :class:`runner.engines.llamacpp.engine.LlamaEngine` (llama.cpp through
llama-cpp-python's low-level API) and :class:`runner.engines.ggml.engine.GGMLEngine` (our model
code over GGML). The loop *holds* an engine; it never subclasses one and never asks which one it
holds. Everything an engine differs in is a method here or a value it exposes.

Threading: every method except the vocabulary ones (``tokenize``, ``piece``, ``is_eog``,
``add_bos``, ``special_tokens``) and :meth:`Engine.decode` is called only from the loop thread.
The vocabulary methods may be called from any thread (request preparation runs on the caller's
thread); ``decode`` may run on the pipeline's compute thread while the loop thread builds and
prepares the next batch.

A batch's life: :meth:`Engine.batch_begin`, :meth:`Engine.batch_add` once per sequence (each
call's last token produces logits, or its last few; a token not sampled yet is :data:`PLACEHOLDER`),
:meth:`Engine.prepare`, :meth:`Engine.fill` for each placeholder, :meth:`Engine.decode`;
afterwards :meth:`Engine.logits` and :meth:`Engine.sample` read the rows of that decode. At most
two batches are alive: one decoding, and the next one being built and prepared meanwhile
(:mod:`runner.loop.pipeline`), which the loop fills and decodes once the first is done.
"""

from __future__ import annotations

import threading
from typing import Any, Mapping, Protocol

import numpy as np

from ..api import Grammar, Image, ModelInfo, Options
from .embedding import EmbedLanes
from .slots import ImageInput, Input, KvOps

#: a batch input whose token id is filled in later (:meth:`Engine.fill`): the token the
#: sequence samples from the batch decoding meanwhile
PLACEHOLDER = -1


class Engine(Protocol):
    name: str  # "old" (llama.cpp) or "new" (our GGML model code): Runner.engine
    info: ModelInfo
    n_vocab: int  # token ids are 0 <= id < n_vocab
    memory_size: int  # bytes held besides the weights (KV cache, compute buffers); 0: not known
    kv: KvOps  # the KV-memory operations the slot cache (runner.loop.slots) runs on
    # how it multiplies the weights by several rows at once, by GGUF file type (runner.ml.kernels):
    # what a step of drafted rows costs (runner.spec.controller.StepCost.of)
    multiplies: Mapping[str, str]

    @property
    def batch_capacity(self) -> int:
        """Tokens one :meth:`decode` may hold, all sequences together. Each sequence adds at most
        ``num_batch`` a batch; llama.cpp (a KV stream per slot, ``n_batch = num_batch x
        num_parallel``) takes ``num_batch`` from every slot at once, our engine ``num_batch`` in all.
        When the capacity is below ``num_batch x num_parallel`` the loop shares it round robin."""

    # ----------------------------------------------------------------------- vocabulary
    @property
    def add_bos(self) -> bool:
        """Whether tokenizing with ``add_special`` prepends BOS (chat templates need to know)."""

    @property
    def special_tokens(self) -> tuple[str, str]:
        """(bos, eos) token texts, for chat templates ("" where the model has none)."""

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        """The token ids of ``text``. ``add_special``: with BOS/EOS as the model adds them;
        ``parse_special``: control-token texts become their ids. Raises InvalidRequest for text
        the vocabulary cannot spell."""

    def piece(self, token: int) -> bytes:
        """The bytes ``token`` renders as in output (control tokens render as nothing); may be
        part of a UTF-8 character. ``0 <= token < n_vocab``."""

    def is_eog(self, token: int) -> bool:
        """Whether ``token`` ends generation (EOS, EOT and the like)."""

    # ---------------------------------------------------------------------------- batch
    def batch_begin(self) -> None:
        """Start building a new, empty batch (the one decoding, if any, is not touched)."""

    def batch_add(self, tokens: list[int], pos: int, seq_id: int, outputs: int = 1) -> int:
        """Append ``tokens`` at positions ``pos..pos+len-1`` of KV sequence ``seq_id`` (a slot
        id); the last ``outputs`` tokens (``1 <= outputs <= len(tokens)``) produce logits: one
        for a prompt chunk or a sampled token, ``1 + K`` for a sampled token and K drafted ones
        (:mod:`runner.spec`). A token may be :data:`PLACEHOLDER` (filled in by :meth:`fill`
        before the decode). Returns the batch row of the *last* token: the row :meth:`fill`,
        :meth:`logits` and :meth:`sample` take; the output rows are consecutive, so token
        ``len - 1 - j``'s row is that row minus ``j`` (``j < outputs``)."""

    def prepare(self) -> None:
        """Make the batch being built ready to decode but for its placeholders (our engine:
        places it in the KV cache and builds its graph). May run while the previous batch
        decodes, once that decode has set its ``started`` event. Rows of a prepared batch that
        is never decoded are undone by the caller with ``kv.seq_rm`` from their positions."""

    def fill(self, row: int, token: int) -> None:
        """Set the token id of placeholder ``row`` of the prepared batch."""

    def decode(self, started: threading.Event | None = None) -> None:
        """Evaluate the prepared batch: its tokens enter the KV cache and the marked rows get
        logits. ``started`` is set once the batch's inputs are handed to the backend, so the
        next batch may be prepared meanwhile. May run on a thread other than the loop's (one
        decode at a time). Raises PollamaError (LoadError) on failure; the loop then fails the
        batch's sequences."""

    def logits(self, row: int) -> np.ndarray:
        """Float32 ``(n_vocab,)``: the logits of ``row`` of the last decode. A view, valid until
        the next :meth:`decode`; copy it to keep it."""

    # --------------------------------------------------------------------------- images
    def image_inputs(self, image: Image) -> list[Input]:
        """The inputs ``image`` fills in a prompt: the model's wrapping token ids around one
        :class:`~runner.loop.slots.ImageInput` per position, all carrying the image's identity
        (so the slot cache reuses an image it holds). May encode the image (vision tower) or
        defer that to :meth:`decode_image`. Called on the caller's thread. Raises NoVision for a
        model without a projector, InvalidRequest for an image this model cannot take."""

    def decode_image(self, image: ImageInput, pos: int, seq_id: int) -> None:
        """Put the whole image that starts with ``image`` (index 0) into KV sequence ``seq_id``
        at positions ``pos..pos+count-1``, at once, outside any batch being built (its positions
        attend to each other as the model wants: gemma3's both ways). Called on the loop thread
        while no decode runs. Raises PollamaError on failure."""

    # ------------------------------------------------------------------------- sampling
    def new_sampler(self, options: Options, grammar: Grammar | None, prompt: list[int]) -> Any:
        """A sampler for one sequence: ``options``' temperature, top-k/p, min-p, typical, seed
        and repeat penalties (which see the end of ``prompt``), constrained by ``grammar``.
        Raises InvalidRequest when the grammar does not compile; the request alone fails."""

    def sample(self, sampler: Any, row: int) -> int:
        """Draw the next token from ``row``'s logits of the last decode with ``sampler`` (which
        also records it, for penalties and the grammar)."""

    def free_sampler(self, sampler: Any) -> None:
        """Release what :meth:`new_sampler` made (the sequence ended)."""

    # ----------------------------------------------------------------------- embeddings
    def embed_lanes(self) -> EmbedLanes:
        """Where embedding inputs are evaluated, several per decode (made on first use)."""

    def close(self) -> None:
        """Free the model, its contexts and caches. Nothing is called after this."""
