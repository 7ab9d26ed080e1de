"""The old engine: llama.cpp through llama-cpp-python's low-level API (Ollama's ``llamarunner``).

One ``llama_context`` holds ``num_parallel`` KV streams of ``num_ctx`` cells each. The batch
loop (:class:`~runner.loop.runner.BatchRunner`) holds this :class:`~runner.loop.engine.Engine` and fills
one ``llama_batch`` with the inputs of every live sequence; the engine only adds tokens to that
batch, decodes it and samples with llama.cpp's
sampler chain (penalties, top-k, typical, top-p, min-p, temperature, seeded draw; a GBNF grammar
for ``format``). Greedy requests without a format take the shared NumPy sampler instead (the
same penalties and argmax, without the chain's per-token copy of every candidate); sampled ones
with top_k and no format give the chain only the top_k candidates (:mod:`.topk`).
"""

from __future__ import annotations

import ctypes
import logging
import threading
from contextlib import contextmanager
from typing import Any, Iterator

import llama_cpp as L
import numpy as np

from . import topk
from ...api import Grammar, Image, InvalidModel, InvalidRequest, LoadError, ModelInfo, NoVision, Options
from ...ml import kernels
from ...model import ggufmeta
from ...loading.gpu import CPU, Placement
from ...loading.plan import LoadOptions
from ...loop.embedding import MAX_LANES, batch_size
from ...loop.slots import ImageInput, Input
from ...sample.grammar import init_sampler
from ...sample.samplers import Sampler, SamplerOptions
from .embed import EmbedContext
from .graph_ops import GraphOps
from .kv import LlamaKv
from .llamalog import log_callback
from .offload import model_params
from .vision import Projector

log = logging.getLogger(__name__)
llama_log = logging.getLogger("llama.cpp")


_LOG_CALLBACK = log_callback(llama_log)  # kept alive for the process's lifetime
L.llama_log_set(_LOG_CALLBACK, None)
L.llama_backend_init()

# llama_get_logits_ith giving the row's address (llama-cpp-python's own binding returns a
# POINTER(c_float)); a function object of our own, so the shared one keeps its restype
_LOGITS_ITH = L.llama_cpp._lib["llama_get_logits_ith"]
_LOGITS_ITH.restype = ctypes.c_void_p
_LOGITS_ITH.argtypes = [ctypes.c_void_p, ctypes.c_int32]


class _Capture(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())


@contextmanager
def _capture_llama_log() -> Iterator[_Capture]:
    handler = _Capture()
    old_level, old_propagate = llama_log.level, llama_log.propagate
    llama_log.addHandler(handler)
    llama_log.setLevel(logging.DEBUG)
    llama_log.propagate = logging.getLogger().isEnabledFor(logging.DEBUG)  # chatter only with OLLAMA_DEBUG
    try:
        yield handler
    finally:
        llama_log.removeHandler(handler)
        llama_log.setLevel(old_level)
        llama_log.propagate = old_propagate


def _load_failure_reason(lines: list[str]) -> str:
    for line in reversed(lines):
        lowered = line.lower()
        if "unknown model architecture" in lowered or "error loading model" in lowered:
            return line.split(": ", 1)[-1] if "error loading model" in lowered else line
    return lines[-1] if lines else "unknown error"


class _SpmBytes:
    """The characters an SPM vocabulary cannot spell. llama.cpp spells a character that is not a
    token with its byte tokens (``<0xC3>``), and throws ``std::out_of_range`` (which aborts the
    process) when one is missing: TinyStories-656K lacks 179 of them. Such text is refused first."""

    def __init__(self, tokens: set[bytes], missing: set[int]) -> None:
        self.tokens, self.missing = tokens, missing

    def check(self, text: str) -> None:
        for ch in set(text.replace(" ", "\u2581")):
            raw = ch.encode("utf-8", "surrogatepass")
            if raw not in self.tokens:
                for byte in raw:
                    if byte in self.missing:
                        raise InvalidRequest(f"cannot tokenize {ch!r}: the vocabulary has no token for byte 0x{byte:02X}")


