"""gemma3's vision path on the new engine (``runner.model.vision``), judged against libmtmd:
real PNG, JPEG and WEBP files written here with Pillow (several sizes and aspect ratios, so the
square-tile fit resizes up, down, one side only, or not at all) go through our preprocessing and
encoder and through libmtmd 0.3.36 with the same random-weight gemma3 projector
(``tests/mmproj.py``) beside gemma-3-270m; the soft tokens must agree to float rounding, with and
without flash attention.

JPEG is compared twice: from the same decoded pixels (tight), and file to file, where libmtmd's
stb_image and Pillow's libjpeg round the IDCT differently by a few levels (a bounded, reported
difference).
"""

from __future__ import annotations

import io
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest
from PIL import Image

from runner.api import InvalidRequest
from runner.ml.backend import BackendOptions
from runner.model.gguf_weights import GGUFError
from runner.model.multimodal import ImageInput, gemma3_post_tokenize
from runner.model.vision import ImageEncoder, load_projector
from runner.model.vision.preprocess import decode, fit_square, fitted_size
from tests.mmproj import MMProjSpec, write_mmproj
from tests.mtmdoracle import THREADS, MtmdOracle
from tests.test_gemma3 import gemma3  # noqa: F401  (the gemma-3-270m fixture)

TIGHT = 1e-4  # float rounding; one pixel level off moves the soft tokens by ~1e-2
SPEC = MMProjSpec()
# (width, height): square (no resize), landscape/portrait down, upscaled, thin, odd
SIZES = [(224, 224), (300, 200), (97, 311), (640, 480), (50, 50), (224, 100), (7, 400), (1023, 769)]


def picture(width: int, height: int, seed: int = 0) -> np.ndarray:
    """An RGB picture with smooth gradients, hard edges and noise (every resize path matters)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    r = 255 * x / max(width - 1, 1)
    g = 255 * y / max(height - 1, 1)
    b = np.where((x // 9 + y // 13) % 2 == 0, 230.0, 25.0)
    img = np.stack([r, g, b], axis=-1) + rng.normal(0, 12, (height, width, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def save(pixels: np.ndarray, path: Path, **kw) -> Path:
    Image.fromarray(pixels).save(path, **kw)
    return path


@pytest.fixture(scope="module")
def mmproj(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_mmproj(tmp_path_factory.mktemp("mmproj") / "mmproj-gemma3-random.gguf", SPEC, seed=3)


@pytest.fixture(scope="module", params=[True, False], ids=["fa", "nofa"])
def pair(request: pytest.FixtureRequest, gemma3: Path, mmproj: Path) -> Iterator[tuple[ImageEncoder, MtmdOracle]]:  # noqa: F811
    flash = request.param
    oracle = MtmdOracle(gemma3, mmproj, flash=flash)
    enc = load_projector(mmproj, BackendOptions(num_threads=THREADS, flash_attention=flash))
    yield enc, oracle
    enc.close()
    oracle.close()


def _report(what: str, ours: np.ndarray, want: np.ndarray) -> float:
    assert ours.shape == want.shape == (SPEC.n_tokens, SPEC.text_width)
    diff = float(np.abs(ours - want).max())
    print(f"{what}: max abs diff {diff:.3g} (values up to {np.abs(want).max():.2f})")
    return diff


@pytest.mark.parametrize("size", SIZES, ids=[f"{w}x{h}" for w, h in SIZES])
def test_png_matches_libmtmd(pair, tmp_path: Path, size: tuple[int, int]) -> None:
    enc, oracle = pair
    path = save(picture(*size), tmp_path / "p.png")
    ours = enc.encode(enc.preprocess(path.read_bytes()))
    assert _report(f"PNG {size}", ours, oracle.embed_file(path)) < TIGHT


@pytest.mark.parametrize("size", [(300, 200), (97, 311), (1023, 769)], ids=["300x200", "97x311", "1023x769"])
@pytest.mark.parametrize("subsampling", [0, 2], ids=["444", "420"])
def test_jpeg_matches_libmtmd(pair, tmp_path: Path, size: tuple[int, int], subsampling: int) -> None:
    enc, oracle = pair
    path = save(picture(*size, seed=1), tmp_path / "p.jpg", quality=85, subsampling=subsampling)
    data = path.read_bytes()
    ours = enc.encode(enc.preprocess(data))
    # the same decoded pixels through libmtmd: preprocessing + encoder agree exactly
    assert _report(f"JPEG {size} same pixels", ours, oracle.embed_rgb(decode(data))) < TIGHT
    # file to file: stb_image and libjpeg decode a few levels apart, and so do the tokens
    levels = int(np.abs(oracle.decoded(path).astype(int) - decode(data)).max())
    assert levels <= 4
    assert _report(f"JPEG {size} file ({levels} levels apart)", ours, oracle.embed_file(path)) < 0.05


def test_gemma3_geometry_matches_libmtmd(gemma3: Path, tmp_path: Path) -> None:  # noqa: F811
    """Gemma 3's own geometry (896 px, 64 x 64 = 4096 patches pooled 4 x 4 to 256 tokens) on a
    narrow tower: the long attention and the pooling agree too."""
    spec = MMProjSpec(image_size=896, width=72, n_head=1, n_ff=128, n_layer=1)
    proj = write_mmproj(tmp_path / "mmproj-896.gguf", spec, seed=5)
    path = save(picture(1200, 900, seed=6), tmp_path / "p.png")
    for flash in (True, False):
        with MtmdOracle(gemma3, proj, flash=flash) as oracle:
            enc = load_projector(proj, BackendOptions(num_threads=THREADS, flash_attention=flash))
            try:
                assert enc.reserve() > 0  # the compute buffer for the image graph, sized up front
                ours = enc.encode(enc.preprocess(path.read_bytes()))
                want = oracle.embed_file(path)
            finally:
                enc.close()
        assert ours.shape == want.shape == (256, 640)
        diff = float(np.abs(ours - want).max())
        print(f"896 px, 256 tokens, flash={flash}: max abs diff {diff:.3g}")
        assert diff < TIGHT


def test_alpha_grey_and_palette_pngs_decode_as_libmtmd_does(pair, tmp_path: Path) -> None:
    """Alpha is dropped (not composited), grey and palette images expand to RGB, 16-bit grey
    keeps its high byte."""
    enc, oracle = pair
    rgb = picture(200, 150, seed=2)
    alpha = np.linspace(0, 255, 200 * 150, dtype=np.uint8).reshape(150, 200, 1)
    images = {
        "rgba": Image.fromarray(np.concatenate([rgb, alpha], axis=-1), "RGBA"),
        "grey": Image.fromarray(rgb[..., 1], "L"),
        "grey16": Image.fromarray(rgb[..., 0].astype(np.uint16) * 256 + 100),
        "palette": Image.fromarray(rgb).quantize(64),
    }
    for name, img in images.items():
        path = tmp_path / f"{name}.png"
        img.save(path)
        assert np.array_equal(decode(path.read_bytes()), oracle.decoded(path)), name
        ours = enc.encode(enc.preprocess(path.read_bytes()))
        assert _report(f"PNG {name}", ours, oracle.embed_file(path)) < TIGHT


def test_lossless_webp_matches_libmtmd_on_its_pixels(pair) -> None:
    """libmtmd 0.3.36 decodes WEBP only through ffmpeg (not built in): compare from the pixels."""
    enc, oracle = pair
    rgb = picture(333, 250, seed=4)
    buf = io.BytesIO()
    Image.fromarray(rgb).save(buf, format="WEBP", lossless=True)
    assert np.array_equal(decode(buf.getvalue()), rgb)
    ours = enc.encode(enc.preprocess(buf.getvalue()))
    assert _report("WEBP 333x250", ours, oracle.embed_rgb(rgb)) < TIGHT


def test_image_chunk_layout_and_token_count(pair, tmp_path: Path) -> None:
    """libmtmd wraps the image's 16 tokens in <start_of_image> ... <end_of_image>, as our
    encoder's token count says."""
    enc, oracle = pair
    path = save(picture(64, 64), tmp_path / "p.png")
    chunk = oracle.image_chunk(oracle._bitmap_from_file(path))
    assert enc.n_tokens == chunk.n_tokens == chunk.n_pos == SPEC.n_tokens
    assert enc.n_embd == SPEC.text_width
    assert chunk.text_before[-1] == 255999  # <start_of_image>
    assert chunk.text_after[0] == 256000  # <end_of_image>


