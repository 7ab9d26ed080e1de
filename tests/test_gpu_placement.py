"""GPU placement (runner.loading.gpu) as pure functions: device tables in, layers out.

The device lists here are built by hand — they isolate the placement rules from the machine
(this one and CI have no GPU). What a real GPU does with the result is bench/gpu_check.py's.
The layer costs of the SmolLM2 test are read from its real GGUF.
"""

from __future__ import annotations

import dataclasses

import llama_cpp as L
import pytest

import runner
from cli.server_cmds import processor
from runner import config
from runner.api import InvalidRequest, Offload, Options
from runner.engines.llamacpp.offload import model_params
from runner.loading import gpu, plan
from runner.loading.gpu import DEVICE_RESERVE, LayerCosts, place
from runner.ml.device import Device

GiB = 2**30
MiB = 2**20


def dev(name: str, free_gib: float, kind: str = "gpu", backend: str = "CUDA", description: str = "Test GPU") -> Device:
    free = int(free_gib * GiB)
    return Device(name, description, backend, kind, free, free)  # type: ignore[arg-type]


# 10 blocks of 100 MiB (20 of them KV), an output layer of 50 MiB, 30 MiB of compute per GPU
COSTS = LayerCosts(blocks=(100 * MiB,) * 10, kv=(20 * MiB,) * 10, output=50 * MiB, graph=30 * MiB)
ROOMY = DEVICE_RESERVE + 30 * MiB  # a GPU with this much free holds nothing but its reserves


def gpu_with_room(name: str, room: int) -> Device:
    return Device(name, "Test GPU", "CUDA", "gpu", ROOMY + room, ROOMY + room)


# ------------------------------------------------------------------------------- the rules
def test_no_gpu_or_num_gpu_0_is_the_cpu_and_main_gpu_is_not_looked_at():
    for gpus, num_gpu in (([], -1), ([], 5), ([dev("CUDA0", 80)], 0)):
        p = place(gpus, COSTS, num_gpu, main_gpu=7)
        assert p.layers == 0 and p.shares == () and p.describe() == "CPU" and p.vram == 0
        assert p.kv_offloaded == 0 and p.total == 11


def test_all_layers_fit_on_one_gpu():
    p = place([dev("CUDA0", 80, description="NVIDIA H200")], COSTS, -1, 0)
    assert (p.layers, p.total, p.split, p.main_gpu) == (11, 11, "none", 0)
    assert p.describe() == "CUDA0 (NVIDIA H200) 11/11 layers"
    assert p.vram == 10 * 100 * MiB + 50 * MiB + 30 * MiB
    assert p.kv_offloaded == 200 * MiB
    assert p.offload() == Offload("CUDA0 (NVIDIA H200) 11/11 layers", p.vram, full=True)


@pytest.mark.parametrize("room_mib, layers", [(0, 0), (49, 0), (50, 1), (149, 1), (150, 2), (1049, 10), (1050, 11)])
def test_as_many_as_fit_output_layer_first(room_mib, layers):
    """n_gpu_layers = k offloads the output layer and the last k - 1 blocks."""
    p = place([gpu_with_room("CUDA0", room_mib * MiB)], COSTS, -1, 0)
    assert p.layers == layers
    assert p.kv_offloaded == 20 * MiB * max(0, layers - 1)
    partial = f"CUDA0 (Test GPU) {layers}/11 layers, CPU {11 - layers}/11 layers"
    assert p.describe() == ("CPU" if layers == 0 else partial if layers < 11 else "CUDA0 (Test GPU) 11/11 layers")


def test_num_gpu_n_offloads_n_at_most_and_what_fits_when_more_is_asked(caplog):
    roomy = [dev("CUDA0", 80)]
    assert place(roomy, COSTS, 4, 0).layers == 4
    assert place(roomy, COSTS, 999, 0).layers == 11  # the model has 11
    small = [gpu_with_room("CUDA0", 350 * MiB)]  # output + 3 blocks
    with caplog.at_level("WARNING"):
        p = place(small, COSTS, 8, 0)
    assert p.layers == 4 and "num_gpu 8: 4 of the model's 11 layers fit" in caplog.text