def _spm_missing_bytes(info: ModelInfo) -> _SpmBytes | None:
    """For an SPM vocabulary (``tokenizer.ggml.model`` "llama") without a token for every byte."""
    if info.metadata.get("tokenizer.ggml.model") != "llama":
        return None
    tokens = set(ggufmeta.read_array(info.path, "tokenizer.ggml.tokens", errors=None) or [])
    missing = {b for b in range(256) if f"<0x{b:02X}>".encode() not in tokens and bytes([b]) not in tokens}
    return _SpmBytes(tokens, missing) if missing else None


class _Batch:
    """A ``llama_batch`` whose arrays are NumPy-owned, so filling it is vectorised."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.token = np.zeros(capacity, dtype=np.int32)
        self.pos = np.zeros(capacity, dtype=np.int32)
        self.n_seq_id = np.ones(capacity, dtype=np.int32)
        self.seq = np.zeros(capacity, dtype=np.int32)
        self.logits = np.zeros(capacity, dtype=np.int8)
        base = self.seq.ctypes.data
        self.seq_ptrs = (ctypes.POINTER(ctypes.c_int32) * capacity)(
            *[ctypes.cast(base + 4 * k, ctypes.POINTER(ctypes.c_int32)) for k in range(capacity)]
        )
        self.struct = L.llama_batch()
        self.struct.token = self.token.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.embd = None
        self.struct.pos = self.pos.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.n_seq_id = self.n_seq_id.ctypes.data_as(ctypes.POINTER(ctypes.c_int32))
        self.struct.seq_id = ctypes.cast(self.seq_ptrs, ctypes.POINTER(ctypes.POINTER(ctypes.c_int32)))
        self.struct.logits = self.logits.ctypes.data_as(ctypes.POINTER(ctypes.c_int8))
        self.n = 0

    def add(self, tokens: list[int], pos: int, seq: int, outputs: int) -> int:
        """Append ``tokens``; the last ``outputs`` of them (at least one) produce logits.
        Returns the row of the first token."""
        first, count = self.n, len(tokens)
        end = first + count
        if end > self.capacity:
            raise RuntimeError(f"batch overflow: {end} > {self.capacity}")
        self.token[first:end] = tokens
        self.pos[first:end] = np.arange(pos, pos + count, dtype=np.int32)
        self.seq[first:end] = seq
        self.logits[first:end] = 0
        self.logits[max(end - outputs, first):end] = 1
        self.logits[end - 1] = 1
        self.n = end
        return first


class LlamaEngine:
    """:class:`runner.loop.engine.Engine` over llama.cpp."""

    name = "old"

    def __init__(self, info: ModelInfo, load: LoadOptions, placement: Placement = CPU, *,
                 lone_rows: bool = True) -> None:
        """``placement``: the layers to offload and where (:mod:`runner.loading.gpu`; the CPU
        by default); ``lone_rows``: a decoded batch's weight products as lone rows' (graph_ops.py;
        off only to measure what that costs, ``bench/bench_rows.py``)."""
        num_ctx, num_parallel, num_batch = load.num_ctx, load.num_parallel, load.num_batch
        if load.batch_invariant:
            log.warning("POLLAMA_BATCH_INVARIANT applies to the new engine only: llama.cpp keeps its "
                        "kernels' choice to itself (OLLAMA_NEW_ENGINE=1)")
        self.info = info
        self.memory_size = 0  # llama.cpp does not say: runner.load's estimate stands
        self.num_ctx, self.num_batch = num_ctx, num_batch
        # every slot its own KV stream and num_batch tokens of each a decode (n_batch below)
        self.batch_capacity = num_batch * num_parallel
        # as loaded (n_gpu_layers, split_mode, main_gpu), with the arrays its pointers point to
        self.model_params, self._model_arrays = model_params(placement, load.use_mmap)
        with _capture_llama_log() as captured:
            self._model = L.llama_model_load_from_file(info.path.encode(), self.model_params)
        if not self._model:
            reason = _load_failure_reason(captured.lines)
            raise InvalidModel(f"llama.cpp cannot load {info.name} (architecture {info.architecture!r}): {reason}")
        self._vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = L.llama_vocab_n_tokens(self._vocab)
        self._views: dict[int, tuple[np.ndarray, ctypes.Array]] = {}  # logits rows by address

        cparams = L.llama_context_default_params()
        cparams.n_ctx = num_ctx * num_parallel
        cparams.n_batch = num_batch * num_parallel
        cparams.n_ubatch = num_batch
        cparams.n_seq_max = num_parallel
        cparams.n_threads = cparams.n_threads_batch = load.num_thread
        cparams.embeddings = False
        cparams.kv_unified = False  # see kv.py: one KV stream per slot, as llama-server -np N
        cparams.swa_full = False  # sliding-window layers keep their window, not the whole context
        cparams.no_perf = True
        # flash attention and the KV cache type as runner.loading.plan resolved them
        cparams.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if load.flash_attention else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        cparams.type_k = cparams.type_v = {"f16": 1, "q8_0": 8, "q4_0": 2}[load.kv_cache_type]
        # our kernels for Q4_1 products, and a verified draft's rows as lone ones (graph_ops.py);
        # flash attention and a quantized cache have no f16 products to take
        self._ops = GraphOps.create(row_kernels=load.row_kernels,
                                    attention=not load.flash_attention and load.kv_cache_type == "f16",
                                    lone=lone_rows)
        if self._ops is not None:
            self._ops.hook(cparams)
        # llama.cpp's GGML kernels, and ours for Q4_1 where the callback takes them
        self.multiplies = kernels.multiplies(ggml_batched=True, tiled=self._ops is not None and self._ops.q4_1,
                                             lone=self._ops is not None and self._ops.lone)
        with _capture_llama_log() as captured:
            self._ctx = L.llama_init_from_model(self._model, cparams)
        if not self._ctx:
            L.llama_model_free(self._model)
            if self._ops is not None:
                self._ops.close()
            raise LoadError(
                f"cannot create a context of {num_ctx}×{num_parallel} tokens for {info.name}: "
                f"{_load_failure_reason(captured.lines)}"
            )
        self._batches = (_Batch(num_batch * num_parallel), _Batch(num_batch * num_parallel))
        self._flip = 0
        self._batch = self._batches[0]  # the batch being built
        self._prepared: _Batch | None = None  # the batch the next decode evaluates
        self.kv = LlamaKv(self._ctx, self._model, num_parallel, swa_full=bool(cparams.swa_full))
        self._pieces: dict[int, bytes] = {}
        self._n_embd = L.llama_model_n_embd(self._model)
        self._unencodable = _spm_missing_bytes(info)
        self._add_bos = bool(L.llama_vocab_get_add_bos(self._vocab))
        bos, eos = L.llama_vocab_bos(self._vocab), L.llama_vocab_eos(self._vocab)
        self._special = (self._token_text(bos), self._token_text(eos))
        self._cparams = cparams  # the embedding context copies its threads, attention and KV type
        self._row_kernels = load.row_kernels  # and takes Q4_1 products to our kernels as this one
        self._embed: EmbedContext | None = None
        self.vision: Projector | None = None  # libmtmd, when the model has a projector
        if info.projector:
            try:
                self.vision = Projector(info.projector, self._model, load.num_thread, self._n_embd,
                                        flash_attention=load.flash_attention)
            except Exception:
                self.close()
                raise

    # ----------------------------------------------------------------------------- vocab
    def _token_text(self, token: int) -> str:
        if token < 0 or token >= self.n_vocab:
            return ""
        raw = L.llama_vocab_get_text(self._vocab, token)
        return raw.decode("utf-8", errors="replace") if raw else ""

    @property
    def add_bos(self) -> bool:
        return self._add_bos

    @property
    def special_tokens(self) -> tuple[str, str]:
        return self._special

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        if self._unencodable is not None:
            self._unencodable.check(text)
        return llama_tokenize(self._vocab, text, add_special, parse_special)

    def piece(self, token: int) -> bytes:
        cached = self._pieces.get(token)
        if cached is None:
            buf = ctypes.create_string_buffer(64)
            n = L.llama_token_to_piece(self._vocab, token, buf, 64, 0, True)
            if n < 0:
                buf = ctypes.create_string_buffer(-n)
                n = L.llama_token_to_piece(self._vocab, token, buf, -n, 0, True)
            cached = self._pieces[token] = buf.raw[:n]
        return cached

    def is_eog(self, token: int) -> bool:
        return bool(L.llama_vocab_is_eog(self._vocab, token))

    # ----------------------------------------------------------------------------- batch
    def batch_begin(self) -> None:
        # two llama_batch buffers in turn: the one decoding is not touched while the next fills
        self._flip ^= 1
        self._batch = self._batches[self._flip]
        self._batch.n = 0

    def batch_add(self, tokens: list[int], pos: int, seq_id: int, outputs: int = 1) -> int:
        return self._batch.add(tokens, pos, seq_id, outputs) + len(tokens) - 1

    def prepare(self) -> None:
        self._prepared = self._batch  # llama.cpp places the batch when it decodes it

    def fill(self, row: int, token: int) -> None:
        assert self._prepared is not None
        self._prepared.token[row] = token

    def decode(self, started: threading.Event | None = None) -> None:
        assert self._prepared is not None
        batch, self._prepared = self._prepared, None
        batch.struct.n_tokens = batch.n
        ops = self._ops
        if ops is not None:  # every row an output of one sequence: a sampled token and its drafted ones
            n = batch.n
            ops.decoding(n > 1 and bool(batch.logits[:n].all()) and bool((batch.seq[:n] == batch.seq[0]).all()))
        if started is not None:
            started.set()
        try:
            rc = L.llama_decode(self._ctx, batch.struct)
        finally:
            if ops is not None:  # an image's decode (libmtmd's) is not one
                ops.decoding(False)
        self._ops_done()
        if rc != 0:
            raise LoadError(f"llama_decode failed with code {rc}")

    def _ops_done(self) -> None:
        """After every decode of the context (ours, an image's): our kernels' state tidied and
        checked (graph_ops.py)."""
        if self._ops is not None and self._ops.failed():
            raise LoadError("llama_decode failed: out of memory for our kernels' rows")

    def image_inputs(self, image: Image) -> list[Input]:
        if self.vision is None:
            raise NoVision()
        inputs = self.vision.image_inputs(image)
        count = next((x.count for x in inputs if isinstance(x, ImageInput)), 0)
        if count > self.num_batch:
            raise InvalidRequest(f"an image takes {count} tokens in one batch: set num_batch to at least {count}")
        return inputs

    def decode_image(self, image: ImageInput, pos: int, seq_id: int) -> None:
        if self.vision is None:
            raise NoVision()
        try:
            self.vision.decode(self._ctx, image.source, pos, seq_id, self.num_batch)
        finally:
            self._ops_done()

    def embed_lanes(self) -> EmbedContext:
        if self._embed is None:
            n = batch_size(self.num_batch)
            self._embed = EmbedContext(self._model, self._cparams, _Batch(n), num_ctx=self.num_ctx, num_batch=n,
                                       max_lanes=min(MAX_LANES, n), n_embd=self._n_embd,
                                       ops=GraphOps.create(row_kernels=self._row_kernels, attention=False, lone=False))
        return self._embed

    def logits(self, row: int) -> np.ndarray:
        return self._row(row)[0]

    def _row(self, row: int) -> tuple[np.ndarray, ctypes.Array]:
        """Batch row ``row``'s logits as a NumPy view and a ctypes float array over the same
        memory. Views are kept per address (llama.cpp's output buffer moves only when it grows):
        wrapping the pointer anew cost tens of microseconds a token."""
        addr = _LOGITS_ITH(self._ctx, row)
        if not addr:
            raise LoadError(f"no logits for batch row {row}")
        views = self._views.get(addr)
        if views is None:
            if len(self._views) >= 64:
                self._views.clear()
            floats = (ctypes.c_float * self.n_vocab).from_address(addr)
            views = self._views[addr] = (np.ctypeslib.as_array(floats), floats)
        return views

    # --------------------------------------------------------------------------- sampling
    def new_sampler(self, opts: Options, grammar: Grammar | None, prompt: list[int]) -> Any:
        if opts.temperature <= 0 and grammar is None:
            # Greedy: the shared sampler (llama.cpp's penalties, then argmax) reads the logits in
            # place, where llama.cpp's chain first copies all n_vocab candidates: ~0.05 ms a token
            # instead of ~0.3 ms, time the batch loop otherwise spends between two decodes.
            greedy = Sampler(SamplerOptions.from_options(opts), num_ctx=self.num_ctx)
            if greedy.penalize:
                greedy.accept_many(prompt[-greedy.history.maxlen:])
            return greedy
        if topk.applies(opts, grammar is not None, self.n_vocab):
            # llama.cpp's chain after top_k, fed only the top_k candidates (same tokens)
            return topk.TopKChain(opts, prompt, self.num_ctx)
        chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
        if grammar is not None:
            g = init_sampler(self._vocab, grammar)
            if not g:
                L.llama_sampler_free(chain)
                raise InvalidRequest("the format could not be compiled to a grammar")
            L.llama_sampler_chain_add(chain, g)
        last_n = self.num_ctx if opts.repeat_last_n < 0 else opts.repeat_last_n
        penalties = None
        if last_n and (opts.repeat_penalty != 1.0 or opts.frequency_penalty or opts.presence_penalty):
            penalties = L.llama_sampler_init_penalties(
                self.n_vocab, last_n, opts.repeat_penalty, opts.frequency_penalty, opts.presence_penalty
            )
            L.llama_sampler_chain_add(chain, penalties)
        if opts.temperature <= 0:
            L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
        else:
            if opts.top_k > 0:
                L.llama_sampler_chain_add(chain, L.llama_sampler_init_top_k(opts.top_k))
            topk.add_after_top_k(chain, opts)
        if penalties is not None:
            for token in prompt[-last_n:]:  # repeat penalties see the prompt (Ollama's Accept)
                L.llama_sampler_accept(penalties, token)
        return chain

    def free_sampler(self, sampler: Any) -> None:
        if isinstance(sampler, topk.TopKChain):
            sampler.close()
        elif not isinstance(sampler, Sampler):
            L.llama_sampler_free(sampler)

    def sample(self, sampler: Any, row: int) -> int:
        if isinstance(sampler, Sampler):
            token = sampler.sample(self.logits(row))
            sampler.accept(token)
            return token
        if isinstance(sampler, topk.TopKChain):
            return sampler.sample(*self._row(row))
        return int(L.llama_sampler_sample(sampler, self._ctx, row))

    def close(self) -> None:
        if self.vision is not None:
            self.vision.close()
            self.vision = None
        if self._embed is not None:
            self._embed.close()
            self._embed = None
        if getattr(self, "_ctx", None):
            L.llama_free(self._ctx)
            self._ctx = None
        if getattr(self, "_model", None):
            L.llama_model_free(self._model)
            self._model = None
        if getattr(self, "_ops", None) is not None:
            self._ops.close()
            self._ops = None


def llama_tokenize(vocab: Any, text: str, add_special: bool, parse_special: bool) -> list[int]:
    """llama.cpp's tokens for ``text`` (a second call when the first buffer was too small)."""
    data = text.encode("utf-8")
    capacity = len(data) + 8
    buf = (L.llama_token * capacity)()
    n = L.llama_tokenize(vocab, data, len(data), buf, capacity, add_special, parse_special)
    if n < 0:
        capacity = -n
        buf = (L.llama_token * capacity)()
        n = L.llama_tokenize(vocab, data, len(data), buf, capacity, add_special, parse_special)
    return list(buf[:n])

