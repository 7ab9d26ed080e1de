"""The GGUF tokenizer, token-for-token identical to llama.cpp's (``src/llama-vocab.cpp``).

    tok = load_tokenizer("model.gguf")
    ids = tok.encode("Hello", add_special=True, parse_special=False)
    text = tok.decode(ids)

Two vocabulary types are supported, the two that ``tokenizer.ggml.model`` names for llama-family
models:

* ``"llama"`` -- SentencePiece-style BPE over token scores: spaces become ``▁``, a space is put
  in front of the text (``add_space_prefix``), the highest-scoring adjacent pair that forms a token
  is merged first, and characters that end up outside every token fall back to ``<0xNN>`` bytes.
  llama.cpp merges the whole text at once; we first cut it between characters that no token
  holds side by side (the merging can never join them), so the pieces are mostly words.
* ``"gpt2"`` -- byte-level BPE: a pre-tokenizer (the regexes that ``tokenizer.ggml.pre`` names,
  :mod:`runner.model.pretokenize`) splits the text into words, each word's UTF-8 bytes are mapped
  to printable characters, and the adjacent pair with the lowest merge rank is merged first.

Both merge words (pieces) independently and remember them, so a 10 MB prompt costs about what
llama.cpp takes. Merging has three implementations of one rule, picked by the word's shape
(short, a long run over few characters, anything else): see ``_merge``.

Special tokens (control / user-defined / unknown types) are cut out of the text before either
algorithm runs, longest first, as ``tokenizer_st_partition`` does: user-defined tokens always,
control and unknown tokens only when ``parse_special`` is true.
"""

from __future__ import annotations

import heapq
import logging
import math
import mmap
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from enum import IntFlag
from itertools import chain, repeat
from operator import add
from pathlib import Path
from typing import Any

import numpy as np

from runner.model import ggufmeta
from runner.api import InvalidModel, InvalidRequest
from runner.model.pretokenize import PRE_REGEXES, PRE_TYPES, PreTokenizer, PreType

log = logging.getLogger(__name__)

__all__ = ["Tokenizer", "TokenAttr", "load_tokenizer", "read_tokenizer_metadata", "refusal"]


class TokenAttr(IntFlag):
    """llama.cpp's ``llama_token_attr`` bits."""

    UNDEFINED = 0
    UNKNOWN = 1 << 0
    UNUSED = 1 << 1
    NORMAL = 1 << 2
    CONTROL = 1 << 3
    USER_DEFINED = 1 << 4
    BYTE = 1 << 5
    NORMALIZED = 1 << 6
    LSTRIP = 1 << 7
    RSTRIP = 1 << 8
    SINGLE_WORD = 1 << 9


# GGUF ``tokenizer.ggml.token_type`` values (llama_token_type) -> attributes.
_TOKEN_TYPE_ATTR = {
    0: TokenAttr.UNDEFINED,
    1: TokenAttr.NORMAL,
    2: TokenAttr.UNKNOWN,
    3: TokenAttr.CONTROL,
    4: TokenAttr.USER_DEFINED,
    5: TokenAttr.UNUSED,
    6: TokenAttr.BYTE,
}

_A_UNKNOWN = int(TokenAttr.UNKNOWN)
_A_UNUSED = int(TokenAttr.UNUSED)
_A_NORMAL = int(TokenAttr.NORMAL)
_A_CONTROL = int(TokenAttr.CONTROL)
_A_USER_DEFINED = int(TokenAttr.USER_DEFINED)
_A_BYTE = int(TokenAttr.BYTE)
_A_LSTRIP = int(TokenAttr.LSTRIP)
_A_RSTRIP = int(TokenAttr.RSTRIP)

_SPM_SPACE = "\u2581"  # ▁
_C_SPACES = " \t\n\v\f\r"  # C isspace() in the "C" locale


# ------------------------------------------------------------------------------ GGUF metadata
def _wanted_key(key: str, is_array: bool) -> bool:  # arrays or not, by name alone
    return (key.startswith("tokenizer.") and key != "tokenizer.chat_template"
            and not key.startswith("tokenizer.chat_template.")) or key in (
        "general.name", "general.architecture")


def read_tokenizer_metadata(path: str | Path) -> dict[str, Any]:
    """Read the ``tokenizer.*`` keys (and ``general.name``/``general.architecture``) of a GGUF file.

    Only the key/value header is parsed (:mod:`runner.model.ggufmeta`, over a memory map; tensors are
    never touched). Strings come back as ``str`` (undecodable bytes kept as surrogate escapes),
    numeric arrays as lists. Raises :class:`runner.api.InvalidModel` when the file is not a
    little-endian GGUF v2/v3.
    """
    path = Path(path)
    try:
        with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            return ggufmeta.read_key_values(mm, _wanted_key, errors="surrogateescape").values
    except ggufmeta.NotGGUF:
        raise InvalidModel(f"{path}: not a GGUF file") from None
    except (OSError, ValueError, struct.error) as err:
        raise InvalidModel(f"{path}: cannot read GGUF header: {err}") from err


