"""A copy of a GGUF with one field changed, written with the ``gguf`` package: a real model
(SmolLM2) given a real tool or reasoning template, for the end-to-end tests, or a real model
saying another file type."""

from __future__ import annotations

from pathlib import Path

import gguf


def with_chat_template(src: Path, dst: Path, template: str) -> Path:
    """Write ``dst``: ``src``'s metadata and tensors with ``template`` as its chat template."""
    return _copy(src, dst, "tokenizer.chat_template", lambda w: w.add_chat_template(template))


def with_file_type(src: Path, dst: Path, file_type: int) -> Path:
    """Write ``dst``: ``src`` saying its ``general.file_type`` is ``file_type`` (llama.cpp's
    ``LLAMA_FTYPE_*`` number; the tensors stay as they are)."""
    return _copy(src, dst, "general.file_type", lambda w: w.add_file_type(file_type))


def _copy(src: Path, dst: Path, replaced: str, add) -> Path:
    reader = gguf.GGUFReader(str(src))
    arch = str(reader.fields["general.architecture"].contents())
    writer = gguf.GGUFWriter(str(dst), arch)
    for name, fld in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", replaced):
            continue
        kind = fld.types[0]
        if kind == gguf.GGUFValueType.ARRAY:
            writer.add_key_value(name, fld.contents(), kind, sub_type=fld.types[-1])
        else:
            writer.add_key_value(name, fld.contents(), kind)
    add(writer)
    for tensor in reader.tensors:
        writer.add_tensor(tensor.name, tensor.data, raw_shape=tensor.data.shape, raw_dtype=tensor.tensor_type)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dst
