"""What a saved KV state is keyed by: the model fingerprint and a chain of block hashes.

A sequence's KV bytes depend on its inputs *and* on everything the model was loaded with that
changes them: the engine, the GGUF, the projector, the KV cache type, flash attention (the V
layout), the context. :class:`Fingerprint` names those; two loads with equal fingerprints read
each other's states. Its :attr:`Fingerprint.digest` roots every chain, so a state can never be
found under another model or setting.

:func:`chain` hashes the inputs in fixed blocks of :data:`BLOCK`, each hash over its parent's
(vLLM's automatic prefix caching, llama.cpp PR #24004): ``h_0 = H(fingerprint)``,
``h_k = H(h_{k-1} || block k)``. Two prompts share ``h_k`` exactly when they share their first
``k * BLOCK`` inputs under the same fingerprint, so conversations with one system prompt share its
blocks. A token is its int32; an image position (:class:`runner.loop.slots.ImageInput`) is its
identity (sha256 of the image's bytes), index and count, never the pixels or embedding it decodes
from.

The exact-tail rule: the inputs after the last full block get a *tail key*
``H_tail(h_k || partial block)`` (another BLAKE2 personalisation, so it never equals a block
hash). :meth:`Chain.key` is the key of exactly all ``n`` inputs, so a state saved after ``n``
inputs is found for a prompt only when the prompt's first ``n`` inputs are exactly those: restores
are exact to the input, not rounded down to a block (Ollama's MLX runner lost up to 8191 tokens
a turn by restoring only at snapshot boundaries, ollama#18267).

Pages (:mod:`.ram`): a state is kept as the states of its blocks, each filed under its block hash
and its parent's (:meth:`Chain.pages`), the partial block at its end under the tail key;
:func:`page_key` is how a page's key follows from its parent and its inputs alone (what a cache
file is checked against).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import struct
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

BLOCK = 16  # inputs per hashed block (vLLM's default)
DIGEST = 32  # bytes of every hash
_STORE_BLOB = re.compile(r"sha256-[0-9a-f]{64}")


def file_identity(path: str | None) -> str:
    """A model file's identity: its store digest (``sha256-<hex>``, the blob's name) when it is a
    store blob, else its real path, size and mtime (a changed file is another model). "" for None."""
    if not path:
        return ""
    name = os.path.basename(path)
    if _STORE_BLOB.fullmatch(name):
        return name
    st = os.stat(path)
    return f"{os.path.realpath(path)}:{st.st_size}:{st.st_mtime_ns}"


@dataclass(frozen=True)
class Fingerprint:
    """Everything besides the inputs that a sequence's KV bytes depend on."""

    engine: str  # "old" (llama.cpp) or "new" (our GGML code)
    engine_version: str  # the engine's state format and what it is tied to (KvOps.state_layout)
    model: str  # file_identity of the GGUF
    projector: str  # file_identity of the vision projector ("" without one)
    kv_cache_type: str  # "f16", "q8_0", "q4_0"
    flash_attention: bool  # the V layout (transposed without it)
    num_ctx: int  # tokens per sequence (RoPE/YaRN settings follow the GGUF, which `model` names)
    layout: str = ""  # engine-specific: what else its states are tied to (llama.cpp: KV streams)

    @classmethod
    def of(cls, engine: str, engine_version: str, info: Any, load: Any, layout: str = "") -> Fingerprint:
        """The fingerprint of a load: ``info`` a :class:`runner.api.ModelInfo`, ``load`` its
        :class:`runner.loading.plan.LoadOptions`."""
        return cls(engine=engine, engine_version=engine_version, model=file_identity(info.path),
                   projector=file_identity(info.projector), kv_cache_type=load.kv_cache_type,
                   flash_attention=bool(load.flash_attention), num_ctx=int(load.num_ctx), layout=layout)

    @property
    def digest(self) -> bytes:
        """The root of every chain under this fingerprint (:data:`DIGEST` bytes)."""
        text = json.dumps(asdict(self), sort_keys=True, separators=(",", ":")).encode()
        return hashlib.blake2b(text, digest_size=DIGEST, person=b"pollama-kv-fp").digest()


