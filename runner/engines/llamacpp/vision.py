"""Images on the old engine: llama.cpp's multimodal library (libmtmd) through llama-cpp-python's
``mtmd_cpp`` ctypes bindings.

:class:`Projector` loads the projector GGUF (``mmproj``) next to the text model and turns each
image into inputs for the slot: the model's own wrapping tokens (gemma3: ``<start_of_image>`` ...
``<end_of_image>``) as token ids, and one :class:`~runner.loop.slots.ImageInput` per position the
image fills, all carrying the image's identity (the sha256 of its bytes). The libmtmd chunk rides
on those inputs (not compared), so the loop can later :meth:`~Projector.decode` it at its
positions of a slot's sequence. Encoding (the vision tower) runs once per image: the embeddings
stay on the host in a small cache keyed by identity, and a slot that already holds the image's
positions needs neither encode nor decode (the slot cache's prefix match).

Decoding goes through ``mtmd_helper_decode_image_chunk``, which batches the embeddings and turns
causal attention off for models whose image tokens attend to each other both ways (gemma3:
``mtmd_decode_use_non_causal``); such an image must fit in one batch.
"""

from __future__ import annotations

import ctypes
import io
import logging
import threading
from typing import Any

import llama_cpp as L
import llama_cpp.mtmd_cpp as M
import numpy as np

from ...api import Image, InvalidModel, InvalidRequest, LoadError
from ...images import EmbeddingCache
from ...loop.slots import ImageInput, Input
from .llamalog import log_callback

log = logging.getLogger(__name__)
mtmd_log = logging.getLogger("llama.cpp.mtmd")

MTMD_INPUT_CHUNK_TYPE_TEXT = 0
MTMD_INPUT_CHUNK_TYPE_IMAGE = 1


_LOG_CALLBACK = log_callback(mtmd_log)  # kept alive for the process's lifetime
M.mtmd_helper_log_set(_LOG_CALLBACK, None)


class ImageChunk:
    """One image as libmtmd tokenized it: the chunk (freed with this object), how many positions
    it fills, and whether its tokens attend to each other non-causally."""

    def __init__(self, handle: int, digest: str, n_tokens: int, non_causal: bool) -> None:
        self.handle, self.digest, self.n_tokens, self.non_causal = handle, digest, n_tokens, non_causal

    def __del__(self) -> None:
        handle, self.handle = self.handle, 0
        if handle and M is not None:  # None at interpreter shutdown
            M.mtmd_input_chunk_free(handle)


