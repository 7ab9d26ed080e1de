"""Image bytes -> the pixels a vision encoder reads: decode, fit into one square tile, normalise.

This is what llama.cpp's libmtmd does for gemma3 (``mtmd_image_preprocessor_fixed_size`` in
``tools/mtmd``), step for step, so that both engines see the same pixels:

1. **decode** to 8-bit RGB (an alpha channel is dropped, not composited; grey and palette images
   are expanded to RGB; EXIF orientation is ignored, as stb_image ignores it);
2. **fit** into an ``size x size`` tile keeping the aspect ratio: scale by
   ``min(size / w, size / h)`` (single precision), round each side *up* (at most ``size``),
   resample with Pillow's bilinear filter (clip.cpp's resampler is a port of Pillow's: same
   22-bit fixed-point weights; one pass per side, horizontal first) and centre it on black;
3. **normalise**: ``(v / 255 - mean[c]) / std[c]`` in float32, laid out channel-first
   ``(3, size, size)`` (GGML ``[size, size, 3]``).

Pixels decoded from a JPEG can differ from libmtmd's by a few levels: libmtmd decodes with
stb_image, Pillow with libjpeg(-turbo), and their IDCT and colour conversion round differently.
PNG and WEBP (lossless) decode to the same pixels.
"""

from __future__ import annotations

import io

import numpy as np

from runner.api import InvalidRequest

__all__ = ["FORMATS", "decode", "fit_square", "normalize", "preprocess"]

FORMATS = ("PNG", "JPEG", "WEBP")


def decode(data: bytes) -> np.ndarray:
    """The image in ``data`` (PNG, JPEG or WEBP) as RGB pixels ``(height, width, 3)`` uint8.
    Raises :class:`~runner.api.InvalidRequest` (one line) for anything else."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as img:
            if img.mode == "RGB":
                rgb = np.asarray(img)
            elif img.mode in ("I;16", "I;16B", "I;16L", "I"):  # 16-bit grey: keep the high byte
                grey = (np.asarray(img).astype(np.uint32) >> 8).astype(np.uint8)
                rgb = np.repeat(grey[..., None], 3, axis=2)
            else:  # RGBA/LA drop alpha, L/P/CMYK/YCbCr convert
                rgb = np.asarray(img.convert("RGB"))
    except (Image.DecompressionBombError, MemoryError):
        raise InvalidRequest("invalid image: too many pixels") from None
    except Exception:  # Pillow raises many kinds for bytes that are not an image or are broken
        raise InvalidRequest("invalid image: not a PNG, JPEG or WEBP image") from None
    if rgb.ndim != 3 or rgb.shape[2] != 3 or rgb.shape[0] < 1 or rgb.shape[1] < 1:
        raise InvalidRequest(f"invalid image: cannot read {rgb.shape} pixels as RGB")
    return np.ascontiguousarray(rgb, dtype=np.uint8)


def fitted_size(width: int, height: int, size: int) -> tuple[int, int]:
    """The resized ``(width, height)`` of a ``width x height`` image fitted into ``size x size``
    (clip.cpp's ``PAD_CEIL``: a float32 scale, sides rounded up, at most ``size``)."""
    f = np.float32
    scale = min(f(size) / f(width), f(size) / f(height))
    new_w = min(int(np.ceil(f(width) * scale)), size)
    new_h = min(int(np.ceil(f(height) * scale)), size)
    return max(new_w, 1), max(new_h, 1)


def fit_square(rgb: np.ndarray, size: int) -> np.ndarray:
    """``rgb (h, w, 3)`` uint8 resized (bilinear) to fit ``size x size`` and centred on black."""
    from PIL import Image

    h, w, _ = rgb.shape
    if (w, h) == (size, size):
        return rgb
    new_w, new_h = fitted_size(w, h, size)
    # clip.cpp always resamples horizontally first (the 8-bit intermediate rounds); Pillow picks
    # its own order when both sides change, so ask it for one side at a time.
    img = Image.fromarray(rgb, "RGB")
    if new_w != w:
        img = img.resize((new_w, h), Image.Resampling.BILINEAR)
    if new_h != h:
        img = img.resize((new_w, new_h), Image.Resampling.BILINEAR)
    resized = np.asarray(img)
    tile = np.zeros((size, size, 3), dtype=np.uint8)
    x0, y0 = (size - new_w) // 2, (size - new_h) // 2
    tile[y0 : y0 + new_h, x0 : x0 + new_w] = resized
    return tile


def normalize(rgb: np.ndarray, mean: tuple[float, float, float], std: tuple[float, float, float]) -> np.ndarray:
    """``(rgb / 255 - mean) / std`` per channel in float32, channel-first ``(3, h, w)``."""
    x = rgb.astype(np.float32) / np.float32(255.0)
    x = (x - np.asarray(mean, dtype=np.float32)) / np.asarray(std, dtype=np.float32)
    return np.ascontiguousarray(x.transpose(2, 0, 1))


def preprocess(
    data: bytes, size: int, mean: tuple[float, float, float], std: tuple[float, float, float]
) -> np.ndarray:
    """Decode, fit and normalise: the ``(3, size, size)`` float32 pixels of the image ``data``."""
    return normalize(fit_square(decode(data), size), mean, std)
