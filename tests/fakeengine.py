"""A deterministic, batch-invariant Engine for tests of the batch loop's decisions.

Real engines compute a token's logits slightly differently in a batch of one row and in a batch
of several (GGML's CPU kernels; issue 26 notes §C), so they cannot show that speculative decoding
decides exactly as plain decoding does. This engine can: a row's logits are a pure function of
the tokens its KV sequence holds at positions ``0..pos``, whatever batch computed them. It is a
stand-in for the decision procedure only; real models are tested in their own files.

The "model" copies, as an induction head does: after the last few tokens it predicts what followed
their latest earlier occurrence (so prompt lookup finds good drafts), except where a hash of the
whole context picks another token of the context (so some drafts fail); ``#`` is followed by end of generation. Its
logits are that choice lifted above noise drawn from the hash, so sampling at temperature > 0
mostly, not always, takes it. The vocabulary: end of generation, newline and the printable ASCII characters,
and the UTF-8 bytes of "é" (two tokens) and "€" (three), so a character can be split across
tokens. A ``format`` is a toy grammar: at step k the tokens with ``(id + k) % 5 == 0`` are
forbidden (so a drafted token can be one the grammar refuses).

The KV memory is a dict per sequence (position -> token) with ``seq_rm``, ``seq_cp`` and
``shift``; a row's logits need positions ``0..pos`` all present, and a token may not go to a
position the sequence still holds (a KV cache would keep both cells), else the decode fails: the
loop lost track of its cache.
"""

from __future__ import annotations

import hashlib
import threading
from typing import Any

import numpy as np

from runner.api import Grammar, Image, InvalidRequest, ModelInfo, NoVision, Options
from runner.loop.slots import ImageInput, Input
from runner.sample import Sampler, SamplerOptions

EOG = 0
_ASCII = ["\n"] + [chr(c) for c in range(32, 127)]
_MULTI = {"é": [0xC3, 0xA9], "€": [0xE2, 0x82, 0xAC]}
_BYTES = [0xC3, 0xA9, 0xE2, 0x82, 0xAC]
PIECES: list[bytes] = [b""] + [c.encode() for c in _ASCII] + [bytes([b]) for b in _BYTES]
_IDS = {p: i for i, p in enumerate(PIECES) if i}


class DictKv:
    """:class:`runner.loop.slots.KvOps` over a dict per sequence."""

    state_layout = ""  # no export: no prompt store

    def __init__(self) -> None:
        self.seqs: dict[int, dict[int, int]] = {}

    def seq(self, seq: int) -> dict[int, int]:
        return self.seqs.setdefault(seq, {})

    def seq_rm(self, seq: int, begin: int, end: int | None) -> bool:
        cells = self.seq(seq)
        for pos in [p for p in cells if p >= begin and (end is None or p < end)]:
            del cells[pos]
        return True

    def seq_cp(self, src: int, dst: int, length: int) -> None:
        self.seqs[dst] = {p: t for p, t in self.seq(src).items() if p < length}

    def shift(self, seq: int, keep: int, discard: int, length: int) -> bool:
        cells = self.seq(seq)
        self.seqs[seq] = {(p - discard if p >= keep + discard else p): t for p, t in cells.items()
                          if not keep <= p < keep + discard and p < length}
        return True

    def can_resume(self, seq: int, pos: int) -> bool:
        return True

    def export_seq(self, seq: int, start: int = 0) -> None:
        return None

    def import_seq(self, seq: int, state: bytes | bytearray) -> bool:
        self.seq_rm(seq, 0, None)
        return False


def _hash(tokens: tuple[int, ...]) -> int:
    return int.from_bytes(hashlib.blake2b(np.asarray(tokens, dtype=np.int32).tobytes(), digest_size=8).digest(), "little")