def _encode(inputs: Sequence[Any]) -> bytes:
    """The bytes a block of inputs hashes as: tokens as little-endian int32 tagged ``t``, image
    positions as (sha256, index, count) tagged ``i`` (duck-typed: ``digest``, ``index``, ``count``)."""
    out = bytearray()
    for item in inputs:
        if isinstance(item, int):
            out += b"t" + struct.pack("<i", item)
        else:
            out += b"i" + bytes.fromhex(item.digest) + struct.pack("<ii", item.index, item.count)
    return bytes(out)


def _block_hash(parent: bytes, inputs: Sequence[Any]) -> bytes:
    return hashlib.blake2b(parent + _encode(inputs), digest_size=DIGEST, person=b"pollama-kv-blk").digest()


def _tail_hash(parent: bytes, inputs: Sequence[Any]) -> bytes:
    return hashlib.blake2b(parent + _encode(inputs), digest_size=DIGEST, person=b"pollama-kv-tail").digest()


def page_key(parent: bytes, inputs: Sequence[Any], block: int) -> bytes:
    """The key of ``inputs`` following the prefix keyed ``parent``: a full block's hash when they
    are ``block`` inputs, else a tail's (so ``chain(root, x).key() == page_key(prefixes[-1], rest)``)."""
    return _block_hash(parent, inputs) if len(inputs) == block else _tail_hash(parent, inputs)


@dataclass(frozen=True)
class Page:
    """Where one page of a chain lies: inputs ``[start, end)``, keyed ``key``, after ``parent``."""

    parent: bytes  # the key of inputs [0, start): a block prefix (the root for the first page)
    key: bytes  # the key of inputs [0, end)
    start: int
    end: int


@dataclass(frozen=True)
class Chain:
    """The hashes of a sequence of ``n`` inputs: ``prefixes[k]`` is the key of its first
    ``k * block`` inputs (``prefixes[0]`` the fingerprint root)."""

    prefixes: tuple[bytes, ...]
    n: int
    block: int
    tail: bytes | None  # key of all n inputs when n is not a multiple of block
    inputs: tuple[Any, ...] = field(repr=False, compare=False)  # for key_at's partial blocks

    def key(self) -> bytes:
        """The key of exactly these ``n`` inputs (the exact-tail rule)."""
        return self.tail if self.tail is not None else self.prefixes[-1]

    def key_at(self, n: int) -> bytes:
        """The key of exactly the first ``n`` inputs (``0 <= n <= self.n``)."""
        if not 0 <= n <= self.n:
            raise ValueError(f"prefix {n} outside 0..{self.n}")
        full, rest = divmod(n, self.block)
        if rest == 0:
            return self.prefixes[full]
        start = full * self.block
        return _tail_hash(self.prefixes[full], self.inputs[start:n])

    def pages(self) -> list[Page]:
        """The pages of these inputs: one per full block, then the tail (when ``n`` is not a
        multiple of ``block``)."""
        out = [Page(self.prefixes[k], self.prefixes[k + 1], k * self.block, (k + 1) * self.block)
               for k in range(len(self.prefixes) - 1)]
        if self.tail is not None:
            full = len(self.prefixes) - 1
            out.append(Page(self.prefixes[full], self.tail, full * self.block, self.n))
        return out


def chain(fingerprint: Fingerprint | bytes, inputs: Sequence[Any], block: int = BLOCK) -> Chain:
    """The chained block hashes of ``inputs`` (token ids and image positions) under
    ``fingerprint`` (or its digest)."""
    if block < 1:
        raise ValueError("block must be at least 1")
    root = fingerprint.digest if isinstance(fingerprint, Fingerprint) else bytes(fingerprint)
    items = tuple(inputs)
    prefixes = [root]
    full = len(items) // block
    for k in range(full):
        prefixes.append(_block_hash(prefixes[-1], items[k * block : (k + 1) * block]))
    rest = items[full * block :]
    tail = _tail_hash(prefixes[-1], rest) if rest else None
    return Chain(prefixes=tuple(prefixes), n=len(items), block=block, tail=tail, inputs=items)
