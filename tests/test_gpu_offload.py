"""GPU offload's plumbing through real loads, a real ``pollama serve`` and the real CLI.

This machine and CI run llama-cpp-python's CPU build: every load here must read "CPU" and put
nothing on a GPU, whatever ``num_gpu`` and ``main_gpu`` say; on a GPU build the same tests check
that ``num_gpu`` 0 keeps a model on the CPU and that what the engine was given is what is
reported. bench/gpu_check.py is the check on a GPU.

``POLLAMA_TEST_GPU_LIB`` names the lib folder of a GPU build of the pinned llama.cpp (the folder
``LLAMA_CPP_LIB_PATH`` would name): the served offload test then runs on it. On a machine without a
GPU, ``bash bench/vulkan_build.sh`` makes one whose Vulkan backend runs on Mesa's lavapipe (with
``GGML_VK_VISIBLE_DEVICES=0``, which lets GGML use a Vulkan device of type CPU).
"""

from __future__ import annotations

import json
import os
import re
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
GPU_LIB = os.environ.get("POLLAMA_TEST_GPU_LIB")


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
    assert one_file_each(seen["maps"])


def one_file_each(maps: list[str]) -> bool:
    """Whether every GGML library is mapped from one file: a wheel stores libggml-cpu.so,
    .so.0 and .so.0.25.3 as copies, and loading one name beside another maps a second GGML."""
    ggml = [Path(p).name for p in maps if Path(p).name.startswith("libggml")]
    return len(ggml) == len({name.split(".so")[0] for name in ggml})


@pytest.mark.parametrize("order", [("llama_cpp", "runner.ml.ggml.bindings"), ("runner.ml.ggml.bindings", "llama_cpp")])
def test_both_engines_share_one_ggml_from_the_wheel(order):
    """Without LLAMA_CPP_LIB_PATH, in either import order: llama.cpp loads its GGML by SONAME
    (libggml-cpu.so.0), and so do our bindings. When they loaded libggml-cpu.so, a process that
    imported llama_cpp first had two GGMLs: the old engine's eval callback did not know
    llama.cpp's repacked weights (another copy's buffer type), and gemma-3-270m's guessed rows
    parted from its lone ones."""
    env = {k: v for k, v in os.environ.items() if k != "LLAMA_CPP_LIB_PATH"}
    out = subprocess.run([sys.executable, "-c", _MAPS, *order], cwd=ROOT, env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    maps = json.loads(out.stdout)["maps"]
    assert one_file_each(maps), maps


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


def _processor(server: ServerProcess) -> str:
    ps = subprocess.run([sys.executable, "-c", "from cli.main import app; app()", "ps"], env=server.env, cwd=ROOT,
                        capture_output=True, text=True, timeout=60)
    assert ps.returncode == 0, ps.stderr
    header, *rows = ps.stdout.splitlines()
    row = next(line for line in rows if line.startswith(str(STORIES)))
    return row[header.index("PROCESSOR"):].split("  ")[0].strip()


def test_served_offload_of_all_some_and_no_layers_answers_as_the_cpu_does():
    """The old engine's offload through a real ``pollama serve`` on ``POLLAMA_TEST_GPU_LIB``'s build
    (else the libraries this process loaded): ``num_gpu`` -1 puts all of stories260K's 6 layers on
    the GPU, 3 half of them, 0 none; ``/api/ps`` and ``pollama ps`` say so, and the greedy answers
    equal the CPU's (F32 weights: the kernels' rounding stays far from a tie for these tokens).
    The server lives through every load (on an H200 a served offloaded load once ended it). On a
    build that cannot offload, each load reads CPU."""
    env = {"OLLAMA_NEW_ENGINE": "0", "OLLAMA_CONTEXT_LENGTH": "256", "PYTHONFAULTHANDLER": "1"}
    if GPU_LIB:
        env.update(LLAMA_CPP_LIB_PATH=GPU_LIB, MTMD_CPP_LIB=GPU_LIB)
    offloads = bool(GPU_LIB) or not CPU_BUILD
    seen = {}
    with ServerProcess(env) as server:
        for num_gpu in (-1, 3, 0):
            body = {"model": str(STORIES), "prompt": "Once upon a time", "raw": True, "stream": False,
                    "options": {"num_gpu": num_gpu, "temperature": 0, "num_predict": 16, "num_thread": 1}}
            r = httpx.post(server.url + "/api/generate", json=body, timeout=300)
            assert r.status_code == 200, (num_gpu, r.text, server.log()[-4000:])
            (entry,) = httpx.get(server.url + "/api/ps").json()["models"]
            seen[num_gpu] = (r.json()["response"], entry, _processor(server))
        assert server.proc.poll() is None, server.log()[-4000:]
        assert server.log().count("loading model") == 3
    (full_text, full, full_ps), (part_text, part, part_ps), (cpu_text, cpu, cpu_ps) = (seen[n] for n in (-1, 3, 0))
    assert cpu_text and full_text == cpu_text and part_text == cpu_text
    assert (cpu["size_vram"], cpu["devices"], cpu_ps) == (0, "CPU", "100% CPU")
    if not offloads:
        assert [(e["size_vram"], e["devices"], shown) for _, e, shown in seen.values()] == [(0, "CPU", "100% CPU")] * 3
        return
    assert full["size_vram"] == full["size"] > 0 and full["devices"].endswith(" 6/6 layers"), full
    assert full_ps == "100% GPU"
    assert 0 < part["size_vram"] < part["size"] and part["devices"].endswith(" 3/6 layers, CPU 3/6 layers"), part
    assert re.fullmatch(r"\d+%/\d+% CPU/GPU", part_ps), part_ps