def model_logits(context: tuple[int, ...], n_vocab: int, salt: int = 0) -> np.ndarray:
    """The fake model: float32 logits of the token after ``context``; another ``salt``, another
    model with the same vocabulary (a draft model that is mostly, not always, right)."""
    h = _hash(context if not salt else (salt, *context))
    logits = np.random.default_rng(h).standard_normal(n_vocab).astype(np.float32)
    logits[EOG] -= 4.0  # rare, unless chosen
    last = context[-1]
    if PIECES[last] == b"#":
        choice = EOG
    elif h % 17 == 0:  # a token from elsewhere in the context: a draft that copied fails here
        choice = context[h // 17 % len(context)]
    else:
        choice = _induction(context)
        if choice is None:
            choice = context[h // 19 % len(context)]
    logits[choice] = logits.max() + 3.0
    return logits


def _induction(context: tuple[int, ...]) -> int | None:
    """What followed the latest earlier occurrence of the last three tokens, else of the last
    two, else of the last one."""
    for n in (3, 2, 1):
        key = context[-n:]
        for j in range(len(context) - n - 1, -1, -1):
            if context[j : j + n] == key:
                return context[j + n]
    return None


class ToyGrammar:
    """The fake's constraint for a ``format``: see the module's doc."""

    def __init__(self) -> None:
        self.step = 0

    def mask(self, logits: np.ndarray) -> np.ndarray:
        out = logits.copy()
        ids = np.arange(len(out))
        out[((ids + self.step) % 5 == 0) & (ids != EOG)] = -np.inf
        return out

    def accept(self, token: int) -> None:
        self.step += 1


class FakeSampler:
    def __init__(self, sampler: Sampler, grammar: ToyGrammar | None) -> None:
        self.sampler, self.grammar = sampler, grammar


class FakeEngine:
    """:class:`runner.loop.engine.Engine`, batch-invariant; see the module's doc."""

    name = "fake"
    n_vocab = len(PIECES)
    memory_size = 0
    closed = False  # close() was called

    def __init__(self, num_ctx: int = 256, num_parallel: int = 1, num_batch: int = 64, salt: int = 0) -> None:
        self.info = ModelInfo(name="fake", path="", architecture="fake", size=0, context_length=num_ctx,
                              embedding_length=8, parameter_count=0, quantization="", chat_template=None,
                              metadata={})
        self.num_ctx = num_ctx
        self.salt = salt
        self.batch_capacity = num_batch * num_parallel
        self.kv = DictKv()
        self._building: list[list[int]] = []  # [token, pos, seq, output]
        self._prepared: list[list[int]] | None = None
        self._logits: dict[int, np.ndarray] = {}
        self.decodes: list[int] = []  # rows per decode
        self.samples: list[tuple[int, int]] = []  # (position of the row, token) of each sample, in order
        self._positions: dict[int, int] = {}

    # vocabulary
    add_bos = False
    special_tokens = ("", "")

    def tokenize(self, text: str, add_special: bool = True, parse_special: bool = True) -> list[int]:
        out: list[int] = []
        for ch in text:
            if ch in _MULTI:
                out.extend(_IDS[bytes([b])] for b in _MULTI[ch])
            elif ch.encode() in _IDS:
                out.append(_IDS[ch.encode()])
            else:
                raise InvalidRequest(f"the fake vocabulary has no {ch!r}")
        return out

    def piece(self, token: int) -> bytes:
        return PIECES[token]

    def is_eog(self, token: int) -> bool:
        return token == EOG

    # batches
    def batch_begin(self) -> None:
        self._building = []

    def batch_add(self, tokens: list[int], pos: int, seq_id: int, outputs: int = 1) -> int:
        assert 1 <= outputs <= len(tokens)
        first = len(self._building)
        for k, token in enumerate(tokens):
            self._building.append([token, pos + k, seq_id, int(k >= len(tokens) - outputs)])
        return first + len(tokens) - 1

    def prepare(self) -> None:
        self._prepared = self._building

    def fill(self, row: int, token: int) -> None:
        assert self._prepared is not None and self._prepared[row][0] == -1
        self._prepared[row][0] = token

    def decode(self, started: threading.Event | None = None) -> None:
        assert self._prepared is not None
        batch, self._prepared = self._prepared, None
        if started is not None:
            started.set()
        for token, pos, seq, _ in batch:
            assert 0 <= token < self.n_vocab, f"token {token} at {pos} not filled in"
            cells = self.kv.seq(seq)
            # a KV cache adds a cell: one left at this position would be attended to as well
            assert pos not in cells, f"sequence {seq} still holds a cell at position {pos}"
            cells[pos] = token
        self._logits = {}
        self._positions = {row: pos for row, (_, pos, _, _) in enumerate(batch)}
        for row, (_, pos, seq, output) in enumerate(batch):
            if output:
                cells = self.kv.seq(seq)
                missing = [p for p in range(pos + 1) if p not in cells]
                assert not missing, f"sequence {seq} has no cells at {missing[:5]} for position {pos}"
                self._logits[row] = model_logits(tuple(cells[p] for p in range(pos + 1)), self.n_vocab, self.salt)
        self.decodes.append(len(batch))

    def logits(self, row: int) -> np.ndarray:
        return self._logits[row]

    # images, embeddings
    def image_inputs(self, image: Image) -> list[Input]:
        raise NoVision()

    def decode_image(self, image: ImageInput, pos: int, seq_id: int) -> None:
        raise NoVision()

    def embed_lanes(self) -> Any:
        raise NotImplementedError("the fake engine has no embeddings")

    # sampling
    def new_sampler(self, options: Options, grammar: Grammar | None, prompt: list[int]) -> FakeSampler:
        sampler = Sampler(SamplerOptions.from_options(options), num_ctx=self.num_ctx)
        sampler.accept_many(prompt[-64:])
        return FakeSampler(sampler, ToyGrammar() if grammar is not None else None)

    def sample(self, sampler: FakeSampler, row: int) -> int:
        logits = self._logits[row]
        if sampler.grammar is not None:
            logits = sampler.grammar.mask(logits)
        token = sampler.sampler.sample(logits)
        sampler.sampler.accept(token)
        if sampler.grammar is not None:
            sampler.grammar.accept(token)
        self.samples.append((self._positions[row], token))
        return token

    def free_sampler(self, sampler: FakeSampler) -> None:
        pass

    def close(self) -> None:
        self.closed = True
