"""A grammar that waits for a tag anywhere in the output, then constrains what follows it
(``tool_choice: "auto"``: the model may write text first; a call it starts is well formed).

llama.cpp's lazy grammar can do this with a trigger pattern over the whole output
(``[\\s\\S]*?(<tag>)[\\s\\S]*``), but it runs that regular expression over all the text so far after
every token: with libstdc++'s ``std::regex`` a 1,000-token answer spends about 90 s in it (measured
on SmolLM2's vocabulary). And when the token that completes the tag carries more text that the
grammar rejects, llama.cpp throws out of its C API and the process aborts.

So the watching is done here: :class:`TagTrigger` keeps only the last few tokens, enough to hold a
partial tag, and says when the tag is complete (constant work per token). Only then is llama.cpp's
grammar created, lazy with that pattern, and given just those few tokens: its regular expression
runs once over a short text, and takes over from the tag. When the completing token carries more
than the text the grammar is known to accept right after the tag (:attr:`TagTrigger.tail`), the
grammar is not started at all and the call is only parsed.

:class:`LazyTagSampler` is that, as a llama.cpp sampler (``llama_sampler_init`` with Python
callbacks), so both engines use it unchanged: the old engine in its sampler chain, the new one
through :class:`~runner.sample.grammar.GrammarSampler`.
"""

from __future__ import annotations

import ctypes
import functools
import re
from collections import deque
from dataclasses import dataclass, field

from ..api import Grammar


def anywhere_pattern(tag: str) -> str:
    """llama.cpp's trigger pattern for ``tag`` anywhere in the text (ECMAScript syntax)."""
    escaped = "".join("\\" + ch if ch in "\\^$.|?*+()[]{}/-" else ch for ch in tag)
    escaped = escaped.replace("\n", "\\n").replace("\r", "\\r").replace("\t", "\\t")
    return r"[\s\S]*?(" + escaped + r")[\s\S]*"


@dataclass
class TagTrigger:
    """Follows the sampled tokens until ``tag`` has been written (pure bookkeeping).

    :meth:`accept` returns, the moment the tag is complete, the recent tokens whose text holds
    it (from the token where the tag starts): what the grammar must be given to take over from
    the tag. The text the completing token adds after the tag must match ``tail`` (what the
    grammar accepts there), else the trigger gives up for good (returns ``[]`` once).
    """

    tag: bytes
    tail: re.Pattern[bytes]
    _recent: deque[tuple[int, bytes]] = field(default_factory=deque)
    _size: int = 0
    done: bool = False

    def accept(self, token: int, piece: bytes) -> list[int] | None:
        """Record one sampled token; the tokens to replay when it completes the tag, ``[]`` when
        the tag came but cannot be taken over, None while there is no tag yet (or after)."""
        if self.done:
            return None
        self._recent.append((token, piece))
        self._size += len(piece)
        text = b"".join(p for _, p in self._recent)
        at = text.find(self.tag)
        if at >= 0:
            self.done = True
            if not self.tail.fullmatch(text[at + len(self.tag):]):
                return []
            out, start = [], 0
            for tok, p in self._recent:
                if start + len(p) > at:
                    out.append(tok)
                start += len(p)
            return out
        # keep just enough to hold a partial tag: drop tokens while the rest still spans len(tag)-1 bytes
        while self._recent and self._size - len(self._recent[0][1]) >= len(self.tag) - 1:
            self._size -= len(self._recent.popleft()[1])
        return None


class LazyTagSampler:
    """A llama.cpp sampler that is nothing until its grammar's tag is written, then that grammar
    (see the module's doc). :attr:`pointer` is the ``llama_sampler *``; whoever owns it (a chain,
    or :class:`~runner.sample.grammar.GrammarSampler`) frees it with ``llama_sampler_free``, which
    releases this object too."""

    def __init__(self, vocab, grammar: Grammar) -> None:
        import llama_cpp as L

        assert grammar.tag is not None
        self._L = L
        self._vocab = vocab
        self._gbnf = grammar.gbnf.encode()
        self._pattern = anywhere_pattern(grammar.tag).encode()
        self.trigger = TagTrigger(grammar.tag.encode(), re.compile(rb"[ \n]{0,2}"))
        self.inner = None  # the llama.cpp grammar, once the tag came
        self._piece = ctypes.create_string_buffer(256)
        self._self = ctypes.py_object(self)
        ctypes.pythonapi.Py_IncRef(self._self)  # held by the C sampler until its free callback
        self.pointer = L.llama_sampler_init(_iface()[0], ctypes.cast(ctypes.pointer(self._self), ctypes.c_void_p))

    def _text(self, token: int) -> bytes:
        n = self._L.llama_token_to_piece(self._vocab, token, self._piece, len(self._piece), 0, True)
        return self._piece.raw[:n] if n > 0 else b""

    def accept(self, token: int) -> None:
        if self.inner is not None:
            self._L.llama_sampler_accept(self.inner, token)
            return
        replay = self.trigger.accept(token, self._text(token))
        if not replay:
            return
        patterns = (ctypes.c_char_p * 1)(self._pattern)
        inner = self._L.llama_sampler_init_grammar_lazy_patterns(self._vocab, self._gbnf, b"root", patterns, 1,
                                                                 None, 0)
        if not inner:
            return
        for tok in replay:  # the pattern fires on the last one: the grammar starts at the tag
            self._L.llama_sampler_accept(inner, tok)
        self.inner = inner

    def apply(self, cur_p) -> None:
        if self.inner is not None:
            self._L.llama_sampler_apply(self.inner, cur_p)

    def free(self) -> None:
        if self.inner is not None:
            self._L.llama_sampler_free(self.inner)
            self.inner = None
        ctypes.pythonapi.Py_DecRef(self._self)


# -------------------------------------------------- the C callbacks, shared by every LazyTagSampler
def _owner(smpl) -> LazyTagSampler:
    return ctypes.cast(smpl.contents.ctx, ctypes.POINTER(ctypes.py_object)).contents.value


def _name(smpl):
    return b"pollama-lazy-tag-grammar"


def _accept(smpl, token):
    _owner(smpl).accept(int(token))


def _apply(smpl, cur_p):
    _owner(smpl).apply(cur_p)


def _reset(smpl):
    pass


def _free(smpl):
    _owner(smpl).free()


@functools.cache
def _iface():
    """The callbacks every LazyTagSampler shares (built once; llama_cpp is imported lazily)."""
    import llama_cpp as L

    callbacks = (L.llama_sampler_i_name(_name), L.llama_sampler_i_accept(_accept),
                 L.llama_sampler_i_apply(_apply), L.llama_sampler_i_reset(_reset),
                 L.llama_sampler_i_free(_free))
    iface = L.llama_sampler_i()
    iface.name, iface.accept, iface.apply, iface.reset, iface.free = callbacks
    return ctypes.pointer(iface), callbacks  # the callbacks must outlive every sampler
