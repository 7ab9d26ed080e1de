"""The GGUF key/value walker shared by the model store and the tokenizer."""

from __future__ import annotations

import struct

import gguf
import numpy as np
import pytest

from runner.model import ggufmeta
from tests.conftest import STORIES


def _write(path, *, tensors=True):
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_string("general.name", "tiny")
    w.add_uint32("llama.context_length", 64)
    w.add_float32("llama.rope.freq_base", 10000.0)
    w.add_bool("tokenizer.ggml.add_bos_token", True)
    w.add_array("tokenizer.ggml.tokens", ["<s>", "a", "bé", "\u2581c"])
    w.add_array("tokenizer.ggml.scores", [0.0, -1.5, -2.0, -3.0])
    if tensors:
        w.add_tensor("t", np.ones((2, 3), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path.read_bytes()


def test_keeps_what_it_is_asked_for(tmp_path):
    data = _write(tmp_path / "m.gguf")
    kv = ggufmeta.read_key_values(data, keep=lambda key, is_array: True)
    assert kv.version == 3 and kv.tensor_count == 1
    assert kv.values["general.name"] == "tiny" and kv.values["llama.context_length"] == 64
    assert kv.values["tokenizer.ggml.tokens"] == ["<s>", "a", "bé", "\u2581c"]
    assert kv.values["tokenizer.ggml.scores"] == [0.0, -1.5, -2.0, -3.0]
    assert kv.values["tokenizer.ggml.add_bos_token"] is True
    assert kv.array_lengths == {"tokenizer.ggml.tokens": 4, "tokenizer.ggml.scores": 4}
    scalars = ggufmeta.read_key_values(data, keep=lambda key, is_array: not is_array)
    assert "tokenizer.ggml.tokens" not in scalars.values and scalars.array_lengths == kv.array_lengths
    assert scalars.end == kv.end  # skipping walks to the same place: the tensor infos
    (name_len,) = struct.unpack_from("<Q", data, kv.end)
    assert data[kv.end + 8: kv.end + 8 + name_len] == b"t"


def test_matches_the_gguf_package_on_a_real_model():
    reader = gguf.GGUFReader(str(STORIES))
    kv = ggufmeta.read_key_values(STORIES.read_bytes(), keep=lambda key, is_array: True)
    assert set(kv.values) == {k for k in reader.fields if not k.startswith("GGUF.")}
    tokens = reader.fields["tokenizer.ggml.tokens"]
    assert kv.values["tokenizer.ggml.tokens"] == [bytes(tokens.parts[i]).decode() for i in tokens.data]


def test_bad_input_raises_clear_errors(tmp_path):
    data = _write(tmp_path / "m.gguf")
    keep = lambda key, is_array: True  # noqa: E731
    with pytest.raises(ggufmeta.NotGGUF):
        ggufmeta.read_key_values(b"PK\x03\x04" + data[4:], keep)
    with pytest.raises(ggufmeta.UnsupportedVersion, match="version 7"):
        ggufmeta.read_key_values(data[:4] + struct.pack("<I", 7) + data[8:], keep)
    end = ggufmeta.read_key_values(data, keep).end
    for cut in (10, 30, end // 2, end - 3):
        with pytest.raises((struct.error, ValueError)):
            ggufmeta.read_key_values(data[:cut], keep)
