"""GPU offload's plumbing through real loads, a real ``pollama serve`` and the real CLI.

This machine and CI run llama-cpp-python's CPU build: every load here must read "CPU" and put
nothing on a GPU, whatever ``num_gpu`` and ``main_gpu`` say; on a GPU build the same tests check
that ``num_gpu`` 0 keeps a model on the CPU and that what the engine was given is what is
reported. bench/gpu_check.py is the check on a GPU.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import httpx
import llama_cpp as L
import pytest

from conftest import STORIES, collect, load
from runner.api import Offload, Options, Request
from runner.loading import gpu
from runner.ml.ggml import bindings as g
from runner.ml.ggml.devices import devices
from serverproc import ROOT, ServerProcess
from test_cli import run_cli

CPU_BUILD = not L.llama_supports_gpu_offload()


def _greedy(r) -> str:
    options = Options(temperature=0, num_predict=12)
    return collect(r.stream(Request(prompt="Once upon a time", raw=True, options=options)))[0]


def test_old_engine_takes_num_gpu_and_main_gpu():
    texts = []
    for num_gpu in (0, -1, 10):
        r = load(STORIES, "old", num_ctx=256, num_thread=1, num_gpu=num_gpu, main_gpu=0)
        try:
            params = r.model_engine.model_params
            if CPU_BUILD or num_gpu == 0:
                assert params.n_gpu_layers == 0 and r.offload == Offload(), num_gpu
            else:
                assert params.n_gpu_layers > 0 and "layers" in r.offload.devices and r.offload.vram > 0
            texts.append(_greedy(r))
        finally:
            r.close()
    assert texts[0] and texts == [texts[0]] * 3


@pytest.mark.skipif(not CPU_BUILD, reason="a GPU build checks main_gpu against its GPUs (test_gpu_placement)")
def test_main_gpu_is_not_looked_at_where_there_is_no_gpu():
    r = load(STORIES, "old", num_ctx=256, num_thread=1, num_gpu=-1, main_gpu=5)
    try:
        assert r.offload == Offload() and r.model_engine.model_params.n_gpu_layers == 0
    finally:
        r.close()


def test_ggml_registry_lists_the_cpu_and_the_new_engine_runs_there():
    found = devices()
    cpus = [d for d in found if d.kind == "cpu"]
    assert len(cpus) == 1 and cpus[0].name == "CPU" and cpus[0].total > 0
    if CPU_BUILD:
        assert gpu.offload_devices(found) == [] and gpu.cpu_only_note(found) == ""
    r = load(STORIES, "new", num_ctx=256, num_thread=1, num_gpu=10)
    try:
        backend = r.model_engine.model.backend
        assert g.ggml_backend_name(backend.ptr) == b"CPU"
        device = g.ggml_backend_get_device(backend.ptr)
        assert g.ggml_backend_dev_name(device) == b"CPU"
        assert g.ggml_backend_dev_type(device) == g.GGML_BACKEND_DEVICE_TYPE_CPU
        assert r.offload.devices == ("CPU" if CPU_BUILD else f"CPU ({gpu.cpu_only_note(found)})")
        assert r.offload.vram == 0
    finally:
        r.close()


_MAPS = """
import json, sys
first, second = sys.argv[1:]
__import__(first); __import__(second)
from runner.ml.ggml import bindings
from runner.ml.ggml.devices import devices
maps = {line.split()[-1] for line in open("/proc/self/maps") if "libggml" in line or "libllama" in line}
print(json.dumps({"lib_dir": str(bindings.LIB_DIR), "maps": sorted(maps), "devices": [d.name for d in devices()]}))
"""


@pytest.mark.parametrize("order", [("llama_cpp", "runner.ml.ggml.bindings"), ("runner.ml.ggml.bindings", "llama_cpp")])
def test_llama_cpp_lib_path_points_both_engines_at_one_copy(tmp_path: Path, order):
    wheel = Path(L.__file__).parent / "lib"
    copy = tmp_path / "gpu-build-lib"
    shutil.copytree(wheel, copy, symlinks=True, ignore=shutil.ignore_patterns("cmake", "pkgconfig"))
    env = dict(os.environ, LLAMA_CPP_LIB_PATH=str(copy))
    out = subprocess.run([sys.executable, "-c", _MAPS, *order], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["lib_dir"] == str(copy) and "CPU" in seen["devices"]
    names = {Path(p).name.split(".so")[0] for p in seen["maps"]}
    assert {"libggml-base", "libggml-cpu", "libggml", "libllama"} <= names
    assert all(Path(p).resolve().is_relative_to(copy.resolve()) for p in seen["maps"]), seen["maps"]


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess({"OLLAMA_NEW_ENGINE": "0", "OLLAMA_CONTEXT_LENGTH": "256"}).start()
    yield proc
    proc.stop()


def test_ps_reports_the_cpu_through_serve_and_the_cli(server):
    body = {"model": str(STORIES), "prompt": "Once", "stream": False,
            "options": {"num_predict": 2, "num_gpu": 10, "main_gpu": 0, "num_thread": 1}}
    r = httpx.post(server.url + "/api/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    (entry,) = httpx.get(server.url + "/api/ps").json()["models"]
    assert entry["size"] > 0 and entry["size_vram"] == (0 if CPU_BUILD else entry["size_vram"])
    ps = subprocess.run([sys.executable, "-c", "from cli.main import app; app()", "ps"], env=server.env, cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0, ps.stderr
    row = next(line for line in ps.stdout.splitlines() if str(STORIES) in line)
    assert ("100% CPU" in row) if CPU_BUILD else ("GPU" in row)

    # a request with the default num_gpu (-1) is served by the runner loaded with num_gpu 10
    again = httpx.post(server.url + "/api/generate", json={**body, "options": {"num_predict": 2, "num_thread": 1}},
                       timeout=120)
    assert again.status_code == 200 and server.log().count("loading model") == 1
    # num_gpu 0 is another load (Ollama reloads for any other runner option)
    cpu = httpx.post(server.url + "/api/generate",
                     json={**body, "options": {"num_predict": 2, "num_gpu": 0, "num_thread": 1}}, timeout=120)
    assert cpu.status_code == 200 and server.log().count("loading model") == 2
    assert httpx.get(server.url + "/api/ps").json()["models"][0]["size_vram"] == 0


def test_show_and_verbose_say_the_devices(tmp_path):
    shown = run_cli(["show", str(STORIES)], tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert "  Devices\n    CPU" in shown.stdout if CPU_BUILD else "  Devices\n" in shown.stdout
    ran = run_cli(["run", str(STORIES), "Once", "--verbose", "-o", "num_predict=3", "-o", "num_thread=1"], tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert ("devices:              CPU\n" in ran.stderr) if CPU_BUILD else ("devices:" in ran.stderr)
