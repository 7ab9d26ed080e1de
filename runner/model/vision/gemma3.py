"""Gemma 3's vision path (Gemma Team 2025): a SigLIP tower and the projector that turns its
patches into a few soft tokens of the text model's width.

    x = VisionTransformer(patches)                # [width, side * side]
    x = AvgPool2d(k)(x as side x side x width)     # k = side / tokens_per_side (4 for Gemma 3)
    x = RMSNorm(x) * soft_emb_norm                 # per token, over width
    x = input_projection^T x                      # [text_width, (side / k)^2]

One image is one square tile (:mod:`runner.model.vision.preprocess`), so the graph has one shape:
it is built once and re-run for every image with new pixels. The encoder runs in its own graph,
not the text model's; the text model places the result at the image's positions.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from runner.ml.backend import BackendOptions
from runner.ml.ggml.backend import GGMLBackend, GraphContext
from runner.ml.ggml.backend import GGMLTensor as Tensor
from runner.model.gguf_weights import GGUFError, GGUFFile, Weights
from runner.model.nn import RMSNorm
from runner.model.vision.preprocess import preprocess
from runner.model.vision.siglip import SigLIPConfig, VisionTransformer, patchify

log = logging.getLogger(__name__)

__all__ = ["Gemma3Projector", "Gemma3Vision"]

DEFAULT_SCALE_FACTOR = 4  # every Gemma 3 size; clip.cpp reads clip.vision.projector.scale_factor if present


class Gemma3Projector:
    """Average-pool the patch grid by ``scale_factor`` per side, RMS-normalise, project."""

    def __init__(self, w: Weights, c: SigLIPConfig, scale_factor: int) -> None:
        self.soft_emb_norm = RMSNorm(w["mm.soft_emb_norm.weight"], c.eps)
        self.input_projection = w["mm.input_projection.weight"]  # [text_width, width]
        if self.input_projection.dim(1) != c.n_embd:
            raise GGUFError(f"mm.input_projection.weight is {list(self.input_projection.shape)}, width {c.n_embd}")
        self.side = c.patches_per_side
        self.k = scale_factor
        self.width = c.n_embd

    def __call__(self, ctx: GraphContext, x: Tensor) -> Tensor:
        side, k = self.side, self.k
        x = x.transpose().contiguous(side, side, self.width)  # [side, side, width]: the patch grid
        x = x.avg_pool_2d(k)  # [side / k, side / k, width]
        x = x.reshape((side // k) ** 2, self.width).transpose().contiguous()  # [width, n_tokens]
        x = self.soft_emb_norm(x)
        return self.input_projection.on(ctx).transpose().contiguous().mulmat(x)  # [text_width, n_tokens]


class Gemma3Vision:
    """The image encoder of a gemma3 projector file (``clip.projector_type = gemma3``). One
    caller at a time (the batch loop): the graph is built once and re-run."""

    def __init__(self, gguf: GGUFFile, weights: Weights, backend: GGMLBackend) -> None:
        self.gguf = gguf
        self.weights = weights
        self.backend = backend
        c = self.config = SigLIPConfig.from_gguf(gguf)
        k = int(gguf.get("clip.vision.projector.scale_factor", DEFAULT_SCALE_FACTOR))
        if k < 1 or c.patches_per_side % k:
            raise GGUFError(f"{c.patches_per_side} patches per side do not pool by scale_factor {k}")
        self.tower = VisionTransformer(weights, c)
        self.projector = Gemma3Projector(weights, c, k)
        self.n_tokens = (c.patches_per_side // k) ** 2
        self.n_embd = self.projector.input_projection.dim(0)
        self._graph: tuple[GraphContext, Tensor] | None = None
        self._out = np.empty((self.n_tokens, self.n_embd), dtype=np.float32)
        self.encode_ns = 0  # cumulative time in encode()
        self.encodes = 0

    @classmethod
    def load(cls, path: str | os.PathLike[str], options: BackendOptions | None = None) -> Gemma3Vision:
        """Open a gemma3 projector GGUF (:func:`runner.model.vision.load_projector` checks its
        kind) and map its weights. Raises GGUFError."""
        gguf = GGUFFile.open(path)
        try:
            weights = gguf.load_weights()
        except Exception:
            gguf.close()
            raise
        backend = GGMLBackend(options)
        try:
            return cls(gguf, weights, backend)
        except Exception:
            weights.close()
            backend.close()
            gguf.close()
            raise

    # --- images ---------------------------------------------------------------------------------
    def preprocess(self, data: bytes) -> np.ndarray:
        """The encoder's input for the image ``data``: ``(3, size, size)`` float32."""
        c = self.config
        return preprocess(data, c.image_size, c.image_mean, c.image_std)

    def _build(self, patches: np.ndarray) -> tuple[GraphContext, Tensor]:
        ctx = self.backend.new_context()
        x = self.tower(ctx, ctx.input("patches", patches), self.backend.flash_attention)
        return ctx, self.projector(ctx, x)

    def reserve(self) -> int:
        """Build the image graph and size the compute buffer for it; returns its bytes."""
        c = self.config
        dummy = np.zeros((c.n_patches, 3 * c.patch_size**2), dtype=np.float16)
        if self._graph is None:
            self._graph = self._build(dummy)
        ctx, out = self._graph
        return ctx.reserve(out)

    def encode(self, pixels: np.ndarray) -> np.ndarray:
        """Soft tokens of one preprocessed image ``(3, size, size)``: ``(n_tokens, n_embd)``
        float32 (a new array)."""
        c = self.config
        if pixels.shape != (3, c.image_size, c.image_size):
            raise ValueError(f"pixels of shape {pixels.shape}, the encoder reads {(3, c.image_size, c.image_size)}")
        t0 = time.perf_counter_ns()
        patches = patchify(pixels, c.patch_size)
        if self._graph is None:
            self._graph = self._build(patches)
        else:
            self._graph[0].set_input("patches", patches)
        ctx, out = self._graph
        ctx.compute(out)
        out.read_into(self._out)
        self.encode_ns += time.perf_counter_ns() - t0
        self.encodes += 1
        return self._out.copy()

    def close(self) -> None:
        if self._graph is not None:
            self._graph[0].close()
            self._graph = None
        self.weights.close()
        self.backend.close()
        self.gguf.close()
