"""gemma3's image encoder: ours (``runner.model.vision``, GGML graph built once and re-run) vs
libmtmd 0.3.36 (llama.cpp's), same random-weight projector, threads and attention kernel. Prints
a Markdown table of milliseconds per image (median of ``--runs``) and the max abs difference of
the soft tokens.

- *decode*: ours (Pillow) of the PNG; libmtmd's (stb_image) happens before, untimed;
- *fit + normalise*: ours is the square-tile fit and normalisation (Pillow, NumPy); libmtmd's is
  ``mtmd_tokenize`` of a prompt with the image (its resize + normalise);
- *encode*: ours is :meth:`Gemma3Vision.encode` (patchify + graph); libmtmd's is
  ``mtmd_encode_chunk``.

Towers: ``test`` is the tests' (224 px, width 144, 2 blocks -> 16 tokens); ``gemma3`` has Gemma
3's real geometry and width (896 px, patch 14, width 1152, 16 heads, MLP 4304 -> 256 tokens)
with ``--layers`` blocks instead of 27 (random weights: 30 MB a block); its time grows by one
block's cost per block.

    flock /tmp/pollama-heavy.lock python bench/bench_vision_encoder.py [--runs 5] [--threads 2] [--layers 2]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from runner.ml.backend import BackendOptions  # noqa: E402
from runner.model.vision import load_projector  # noqa: E402
from runner.model.vision.preprocess import decode, fit_square, normalize  # noqa: E402
from tests.mmproj import MMProjSpec, write_mmproj  # noqa: E402
from tests.mtmdoracle import MtmdOracle  # noqa: E402

SHARED = ROOT.parent / "shared" if (ROOT.parent / "shared").is_dir() else ROOT / "shared"


def gemma3_path() -> Path:
    out = subprocess.run(["bash", str(SHARED / "models" / "fetch-gemma3.sh")], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip().splitlines()[-1])


def picture(width: int, height: int) -> bytes:
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:height, 0:width]
    img = np.stack([x * 255 // width, y * 255 // height, (x // 7 + y // 5) % 2 * 200], -1) + rng.normal(0, 10, (height, width, 3))
    buf = io.BytesIO()
    Image.fromarray(np.clip(img, 0, 255).astype(np.uint8)).save(buf, format="PNG")
    return buf.getvalue()


def ms(ns: list[int]) -> str:
    return f"{statistics.median(ns) / 1e6:.1f}"


def bench(text_model: Path, proj: Path, data: bytes, flash: bool, threads: int, runs: int) -> list[str]:
    enc = load_projector(proj, BackendOptions(num_threads=threads, flash_attention=flash))
    oracle = MtmdOracle(text_model, proj, flash=flash, threads=threads)
    tmp = Path(tempfile.mkstemp(suffix=".png")[1])
    tmp.write_bytes(data)
    ours_dec, ours_pre, ours_enc, their_pre, their_enc = [], [], [], [], []
    c = enc.config
    first_ns = 0
    diff = 0.0
    try:
        for i in range(runs + 1):  # run 0 warms both up (ours: builds the graph)
            td = time.perf_counter_ns()
            rgb = decode(data)
            t0 = time.perf_counter_ns()
            pixels = normalize(fit_square(rgb, c.image_size), c.image_mean, c.image_std)
            t1 = time.perf_counter_ns()
            ours = enc.encode(pixels)
            t2 = time.perf_counter_ns()
            chunk = oracle.image_chunk(oracle._bitmap_from_file(tmp))
            if i == 0:
                first_ns = t2 - t1
                continue
            ours_dec.append(t0 - td)
            ours_pre.append(t1 - t0)
            ours_enc.append(t2 - t1)
            their_pre.append(chunk.tokenize_ns)
            their_enc.append(chunk.encode_ns)
            diff = max(diff, float(np.abs(ours - chunk.embeddings).max()))
        return [ms(ours_dec), ms(ours_pre), ms(their_pre), f"{first_ns / 1e6:.1f}", ms(ours_enc), ms(their_enc),
                f"{statistics.median(their_enc) / statistics.median(ours_enc):.2f}x", f"{diff:.2g}"]
    finally:
        enc.close()
        oracle.close()
        tmp.unlink()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--threads", type=int, default=min(4, os.cpu_count() or 1))
    ap.add_argument("--layers", type=int, default=2)
    args = ap.parse_args()
    text_model = gemma3_path()
    towers = {
        "test (224 px, w144, 2 blocks, 16 tok)": MMProjSpec(),
        f"gemma3 (896 px, w1152, {args.layers} blocks, 256 tok)": MMProjSpec(
            image_size=896, width=1152, n_head=16, n_ff=4304, n_layer=args.layers),
    }
    data = picture(1024, 768)
    print(f"{platform.machine()}, {os.cpu_count()} cores, {args.threads} threads, load average "
          f"{os.getloadavg()[0]:.2f}, image 1024x768 PNG, median of {args.runs}\n")
    print("| tower | attention | decode ours ms | fit + normalise ours ms | libmtmd ms | first encode ours ms "
          "| encode ours ms | encode libmtmd ms | ours speed | max abs diff |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as d:
        for name, spec in towers.items():
            proj = write_mmproj(Path(d) / "mmproj.gguf", spec, seed=1)
            for flash in (True, False):
                row = bench(text_model, proj, data, flash, args.threads, args.runs)
                print(f"| {name} | {'flash' if flash else 'softmax'} | " + " | ".join(row) + " |", flush=True)
    print(f"\nload average after: {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