def test_overhead_is_left_free():
    p = place([gpu_with_room("CUDA0", 1050 * MiB)], COSTS, -1, 0, overhead=100 * MiB)
    assert p.layers == 10


def test_main_gpu_takes_a_model_that_fits_on_it():
    gpus = [dev("CUDA0", 80), dev("CUDA1", 80)]
    p = place(gpus, COSTS, -1, 1)
    assert (p.split, p.main_gpu, [s.index for s in p.shares], p.layers) == ("none", 1, [1], 11)
    assert p.tensor_split(4) == [0.0, 11.0, 0.0, 0.0]


def test_a_model_too_big_for_one_gpu_spreads_in_layer_order():
    gpus = [gpu_with_room("CUDA0", 450 * MiB), gpu_with_room("CUDA1", 1000 * MiB)]
    p = place(gpus, COSTS, -1, 0)
    assert (p.split, p.layers) == ("layer", 11)
    # blocks 0-3 on CUDA0 (400 MiB), blocks 4-9 and the output layer on CUDA1 (650 MiB)
    assert [(s.device.name, s.layers) for s in p.shares] == [("CUDA0", 4), ("CUDA1", 7)]
    assert p.tensor_split(3) == [4.0, 7.0, 0.0]
    assert p.vram == 400 * MiB + 650 * MiB + 2 * 30 * MiB
    assert p.describe() == "CUDA0 (Test GPU) 4/11 layers, CUDA1 (Test GPU) 7/11 layers"


def test_spreading_only_when_it_offloads_more():
    gpus = [gpu_with_room("CUDA0", 1050 * MiB), gpu_with_room("CUDA1", 0)]
    p = place(gpus, COSTS, -1, 0)
    assert (p.split, p.layers) == ("none", 11)
    partial = place([gpu_with_room("CUDA0", 500 * MiB), gpu_with_room("CUDA1", 10 * MiB)], COSTS, -1, 0)
    assert (partial.split, partial.layers, len(partial.shares)) == ("none", 5, 1)


@pytest.mark.parametrize("main_gpu", [-1, 2, 99])
def test_main_gpu_naming_no_gpu_is_a_400(main_gpu):
    gpus = [dev("CUDA0", 80, description="NVIDIA H200"), dev("CUDA1", 80, description="NVIDIA H200")]
    with pytest.raises(InvalidRequest) as err:
        place(gpus, COSTS, -1, main_gpu)
    assert err.value.status == 400
    assert str(err.value) == (f"main_gpu {main_gpu} names no GPU: this machine has 2 "
                              f"(0 CUDA0 (NVIDIA H200), 1 CUDA1 (NVIDIA H200))")


def test_offload_devices_in_llama_cpp_order():
    cpu = dev("CPU", 100, kind="cpu", backend="CPU")
    blas = dev("BLAS", 0, kind="accel", backend="BLAS")
    igpu = dev("Vulkan1", 8, kind="igpu", backend="Vulkan")
    cuda = dev("CUDA0", 80)
    rpc = dev("RPC[host:50052]", 24, backend="RPC")
    assert gpu.offload_devices([cpu, blas]) == []
    assert gpu.offload_devices([cpu, igpu]) == [igpu]  # integrated GPUs when there is nothing else
    assert gpu.offload_devices([cpu, cuda, igpu, rpc]) == [rpc, cuda]
    assert gpu.cpu_only_note([cpu, blas]) == ""
    assert gpu.cpu_only_note([cpu, cuda]) == ("the new engine runs on the CPU; GPU devices present: "
                                              "CUDA0 (Test GPU); use the old engine for offload")