class Projector:
    """libmtmd for one loaded text model. Tokenizing may run on any thread; encode and decode run
    on the loop thread (they use the llama context)."""

    def __init__(self, path: str, model: Any, n_threads: int, n_embd: int, flash_attention: bool = False) -> None:
        """``flash_attention`` as the text model runs (not libmtmd's own "auto"): the new engine's
        encoder follows the same setting, so both engines make the same embeddings."""
        params = M.mtmd_context_params_default()
        params.use_gpu = False
        params.n_threads = max(1, n_threads)
        params.print_timings = False
        params.warmup = False
        params.flash_attn_type = L.LLAMA_FLASH_ATTN_TYPE_ENABLED if flash_attention else L.LLAMA_FLASH_ATTN_TYPE_DISABLED
        self._ctx = M.mtmd_init_from_file(path.encode(), model, params)
        if not self._ctx:
            raise InvalidModel(f"cannot load the vision projector {path}: libmtmd refused it (see OLLAMA_DEBUG=2)")
        if not M.mtmd_support_vision(self._ctx):
            M.mtmd_free(self._ctx)
            self._ctx = None
            raise InvalidModel(f"the projector {path} has no vision encoder")
        self._marker = M.mtmd_default_marker()
        self._n_embd = n_embd
        self._lock = threading.Lock()  # tokenize (any thread) vs. close
        self._embeddings = EmbeddingCache()
        self.stats = self._embeddings.stats

    # ------------------------------------------------------------------------- tokenize
    def image_inputs(self, image: Image) -> list[Input]:
        """The inputs ``image`` fills: the wrapping tokens and one ImageInput per position."""
        rgb, width, height = _rgb(image)
        with self._lock:
            if not self._ctx:
                raise LoadError("the model was unloaded")
            bitmap = M.mtmd_bitmap_init(width, height, rgb)
            if not bitmap:
                raise InvalidRequest("invalid image: libmtmd cannot take it")
            chunks = M.mtmd_input_chunks_init()
            try:
                M.mtmd_bitmap_set_id(bitmap, image.digest.encode())
                text = M.mtmd_input_text(self._marker, len(self._marker), False, True)
                bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
                rc = M.mtmd_tokenize(self._ctx, chunks, ctypes.byref(text), bitmaps, 1)
                if rc != 0:
                    raise InvalidRequest(f"invalid image: libmtmd could not preprocess it (code {rc})")
                return self._inputs(chunks, image.digest)
            finally:
                M.mtmd_input_chunks_free(chunks)
                M.mtmd_bitmap_free(bitmap)

    def _inputs(self, chunks: int, digest: str) -> list[Input]:
        out: list[Input] = []
        for i in range(M.mtmd_input_chunks_size(chunks)):
            chunk = M.mtmd_input_chunks_get(chunks, i)
            kind = M.mtmd_input_chunk_get_type(chunk)
            if kind == MTMD_INPUT_CHUNK_TYPE_TEXT:
                n = ctypes.c_size_t(0)
                tokens = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                out.extend(int(tokens[k]) for k in range(n.value))
            elif kind == MTMD_INPUT_CHUNK_TYPE_IMAGE:
                n_tokens = int(M.mtmd_input_chunk_get_n_tokens(chunk))
                if int(M.mtmd_input_chunk_get_n_pos(chunk)) != n_tokens:
                    raise InvalidRequest("this projector places images by M-RoPE positions, which pollama does not support yet")
                held = ImageChunk(M.mtmd_input_chunk_copy(chunk), digest, n_tokens,
                                  bool(M.mtmd_decode_use_non_causal(self._ctx, chunk)))
                out.extend(ImageInput(digest, k, n_tokens, held) for k in range(n_tokens))
            else:
                raise InvalidRequest("only image inputs are supported")
        return out

    # ---------------------------------------------------------------------- encode/decode
    def embedding(self, chunk: ImageChunk) -> np.ndarray:
        """The image's embeddings (n_tokens × n_embd), from the cache or from the vision tower."""
        def encode() -> np.ndarray:
            rc = M.mtmd_encode_chunk(self._ctx, chunk.handle)
            if rc != 0:
                raise LoadError(f"the vision encoder failed (code {rc})")
            ptr = M.mtmd_get_output_embd(self._ctx)
            return np.ctypeslib.as_array(ptr, shape=(chunk.n_tokens * self._n_embd,)).copy()

        return self._embeddings.get(chunk.digest, encode)

    def decode(self, lctx: Any, chunk: ImageChunk, pos: int, seq_id: int, n_batch: int) -> None:
        """Put the image's embeddings at positions pos.. of ``seq_id`` in the KV cache."""
        embd = self.embedding(chunk)
        new_pos = L.llama_pos(0)
        rc = M.mtmd_helper_decode_image_chunk(
            self._ctx, lctx, chunk.handle, embd.ctypes.data_as(ctypes.POINTER(ctypes.c_float)),
            pos, seq_id, n_batch, ctypes.byref(new_pos), M.mtmd_helper_post_decode_callback(), None)
        if rc != 0:
            raise LoadError(f"decoding the image failed (code {rc})")
        self.stats.decodes += 1

    def close(self) -> None:
        with self._lock:
            if self._ctx:
                M.mtmd_free(self._ctx)
                self._ctx = None
            self._embeddings.clear()


def _rgb(image: Image) -> tuple[Any, int, int]:
    """The image's pixels as RGB bytes for ``mtmd_bitmap_init``. Pillow decodes PNG, JPEG and WEBP
    alike (libmtmd's own loader, stb_image, has no WEBP); an alpha channel is dropped, as
    stb_image's 3-channel load does. JPEG decoders may differ from stb_image by a level here and
    there; PNG pixels are identical."""
    from PIL import Image as PILImage

    with PILImage.open(io.BytesIO(image.data)) as img:
        rgb = img.convert("RGB")
    width, height = rgb.size
    data = rgb.tobytes()
    return (ctypes.c_uint8 * len(data)).from_buffer_copy(data), width, height
