"""The new engine: :class:`runner.loop.engine.Engine` over our GGML model and ``kvcache``.

Differences from the old engine that matter (reference §2.3, §2.9): the *total* batch is capped
at ``num_batch``; the KV cache is ours (cells shared by ``copy_prefix``, context shift by
``remove`` + the model's RoPE ``shift``); sampling is ours (``runner.sample``), with the repeat
penalties Ollama's new engine skipped.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import numpy as np

from ...api import Grammar, Image, InvalidModel, LoadError, ModelInfo, NoVision, Options
from ...loading.plan import LoadOptions
from ...loop.embedding import MAX_LANES, batch_size
from ...loop.slots import ImageInput, Input
from ...ml import kernels
from ...ml.backend import BackendOptions
from ...ml.ggml import lone_rows, q4_1
from ...model import load_tokenizer
from ...model.model import Outputs, Prepared
from ...model.models import Batch, ModelLoadError, supported_architectures
from ...model.models import load as load_model
from ...sample import Sampler, SamplerOptions
from ...sample.grammar import GrammarSampler, VocabOnly
from ...spec.controller import MAX_DRAFT
from .embed import CacheLanes
from .kv import CacheKv
from .vision import Vision, projector_type

log = logging.getLogger(__name__)


def supports(architecture: str) -> bool:
    return architecture in supported_architectures()


class _SeqSampler:
    def __init__(self, sampler: Sampler, grammar: GrammarSampler | None) -> None:
        self.sampler, self.grammar = sampler, grammar

    def sample(self, out: Outputs, row: int) -> int:
        """The next token from row ``row`` of ``out``: from the row's best logits
        (:meth:`Outputs.top`) when they can decide it (no grammar; :attr:`Sampler.reads_top`,
        :meth:`Sampler.sample_top`), else from the whole row."""
        if self.grammar is not None:
            token = self.grammar.sample(out.logits()[row], self.sampler.sample)
            self.grammar.accept(token)
        elif self.sampler.reads_top and (top := out.top(row)) is not None:
            token = self.sampler.sample_top(*top, lambda: out.logits()[row])
        else:
            token = self.sampler.sample(out.logits()[row])
        self.sampler.accept(token)
        return token


class GGMLEngine:
    """:class:`runner.loop.engine.Engine` over our model code (``model``) and its KV cache."""

    name = "new"

    def __init__(self, info: ModelInfo, load: LoadOptions) -> None:
        """``load.kv_cache_type`` and ``load.flash_attention`` as ``runner.loading.plan`` resolved them
        (Ollama leaves flash attention off for llama/qwen2 unless OLLAMA_FLASH_ATTENTION says so)."""
        num_ctx, num_parallel, num_batch = load.num_ctx, load.num_parallel, load.num_batch
        self.info = info
        self.num_ctx, self.num_batch = num_ctx, num_batch
        self.batch_capacity = num_batch  # one cell pool: num_batch tokens a decode in all
        # GGML's batched kernels (not in the batch-invariant mode), ours for Q4_1 where they run,
        # and a decoded batch's other products as lone rows' (runner/ml/ggml/backend.py)
        self.multiplies = kernels.multiplies(ggml_batched=not load.batch_invariant,
                                             tiled=load.row_kernels and bool(q4_1.variant()),
                                             lone=lone_rows.ops() is not None)
        options = BackendOptions(num_threads=load.num_thread, flash_attention=load.flash_attention,
                                 batch_invariant=load.batch_invariant, row_kernels=load.row_kernels)
        try:
            self._tok = load_tokenizer(info.path)
            self.model = load_model(info.path, options)
        except ModelLoadError as err:
            raise InvalidModel(str(err)) from None
        self.vision: Vision | None = None
        try:
            self.model.init_cache(num_ctx * num_parallel, num_parallel, num_batch, load.kv_cache_type)
            # a decode that verifies a draft has an output row per drafted token (runner.spec),
            # and its graph its own layout (decoded rows' attention): both worst cases, so that
            # no step grows the compute buffer mid-answer (which makes every built graph stale)
            self.model.reserve(num_batch, n_outputs=num_parallel + MAX_DRAFT)
            self.model.reserve(min(num_batch, max(num_parallel, 1 + MAX_DRAFT)), decode=True)
            if info.projector is not None:
                # the worst-case image batch (num_batch given embeddings) in the compute buffer,
                # and the encoder's own graph: a vision model that loads cannot fail mid-answer
                self.model.reserve(num_batch, embeds=True)
                self.vision = Vision(info.projector, projector_type(info.projector) or "", self.model, options)
        except ModelLoadError as err:
            self.model.close()
            raise LoadError(str(err)) from None
        except Exception:
            self.model.close()
            raise
        # KV cache (all layers, windows sized) + compute buffers (text; image encoder)
        self.memory_size = self.model.memory_size + (self.vision.memory_size if self.vision is not None else 0)
        self.kv = CacheKv(self.model.cache)
        self.n_vocab = self._tok.n_vocab
        self._vocab: VocabOnly | None = None  # loaded on the first request with a format
        self._batch: tuple[list[int], list[int], list[int], list[int]] = ([], [], [], [])
        self._prepared: tuple[Prepared, np.ndarray, dict[int, int]] | None = None
        self._lanes = CacheLanes(self.model, self.kv, num_parallel, min(MAX_LANES, batch_size(num_batch)))
        self._rows: dict[int, int] = {}
        self._out: Outputs | None = None
        bos = self._tok.token_text(self._tok.bos_id) if self._tok.bos_id is not None and self._tok.bos_id >= 0 else ""
        eos = self._tok.token_text(self._tok.eos_id) if self._tok.eos_id is not None and self._tok.eos_id >= 0 else ""
        self._special = (bos, eos)

    # ----------------------------------------------------------------------------- vocab
    @property
    def add_bos(self) -> bool:
        return bool(self._tok.add_bos)

    @property
    def special_tokens(self) -> tuple[str, str]:
        return self._special

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        return self._tok.encode(text, add_special=add_special, parse_special=parse_special)

    def piece(self, token: int) -> bytes:
        return self._tok.token_to_piece(token)

    def is_eog(self, token: int) -> bool:
        return self._tok.is_eog(token)

    # ----------------------------------------------------------------------------- batch
    def batch_begin(self) -> None:
        self._batch = ([], [], [], [])

    def batch_add(self, tokens: list[int], pos: int, seq_id: int, outputs: int = 1) -> int:
        toks, positions, seqs, rows = self._batch
        first = len(toks)
        end = first + len(tokens)
        toks.extend(tokens)
        positions.extend(range(pos, pos + len(tokens)))
        seqs.extend([seq_id] * len(tokens))
        rows.extend(range(max(end - outputs, first), end) if outputs > 1 else (end - 1,))
        return end - 1

    def prepare(self) -> None:
        toks, positions, seqs, outputs = self._batch
        try:
            # every row an output of one sequence: a sampled token and its drafted ones to
            # verify, computed as lone rows (several conversations' tokens: as GGML batches them)
            decode = len(outputs) == len(toks) and min(seqs) == max(seqs)
            prepared = self.model.prepare(Batch(toks, positions, seqs, outputs, decode=decode))
        except Exception as err:
            raise LoadError(f"forward pass failed: {err}") from err
        rows = {index: row for row, index in enumerate(outputs)}
        self._prepared = (prepared, np.asarray(toks, dtype=np.int32), rows)

    def fill(self, row: int, token: int) -> None:
        assert self._prepared is not None
        self._prepared[1][row] = token

    def decode(self, started: threading.Event | None = None) -> None:
        assert self._prepared is not None
        (prepared, tokens, rows), self._prepared = self._prepared, None
        try:
            out = self.model.execute(prepared, tokens, started)
        except Exception as err:
            raise LoadError(f"forward pass failed: {err}") from err
        self._out = out
        self._rows = rows

    def logits(self, row: int) -> np.ndarray:
        assert self._out is not None
        return self._out.logits()[self._rows[row]]

    def image_inputs(self, image: Image) -> list[Input]:
        if self.vision is None:
            raise NoVision()
        return self.vision.image_inputs(image)

    def decode_image(self, image: ImageInput, pos: int, seq_id: int) -> None:
        if self.vision is None:
            raise NoVision()
        self.vision.decode(image, pos, seq_id, self.num_batch)

    def embed_lanes(self) -> CacheLanes:
        return self._lanes

    # --------------------------------------------------------------------------- sampling
    def new_sampler(self, opts: Options, grammar: Grammar | None, prompt: list[int]) -> Any:
        sampler = Sampler(SamplerOptions.from_options(opts), num_ctx=self.num_ctx)
        last_n = self.num_ctx if opts.repeat_last_n < 0 else opts.repeat_last_n
        if last_n:
            sampler.accept_many(prompt[-last_n:])  # repeat penalties see the prompt
        constrained = None
        if grammar is not None:
            if self._vocab is None:
                self._vocab = VocabOnly(self.info.path)
            constrained = GrammarSampler(self._vocab, grammar)
        return _SeqSampler(sampler, constrained)

    def free_sampler(self, sampler: Any) -> None:
        if sampler.grammar is not None:
            sampler.grammar.close()

    def sample(self, sampler: Any, row: int) -> int:
        assert self._out is not None
        return sampler.sample(self._out, self._rows[row])

    def close(self) -> None:
        if self._vocab is not None:
            self._vocab.close()
            self._vocab = None
        if self.vision is not None:
            self.vision.close()
        self.model.close()

