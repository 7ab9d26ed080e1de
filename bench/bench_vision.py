"""Time to first token with one image, cold vs second turn (cached), old engine (libmtmd) vs new
engine (our encoder), interleaved, and each engine's vision encoder time per image. gemma-3-270m with the random-weight gemma3 projector of
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
    for chunk in r.stream(Request(messages=messages, options=Options().merged({"temperature": 0, "num_predict": 2}))):
        if first is None:
            first = time.perf_counter()
        if chunk.done:
            final = chunk
    return ((first or time.perf_counter()) - t0) * 1e3, final.metrics.prompt_eval_count, final.metrics.prompt_cached_count


def load(proj: Path, engine: str, threads: int):
    cfg = dataclasses.replace(config.load({}), new_engine=engine == "new")
    r = runner.load(runner.resolve(str(GEMMA3), cfg, projector=str(proj)),
                    Options().merged({"num_ctx": 1024, "num_thread": threads}), cfg, num_parallel=1)
    assert r.engine == engine, r.engine
    return r


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    engines = ("old", "new")
    with tempfile.TemporaryDirectory() as tmp:
        proj = write_mmproj(Path(tmp) / "mmproj.gguf")
        runners = {e: load(proj, e, args.threads) for e in engines}
        try:
            question = "Describe this picture in detail, please."
            rows: dict[tuple[str, str], list[tuple[float, int, int]]] = {}
            for r in runners.values():
                first_token_ms(r, [Message("user", "warm up", images=[image_from_bytes(picture(999))])])
            for rep in range(args.reps):  # interleaved: each image on one engine, then the other
                image = image_from_bytes(picture(rep))
                for e, r in runners.items():
                    turn1 = [Message("user", question, images=[image])]
                    rows.setdefault((e, "one image, cold"), []).append(first_token_ms(r, turn1))
                    turn2 = turn1 + [Message("assistant", "It is noise."), Message("user", "What colours?")]
                    rows.setdefault((e, "second turn, image cached"), []).append(first_token_ms(r, turn2))
                    rows.setdefault((e, "text only, cold"), []).append(
                        first_token_ms(r, [Message("user", question + f" ({rep})")]))
            print(f"{os.uname().machine}, {os.cpu_count()} cores; load average {os.getloadavg()[0]:.2f}, "
                  f"threads {args.threads}, reps {args.reps}, medians\n")
            print("| case | old ms | new ms | new/old | evaluated | cached |")
            print("|---|---:|---:|---:|---:|---:|")
            for case in ("text only, cold", "one image, cold", "second turn, image cached"):
                old, new = (statistics.median(x[0] for x in rows[(e, case)]) for e in engines)
                last = rows[("new", case)][-1]
                print(f"| {case} | {old:.1f} | {new:.1f} | {new / old:.2f}x | {last[1]} | {last[2]} |")
            print()
            for e, r in runners.items():
                stats = r.model_engine.vision.stats
                print(f"{e} engine encoder: {stats.encodes} images, "
                      f"{stats.encode_ns / max(stats.encodes, 1) / 1e6:.1f} ms per image; {stats.decodes} image decodes")
        finally:
            for r in runners.values():
                r.close()


if __name__ == "__main__":
    main()
