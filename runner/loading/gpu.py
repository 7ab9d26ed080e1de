"""GPU placement: which of a model's layers llama.cpp offloads, and to which GPUs — decided before
it allocates anything, from the devices' free memory (Ollama's estimate, ``llm/memory.go``).

Devices in, layers out. :func:`place` takes the GPUs llama.cpp would use (:func:`offload_devices`
of GGML's registry) and what each layer costs on a device (:func:`layer_costs`: its weights from
the GGUF's tensor sizes, its KV cache for ``num_ctx`` x ``num_parallel``, and a compute buffer per
device used), and returns a :class:`Placement`: ``n_gpu_layers``, the split, the main GPU.

llama.cpp's counting, which Ollama's ``num_gpu`` follows: a model has ``block_count + 1`` layers,
the repeating blocks and the output layer (output norm and projection). ``n_gpu_layers = k``
offloads the output layer and the last ``k - 1`` blocks; the token embedding stays on the host
(a row lookup), whatever ``k`` is.

The rules:

- ``num_gpu`` 0, or no GPU (a CPU build: ``llama_supports_gpu_offload`` false): the CPU, as
  before; ``main_gpu`` is then not looked at.
- ``num_gpu`` -1 (any negative): as many layers as fit. ``num_gpu`` N: N layers at most, and
  only as many as fit — a larger N offloads what fits, with a warning, instead of failing the
  load when a device runs out (Ollama's estimate offloads what fits too).
- A model whose layers all fit on ``main_gpu`` goes there alone (split mode none); otherwise its
  layers are spread over every GPU in order (split mode layer, ``tensor_split`` = layers per GPU),
  when that offloads more (Ollama's scheduler: one GPU if it fits, else spread).
- ``main_gpu`` must name one of the GPUs (0 .. count-1): otherwise InvalidRequest (400).
- Each GPU keeps :data:`DEVICE_RESERVE` plus ``OLLAMA_GPU_OVERHEAD`` bytes free for its backend
  (driver context, library workspaces), and the compute buffer on every GPU that holds layers.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from typing import Literal, Sequence

from ..api import InvalidRequest, ModelInfo, Offload
from ..ml.device import Device
from ..model import ggufmeta
from .plan import Reservation

log = logging.getLogger(__name__)

MiB = 2**20
# per GPU used: what its backend takes besides our buffers (Ollama: 457 MiB for CUDA and ROCm)
DEVICE_RESERVE = 512 * MiB
_BLOCK = re.compile(r"blk\.(\d+)\.")


@dataclass(frozen=True)
class LayerCosts:
    """Bytes a device holds for each offloadable layer of one load."""

    blocks: tuple[int, ...]  # each repeating block: its weights and its KV cache
    kv: tuple[int, ...]  # the KV cache part of each block
    output: int  # the output layer: norm and projection (the token embedding when tied to it)
    graph: int  # the compute buffer of every device that holds layers

    @property
    def count(self) -> int:
        """Layers as llama.cpp counts them: the blocks and the output layer."""
        return len(self.blocks) + 1

    def offloaded(self, k: int) -> list[int]:
        """What ``n_gpu_layers = k`` puts on the GPUs, in llama.cpp's order: the last ``k - 1``
        blocks, then the output layer."""
        if k <= 0:
            return []
        first = len(self.blocks) - (k - 1)
        return list(self.blocks[first:]) + [self.output]


def layer_costs(info: ModelInfo, need: Reservation) -> LayerCosts:
    """The costs of ``info``'s layers under ``need`` (:func:`runner.loading.plan.reservation`):
    each ``blk.N.*`` tensor's bytes go to block N, ``output*`` tensors to the output layer
    (``token_embd.weight`` instead when the GGUF has no ``output.weight``: llama.cpp copies the
    tied embedding there); other tensors stay on the host."""
    n_blocks = len(need.kv_layers)
    weights = [0] * n_blocks
    output = 0
    tensors = ggufmeta.read_gguf_header(info.path).tensors
    for name, tensor in tensors.items():
        match = _BLOCK.match(name)
        if match:
            block = int(match.group(1))
            if block < n_blocks:
                weights[block] += tensor.nbytes
        elif name.startswith("output"):
            output += tensor.nbytes
    if "output.weight" not in tensors and "token_embd.weight" in tensors:
        output += tensors["token_embd.weight"].nbytes
    blocks = tuple(w + kv for w, kv in zip(weights, need.kv_layers))
    return LayerCosts(blocks, need.kv_layers, output, need.compute)


@dataclass(frozen=True)
class Share:
    """The layers one GPU holds: ``index`` numbers it among the offload devices (``main_gpu``'s
    numbering), ``nbytes`` is their weights, KV cache and the compute buffer."""

    device: Device
    index: int
    layers: int
    nbytes: int


@dataclass(frozen=True)
class Placement:
    """Where a load's layers go: ``layers`` of ``total`` offloaded (llama.cpp's
    ``n_gpu_layers``), held by ``shares`` in llama.cpp's order (the first gets the earliest
    blocks, the last the output layer)."""

    layers: int = 0
    total: int = 0
    shares: tuple[Share, ...] = ()
    split: Literal["none", "layer"] = "layer"  # llama.cpp's split mode
    main_gpu: int = 0
    kv_offloaded: int = 0  # bytes of the KV cache on the GPUs (host memory they spare)
    note: str = ""  # said once at load and shown with the devices (the new engine's notice)

    @property
    def vram(self) -> int:
        return sum(s.nbytes for s in self.shares)

    def describe(self) -> str:
        """``CPU``; ``CUDA0 (NVIDIA H200) 31/31 layers``; ``CUDA0 (NVIDIA T4) 20/31 layers,
        CPU 11/31 layers``: what ``--verbose`` and ``pollama show`` say."""
        if not self.shares:
            return "CPU" + (f" ({self.note})" if self.note else "")
        parts = [f"{s.device.label()} {s.layers}/{self.total} layers" for s in self.shares]
        if self.layers < self.total:
            parts.append(f"CPU {self.total - self.layers}/{self.total} layers")
        return ", ".join(parts)

    def tensor_split(self, n: int) -> list[float]:
        """llama.cpp's ``tensor_split`` for ``n`` entries: the layers of each offload device."""
        out = [0.0] * n
        for share in self.shares:
            if share.index < n:
                out[share.index] = float(share.layers)
        return out

    def offload(self) -> Offload:
        """What the runner reports (``/api/ps``, ``pollama ps``, ``--verbose``)."""
        return Offload(devices=self.describe(), vram=self.vram, full=self.layers > 0 and self.layers == self.total)