# ---------------------------------------------------------------------- byte-level (GPT-2) map
def _byte_to_unicode() -> list[str]:
    """GPT-2's map from a byte to a printable character (unicode_byte_to_utf8_map)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    table = {b: chr(b) for b in keep}
    n = 0
    for b in range(256):
        if b not in table:
            table[b] = chr(256 + n)
            n += 1
    return [table[b] for b in range(256)]


_BYTE_TO_UNICODE = _byte_to_unicode()
_UNICODE_TO_BYTE = {c: b for b, c in enumerate(_BYTE_TO_UNICODE)}
_LATIN1_TO_BYTE_CHAR = {b: c for b, c in enumerate(_BYTE_TO_UNICODE)}  # for str.translate


# ------------------------------------------------------------------------------ merging
# Both vocabularies tokenize a word the same way: start from its characters and repeatedly merge
# the adjacent pair that comes first in an order, the leftmost of equals, until no pair can merge.
# The order is ``rank[left + sep + right]``, lowest first; a pair not in ``rank`` never merges.
# BPE: the index in the merges list, sep " ". SPM: minus the score of the token the pair forms
# (the best score first), sep "". Three implementations of that one rule follow, chosen by the
# word's shape; each gives exactly llama.cpp's result (its priority queue, ``llm_tokenizer_*``).
_NEVER = math.inf
_SHORT_WORD = 64  # up to this many characters, rescanning the pair list beats a heap
_FEW_CHARS = 8  # longer words over at most this many distinct characters try whole rounds first
_MAX_ROUNDS = 64


@dataclass(frozen=True)
class _MergeOrder:
    """Which adjacent symbols merge, and in what order (see the comment above)."""

    rank: dict[str, float]
    sep: str


def _merge(word: str, order: _MergeOrder) -> list[str]:
    """The symbols that ``word`` merges into."""
    if len(word) <= _SHORT_WORD:
        return _merge_scan(list(word), order)
    if len(set(word)) <= _FEW_CHARS:  # a run: "    ", "====", "1111", "🦙🦙🦙"
        syms, finished = _merge_rounds(word, order)
        return syms if finished else _merge_heap(syms, order)
    return _merge_heap(list(word), order)


def _merge_scan(syms: list[str], order: _MergeOrder) -> list[str]:
    """The rule as written: find the first pair, merge it, re-rank its two new neighbour pairs.

    Quadratic in the word's length, but each step is two C-level scans (``min``, ``index``).
    """
    rank, sep = order.rank.get, order.sep
    keys = map(add, map(add, syms, repeat(sep)), syms[1:])  # a + sep + b, in C loops
    ranks = list(map(rank, keys, repeat(_NEVER)))
    while ranks:
        best = min(ranks)
        if best == _NEVER:
            break
        i = ranks.index(best)  # the leftmost of equals
        merged = syms[i] + syms[i + 1]
        syms[i] = merged
        del syms[i + 1], ranks[i]
        if i > 0:
            ranks[i - 1] = rank(syms[i - 1] + sep + merged, _NEVER)
        if i < len(ranks):
            ranks[i] = rank(merged + sep + syms[i + 1], _NEVER)
    return syms


def _merge_heap(syms: list[str], order: _MergeOrder) -> list[str]:
    """llama.cpp's priority queue of pairs (rank, left index): O(n log n) for long words.

    Symbols are linked left/right; a merged-away symbol becomes "". A queued pair is stale once
    either side changed, which its recorded length detects (symbols only grow).
    """
    n = len(syms)
    if n < 2:
        return syms
    rank, sep = order.rank.get, order.sep
    heap = [(r, i, len(a) + len(b)) for i, (a, b) in enumerate(zip(syms, syms[1:]))
            if (r := rank(a + sep + b, _NEVER)) != _NEVER]
    heapq.heapify(heap)
    nxt = list(range(1, n + 1))
    nxt[-1] = -1
    prv = list(range(-1, n - 1))
    pop, push = heapq.heappop, heapq.heappush
    while heap:
        _, left, size = pop(heap)
        right = nxt[left]
        a = syms[left]
        if right < 0 or not a or len(a) + len(syms[right]) != size:
            continue  # stale
        merged = a + syms[right]
        syms[left] = merged
        syms[right] = ""
        after = nxt[right]
        nxt[left] = after
        if after >= 0:
            prv[after] = left
            c = syms[after]
            r = rank(merged + sep + c, _NEVER)
            if r != _NEVER:
                push(heap, (r, left, len(merged) + len(c)))
        before = prv[left]
        if before >= 0:
            c = syms[before]
            r = rank(c + sep + merged, _NEVER)
            if r != _NEVER:
                push(heap, (r, before, len(c) + len(merged)))
    return [s for s in syms if s]


def _merge_rounds(word: str, order: _MergeOrder) -> tuple[list[str], bool]:
    """Merge every occurrence of the first pair at once, while that is what the queue would do.

    For long runs over a few characters, where the queue pays a heap operation per merge. Each
    distinct symbol is written as one character (the word's own characters stand for themselves,
    merged symbols get private-use code points), so one round is one ``str.replace``: the
    occurrences of the pair, left to right, skipping overlaps -- the queue's order too, provided
    (1) no other pair present ranks equal to it, and (2) no pair the merge creates ranks before
    or equal to it. When either could fail, or after ``_MAX_ROUNDS``, the rounds stop and the
    caller finishes with the queue from the symbols reached. Returns (symbols, finished).
    """
    rank, sep = order.rank.get, order.sep
    symbol = {c: c for c in set(word)}  # code -> the symbol it stands for
    code = {c: c for c in symbol}  # symbol -> its code
    fresh = 0xF0000  # Supplementary Private Use Area-A

    def ranked(a: str, b: str) -> tuple[float, str, str]:
        return rank(symbol[a] + sep + symbol[b], _NEVER), a, b

    def symbols() -> list[str]:
        return list(map(symbol.__getitem__, text))

    text = word
    queue = [p for a in symbol for b in symbol if (p := ranked(a, b))[0] != _NEVER]
    heapq.heapify(queue)  # pair kinds that may be present, by rank
    for _ in range(_MAX_ROUNDS):
        while queue and queue[0][1] + queue[0][2] not in text:
            heapq.heappop(queue)  # kinds only vanish, except those with the newest symbol
        if not queue:
            return symbols(), True
        best, a, b = heapq.heappop(queue)
        while queue and queue[0][0] == best:  # (1)
            _, a2, b2 = heapq.heappop(queue)
            if (a2, b2) != (a, b) and a2 + b2 in text:
                return symbols(), False
        merged = symbol[a] + symbol[b]
        c = code.get(merged)
        if c is None:
            while chr(fresh) in symbol:
                fresh += 1
            c = code[merged] = chr(fresh)
            symbol[c] = merged
        created = [ranked(x, c) for x in symbol] + [ranked(c, x) for x in symbol]
        if any(r <= best for r, _, _ in created):  # (2)
            return symbols(), False
        text = text.replace(a + b, c)
        for p in created:
            if p[0] != _NEVER:
                heapq.heappush(queue, p)
    return symbols(), False


def _symbol_ids(syms: list[str], token_to_id: dict[str, int],
                fallback: Callable[[str], tuple[int, ...]]) -> tuple[int, ...]:
    """The ids of merged symbols; ``fallback`` for a symbol that is no token."""
    try:
        return tuple(map(token_to_id.__getitem__, syms))
    except KeyError:
        return tuple(chain.from_iterable(
            (token_to_id[s],) if s in token_to_id else fallback(s) for s in syms))


class _Memo(dict[str, tuple[int, ...]]):
    """word -> token ids, computed on first use; bounded (cleared when full, long words not kept)."""

    def __init__(self, compute: Callable[[str], tuple[int, ...]], limit: int = 200_000,
                 longest: int = 256) -> None:
        super().__init__()
        self._compute = compute
        self._limit = limit
        self._longest = longest

    def __missing__(self, word: str) -> tuple[int, ...]:
        ids = self._compute(word)
        if len(word) <= self._longest:
            if len(self) >= self._limit:
                self.clear()
            self[word] = ids
        return ids

    def ids(self, words: Iterable[str]) -> Iterator[int]:
        """The ids of ``words``, concatenated (C-level loops: this is the hot path)."""
        return chain.from_iterable(map(self.__getitem__, words))


# ------------------------------------------------------------------------------ the algorithms
class _SpmModel:
    """llama.cpp's ``llm_tokenizer_spm``: merge the best-scoring adjacent pair that is a token.

    llama.cpp merges over the whole text at once. A pair of characters that occurs inside no
    token can never be joined, so the text is cut there first (``_PairCuts``) and the pieces --
    mostly words, since few tokens have ``▁`` inside -- are merged one by one and remembered.
    """

    def __init__(self, token_to_id: dict[str, int], scores: Sequence[float],
                 byte_ids: Sequence[int | None]) -> None:
        self._token_to_id = token_to_id
        self._order = _MergeOrder({t: -scores[i] for t, i in token_to_id.items()}, "")
        self._byte_ids = byte_ids
        self._cuts = _PairCuts(list(token_to_id))
        self._memo = _Memo(self._piece)

    def tokenize(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (spaces already escaped as ``▁``) to ``out``."""
        memo = self._memo
        pos = 0
        for start, end in self._cuts.long_pieces(text):
            out.extend(memo.ids(text[pos:start]))  # pieces of one character: a str iterates as them
            out.extend(memo[text[start:end]])
            pos = end
        out.extend(memo.ids(text[pos:]))

    def _piece(self, piece: str) -> tuple[int, ...]:
        if len(piece) == 1:  # most new pieces in mixed scripts: nothing to merge
            tid = self._token_to_id.get(piece)
            return (tid,) if tid is not None else self._bytes(piece)
        return _symbol_ids(_merge(piece, self._order), self._token_to_id, self._bytes)

    def _bytes(self, sym: str) -> tuple[int, ...]:
        """A symbol that is no token (a single character): its UTF-8 bytes as ``<0xNN>`` tokens."""
        ids = []
        for byte in sym.encode("utf-8"):
            tid = self._byte_ids[byte]
            if tid is None:  # llama.cpp aborts here (unordered_map::at)
                raise InvalidRequest(
                    f"cannot tokenize {sym!r}: the vocabulary has no token for byte 0x{byte:02X}")
            ids.append(tid)
        return tuple(ids)