def test_layer_costs_of_smollm2_from_its_tensors():
    cfg = config.load({})
    model = runner.resolve(None, cfg)
    load = plan.load_options(model.info, Options(num_ctx=1024), cfg)
    need = plan.reservation(model.info, load.num_ctx, load.num_parallel, load.num_batch, load.kv_cache_type,
                            load.flash_attention, "old")
    costs = gpu.layer_costs(model.info, need)
    assert costs.count == 31 and len(costs.kv) == 30 and sum(costs.kv) == need.kv
    from runner.model import ggufmeta

    tensors = ggufmeta.read_gguf_header(model.info.path).tensors
    weights = sum(t.nbytes for t in tensors.values())
    embd = tensors["token_embd.weight"].nbytes
    # every block's weights, and the output layer: its norm plus the tied embedding llama.cpp copies
    assert sum(costs.blocks) - need.kv + costs.output == weights
    assert costs.output == embd + tensors["output_norm.weight"].nbytes
    assert costs.graph == need.compute


# ------------------------------------------------------------------ placement -> llama.cpp
def test_model_params_for_each_placement():
    cpu, keep = model_params(gpu.CPU, use_mmap=True)
    assert (cpu.n_gpu_layers, cpu.use_mmap) == (0, True)
    if not L.llama_supports_gpu_offload():  # a CPU build: llama.cpp's defaults, as before
        defaults = L.llama_model_default_params()
        assert (cpu.split_mode, cpu.main_gpu, cpu.devices, keep) == (defaults.split_mode, defaults.main_gpu, None, ())

    one = place([dev("CUDA0", 80), dev("CUDA1", 80)], COSTS, 6, 1)
    params, keep = model_params(one, use_mmap=False)
    assert (params.n_gpu_layers, params.split_mode, params.main_gpu) == (6, L.LLAMA_SPLIT_MODE_NONE, 1)

    spread = place([gpu_with_room("CUDA0", 450 * MiB), gpu_with_room("CUDA1", 1000 * MiB)], COSTS, -1, 0)
    params, keep = model_params(spread, use_mmap=True)
    assert (params.n_gpu_layers, params.split_mode) == (11, L.LLAMA_SPLIT_MODE_LAYER)
    assert [params.tensor_split[i] for i in range(3)] == [4.0, 7.0, 0.0] and keep


# ------------------------------------------------------------------------ what ps reports
@pytest.mark.parametrize("size, vram, shown", [
    (1000, 0, "100% CPU"), (0, 0, "100% CPU"), (1000, 1000, "100% GPU"), (1000, 1001, "Unknown"),
    (0, 5, "Unknown"), (1000, 730, "27%/73% CPU/GPU"), (1000, 995, "1%/99% CPU/GPU"),
    (1000, 5, "100%/0% CPU/GPU"),  # Go's math.Round(99.5) is 100
    (200, 101, "50%/50% CPU/GPU"),  # 49.5 rounds half away from zero
])
def test_processor_column_as_ollama_writes_it(size, vram, shown):
    assert processor(size, vram) == shown


def test_size_vram_is_all_of_it_when_every_layer_is_offloaded():
    assert Offload().size_vram(10**9) == 0
    assert Offload("CUDA0 31/31 layers", vram=900, full=True).size_vram(1000) == 1000
    assert Offload("CUDA0 10/31 layers, CPU 21/31 layers", vram=300).size_vram(1000) == 300
    assert Offload("x", vram=2000).size_vram(1000) == 1000


def test_a_default_num_gpu_request_is_served_by_any_loaded_num_gpu():
    cfg = config.load({})
    info = runner.resolve(None, cfg).info
    loaded = plan.load_options(info, Options(num_gpu=12, main_gpu=1), cfg)
    assert (loaded.num_gpu, loaded.main_gpu) == (12, 1)
    assert loaded.serves(plan.load_options(info, Options(main_gpu=1), cfg))  # num_gpu -1: whatever is loaded
    assert loaded.serves(plan.load_options(info, Options(num_gpu=-5, main_gpu=1), cfg))
    assert not loaded.serves(plan.load_options(info, Options(num_gpu=0, main_gpu=1), cfg))
    assert not loaded.serves(plan.load_options(info, Options(num_gpu=12), cfg))
    assert not loaded.serves(dataclasses.replace(loaded, num_ctx=loaded.num_ctx // 2))
