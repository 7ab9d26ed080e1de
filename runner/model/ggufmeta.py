"""The key/value header of a GGUF file, read straight from a memory map.

One walker for the two readers that need the header without the tensors:
:func:`read_gguf_header` (metadata and the extent of the tensor data, for ``pollama show``,
truncation checks and load decisions) and the new engine's tokenizer (its vocabulary arrays). ``gguf.GGUFReader`` parses
every array element into NumPy views, ~1.5 s for a 49k-token vocabulary; this walker skips what
its caller does not keep and takes a few milliseconds.

Layout (little-endian): magic ``GGUF``, u32 version, u64 tensor count, u64 key/value count, then
per pair a string key, a u32 value type and the value; strings are a u64 length and the bytes;
arrays a u32 element type, a u64 count and the elements. The tensor infos follow.
"""

from __future__ import annotations

import mmap
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ..api import InvalidModel

MAGIC = b"GGUF"
STRING, ARRAY = 8, 9
SCALARS: dict[int, struct.Struct] = {
    code: struct.Struct("<" + fmt)
    for code, fmt in {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?",
                      10: "Q", 11: "q", 12: "d"}.items()
}
U32 = SCALARS[4]
U64 = SCALARS[10]


class NotGGUF(ValueError):
    """The bytes do not start with the GGUF magic."""


class PastEnd(ValueError):
    """A length or count in the header reaches past the end of the file (truncated, or corrupt)."""


class UnsupportedVersion(ValueError):
    def __init__(self, version: int) -> None:
        super().__init__(f"unsupported GGUF version {version}")
        self.version = version


@dataclass
class KeyValues:
    version: int
    tensor_count: int
    values: dict[str, Any]  # the kept pairs: scalars, strings, and arrays as lists
    array_lengths: dict[str, int]  # every array's element count, kept or not
    end: int  # offset just past the last pair, where the tensor infos start
    types: dict[str, int] = field(default_factory=dict)  # every key's value type (ARRAY for arrays)


def read_key_values(buf: Any, keep: Callable[[str, bool], bool], errors: str | None = "replace") -> KeyValues:
    """Walk the header in ``buf`` (bytes, or an mmap); ``keep(key, is_array)`` says which values
    to decode, the rest are skipped. Strings decode as UTF-8 with ``errors``; ``errors=None``
    keeps the strings of arrays as raw ``bytes``.

    Raises :class:`NotGGUF`, :class:`UnsupportedVersion`, ``ValueError`` for what GGML's own
    reader refuses (an unknown value type, an empty or repeated key, an array of arrays, a length
    past the end), and ``struct.error`` when the header ends early.
    """
    if bytes(buf[:4]) != MAGIC:
        raise NotGGUF("not a GGUF file")
    (version,) = U32.unpack_from(buf, 4)
    if version not in (2, 3):
        raise UnsupportedVersion(version)
    (tensor_count,) = U64.unpack_from(buf, 8)
    (n_kv,) = U64.unpack_from(buf, 16)
    if n_kv > len(buf) // 12:  # each pair takes at least a key length and a type
        raise PastEnd(f"the header claims {n_kv:,} key/value pairs, more than the file holds")
    walker = _Walker(buf, errors)
    off = 24
    values: dict[str, Any] = {}
    arrays: dict[str, int] = {}
    types: dict[str, int] = {}
    for _ in range(n_kv):
        key, off = walker.string(off)
        if not key:
            raise ValueError("a metadata key is empty")
        if key in types:
            raise ValueError(f"metadata key {key!r} appears twice")
        (vtype,) = U32.unpack_from(buf, off)
        off += 4
        types[key] = vtype
        if vtype == ARRAY:
            (etype,) = U32.unpack_from(buf, off)
            (count,) = U64.unpack_from(buf, off + 4)
            arrays[key] = count
            value, off = walker.array(off + 12, etype, count, keep(key, True))
        else:
            value, off = walker.value(off, vtype, keep(key, False))
        if value is not None:
            values[key] = value
    return KeyValues(version, tensor_count, values, arrays, off, types)


def read_array(path: str | os.PathLike, key: str, errors: str | None = "replace") -> list | None:
    """The array ``key`` of the GGUF at ``path`` (None when absent); see :func:`read_key_values`."""
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        return read_key_values(buf, keep=lambda k, is_array: k == key and is_array, errors=errors).values.get(key)