class _PairCuts:
    """Where a text can be cut without changing its SPM tokens: between two characters that
    are adjacent in no token.

    The pairs that do occur are hashed into a bit table, so a 10 MB text is checked with a few
    NumPy operations. A hash collision can only hide a cut (a longer piece), never invent one.
    """

    _BITS = 22

    def __init__(self, tokens: Sequence[str]) -> None:
        # All tokens end to end as code points; a pair that straddles two tokens is left out.
        points = np.frombuffer("".join(tokens).encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        inside = np.ones(max(len(points) - 1, 0), dtype=bool)
        starts = np.cumsum(np.fromiter(map(len, tokens), dtype=np.int64, count=len(tokens)))[:-1]
        inside[starts[(starts > 0) & (starts < len(points))] - 1] = False
        self._joined = np.zeros(1 << self._BITS, dtype=bool)
        self._joined[self._hash(points[:-1][inside], points[1:][inside])] = True

    @classmethod
    def _hash(cls, left: np.ndarray, right: np.ndarray) -> np.ndarray:
        mixed = left * np.uint32(0x9E3779B1) ^ right * np.uint32(0x85EBCA77)  # wraps mod 2**32
        return mixed >> np.uint32(32 - cls._BITS)  # multiplicative hashing: the top bits

    def long_pieces(self, text: str) -> Iterator[tuple[int, int]]:
        """(start, end) of the pieces of ``text`` longer than one character, in order."""
        points = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), dtype=np.uint32)
        joined = self._joined[self._hash(points[:-1], points[1:])]
        bounds = np.concatenate(([0], np.flatnonzero(~joined) + 1, [len(text)]))
        long = np.flatnonzero(np.diff(bounds) > 1)
        return zip(bounds[long].tolist(), bounds[long + 1].tolist())