def test_gemma3_layout_is_libmtmds(pair, tmp_path: Path) -> None:
    """Our post_tokenize of [tokens("Describe "), image, tokens(" please")] is libmtmd's chunking
    of "Describe <marker> please": <start_of_image>, the rows, <end_of_image>, nothing else."""
    _, oracle = pair
    path = save(picture(40, 30), tmp_path / "p.png")
    chunk = oracle.image_chunk(oracle._bitmap_from_file(path))
    theirs = chunk.text_before + [None] * chunk.n_tokens + chunk.text_after
    prompt = [*oracle.tokenize("Describe ", True), ImageInput("sha", SPEC.n_tokens), *oracle.tokenize(" please", False)]
    ours = [x.token if x.image is None else None for x in gemma3_post_tokenize(prompt)]
    assert ours == theirs


def test_encoder_rejects_what_is_not_an_image(pair) -> None:
    enc, _ = pair
    for data in (b"", b"definitely not an image", b"\x89PNG\r\n\x1a\n" + b"\0" * 40):
        with pytest.raises(InvalidRequest, match="invalid image"):
            enc.preprocess(data)
    with pytest.raises(ValueError, match="pixels of shape"):
        enc.encode(np.zeros((3, 10, 10), dtype=np.float32))


def test_fit_keeps_the_aspect_ratio_centred_on_black() -> None:
    assert fitted_size(300, 200, 224) == (224, 150)
    assert fitted_size(7, 400, 224) == (4, 224)
    assert fitted_size(50, 50, 224) == (224, 224)
    tile = fit_square(np.full((200, 300, 3), 200, dtype=np.uint8), 224)
    rows = np.flatnonzero(tile[:, 112, 0])
    assert (rows[0], rows[-1]) == (37, 186)  # 150 rows, (224 - 150) // 2 above
    assert not tile[:37].any() and not tile[187:].any()


def test_a_text_model_is_not_a_projector(gemma3: Path) -> None:  # noqa: F811
    with pytest.raises(GGUFError, match="not a vision projector"):
        load_projector(gemma3)