class _Walker:
    def __init__(self, buf: Any, errors: str | None) -> None:
        self.buf, self.errors, self.size = buf, errors, len(buf)

    def _bytes_end(self, off: int) -> tuple[int, int]:
        (n,) = U64.unpack_from(self.buf, off)
        end = off + 8 + n
        if end > self.size:
            raise PastEnd("a string runs past the end of the file")
        return off + 8, end

    def string(self, off: int) -> tuple[str, int]:
        start, end = self._bytes_end(off)
        return bytes(self.buf[start:end]).decode("utf-8", self.errors or "replace"), end

    def value(self, off: int, vtype: int, keep: bool) -> tuple[Any, int]:
        """Read (or, when ``keep`` is false, skip) one non-array value: (value or None, next offset)."""
        if vtype == STRING:
            if keep:
                return self.string(off)
            return None, self._bytes_end(off)[1]
        fmt = SCALARS.get(vtype)
        if fmt is None:
            raise ValueError(f"unknown GGUF value type {vtype}")
        return (fmt.unpack_from(self.buf, off)[0] if keep else None), off + fmt.size

    def array(self, off: int, etype: int, count: int, keep: bool) -> tuple[list | None, int]:
        if etype == STRING:  # vocabularies: tens of thousands of strings, so a tight loop
            if count > (self.size - off) // 8:
                raise PastEnd("a string array runs past the end of the file")
            buf, unpack, items = self.buf, U64.unpack_from, []
            append = items.append
            for _ in range(count):
                start = off + 8
                off = start + unpack(buf, off)[0]
                if keep:
                    append(buf[start:off])
            if off > self.size:
                raise PastEnd("a string array runs past the end of the file")
            if not keep:
                return None, off
            if self.errors is None:
                return items, off
            return [bytes(b).decode("utf-8", self.errors) for b in items], off
        fmt = SCALARS.get(etype)
        if fmt is not None:
            end = off + fmt.size * count
            if end > self.size:
                raise PastEnd("an array runs past the end of the file")
            if not keep:
                return None, end
            return list(struct.unpack_from(f"<{count}{fmt.format[1:]}", self.buf, off)), end
        if etype == ARRAY:  # GGML's reader has no arrays of arrays
            raise ValueError("an array of arrays (GGML cannot read those)")
        raise ValueError(f"unknown GGUF array element type {etype}")