class _BpeModel:
    """llama.cpp's ``llm_tokenizer_bpe``: pre-tokenize, byte-map, merge the lowest-rank pair."""

    def __init__(self, token_to_id: dict[str, int], merges: Sequence[str],
                 pre: PreType) -> None:
        self._token_to_id = token_to_id
        self._order = _MergeOrder(_merge_ranks(merges), " ")
        self._pre = PreTokenizer(PRE_REGEXES[pre.regexes])
        self._ignore_merges = pre.ignore_merges
        self._memo = _Memo(self._word)

    def tokenize(self, text: str, out: list[int]) -> None:
        """Append the ids of ``text`` (a fragment free of special tokens) to ``out``."""
        out.extend(self._memo.ids(self._pre.split(text)))

    def _word(self, word: str) -> tuple[int, ...]:
        mapped = word.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_BYTE_CHAR)
        t2i = self._token_to_id
        if self._ignore_merges:
            tid = t2i.get(mapped)
            if tid is not None:
                return (tid,)
        return _symbol_ids(_merge(mapped, self._order), t2i, self._bytes)

    def _bytes(self, sym: str) -> tuple[int, ...]:
        """A merged symbol that is no token: llama.cpp looks up each of its UTF-8 bytes as a
        one-byte token and drops the bytes that have none."""
        t2i = self._token_to_id
        found = (t2i.get(bytes((byte,)).decode("utf-8", "surrogateescape")) for byte in sym.encode("utf-8"))
        return tuple(tid for tid in found if tid is not None)


def _merge_ranks(merges: Sequence[str]) -> dict[str, float]:
    """``"left right"`` -> rank; the first of duplicate merges wins, as std::map::emplace does."""
    ranks: dict[str, float] = {}
    for rank in range(len(merges) - 1, -1, -1):
        merge = merges[rank]
        if merge.find(" ", 1) > 0:
            ranks[merge] = rank
    return ranks


# -------------------------------------------------------------------------------- the tokenizer
# Texts that llama.cpp recognises as EOT / EOM / FIM tokens when the GGUF names none, in its order.
_ROLE_TEXTS: dict[str, tuple[str, ...]] = {
    "eot": ("<|eot_id|>", "<|im_end|>", "<|end|>", "<end_of_turn>", "<|endoftext|>", "<|end_of_text|>",
            "<EOT>", "_<EOT>", "[EOT]", "<｜end▁of▁sentence｜>", "<end_of_utterance>"),
    "eom": ("<|eom_id|>",),
    "fim_pre": ("<|fim_prefix|>", "<fim-prefix>", "<fim_prefix>", "<｜fim▁begin｜>", "<PRE>", "▁<PRE>",
                "<|code_prefix|>", "<|prefix|>"),
    "fim_suf": ("<|fim_suffix|>", "<fim-suffix>", "<fim_suffix>", "<｜fim▁hole｜>", "<SUF>", "▁<SUF>",
                "<|code_suffix|>", "<|suffix|>"),
    "fim_mid": ("<|fim_middle|>", "<fim-middle>", "<fim_middle>", "<｜fim▁end｜>", "<MID>", "▁<MID>",
                "<|code_middle|>", "<|middle|>"),
    "fim_pad": ("<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"),
    "fim_rep": ("<|fim_repo|>", "<|repo_name|>", "<fim-repo>", "<REPO>", "<reponame>"),
    "fim_sep": ("<|file_sep|>",),
}
_EOG_TEXTS = frozenset({
    "<|eot_id|>", "<|im_end|>", "<|end|>", "<|return|>", "<|call|>", "<|flush|>", "<|calls|>",
    "<end_of_turn>", "<|endoftext|>", "</s>", "<|eom_id|>", "<EOT>", "_<EOT>", "[EOT]", "[EOS]",
    "<|end_of_text|>", "<end_of_utterance>", "<eos>", "<turn|>", "<|tool_response>",
    "<｜end▁of▁sentence｜>", "[e~["})
