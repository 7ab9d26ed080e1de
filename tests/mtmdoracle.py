"""libmtmd (llama.cpp's multimodal library, bound in ``llama_cpp.mtmd_cpp``) as the oracle for
image embeddings: load a projector beside a text model, turn an image into a bitmap (decoded by
libmtmd from the file's bytes, or from raw RGB pixels), tokenize a prompt holding the default
media marker, encode the image chunk and read the embeddings libmtmd would hand the text model.

    with MtmdOracle(text_gguf, mmproj_gguf, flash=True) as oracle:
        emb = oracle.embed_file(path)          # (n_tokens, n_embd) float32
        emb = oracle.embed_rgb(pixels)         # pixels: (height, width, 3) uint8
        oracle.decoded(path)                   # the RGB pixels libmtmd decoded (stb_image)

The text model is loaded in full (mmap-ed, so cheap): with ``vocab_only`` its embedding width reads
0 and libmtmd would skip its check that the projector's output width matches the text model.
"""

from __future__ import annotations

import ctypes
import time
from dataclasses import dataclass
from pathlib import Path

import llama_cpp
import numpy as np
from llama_cpp import mtmd_cpp as M

__all__ = ["ImageChunk", "MtmdOracle"]

THREADS = 1  # the tests compare at one thread: on a loaded machine GGML's spinning barriers cost more than they give


@llama_cpp.llama_log_callback
def _quiet(level: int, text: bytes, user: int) -> None:
    pass


def _silence() -> None:
    """llama.cpp and libmtmd log to stderr by default; tests want their own output only."""
    llama_cpp.llama_log_set(_quiet, None)
    M.mtmd_log_set(_quiet, None)
    M.mtmd_helper_log_set(_quiet, None)


@dataclass(frozen=True)
class ImageChunk:
    """What libmtmd made of one image in a prompt: token count, positions, and embeddings."""

    n_tokens: int
    n_pos: int
    nx: int
    ny: int
    embeddings: np.ndarray  # (n_tokens, n_embd) float32
    text_before: list[int]  # the tokens of the text chunk before the image (markers included)
    text_after: list[int]
    tokenize_ns: int = 0  # mtmd_tokenize: preprocessing (resize, normalise) happens here
    encode_ns: int = 0  # mtmd_encode_chunk: the encoder graph


