"""Constrained output (``format: "json"`` or a JSON schema) as a GBNF grammar.

Both engines compile ``format`` here. The new engine applies the grammar to its own logits with
llama.cpp's grammar engine over a vocab-only model (the grammar needs the vocabulary's token
texts); like Ollama, it first samples freely and only masks the logits when that token is not
allowed, so the common case costs one single-token check.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Callable

import numpy as np

from ..api import Grammar, InvalidRequest
from .grammarcheck import GrammarCheck
from .lazygrammar import LazyTagSampler


def format_grammar(fmt: str | dict | None, grammars: GrammarCheck,
                   cancel: threading.Event | None = None) -> Grammar | None:
    """The grammar for a request's ``format`` (None: unconstrained): ``"json"`` (any JSON value)
    or a JSON schema, bounded and converted by ``grammars``. Raises InvalidRequest."""
    from llama_cpp.llama_grammar import JSON_GBNF

    if fmt in (None, "", "null"):
        return None
    if fmt == "json":
        return Grammar(JSON_GBNF)
    if isinstance(fmt, dict):
        return Grammar(grammars.schema_gbnf(fmt, "format", cancel))
    raise InvalidRequest(f"invalid format {fmt!r}: use \"json\" or a JSON schema")


def init_sampler(vocab, grammar: Grammar):
    """A llama.cpp grammar sampler for ``grammar`` over ``vocab`` (a ``llama_vocab`` pointer):
    lazy, from its trigger's first group, when it has a trigger; from its tag, wherever it comes,
    when it has a tag (:class:`~runner.sample.lazygrammar.LazyTagSampler`). NULL when it does not
    compile."""
    import llama_cpp as L

    if grammar.tag is not None:
        compiled = L.llama_sampler_init_grammar(vocab, grammar.gbnf.encode(), b"root")
        if not compiled:
            return compiled
        L.llama_sampler_free(compiled)
        return LazyTagSampler(vocab, grammar).pointer
    if grammar.trigger is None:
        return L.llama_sampler_init_grammar(vocab, grammar.gbnf.encode(), b"root")
    patterns = (ctypes.c_char_p * 1)(grammar.trigger.encode())
    return L.llama_sampler_init_grammar_lazy_patterns(vocab, grammar.gbnf.encode(), b"root", patterns, 1, None, 0)


class VocabOnly:
    """A llama.cpp vocabulary loaded without weights (for grammars). Close it when done."""

    def __init__(self, path: str) -> None:
        import llama_cpp as L

        params = L.llama_model_default_params()
        params.vocab_only = True
        self._model = L.llama_model_load_from_file(path.encode(), params)
        if not self._model:
            raise InvalidRequest("cannot load the vocabulary for a grammar")
        self.vocab = L.llama_model_get_vocab(self._model)
        self.n_vocab = L.llama_vocab_n_tokens(self.vocab)

    def close(self) -> None:
        import llama_cpp as L

        if self._model:
            L.llama_model_free(self._model)
            self._model = None


class GrammarSampler:
    """Wraps a token picker so that only tokens the grammar allows come out."""

    _DTYPE = np.dtype([("id", "<i4"), ("logit", "<f4"), ("p", "<f4")])

    def __init__(self, vocab: VocabOnly, grammar: Grammar) -> None:
        import llama_cpp as L

        self._L = L
        self.n_vocab = vocab.n_vocab
        self._smpl = init_sampler(vocab.vocab, grammar)
        if not self._smpl:
            raise InvalidRequest("the format could not be compiled to a grammar")
        self._data = (L.llama_token_data * self.n_vocab)()
        self._view = np.frombuffer(self._data, dtype=self._DTYPE)
        self._view["id"] = np.arange(self.n_vocab, dtype=np.int32)
        self._one = (L.llama_token_data * 1)()

    def _allowed(self, token: int) -> bool:
        self._one[0].id, self._one[0].logit, self._one[0].p = token, 0.0, 0.0
        arr = self._L.llama_token_data_array(self._one, 1, -1, False)
        self._L.llama_sampler_apply(self._smpl, ctypes.byref(arr))
        return bool(np.isfinite(self._one[0].logit))

    def sample(self, logits: np.ndarray, pick: Callable[[np.ndarray], int]) -> int:
        token = pick(logits)
        if token < self.n_vocab and self._allowed(token):
            return token
        view = self._view
        view["logit"] = logits[: self.n_vocab]
        view["p"] = 0.0
        arr = self._L.llama_token_data_array(self._data, self.n_vocab, -1, False)
        self._L.llama_sampler_apply(self._smpl, ctypes.byref(arr))
        masked = np.full_like(logits, -np.inf)
        masked[: self.n_vocab] = view["logit"]
        return pick(masked)

    def accept(self, token: int) -> None:
        self._L.llama_sampler_accept(self._smpl, token)

    def close(self) -> None:
        if self._smpl:
            self._L.llama_sampler_free(self._smpl)
            self._smpl = None