_ALWAYS_RENDERED = frozenset({"<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"})

_ID_KEYS = {
    "bos": "tokenizer.ggml.bos_token_id",
    "eos": "tokenizer.ggml.eos_token_id",
    "eot": "tokenizer.ggml.eot_token_id",
    "eom": "tokenizer.ggml.eom_token_id",
    "unk": "tokenizer.ggml.unknown_token_id",
    "sep": "tokenizer.ggml.seperator_token_id",  # sic: llama.cpp's key name
    "pad": "tokenizer.ggml.padding_token_id",
    "mask": "tokenizer.ggml.mask_token_id",
    "fim_pre": "tokenizer.ggml.fim_pre_token_id",
    "fim_suf": "tokenizer.ggml.fim_suf_token_id",
    "fim_mid": "tokenizer.ggml.fim_mid_token_id",
    "fim_pad": "tokenizer.ggml.fim_pad_token_id",
    "fim_rep": "tokenizer.ggml.fim_rep_token_id",
    "fim_sep": "tokenizer.ggml.fim_sep_token_id",
}
_DEPRECATED_ID_KEYS = {
    "fim_pre": "tokenizer.ggml.prefix_token_id",
    "fim_suf": "tokenizer.ggml.suffix_token_id",
    "fim_mid": "tokenizer.ggml.middle_token_id",
}


@dataclass
class _Config:
    """Everything llama.cpp derives from the GGUF header before it tokenizes anything."""

    model: str
    pre: str
    tokens: list[str]
    scores: list[float]
    attrs: list[int]
    token_to_id: dict[str, int]
    merges: list[str]
    ids: dict[str, int | None]
    add_bos: bool
    add_eos: bool
    add_space_prefix: bool
    eog_ids: set[int]


class Tokenizer:
    """A GGUF vocabulary that encodes and decodes exactly as llama.cpp does.

    ``encode(text, add_special, parse_special)`` returns what ``llama_tokenize`` returns;
    ``token_to_piece(id)`` what ``llama_token_to_piece(..., lstrip=0, special=False)`` writes;
    ``decode(ids)`` the concatenated pieces as UTF-8 text. Build one with :func:`load_tokenizer`.
    ``eog_ids`` is the set ``llama_vocab_is_eog`` accepts; ``bos_id``/``eos_id``/``eot_id`` are
    ``None`` where the model has none (where a vocabulary holds several EOT-like tokens, llama.cpp's
    ``eot_id`` depends on hash order; ours is the first in its list). Safe to share between threads: the
    only mutable state is a bounded word cache and a piece cache, both plain dict/list stores.
    """

    def __init__(self, config: _Config) -> None:
        self.model = config.model
        self.pre = config.pre
        self._tokens = config.tokens
        self._attrs = config.attrs
        self._token_to_id = config.token_to_id
        ids = config.ids
        self.bos_id: int | None = ids["bos"]
        self.eos_id: int | None = ids["eos"]
        self.eot_id: int | None = ids["eot"]
        self.eom_id: int | None = ids["eom"]
        self.unk_id: int | None = ids["unk"]
        self.pad_id: int | None = ids["pad"]
        self.add_bos = config.add_bos
        self.add_eos = config.add_eos
        self.add_space_prefix = config.add_space_prefix
        self.eog_ids: frozenset[int] = frozenset(config.eog_ids)
        self._specials = _special_order(config.tokens, config.attrs)
        self._special_texts = _Occurrences(text for _, text in self._specials)
        self._pieces: list[bytes | None] = [None] * len(config.tokens)
        self._algo: _SpmModel | _BpeModel
        if config.model == "llama":
            self._algo = _SpmModel(config.token_to_id, config.scores, _spm_byte_ids(config.token_to_id))
        else:
            self._algo = _BpeModel(config.token_to_id, config.merges, PRE_TYPES[config.pre])

    # ------------------------------------------------------------------------ properties
    @property
    def n_vocab(self) -> int:
        """Number of tokens; ids are ``0 .. n_vocab - 1``."""
        return len(self._tokens)

    def is_eog(self, token: int) -> bool:
        """True for a token that ends generation (EOS, EOT, ``<|im_end|>``, ...)."""
        return token in self.eog_ids

    def token_text(self, token: int) -> str:
        """The vocabulary entry of ``token`` as stored (``▁`` / byte-mapped characters included)."""
        return self._tokens[token]

    def token_attr(self, token: int) -> TokenAttr:
        """llama.cpp's attributes of ``token`` after its load-time fix-ups."""
        return TokenAttr(self._attrs[token])

    # ---------------------------------------------------------------------------- encode
    def encode(self, text: str, add_special: bool = False, parse_special: bool = False) -> list[int]:
        """Token ids of ``text``, identical to llama.cpp's ``llama_tokenize``.

        ``add_special`` adds BOS/EOS where the model's ``add_bos``/``add_eos`` say so;
        ``parse_special`` lets control tokens written in the text (``<|im_start|>``) become
        their ids instead of being tokenized as characters (user-defined tokens always do).
        Raises :class:`runner.api.InvalidModel` if the model wants a BOS/EOS it does not have,
        :class:`runner.api.InvalidRequest` if an SPM vocabulary without byte tokens cannot
        represent a character (llama.cpp aborts the process there).
        """
        fragments = self._partition(text, parse_special) if text else []
        out: list[int] = []
        if add_special and self.add_bos:
            out.append(self._required(self.bos_id, "BOS"))
        if isinstance(self._algo, _SpmModel):
            self._encode_spm(fragments, out)
        else:
            algo = self._algo
            for frag in fragments:
                if isinstance(frag, str):
                    algo.tokenize(frag, out)
                else:
                    out.append(frag)
        if add_special and self.add_eos:
            out.append(self._required(self.eos_id, "EOS"))
        return out

    def _encode_spm(self, fragments: list[str | int], out: list[int]) -> None:
        algo = self._algo
        assert isinstance(algo, _SpmModel)
        prev_special = True  # the first text fragment gets the space prefix too
        for frag in fragments:
            if isinstance(frag, str):
                if self.add_space_prefix and prev_special:
                    frag = " " + frag
                algo.tokenize(frag.replace(" ", _SPM_SPACE), out)
                prev_special = False
            else:
                out.append(frag)
                prev_special = True

    @staticmethod
    def _required(token: int | None, name: str) -> int:
        if token is None:
            raise InvalidModel(f"the model asks for a {name} token but has none")
        return token

    def _partition(self, text: str, parse_special: bool) -> list[str | int]:
        """Cut special tokens out of ``text`` (llama.cpp's tokenizer_st_partition)."""
        frags: list[str | int] = [text]
        attrs = self._attrs
        present = self._special_texts.present(text)  # gemma3 has 6,414 special tokens
        for tid, tok_text in self._specials:
            if tok_text not in present:
                continue
            attr = attrs[tid]
            if not parse_special and attr & (_A_CONTROL | _A_UNKNOWN):
                continue
            if not any(isinstance(f, str) and tok_text in f for f in frags):
                continue
            new: list[str | int] = []
            for frag in frags:
                if isinstance(frag, str) and tok_text in frag:
                    _cut(frag, tid, tok_text, bool(attr & _A_LSTRIP), bool(attr & _A_RSTRIP), new)
                else:
                    new.append(frag)
            frags = new
        return frags

    # ---------------------------------------------------------------------------- decode
    def token_to_piece(self, token: int) -> bytes:
        """The bytes ``token`` stands for in generated text.

        Control and unknown tokens give ``b""``; user-defined tokens their text; byte tokens
        (``<0x0A>``) the raw byte; SPM tokens have ``▁`` turned back into spaces; byte-level BPE
        tokens are mapped back to bytes. A piece may be part of a UTF-8 sequence.
        Raises ``IndexError`` for an id outside ``0 .. n_vocab - 1``.
        """
        if token < 0:
            raise IndexError(f"token id {token} out of range")
        piece = self._pieces[token]
        if piece is None:
            piece = self._pieces[token] = self._make_piece(token)
        return piece

    def decode(self, ids: Iterable[int]) -> str:
        """The concatenated pieces of ``ids`` as text; invalid UTF-8 becomes U+FFFD."""
        return b"".join(self.token_to_piece(t) for t in ids).decode("utf-8", errors="replace")

    def _make_piece(self, token: int) -> bytes:
        attr = self._attrs[token]
        text = self._tokens[token]
        if attr & (_A_UNKNOWN | _A_CONTROL):
            return b""
        if attr & _A_USER_DEFINED:
            return text.encode("utf-8", "surrogateescape")
        if attr & _A_NORMAL:
            if self.model == "llama":
                return text.replace(_SPM_SPACE, " ").encode("utf-8", "surrogateescape")
            return _unmap_bytes(text)
        if attr & _A_BYTE:
            return bytes((int(text[3:5], 16),))
        return b""


