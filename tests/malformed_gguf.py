"""A generator of malformed GGUF files, from stories260K (llama, F32, 5 layers, 8 heads of 8).

Two kinds of damage:

- **bytes**: the file cut at many offsets, tensor data offsets, types, dims and the header's
  counts overwritten in place (the layout found by walking the header);
- **metadata**: a copy written with the ``gguf`` package where some keys are replaced or dropped
  (huge and zero hyperparameters, inconsistent heads, bad vocabularies), or the tensors left out
  (a vocabulary-only file).

``generate(folder)`` writes every case and returns ``{name: path}``. Each case is a file that
neither engine can run; the tests check that both refuse it with one clear line.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
from gguf import GGUFReader, GGUFValueType, GGUFWriter

from runner.model import ggufmeta

U32, U64, I32, F32, STR = (GGUFValueType.UINT32, GGUFValueType.UINT64, GGUFValueType.INT32,
                           GGUFValueType.FLOAT32, GGUFValueType.STRING)


# ------------------------------------------------------------------------------ the file layout
@dataclass
class TensorSlot:
    """Where one tensor info lives in the file."""

    name: str
    dims_at: int  # the u32 dimension count
    n_dims: int
    type_at: int  # the u32 type
    offset_at: int  # the u64 data offset


@dataclass
class Layout:
    data: bytes
    kv_end: int
    tensors: list[TensorSlot]
    data_start: int


def layout(data: bytes) -> Layout:
    kv = ggufmeta.read_key_values(data, keep=lambda key, is_array: False)
    off, slots = kv.end, []
    for _ in range(kv.tensor_count):
        (n,) = struct.unpack_from("<Q", data, off)
        name = data[off + 8: off + 8 + n].decode()
        off += 8 + n
        (n_dims,) = struct.unpack_from("<I", data, off)
        type_at = off + 4 + 8 * n_dims
        slots.append(TensorSlot(name, off, n_dims, type_at, type_at + 4))
        off = type_at + 12
    return Layout(data, kv.end, slots, off + (-off) % 32)


def _put(data: bytes, at: int, fmt: str, value: int) -> bytes:
    out = bytearray(data)
    struct.pack_into(fmt, out, at, value)
    return bytes(out)


# ------------------------------------------------------------------------- metadata mutations
def copy_gguf(src: Path, dst: Path, overrides: dict[str, tuple[Any, GGUFValueType]] | None = None,
              drop: tuple[str, ...] = (), tensors: bool = True,
              edit_tensors: Callable[[list[tuple[str, np.ndarray, Any]]], list] | None = None) -> Path:
    """Copy ``src`` with keys replaced (``overrides``: key -> (value, type)) or dropped, and the
    tensors kept, left out, or edited (``edit_tensors`` maps the list of (name, data, type))."""
    overrides = overrides or {}
    reader = GGUFReader(src)
    arch = reader.fields["general.architecture"].contents()
    writer = GGUFWriter(dst, arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture" or name in drop or name in overrides:
            continue
        kind = field.types[0]
        sub = field.types[-1] if kind == GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), kind, sub_type=sub)
    for name, (value, kind) in overrides.items():
        sub = None
        if kind == GGUFValueType.ARRAY:
            sub = GGUFValueType.STRING if isinstance(value[0], str) else GGUFValueType.UINT32
        writer.add_key_value(name, value, kind, sub_type=sub)
    if tensors:
        items = [(t.name, t.data, t.tensor_type) for t in reader.tensors]
        if edit_tensors is not None:
            items = edit_tensors(items)
        for name, data, kind in items:
            writer.add_tensor(name, data, raw_dtype=kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst


def _tokens(src: Path) -> list[str]:
    field = GGUFReader(src).fields["tokenizer.ggml.tokens"]
    return field.contents()


# ------------------------------------------------------------------------------------- the cases
def byte_cases(src: Path) -> dict[str, bytes]:
    """Damage done to the bytes of ``src`` (stories260K)."""
    data = src.read_bytes()
    lay = layout(data)
    t0, t3, last = lay.tensors[0], lay.tensors[3], lay.tensors[-1]
    (t2_offset,) = struct.unpack_from("<Q", data, lay.tensors[2].offset_at)
    cases: dict[str, bytes] = {}
    cuts = {"empty": 0, "magic": 3, "version": 6, "counts": 20, "first_key": 30, "kv_middle": 400,
            "vocab": 3000, "kv_end": lay.kv_end - 1, "tensor_infos": lay.kv_end + 20,
            "before_data": lay.data_start - 1, "data_middle": (lay.data_start + len(data)) // 2,
            "last_byte": len(data) - 1}
    for where, at in cuts.items():
        cases[f"cut_{where}"] = data[:at]
    cases["bad_magic"] = b"GGUX" + data[4:]
    cases["version_1"] = _put(data, 4, "<I", 1)
    cases["version_99"] = _put(data, 4, "<I", 99)
    cases["tensor_count_huge"] = _put(data, 8, "<Q", 2**63 - 1)
    cases["tensor_count_plus_one"] = _put(data, 8, "<Q", len(lay.tensors) + 1)
    cases["tensor_count_zero"] = _put(data, 8, "<Q", 0)
    cases["kv_count_huge"] = _put(data, 16, "<Q", 2**62)
    cases["kv_count_plus_one"] = _put(data, 16, "<Q", struct.unpack_from("<Q", data, 16)[0] + 1)
    cases["kv_count_minus_one"] = _put(data, 16, "<Q", struct.unpack_from("<Q", data, 16)[0] - 1)
    cases["offset_misaligned"] = _put(data, t0.offset_at, "<Q", 1)
    cases["offset_overlaps"] = _put(data, t3.offset_at, "<Q", t2_offset)
    cases["offset_past_end"] = _put(data, last.offset_at, "<Q", 2**40)
    cases["offset_max"] = _put(data, last.offset_at, "<Q", 2**64 - 1)
    cases["type_removed"] = _put(data, t0.type_at, "<I", 4)  # Q4_2, long gone from GGML
    cases["type_unknown"] = _put(data, t0.type_at, "<I", 99)
    cases["type_negative"] = _put(data, t0.type_at, "<I", 2**31)
    cases["type_block_mismatch"] = _put(data, t0.type_at, "<I", 12)  # Q4_K: 256-wide blocks, 64-wide rows
    cases["type_f16_norm"] = _put(data, last.type_at, "<I", 1)  # a norm weight: valid layout, half the bytes
    cases["type_i32_weight"] = _put(data, lay.tensors[2].type_at, "<I", 26)  # same bytes as f32
    cases["dims_five"] = _put(data, t0.dims_at, "<I", 5)
    cases["dim_negative"] = _put(data, t0.dims_at + 4, "<q", -64)
    cases["dims_overflow"] = _put(_put(data, t0.dims_at + 4, "<q", 2**40), t0.dims_at + 12, "<q", 2**40)
    cases["dim_huge"] = _put(data, t0.dims_at + 12, "<q", 2**40)
    first_key_type = 24 + 8 + struct.unpack_from("<Q", data, 24)[0]
    cases["value_type_unknown"] = _put(data, first_key_type, "<I", 99)
    cases["string_length_huge"] = _put(data, 24, "<Q", 2**62)
    return cases


def metadata_cases(src: Path, folder: Path) -> dict[str, Path]:
    """Copies of ``src`` with bad metadata (stories260K: 5 layers, 64 wide, 8 heads, 4 K/V heads,
    RoPE over 8 features, 512 tokens)."""
    k = "llama."
    changes: dict[str, dict[str, Any]] = {
        "block_count_0": {"overrides": {k + "block_count": (0, U32)}},
        "block_count_513": {"overrides": {k + "block_count": (513, U32)}},
        "block_count_u32_max": {"overrides": {k + "block_count": (2**32 - 1, U32)}},
        "block_count_2_32": {"overrides": {k + "block_count": (2**32, U64)}},
        "block_count_text": {"overrides": {k + "block_count": ("5", STR)}},
        "block_count_4": {"overrides": {k + "block_count": (4, U32)}},
        "block_count_6": {"overrides": {k + "block_count": (6, U32)}},
        "block_count_missing": {"drop": (k + "block_count",)},
        "embedding_length_0": {"overrides": {k + "embedding_length": (0, U32)}},
        "embedding_length_huge": {"overrides": {k + "embedding_length": (2**31, U32)}},
        "embedding_length_128": {"overrides": {k + "embedding_length": (128, U32)}},
        "head_count_0": {"overrides": {k + "attention.head_count": (0, U32)}},
        "head_count_huge": {"overrides": {k + "attention.head_count": (2**31, U32)}},
        "head_count_16": {"overrides": {k + "attention.head_count": (16, U32)}},
        "head_count_missing": {"drop": (k + "attention.head_count",)},
        "head_count_per_layer_short": {"overrides": {k + "attention.head_count": ([8, 8, 8], GGUFValueType.ARRAY)}},
        "head_count_kv_0": {"overrides": {k + "attention.head_count_kv": (0, U32)}},
        "head_count_kv_3": {"overrides": {k + "attention.head_count_kv": (3, U32)}},
        "head_count_kv_16": {"overrides": {k + "attention.head_count_kv": (16, U32)}},
        "feed_forward_length_0": {"overrides": {k + "feed_forward_length": (0, U32)}},
        "key_length_16": {"overrides": {k + "attention.key_length": (16, U32)}},
        "value_length_16": {"overrides": {k + "attention.value_length": (16, U32)}},
        "rope_dims_0": {"overrides": {k + "rope.dimension_count": (0, U32)}},
        "rope_dims_odd": {"overrides": {k + "rope.dimension_count": (7, U32)}},
        "rope_dims_huge": {"overrides": {k + "rope.dimension_count": (2**31, U32)}},
        "rope_scaling_unknown": {"overrides": {k + "rope.scaling.type": ("bogus", STR)}},
        "norm_eps_negative": {"overrides": {k + "attention.layer_norm_rms_epsilon": (-1.0, F32)}},
        "norm_eps_nan": {"overrides": {k + "attention.layer_norm_rms_epsilon": (float("nan"), F32)}},
        "experts_without_used": {"overrides": {k + "expert_count": (2, U32)}},
        "experts_used_without_experts": {"overrides": {k + "expert_used_count": (2, U32)}},
        "experts_too_many": {"overrides": {k + "expert_count": (5000, U32), k + "expert_used_count": (2, U32)}},
        "nextn_layers_10": {"overrides": {k + "nextn_predict_layers": (10, U32)}},
        "alignment_3": {"overrides": {"general.alignment": (3, U32)}},
        "alignment_1024": {"overrides": {"general.alignment": (1024, U32)}},  # not how the data lies
        "alignment_u64": {"overrides": {"general.alignment": (32, U64)}},
        "architecture_missing": {"drop": ("general.architecture",)},
        "vocab_missing": {"drop": ("tokenizer.ggml.tokens",)},
        "vocab_only": {"tensors": False},
    }
    tokens = _tokens(src)
    changes["vocab_duplicate_token"] = {"overrides": {"tokenizer.ggml.tokens": (tokens[:-1] + [tokens[100]], GGUFValueType.ARRAY)}}
    changes["vocab_shorter_than_embeddings"] = {"overrides": {"tokenizer.ggml.tokens": (tokens[:-8], GGUFValueType.ARRAY)}}
    changes["vocab_longer_than_scores"] = {"overrides": {"tokenizer.ggml.tokens": (tokens + ["x1", "x2"], GGUFValueType.ARRAY)}}
    changes["tensor_shape_transposed"] = {"edit_tensors": lambda items: [
        (n, d.T.copy() if n == "blk.0.attn_k.weight" else d, t) for n, d, t in items]}
    changes["tensor_extra_layer"] = {"edit_tensors": lambda items: items + [
        ("blk.7.attn_norm.weight", np.ones(64, np.float32), items[0][2])]}
    out: dict[str, Path] = {}
    for name, kwargs in changes.items():
        if name == "architecture_missing":
            out[name] = _without_architecture(src, folder / f"{name}.gguf")
            continue
        out[name] = copy_gguf(src, folder / f"{name}.gguf", **kwargs)
    return out


def _without_architecture(src: Path, dst: Path) -> Path:
    """GGUFWriter always writes general.architecture: rename the key in place instead (same
    length, so nothing moves)."""
    data = src.read_bytes()
    key = b"general.architecture"
    at = data.index(key)
    dst.write_bytes(data[:at] + b"general.architectur_" + data[at + len(key):])
    return dst


def generate(src: Path, folder: Path) -> dict[str, Path]:
    """Write every case into ``folder``: ``{case name: path}``."""
    folder.mkdir(parents=True, exist_ok=True)
    out: dict[str, Path] = {}
    for name, data in byte_cases(src).items():
        path = folder / f"{name}.gguf"
        path.write_bytes(data)
        out[name] = path
    out.update(metadata_cases(src, folder))
    return out