# ----------------------------------------------------------------------------- GGUF header check
#: The tensor types of the GGML that llama-cpp-python 0.3.36 vendors: id -> (name, elements per
#: block, bytes per block). Ids missing here (4, 5, 31-33, 36-38: removed types) have no block
#: size, and GGML refuses a tensor of such a type. tests/test_gguf_malformed.py checks the table
#: against the library.
GGML_TYPES: dict[int, tuple[str, int, int]] = {
    0: ("f32", 1, 4), 1: ("f16", 1, 2), 2: ("q4_0", 32, 18), 3: ("q4_1", 32, 20),
    6: ("q5_0", 32, 22), 7: ("q5_1", 32, 24), 8: ("q8_0", 32, 34), 9: ("q8_1", 32, 36),
    10: ("q2_K", 256, 84), 11: ("q3_K", 256, 110), 12: ("q4_K", 256, 144), 13: ("q5_K", 256, 176),
    14: ("q6_K", 256, 210), 15: ("q8_K", 256, 292), 16: ("iq2_xxs", 256, 66), 17: ("iq2_xs", 256, 74),
    18: ("iq3_xxs", 256, 98), 19: ("iq1_s", 256, 50), 20: ("iq4_nl", 32, 18), 21: ("iq3_s", 256, 110),
    22: ("iq2_s", 256, 82), 23: ("iq4_xs", 256, 136), 24: ("i8", 1, 1), 25: ("i16", 1, 2),
    26: ("i32", 1, 4), 27: ("i64", 1, 8), 28: ("f64", 1, 8), 29: ("iq1_m", 256, 56),
    30: ("bf16", 1, 2), 34: ("tq1_0", 256, 54), 35: ("tq2_0", 256, 66), 39: ("mxfp4", 32, 17),
    40: ("nvfp4", 64, 36), 41: ("q1_0", 128, 18), 42: ("q2_0", 64, 18),
}
GGML_MAX_NAME = 64  # tensor names are shorter (GGML keeps them in a 64-byte field with the NUL)
GGML_MAX_DIMS = 4
_INT64_MAX = 2**63 - 1


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it: GGML shape (ne0 first), type id, data offset."""

    name: str
    shape: tuple[int, ...]
    type_id: int
    offset: int  # from the start of the data section
    nbytes: int

    @property
    def type_name(self) -> str:
        return GGML_TYPES[self.type_id][0]


@dataclass
class GGUFHeader:
    """Metadata (arrays kept only as their length), the tensor directory, and the extent of the
    tensor data."""

    version: int
    metadata: dict[str, Any]
    array_lengths: dict[str, int]
    tensor_count: int
    data_end: int  # bytes the file must have to hold every tensor
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    types: dict[str, int] = field(default_factory=dict)  # each key's GGUF value type

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, suffix: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{suffix}", default)


def _read_tensor_infos(buf: Any, off: int, count: int, alignment: int) -> tuple[dict[str, TensorInfo], int]:
    """The tensor directory from ``off`` and where the data section starts, with the checks of
    GGML's ``gguf_init_from_file`` (so a file that passes here also passes there): names shorter
    than 64 bytes and unique, at most 4 dims, none negative, an element count that fits int64, a
    known type whose block divides ``ne0``, and data offsets that follow one another as GGML
    lays them out (each tensor padded to ``alignment``)."""
    u32, u64, i64 = U32.unpack_from, U64.unpack_from, SCALARS[11].unpack_from
    if count > (len(buf) - off) // 24:  # name length, dims count, type and offset at least
        raise PastEnd(f"the header claims {count:,} tensors, more than the file holds")
    walker = _Walker(buf, "replace")
    tensors: dict[str, TensorInfo] = {}
    expected = 0
    for _ in range(count):
        raw_start, raw_end = walker._bytes_end(off)
        name = bytes(buf[raw_start:raw_end]).decode("utf-8", "replace")
        off = raw_end
        if raw_end - raw_start >= GGML_MAX_NAME:
            raise ValueError(f"tensor name {name[:40]!r}... is longer than {GGML_MAX_NAME - 1} bytes")
        if name in tensors:
            raise ValueError(f"tensor {name!r} appears twice")
        (n_dims,) = u32(buf, off)
        if n_dims > GGML_MAX_DIMS:
            raise ValueError(f"tensor {name!r} has {n_dims} dimensions (GGML has at most {GGML_MAX_DIMS})")
        shape = tuple(i64(buf, off + 4 + 8 * k)[0] for k in range(n_dims))
        off += 4 + 8 * n_dims
        type_id, offset = u32(buf, off)[0], u64(buf, off + 4)[0]
        off += 12
        if any(d < 0 for d in shape):
            raise ValueError(f"tensor {name!r} has a negative dimension {list(shape)}")
        elements = 1
        for d in shape:
            elements *= d
        if elements > _INT64_MAX:
            raise ValueError(f"tensor {name!r} has too many elements {list(shape)}")
        kind = GGML_TYPES.get(type_id)
        if kind is None:
            raise ValueError(f"tensor {name!r} has an unknown type {type_id}")
        type_name, block, block_bytes = kind
        ne0 = shape[0] if shape else 1
        if ne0 % block:
            raise ValueError(f"tensor {name!r} of type {type_name} has rows of {ne0} elements, "
                             f"not a multiple of its block size {block}")
        nbytes = elements // block * block_bytes
        if offset != expected:
            raise ValueError(f"tensor {name!r} has data offset {offset}, expected {expected}")
        expected += nbytes + (-nbytes) % alignment
        tensors[name] = TensorInfo(name, shape, type_id, offset, nbytes)
    start = off + (-off) % alignment if count else off
    return tensors, start


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse a GGUF header quickly (arrays are skipped) and check its structure as GGML's reader
    does. Raises InvalidModel with one line."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise InvalidModel(f"{path.name} is not a GGUF file")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            kv = read_key_values(buf, keep=lambda key, is_array: not is_array)
            alignment = kv.values.get("general.alignment", 32)
            if "general.alignment" in kv.types and kv.types["general.alignment"] != 4:
                raise ValueError("general.alignment is not a uint32")
            if alignment <= 0 or alignment & (alignment - 1):
                raise ValueError(f"general.alignment {alignment} is not a power of 2")
            tensors, start = _read_tensor_infos(buf, kv.end, kv.tensor_count, alignment)
        except NotGGUF:
            raise InvalidModel(f"{path.name} is not a GGUF file") from None
        except UnsupportedVersion as err:
            raise InvalidModel(f"{path.name}: {err}") from None
        except struct.error:
            raise InvalidModel(f"{path.name} is truncated or corrupt (the GGUF header ends early)") from None
        except PastEnd as err:
            raise InvalidModel(f"{path.name} is truncated or corrupt ({err})") from None
        except ValueError as err:
            raise InvalidModel(f"{path.name} is a corrupt GGUF file: {err}") from None
    data_end = start + max((t.offset + t.nbytes for t in tensors.values()), default=0)
    header = GGUFHeader(kv.version, kv.values, kv.array_lengths, kv.tensor_count, data_end, tensors, kv.types)
    if header.data_end > size:
        raise InvalidModel(
            f"{path.name} is truncated: its tensors need {header.data_end:,} bytes, the file has {size:,}"
        )
    return header