def _cut(frag: str, tid: int, tok_text: str, lstrip: bool, rstrip: bool,
         out: list[str | int]) -> None:
    """Split ``frag`` on every occurrence of ``tok_text``; strip whitespace as LSTRIP/RSTRIP say."""
    start = 0
    n = len(frag)
    while True:
        at = frag.find(tok_text, start)
        if at < 0:
            if start < n:
                out.append(frag[start:])
            return
        left = frag[start:at]
        if lstrip:
            left = left.rstrip(_C_SPACES)
        if left:
            out.append(left)
        out.append(tid)
        start = at + len(tok_text)
        if rstrip:
            while start < n and frag[start] in _C_SPACES:
                start += 1


def _unmap_bytes(text: str) -> bytes:
    """Byte-level BPE token text -> bytes (llama_decode_text), unmappable characters marked."""
    try:
        return bytes(_UNICODE_TO_BYTE[c] for c in text)
    except KeyError:
        pass
    out = bytearray()
    for c in text:
        b = _UNICODE_TO_BYTE.get(c)
        if b is not None:
            out.append(b)
            continue
        if "\udc80" <= c <= "\udcff":  # an undecodable byte in the file reads as U+FFFD
            c = "\ufffd"
        out += b"[UNK_BYTE_0x" + c.encode("utf-8").hex().encode() + text.encode(
            "utf-8", "surrogateescape") + b"]"
    return bytes(out)


@dataclass
class _PrefixNode:
    prefix: str
    texts: list[str]  # checked one by one
    children: list[_PrefixNode]


