"""Time to first token with one image, cold vs second turn (cached), on the old engine (libmtmd),
and the vision encoder's time per image. gemma-3-270m with the random-weight gemma3 projector of
tests/mmproj.py (224 px, patch 14, width 144, 2 blocks, 16 image tokens): the numbers say what
the image path costs around the encoder, not what a real SigLIP tower (27 blocks, 896 px) costs.

    python bench/bench_vision.py [--reps 5] [--threads 2]
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from PIL import Image as PILImage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Message, Options, Request  # noqa: E402
from runner.images import image_from_bytes  # noqa: E402
from tests.mmproj import write_mmproj  # noqa: E402

GEMMA3 = Path.home() / ".cache" / "pollama-test-models" / "gemma-3-270m-q4_k_m.gguf"


def picture(seed: int) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, size=(480, 640, 3), dtype=np.uint8)
    buf = io.BytesIO()
    PILImage.fromarray(pixels).save(buf, "PNG")
    return buf.getvalue()


def first_token_ms(r, messages) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    first = None
    final = None
    for chunk in r.chat(Request(messages=messages, options=Options().merged({"temperature": 0, "num_predict": 2}))):
        if first is None:
            first = time.perf_counter()
        if chunk.done:
            final = chunk
    return ((first or time.perf_counter()) - t0) * 1e3, final.metrics.prompt_eval_count, final.metrics.prompt_cached_count


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        proj = write_mmproj(Path(tmp) / "mmproj.gguf")
        cfg = dataclasses.replace(config.load({}), new_engine=False)
        r = runner.load(str(GEMMA3), Options().merged({"num_ctx": 1024, "num_thread": args.threads}), cfg,
                        num_parallel=1, projector=str(proj))
        try:
            question = "Describe this picture in detail, please."
            first_token_ms(r, [Message("user", "warm up", images=[image_from_bytes(picture(999))])])
            cold, warm, text = [], [], []
            for rep in range(args.reps):
                image = image_from_bytes(picture(rep))
                turn1 = [Message("user", question, images=[image])]
                ms, evaluated, cached = first_token_ms(r, turn1)
                cold.append((ms, evaluated, cached))
                turn2 = turn1 + [Message("assistant", "It is noise."), Message("user", "What colours?")]
                warm.append(first_token_ms(r, turn2))
                text.append(first_token_ms(r, [Message("user", question + f" ({rep})")]))
            stats = r.vision.stats
            print(f"load average {os.getloadavg()[0]:.2f}, threads {args.threads}, reps {args.reps}\n")
            print("| case | first token ms (median) | evaluated | cached |")
            print("|---|---:|---:|---:|")
            for name, rows in (("text only, cold", text), ("one image, cold", cold), ("second turn, image cached", warm)):
                print(f"| {name} | {statistics.median(x[0] for x in rows):.1f} | {rows[-1][1]} | {rows[-1][2]} |")
            print(f"\nencoder: {stats.encodes} images, {stats.encode_ns / max(stats.encodes, 1) / 1e6:.1f} ms per image; "
                  f"{stats.decodes} image decodes")
        finally:
            r.close()


if __name__ == "__main__":
    main()