CPU = Placement()


def offload_devices(found: Sequence[Device]) -> list[Device]:
    """The devices llama.cpp offloads to, numbered as its ``main_gpu`` numbers them
    (``llama_model_load_from_file``): RPC servers first, then the GPUs in registry order;
    integrated GPUs only when there is neither."""
    gpus = [d for d in found if d.kind == "gpu"]
    ordered = [d for d in gpus if d.backend == "RPC"] + [d for d in gpus if d.backend != "RPC"]
    return ordered or [d for d in found if d.kind == "igpu"]


def cpu_only_note(found: Sequence[Device]) -> str:
    """The new engine's notice where GPUs are present ("" where none is): it runs on the CPU."""
    gpus = offload_devices(found)
    if not gpus:
        return ""
    return (f"the new engine runs on the CPU; GPU devices present: {', '.join(d.label() for d in gpus)}; "
            f"use the old engine for offload")


def _room(device: Device, costs: LayerCosts, overhead: int) -> int:
    return max(0, device.free - DEVICE_RESERVE - overhead - costs.graph)


def _pack(items: list[int], rooms: list[int]) -> list[int] | None:
    """Layers per device when ``items`` go in order, each device filled before the next; None
    when they do not all fit."""
    counts = [0] * len(rooms)
    j, used = 0, 0
    for size in items:
        while j < len(rooms) and used + size > rooms[j]:
            j, used = j + 1, 0
        if j == len(rooms):
            return None
        counts[j] += 1
        used += size
    return counts


def _most(items_for: int, costs: LayerCosts, rooms: list[int]) -> tuple[int, list[int]]:
    """The most layers (at most ``items_for``) that :func:`_pack` places, and how."""
    for k in range(items_for, 0, -1):
        counts = _pack(costs.offloaded(k), rooms)
        if counts is not None:
            return k, counts
    return 0, [0] * len(rooms)


def place(gpus: Sequence[Device], costs: LayerCosts, num_gpu: int, main_gpu: int, overhead: int = 0) -> Placement:
    """Where the layers go (the rules are the module's). ``gpus``: :func:`offload_devices`;
    ``overhead``: ``OLLAMA_GPU_OVERHEAD`` bytes left free on each. Raises InvalidRequest for a
    ``main_gpu`` that names none of ``gpus``."""
    if num_gpu == 0 or not gpus:
        return Placement(total=costs.count)
    if not 0 <= main_gpu < len(gpus):
        names = ", ".join(f"{i} {d.label()}" for i, d in enumerate(gpus))
        raise InvalidRequest(f"main_gpu {main_gpu} names no GPU: this machine has {len(gpus)} ({names})")
    wanted = costs.count if num_gpu < 0 else min(num_gpu, costs.count)
    rooms = [_room(d, costs, overhead) for d in gpus]
    alone, _ = _most(wanted, costs, [rooms[main_gpu]])
    spread, counts = _most(wanted, costs, rooms) if len(gpus) > 1 and alone < wanted else (0, [])
    if spread > alone:
        layers, split = spread, "layer"
        chosen = [(i, n) for i, n in enumerate(counts) if n]
    else:
        layers, split = alone, "none"
        chosen = [(main_gpu, alone)] if alone else []
    if num_gpu > 0 and layers < num_gpu:
        log.warning("num_gpu %d: %d of the model's %d layers fit in the GPUs' free memory; offloading %d",
                    num_gpu, layers, costs.count, layers)
    if layers == 0:
        return Placement(total=costs.count)
    items = costs.offloaded(layers)
    shares, start = [], 0
    for index, n in chosen:
        share = items[start:start + n]
        shares.append(Share(gpus[index], index, n, sum(share) + costs.graph))
        start += n
    first_block = len(costs.blocks) - (layers - 1)
    return Placement(layers=layers, total=costs.count, shares=tuple(shares), split=split, main_gpu=main_gpu,
                     kv_offloaded=sum(costs.kv[first_block:]))