class _Occurrences:
    """Which of many strings occur in a text, in far fewer scans of it than one per string.

    The strings sit in a trie of their prefixes; a search descends only below prefixes that
    occur in the text (one C-level substring search per node visited), so a text without ``<``
    costs one scan for all of ``<unused0>`` ... ``<unused6241>``.
    """

    _LEAF = 8  # a node with this many strings or fewer checks them one by one
    _DEPTH = 64

    def __init__(self, texts: Iterable[str]) -> None:
        self._root = self._build("", sorted(set(texts)))

    @classmethod
    def _build(cls, prefix: str, texts: list[str]) -> _PrefixNode:
        if len(texts) <= cls._LEAF or len(prefix) >= cls._DEPTH:
            return _PrefixNode(prefix, texts, [])
        k = len(prefix) + 1
        groups: dict[str, list[str]] = {}
        for t in texts:
            if len(t) >= k:
                groups.setdefault(t[:k], []).append(t)
        return _PrefixNode(prefix, [t for t in texts if len(t) < k],
                           [cls._build(p, group) for p, group in groups.items()])

    def present(self, text: str) -> set[str]:
        """The strings that occur in ``text``."""
        found: set[str] = set()
        stack = [self._root]
        while stack:
            node = stack.pop()
            if node.prefix and node.prefix not in text:
                continue
            found.update(t for t in node.texts if t in text)
            stack.extend(node.children)
        return found


def _special_order(tokens: Sequence[str], attrs: Sequence[int]) -> list[tuple[int, str]]:
    """Control/user-defined/unknown tokens, longest (in UTF-8 bytes) first."""
    mask = _A_CONTROL | _A_USER_DEFINED | _A_UNKNOWN
    special = [(i, tokens[i]) for i in range(len(tokens)) if attrs[i] & mask]
    special.sort(key=lambda item: -len(item[1].encode("utf-8", "surrogateescape")))
    return special


def _spm_byte_ids(token_to_id: dict[str, int]) -> list[int | None]:
    """byte -> id of ``<0xNN>`` (or of the one-character token, llama.cpp's fallback)."""
    ids: list[int | None] = []
    for b in range(256):
        tid = token_to_id.get(f"<0x{b:02X}>")
        if tid is None:
            tid = token_to_id.get(bytes((b,)).decode("utf-8", "surrogateescape"))
        ids.append(tid)
    return ids


# ---------------------------------------------------------------------------------- loading
def load_tokenizer(path: str | Path) -> Tokenizer:
    """Load the tokenizer of a GGUF model (or vocab-only) file.

    Raises :class:`runner.api.InvalidModel` when the file is not a GGUF, has no vocabulary, or
    has one that :func:`refusal` refuses.
    """
    return Tokenizer(_configure(read_tokenizer_metadata(path), str(path)))


def refusal(meta: Mapping[str, Any]) -> str | None:
    """Why :func:`load_tokenizer` refuses the vocabulary that a GGUF's key/values ``meta`` describe
    (scalars are enough: arrays are not looked at), or None when it takes it.

    It takes ``llama`` (SPM) and ``gpt2`` (byte-level BPE) vocabularies whose ``tokenizer.ggml.pre``
    is one of :data:`runner.model.pretokenize.PRE_TYPES`; a file can still fail to load later for
    a broken vocabulary (no tokens, no merges).
    """
    model = meta.get("tokenizer.ggml.model")
    if model not in ("llama", "gpt2"):
        return f"unsupported tokenizer model {model!r} (need 'llama' or 'gpt2')"
    if model == "gpt2" and str(meta.get("tokenizer.ggml.pre", "")) not in PRE_TYPES:
        return f"unsupported pre-tokenizer {meta.get('tokenizer.ggml.pre')!r}"
    return None


def _configure(meta: dict[str, Any], where: str) -> _Config:
    why = refusal(meta)
    if why is not None:
        raise InvalidModel(f"{where}: {why}")
    model = meta["tokenizer.ggml.model"]
    pre = str(meta.get("tokenizer.ggml.pre", "")) if model == "gpt2" else "default"
    if model == "gpt2":
        if "tokenizer.ggml.merges" not in meta and pre != "kimi-k2":  # llama.cpp lets Kimi-K2 go without
            raise InvalidModel(f"{where}: BPE vocabulary without tokenizer.ggml.merges")
        if not pre:
            log.warning("%s: no tokenizer.ggml.pre; using the 'default' pre-tokenizer", where)
    tokens = meta.get("tokenizer.ggml.tokens")
    if not tokens:
        raise InvalidModel(f"{where}: no tokenizer.ggml.tokens")
    tokens = [t if t else f"[EMPTY_{i}]" for i, t in enumerate(tokens)]
    n = len(tokens)
    scores = [float(s) for s in meta.get("tokenizer.ggml.scores") or [0.0] * n][:n]
    if len(scores) < n:
        raise InvalidModel(f"{where}: fewer scores than tokens")
    types = meta.get("tokenizer.ggml.token_type")
    if types is not None and len(types) < n:
        raise InvalidModel(f"{where}: fewer token types than tokens")
    attrs = ([int(_TOKEN_TYPE_ATTR.get(t, TokenAttr.UNDEFINED)) for t in types[:n]]
             if types is not None else [_A_NORMAL] * n)
    token_to_id = {t: i for i, t in enumerate(tokens)}  # the last of duplicates wins
    pre_type = PRE_TYPES.get(pre, PreType("default"))

    ids = _special_ids(meta, model, pre_type, n)
    if model == "llama":
        add_space_prefix, add_bos, add_eos = True, True, False
    else:
        add_space_prefix, add_bos, add_eos = False, pre_type.add_bos, False
    add_space_prefix = bool(meta.get("tokenizer.ggml.add_space_prefix", add_space_prefix))
    add_bos = bool(meta.get("tokenizer.ggml.add_bos_token", add_bos))
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", add_eos))

    eog = _detect_special_tokens(tokens, attrs, token_to_id, ids)
    _model_attr_fixups(meta, pre, tokens, attrs, token_to_id)
    return _Config(model=model, pre=pre, tokens=tokens, scores=scores, attrs=attrs,
                   token_to_id=token_to_id, merges=list(meta.get("tokenizer.ggml.merges") or []),
                   ids=ids, add_bos=add_bos, add_eos=add_eos,
                   add_space_prefix=add_space_prefix, eog_ids=eog)


