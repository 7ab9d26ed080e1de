"""Where does an old-engine load with GPU offload die, if it does? Step by step, in process, under
faulthandler (the Python stack of a native crash), with llama.cpp's log: bench/gpu_device.sh runs it.

    python bench/gpu_probe.py MODEL.gguf [NUM_GPU]
"""

from __future__ import annotations

import dataclasses
import faulthandler
import logging
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import runner  # noqa: E402
from runner import config  # noqa: E402
from runner.api import Options, Request  # noqa: E402
from runner.engines.llamacpp.offload import offload_devices  # noqa: E402
from runner.ml.ggml.devices import devices  # noqa: E402


def main() -> None:
    faulthandler.enable()
    logging.basicConfig(level=logging.DEBUG, stream=sys.stderr, format="%(asctime)s %(name)s %(message)s")
    path, num_gpu = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else -1
    print("devices", devices(), flush=True)
    print("offload devices", offload_devices(), flush=True)
    cfg = dataclasses.replace(config.load({}), cache_ram=0, cache_disk=0, new_engine=False)
    model = runner.resolve(path, cfg)
    print("placement", runner.placement(model, Options(num_gpu=num_gpu), cfg), flush=True)
    r = runner.load(model, Options(num_gpu=num_gpu, num_ctx=2048), cfg)
    print("loaded", r.engine, r.offload, flush=True)
    t0 = time.time()
    request = Request(prompt="Once upon a time", options=Options(temperature=0, num_predict=64))
    text = "".join(c.text for c in r.stream(request))
    print("generated", len(text), f"{time.time() - t0:.2f}s", flush=True)
    r.close()
    print("closed", flush=True)


if __name__ == "__main__":
    main()
