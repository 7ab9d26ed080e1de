"""Image inputs without a model: what is accepted (Pillow decodes PNG, JPEG, WEBP within bounds),
Ollama's ``[img-N]`` tags, and the CLI's image paths (Ollama's extractFileNames rules)."""

from __future__ import annotations

import base64
import hashlib
import io

import pytest
from PIL import Image as PILImage

from cli.imagefiles import attach_images, find_paths, normalize_path
from runner.api import InvalidRequest, Message, NoVision
from runner.images import (
    image_from_base64,
    image_from_bytes,
    image_from_data_url,
    split_prompt,
    tag_messages,
    tag_prompt,
)


def encoded(fmt: str, size=(20, 10)) -> bytes:
    buf = io.BytesIO()
    PILImage.new("RGB", size, (10, 200, 30)).save(buf, fmt)
    return buf.getvalue()


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP"])
def test_accepted_formats_and_identity(fmt):
    data = encoded(fmt)
    image = image_from_bytes(data)
    assert image.digest == hashlib.sha256(data).hexdigest()
    assert (image.width, image.height) == (20, 10)
    assert image_from_base64(base64.b64encode(data).decode()) == image
    assert image_from_data_url(f"data:image/{fmt.lower()};base64," + base64.b64encode(data).decode()) == image


@pytest.mark.parametrize("data, message", [
    (b"", "it is empty"),
    (b"hello, not an image", "not a PNG, JPEG or WEBP image"),
    (encoded("PNG")[:40], "not a PNG, JPEG or WEBP image"),  # truncated
    (encoded("GIF"), "not a PNG, JPEG or WEBP image"),  # a real image, not a taken format
])
def test_refused_bytes(data, message):
    with pytest.raises(InvalidRequest, match=message):
        image_from_bytes(data)


def test_too_many_pixels_is_refused_before_decoding():
    big = encoded("PNG", size=(9000, 9000))  # 81 M pixels, a few hundred KB encoded
    with pytest.raises(InvalidRequest, match="pixels is more than the limit"):
        image_from_bytes(big)


@pytest.mark.parametrize("text, message", [
    ("not base64!!", "not valid base64"),
    (base64.b64encode(b"plain text").decode(), "not a PNG, JPEG or WEBP image"),
])
def test_bad_base64(text, message):
    with pytest.raises(InvalidRequest, match=message):
        image_from_base64(text)


@pytest.mark.parametrize("url, message", [
    ("https://example.com/cat.png", "remote image URLs are not supported"),
    ("data:image/png,rawbytes", "expected a data URL"),
    ("file:///etc/passwd", "expected a data URL"),
])
def test_bad_data_urls(url, message):
    with pytest.raises(InvalidRequest, match=message):
        image_from_data_url(url)


def test_tags_number_images_across_the_conversation():
    a, b, c = (image_from_bytes(encoded("PNG", (i + 1, 3))) for i in range(3))
    tagged, images = tag_messages([
        Message("user", "look", images=[a]),
        Message("assistant", "ok"),
        Message("user", "compare [img] with this", images=[b, c]),
    ])
    assert [m.content for m in tagged] == ["[img-0]look", "ok", "[img-2]compare [img-1] with this"]
    assert images == [a, b, c] and all(not m.images for m in tagged)
    assert tag_prompt("hi [img-1]", [a, b]) == "[img-0]hi [img-1]"
    assert split_prompt("x[img-0]y[img-1]z[img-7]", [a, b]) == ["x", a, "y", b, "z[img-7]"]


# ------------------------------------------------------------------------------- CLI paths
@pytest.mark.parametrize("text, paths", [
    ("what is in ./cat.png", ["./cat.png"]),
    ("see /tmp/my\\ cat.JPG please", ["/tmp/my cat.JPG"]),
    ("look at '~/a b/c.webp' now", ["~/a b/c.webp"]),
    ("two ./a.png and ./b.jpeg", ["./a.png", "./b.jpeg"]),
    ("no image.png here", []),
    ("a url https://x.com/a.png and 1/2.png", []),
])
def test_find_paths(text, paths):
    assert [normalize_path(p) for p in find_paths(text)] == paths


def test_attach_images_reads_files_and_takes_their_paths_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "my cat.png").write_bytes(encoded("PNG"))
    (tmp_path / "dog.jpg").write_bytes(encoded("JPEG"))
    text, images, added = attach_images("what are './my cat.png' and ./dog.jpg?", vision=True)
    assert text == "what are  and ?" and len(images) == 2 and added == ["./my cat.png", "./dog.jpg"]
    text, images, _ = attach_images("describe ./my\\ cat.png", vision=True)
    assert text == "describe" and len(images) == 1
    with pytest.raises(InvalidRequest, match="no such image file: ./nope.png"):
        attach_images("and ./nope.png", vision=True)
    (tmp_path / "fake.png").write_text("not an image")
    with pytest.raises(InvalidRequest, match="not a PNG, JPEG or WEBP image"):
        attach_images("and ./fake.png", vision=True)
    # a model without vision: text stays text, unless it names an image that exists
    assert attach_images("and ./nope.png", vision=False) == ("and ./nope.png", [], [])
    with pytest.raises(NoVision):
        attach_images("describe ./dog.jpg", vision=False)
