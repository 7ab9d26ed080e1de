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
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from .api import InvalidModel

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


def read_key_values(buf: Any, keep: Callable[[str, bool], bool], errors: str = "replace") -> KeyValues:
    """Walk the header in ``buf`` (bytes, or an mmap); ``keep(key, is_array)`` says which values
    to decode, the rest are skipped. Strings decode as UTF-8 with ``errors``.

    Raises :class:`NotGGUF`, :class:`UnsupportedVersion`, ``ValueError`` for an unknown value
    type or a length past the end, and ``struct.error`` when the header ends early.
    """
    if bytes(buf[:4]) != MAGIC:
        raise NotGGUF("not a GGUF file")
    (version,) = U32.unpack_from(buf, 4)
    if version not in (2, 3):
        raise UnsupportedVersion(version)
    (tensor_count,) = U64.unpack_from(buf, 8)
    (n_kv,) = U64.unpack_from(buf, 16)
    walker = _Walker(buf, errors)
    off = 24
    values: dict[str, Any] = {}
    arrays: dict[str, int] = {}
    for _ in range(n_kv):
        key, off = walker.string(off)
        (vtype,) = U32.unpack_from(buf, off)
        off += 4
        if vtype == ARRAY:
            (etype,) = U32.unpack_from(buf, off)
            (count,) = U64.unpack_from(buf, off + 4)
            arrays[key] = count
            value, off = walker.array(off + 12, etype, count, keep(key, True))
        else:
            value, off = walker.value(off, vtype, keep(key, False))
        if value is not None:
            values[key] = value
    return KeyValues(version, tensor_count, values, arrays, off)


class _Walker:
    def __init__(self, buf: Any, errors: str) -> None:
        self.buf, self.errors, self.size = buf, errors, len(buf)

    def _bytes_end(self, off: int) -> tuple[int, int]:
        (n,) = U64.unpack_from(self.buf, off)
        end = off + 8 + n
        if end > self.size:
            raise ValueError("a string runs past the end of the file")
        return off + 8, end

    def string(self, off: int) -> tuple[str, int]:
        start, end = self._bytes_end(off)
        return bytes(self.buf[start:end]).decode("utf-8", self.errors), end

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
            buf, unpack, items = self.buf, U64.unpack_from, []
            append = items.append
            for _ in range(count):
                start = off + 8
                off = start + unpack(buf, off)[0]
                if keep:
                    append(buf[start:off])
            if off > self.size:
                raise ValueError("a string array runs past the end of the file")
            return ([bytes(b).decode("utf-8", self.errors) for b in items] if keep else None), off
        fmt = SCALARS.get(etype)
        if fmt is not None:
            end = off + fmt.size * count
            if end > self.size:
                raise ValueError("an array runs past the end of the file")
            if not keep:
                return None, end
            return list(struct.unpack_from(f"<{count}{fmt.format[1:]}", self.buf, off)), end
        if etype != ARRAY:
            raise ValueError(f"unknown GGUF array element type {etype}")
        for _ in range(count):  # nested arrays: walk them to find the end
            (inner, n) = U32.unpack_from(self.buf, off)[0], U64.unpack_from(self.buf, off + 4)[0]
            _, off = self.array(off + 12, inner, n, False)
        return None, off


# ----------------------------------------------------------------------------- GGUF header check
@dataclass
class GGUFHeader:
    """Metadata (arrays kept only as their length) and the extent of the tensor data."""

    version: int
    metadata: dict[str, Any]
    array_lengths: dict[str, int]
    tensor_count: int
    data_end: int  # bytes the file must have to hold every tensor

    def get(self, key: str, default: Any = None) -> Any:
        return self.metadata.get(key, default)

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", "unknown"))

    def arch_value(self, suffix: str, default: Any = None) -> Any:
        return self.metadata.get(f"{self.architecture}.{suffix}", default)


def _tensor_nbytes(ggml_type: int, shape: list[int]) -> int:
    from gguf.constants import GGML_QUANT_SIZES, GGMLQuantizationType

    try:
        block, type_size = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
    except (ValueError, KeyError):
        raise ValueError(f"unknown tensor type {ggml_type}") from None
    count = 1
    for dim in shape:
        count *= dim
    return count // block * type_size


def _tensor_data_end(buf: Any, off: int, count: int, alignment: int) -> int:
    """Walk ``count`` tensor infos from ``off``: the file size their data needs."""
    u32, u64 = U32.unpack_from, U64.unpack_from
    data_end = 0
    for _ in range(count):
        off += 8 + u64(buf, off)[0]  # name
        (n_dims,) = u32(buf, off)
        dims = [u64(buf, off + 4 + 8 * k)[0] for k in range(n_dims)]
        off += 4 + 8 * n_dims
        ggml_type, offset = u32(buf, off)[0], u64(buf, off + 4)[0]
        off += 12
        data_end = max(data_end, offset + _tensor_nbytes(ggml_type, dims))
    start = off + (-off) % alignment
    return start + data_end


def read_gguf_header(path: str | os.PathLike) -> GGUFHeader:
    """Parse a GGUF header quickly (arrays are skipped). Raises InvalidModel with one line."""
    path = Path(path)
    size = path.stat().st_size
    if size == 0:
        raise InvalidModel(f"{path.name} is not a GGUF file")
    with open(path, "rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        try:
            kv = read_key_values(buf, keep=lambda key, is_array: not is_array)
            alignment = int(kv.values.get("general.alignment", 32)) or 32
            data_end = _tensor_data_end(buf, kv.end, kv.tensor_count, alignment)
        except NotGGUF:
            raise InvalidModel(f"{path.name} is not a GGUF file") from None
        except UnsupportedVersion as err:
            raise InvalidModel(f"{path.name}: {err}") from None
        except struct.error:
            raise InvalidModel(f"{path.name} is truncated or corrupt (the GGUF header ends early)") from None
        except ValueError as err:
            raise InvalidModel(f"{path.name} is a corrupt GGUF file: {err}") from None
    header = GGUFHeader(kv.version, kv.values, kv.array_lengths, kv.tensor_count, data_end)
    if header.data_end > size:
        raise InvalidModel(
            f"{path.name} is truncated: its tensors need {header.data_end:,} bytes, the file has {size:,}"
        )
    return header
