"""Image inputs: checking what a client sent, and where each image sits in a prompt.

An image arrives as bytes (a file the CLI read, base64 in a request, a data URL). It is accepted
only when Pillow decodes it as PNG, JPEG or WEBP within the size bounds below; its identity is the
sha256 of the bytes (:class:`runner.api.Image`).

In a prompt an image is a tag, as in Ollama's ``chatPrompt``: each message's images are numbered
across the conversation and written ``[img-N]`` at the head of the message's content (or in place
of a ``[img]`` placeholder the content has). The template renders the tags like any text; the
engine then splits the rendered prompt at them (:func:`split_prompt`) and puts the image's own
inputs there.
"""

from __future__ import annotations

import base64
import binascii
import collections
import dataclasses
import hashlib
import io
import re
import time
from typing import Callable, Sequence

import numpy as np

from .api import Image, InvalidRequest, Message

MAX_IMAGE_BYTES = 32 << 20  # an encoded image
MAX_IMAGE_PIXELS = 64 << 20  # width × height once decoded (Pillow's bomb check is at 89M)
FORMATS = ("PNG", "JPEG", "WEBP")
IMAGE_TAG = re.compile(r"\[img-(\d+)\]")


def image_from_bytes(data: bytes, what: str = "image") -> Image:
    """Check ``data`` decodes as a PNG, JPEG or WEBP image within the bounds; raise
    InvalidRequest with one line (naming ``what``, e.g. a file) otherwise."""
    from PIL import Image as PILImage

    if not data:
        raise InvalidRequest(f"invalid {what}: it is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise InvalidRequest(f"invalid {what}: {len(data)} bytes is more than the limit of {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        with PILImage.open(io.BytesIO(data), formats=FORMATS) as img:
            width, height = img.size
            if width < 1 or height < 1 or width * height > MAX_IMAGE_PIXELS:
                raise InvalidRequest(f"invalid {what}: {width}x{height} pixels is more than the limit")
            img.load()  # decode it all: a truncated or corrupt file fails here, not in the engine
    except InvalidRequest:
        raise
    except (PILImage.DecompressionBombError, MemoryError):
        raise InvalidRequest(f"invalid {what}: too many pixels") from None
    except Exception:  # Pillow raises many kinds for a file that is not an image or is broken
        raise InvalidRequest(f"invalid {what}: not a PNG, JPEG or WEBP image") from None
    return Image(data=data, digest=hashlib.sha256(data).hexdigest(), width=width, height=height)


def image_from_base64(text: str, what: str = "image") -> Image:
    """An image sent as base64 (Ollama's ``images``, a data URL's payload)."""
    if not isinstance(text, str):
        raise InvalidRequest(f"invalid {what}: expected a base64 string")
    try:
        data = base64.b64decode("".join(text.split()), validate=True)
    except (binascii.Error, ValueError):
        raise InvalidRequest(f"invalid {what}: not valid base64") from None
    return image_from_bytes(data, what)


def image_from_data_url(url: str, what: str = "image") -> Image:
    """An OpenAI ``image_url``: only ``data:image/...;base64,...`` URLs (pollama fetches nothing
    from the network)."""
    if not isinstance(url, str):
        raise InvalidRequest(f"invalid {what}: expected a URL string")
    if url.startswith(("http://", "https://")):
        raise InvalidRequest(f"invalid {what}: remote image URLs are not supported; send a base64 data URL")
    head, sep, payload = url.partition(",")
    if not sep or not head.startswith("data:") or not head.endswith(";base64"):
        raise InvalidRequest(f"invalid {what}: expected a data URL (data:image/png;base64,...)")
    return image_from_base64(payload, what)


def read_image_file(path: str) -> Image:
    """The CLI's image file (the path as the user wrote it, for the message)."""
    import os

    full = os.path.expanduser(path)
    try:
        size = os.path.getsize(full)
        if size > MAX_IMAGE_BYTES:
            raise InvalidRequest(f"invalid image {path}: {size} bytes is more than the limit of {MAX_IMAGE_BYTES >> 20} MiB")
        with open(full, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise InvalidRequest(f"no such image file: {path}") from None
    except IsADirectoryError:
        raise InvalidRequest(f"{path} is a directory, not an image") from None
    except OSError as err:
        raise InvalidRequest(f"cannot read image {path}: {err.strerror or err}") from None
    return image_from_bytes(data, f"image {path}")


# ------------------------------------------------------------------------------ prompt tags
def has_images(messages: Sequence[Message] | None, images: Sequence[Image] = ()) -> bool:
    return bool(images) or any(m.images for m in messages or ())


def tag_messages(messages: Sequence[Message]) -> tuple[list[Message], list[Image]]:
    """Ollama's image tags: each message's images get the next ids; a ``[img]`` in the content
    takes the tag in its place, else the tags go before the content. Returns the messages with
    tagged contents (and no images) and the images by id."""
    images: list[Image] = []
    out: list[Message] = []
    for m in messages:
        if not m.images:
            out.append(m)
            continue
        prefix, content = "", m.content
        for image in m.images:
            tag = f"[img-{len(images)}]"
            if "[img]" in content:
                content = content.replace("[img]", tag, 1)
            else:
                prefix += tag
            images.append(image)
        out.append(dataclasses.replace(m, content=prefix + content, images=[]))
    return out, images


def tag_prompt(prompt: str, images: Sequence[Image]) -> str:
    """A generate prompt sent raw with images: the tags it lacks go first, in order."""
    missing = "".join(f"[img-{i}]" for i in range(len(images)) if f"[img-{i}]" not in prompt)
    return missing + prompt


def split_prompt(text: str, images: Sequence[Image]) -> list[str | Image]:
    """The rendered prompt as text pieces and images, in order. A tag naming no image stays text."""
    out: list[str | Image] = []
    last = 0
    for match in IMAGE_TAG.finditer(text):
        index = int(match.group(1)) if len(match.group(1)) < 6 else -1
        if not 0 <= index < len(images):
            continue
        out.append(text[last:match.start()])
        out.append(images[index])
        last = match.end()
    out.append(text[last:])
    return [piece for piece in out if not isinstance(piece, str) or piece]


# ------------------------------------------------------------------ embeddings on the host
@dataclasses.dataclass
class VisionStats:
    encodes: int = 0  # vision encoder runs (one per image not in the embedding cache)
    decodes: int = 0  # images decoded into a slot
    encode_ns: int = 0


class EmbeddingCache:
    """The embeddings of the last ``size`` images, kept on the host by identity (the sha256 of
    the bytes), so an image a conversation sends again is not encoded again. Both engines'
    projectors keep one; ``stats`` counts what the encoder and the decodes did."""

    def __init__(self, size: int = 8) -> None:
        self.size = size
        self._items: collections.OrderedDict[str, np.ndarray] = collections.OrderedDict()
        self.stats = VisionStats()

    def get(self, digest: str, encode: Callable[[], np.ndarray]) -> np.ndarray:
        """The embeddings of image ``digest``: cached, or ``encode()``'s (then cached)."""
        hit = self._items.get(digest)
        if hit is not None:
            self._items.move_to_end(digest)
            return hit
        t0 = time.perf_counter_ns()
        out = encode()
        self.stats.encodes += 1
        self.stats.encode_ns += time.perf_counter_ns() - t0
        self._items[digest] = out
        while len(self._items) > self.size:
            self._items.popitem(last=False)
        return out

    def clear(self) -> None:
        self._items.clear()