def _special_ids(meta: dict[str, Any], model: str, pre: PreType, n: int) -> dict[str, int | None]:
    """BOS/EOS/... ids: llama.cpp's defaults per model type, then the GGUF's keys when in range."""
    ids: dict[str, int | None] = dict.fromkeys(_ID_KEYS)
    if model == "llama":
        ids.update(bos=1, eos=2, unk=0)
    else:
        ids.update(bos=None if pre.no_bos else 11, eos=11)
    for name in ids:
        if ids[name] is not None and ids[name] >= n:  # type: ignore[operator]
            ids[name] = None
    for name, key in [*_ID_KEYS.items(), *_DEPRECATED_ID_KEYS.items()]:
        value = meta.get(key)
        if value is None:
            continue
        value = int(value) & 0xFFFFFFFF  # read as uint32
        if value < n:
            ids[name] = value
        else:
            log.debug("bad special token %s = %d (vocab has %d); using %s", key, value, n, ids[name])
    return ids


def _detect_special_tokens(tokens: list[str], attrs: list[int], token_to_id: dict[str, int],
                           ids: dict[str, int | None]) -> set[int]:
    """Find EOT/EOM/FIM tokens by their text, mark them control, and build the EOG set.

    llama.cpp takes the first candidate its unordered map yields, so with two candidates (say
    ``<|endoftext|>`` and ``<|im_end|>``) its ``eot_id`` depends on hash order; we take the
    first in its list order. Nothing else depends on that choice: every candidate is EOG.
    """
    for role, texts in _ROLE_TEXTS.items():
        if ids[role] is not None:
            continue
        for text in texts:
            tid = token_to_id.get(text)
            if tid is not None:
                ids[role] = tid
                attrs[tid] |= _A_CONTROL
                break
    for text, tid in token_to_id.items():
        if attrs[tid] & _A_CONTROL and "unused" in text:
            attrs[tid] |= _A_UNUSED

    eog: set[int] = {ids[r] for r in ("fim_pad", "fim_rep", "fim_sep") if ids[r] is not None}  # type: ignore[misc]
    for text, tid in token_to_id.items():
        if text in _EOG_TEXTS:
            eog.add(tid)
            attrs[tid] |= _A_CONTROL
    for text in _ALWAYS_RENDERED & token_to_id.keys():
        attrs[token_to_id[text]] = _A_USER_DEFINED
    eog.update(ids[r] for r in ("eos", "eot", "eom") if ids[r] is not None)  # type: ignore[misc]

    texts = {tokens[t]: t for t in eog if 0 <= t < len(tokens)}
    has_call = "<|call|>" in texts or "<|calls|>" in texts
    if "<|end|>" in texts and has_call and ("<|return|>" in texts or "<|flush|>" in texts):
        eog.discard(texts["<|end|>"])
        attrs[texts["<|end|>"]] = _A_USER_DEFINED
    if "</s>" in texts and ("<|tool_response>" in texts or "<|plamo:eos|>" in texts):
        eog.discard(texts["</s>"])
        attrs[texts["</s>"]] = _A_NORMAL
    return eog


def _model_attr_fixups(meta: dict[str, Any], pre: str, tokens: list[str], attrs: list[int],
                       token_to_id: dict[str, int]) -> None:
    """Per-model LSTRIP/RSTRIP attributes llama.cpp sets by model name (they steer special-token cuts)."""
    name = str(meta.get("general.name", "")).encode("utf-8", "surrogateescape").lower()
    arch = str(meta.get("general.architecture", ""))

    def set_attr(text: str, bit: int, on: bool) -> None:
        tid = token_to_id.get(text)
        if tid is not None:
            attrs[tid] = attrs[tid] | bit if on else attrs[tid] & ~bit

    if any(s in pre for s in ("jina-v2-de", "jina-v2-es", "jina-v2-code")) or any(
            s in arch for s in ("nomic-bert-moe", "jina-bert-v3")):
        set_attr("<mask>", _A_LSTRIP, True)
    elif b"phi-3" in name or b"phi3" in name:
        for tid, _ in _special_order(tokens, attrs):
            attrs[tid] |= _A_RSTRIP
        set_attr("</s>", _A_RSTRIP, True)
        for text in ("<unk>", "<s>", "<|endoftext|>"):
            set_attr(text, _A_RSTRIP, False)
    elif b"modern-bert" in name:
        set_attr("[MASK]", _A_LSTRIP, True)