class MtmdOracle:
    """One mtmd context over a projector file and a (vocabulary-only) text model."""

    def __init__(self, text_model: Path, mmproj: Path, *, flash: bool = True, threads: int = THREADS) -> None:
        _silence()
        llama_cpp.llama_backend_init()
        mp = llama_cpp.llama_model_default_params()
        mp.use_extra_bufts = False  # its weights are never used: do not spend the load repacking them
        self.model = llama_cpp.llama_model_load_from_file(str(text_model).encode(), mp)
        if not self.model:
            raise RuntimeError(f"llama.cpp cannot load {text_model}")
        self.n_embd = llama_cpp.llama_model_n_embd(self.model)
        params = M.mtmd_context_params_default()
        params.use_gpu = False
        params.print_timings = False
        params.n_threads = threads
        params.flash_attn_type = 1 if flash else 0  # LLAMA_FLASH_ATTN_TYPE_ENABLED / _DISABLED
        params.warmup = False
        self.ctx = M.mtmd_init_from_file(str(mmproj).encode(), self.model, params)
        if not self.ctx:
            llama_cpp.llama_model_free(self.model)
            raise RuntimeError(f"libmtmd cannot load the projector {mmproj}")
        self.marker = M.mtmd_default_marker().decode()

    def tokenize(self, text: str, add_special: bool) -> list[int]:
        """The text model's tokens of ``text`` (special tokens parsed), as libmtmd makes them."""
        raw = text.encode()
        vocab = llama_cpp.llama_model_get_vocab(self.model)
        buf = (llama_cpp.llama_token * (len(raw) + 16))()
        n = llama_cpp.llama_tokenize(vocab, raw, len(raw), buf, len(buf), add_special, True)
        if n < 0:
            raise RuntimeError(f"llama_tokenize returned {n}")
        return list(buf[:n])

    # --- bitmaps ----------------------------------------------------------------------------------
    def _bitmap_from_file(self, path: Path) -> int:
        data = Path(path).read_bytes()
        buf = (ctypes.c_uint8 * len(data)).from_buffer_copy(data)
        bitmap = M.mtmd_helper_bitmap_init_from_buf(self.ctx, buf, len(data), False)
        if not bitmap:
            raise ValueError(f"libmtmd cannot decode {path}")
        return bitmap

    @staticmethod
    def _bitmap_from_rgb(pixels: np.ndarray) -> int:
        pixels = np.ascontiguousarray(pixels, dtype=np.uint8)
        if pixels.ndim != 3 or pixels.shape[2] != 3:
            raise ValueError(f"want (height, width, 3) uint8 pixels, got {pixels.shape}")
        h, w, _ = pixels.shape
        buf = (ctypes.c_uint8 * pixels.size).from_buffer_copy(pixels.tobytes())
        bitmap = M.mtmd_bitmap_init(w, h, buf)
        if not bitmap:
            raise ValueError("mtmd_bitmap_init failed")
        return bitmap

    def decoded(self, path: Path) -> np.ndarray:
        """The RGB pixels libmtmd decodes from ``path`` (stb_image), ``(height, width, 3)``."""
        bitmap = self._bitmap_from_file(path)
        try:
            w, h = M.mtmd_bitmap_get_nx(bitmap), M.mtmd_bitmap_get_ny(bitmap)
            n = M.mtmd_bitmap_get_n_bytes(bitmap)
            data = ctypes.string_at(M.mtmd_bitmap_get_data(bitmap), n)
            return np.frombuffer(data, dtype=np.uint8).reshape(h, w, 3).copy()
        finally:
            M.mtmd_bitmap_free(bitmap)

    # --- tokenize + encode ----------------------------------------------------------------------
    def embed_file(self, path: Path, prompt: str | None = None) -> np.ndarray:
        """Embeddings of the image in ``path`` as libmtmd decodes and encodes it."""
        return self.image_chunk(self._bitmap_from_file(path), prompt).embeddings

    def embed_rgb(self, pixels: np.ndarray, prompt: str | None = None) -> np.ndarray:
        """Embeddings of raw RGB pixels ``(height, width, 3)`` uint8."""
        return self.image_chunk(self._bitmap_from_rgb(pixels), prompt).embeddings

    def image_chunk(self, bitmap: int, prompt: str | None = None) -> ImageChunk:
        """Tokenize ``prompt`` (default: ``"Describe <marker> please"``) with ``bitmap`` for its
        one marker, encode the image chunk and return it. Frees ``bitmap``."""
        text = prompt if prompt is not None else f"Describe {self.marker} please"
        chunks = M.mtmd_input_chunks_init()
        try:
            inp = M.mtmd_input_text(text.encode(), len(text.encode()), True, True)
            bitmaps = (M.mtmd_bitmap_p_ctypes * 1)(bitmap)
            t0 = time.perf_counter_ns()
            rc = M.mtmd_tokenize(self.ctx, chunks, ctypes.byref(inp), bitmaps, 1)
            tokenize_ns = time.perf_counter_ns() - t0
            if rc != 0:
                raise RuntimeError(f"mtmd_tokenize returned {rc}")
            kinds = []
            texts: list[list[int]] = []
            image: ImageChunk | None = None
            for i in range(M.mtmd_input_chunks_size(chunks)):
                chunk = M.mtmd_input_chunks_get(chunks, i)
                kind = M.mtmd_input_chunk_get_type(chunk)
                kinds.append(kind)
                if kind == M.MTMD_INPUT_CHUNK_TYPE_TEXT:
                    n = ctypes.c_size_t()
                    toks = M.mtmd_input_chunk_get_tokens_text(chunk, ctypes.byref(n))
                    texts.append([toks[j] for j in range(n.value)])
                elif kind == M.MTMD_INPUT_CHUNK_TYPE_IMAGE:
                    t0 = time.perf_counter_ns()
                    rc = M.mtmd_encode_chunk(self.ctx, chunk)
                    encode_ns = time.perf_counter_ns() - t0
                    if rc != 0:
                        raise RuntimeError(f"mtmd_encode_chunk returned {rc}")
                    n_tokens = M.mtmd_input_chunk_get_n_tokens(chunk)
                    tokens = M.mtmd_input_chunk_get_tokens_image(chunk)
                    out = M.mtmd_get_output_embd(self.ctx)
                    emb = np.ctypeslib.as_array(out, shape=(n_tokens * self.n_embd,)).copy()
                    image = ImageChunk(
                        n_tokens=n_tokens,
                        n_pos=M.mtmd_input_chunk_get_n_pos(chunk),
                        nx=M.mtmd_image_tokens_get_nx(tokens),
                        ny=M.mtmd_image_tokens_get_ny(tokens),
                        embeddings=emb.reshape(n_tokens, self.n_embd),
                        text_before=[],
                        text_after=[],
                        tokenize_ns=tokenize_ns,
                        encode_ns=encode_ns,
                    )
            if image is None:
                raise RuntimeError(f"no image chunk in {kinds}")
            idx = kinds.index(M.MTMD_INPUT_CHUNK_TYPE_IMAGE)
            before = texts[0] if idx > 0 else []
            after = texts[-1] if idx < len(kinds) - 1 else []
            return ImageChunk(**{**image.__dict__, "text_before": before, "text_after": after})
        finally:
            M.mtmd_input_chunks_free(chunks)
            M.mtmd_bitmap_free(bitmap)

    def close(self) -> None:
        if self.ctx:
            M.mtmd_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None

    def __enter__(self) -> MtmdOracle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
