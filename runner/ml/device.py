"""A compute device as GGML's backend registry lists it: plain data, read once per load.

:func:`runner.ml.ggml.devices.devices` fills these from the registry of the GGML libraries this
process loaded; :mod:`runner.loading.gpu` places a model's layers on them. Tests build them by
hand to isolate the placement rules from the machine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Kind = Literal["cpu", "gpu", "igpu", "accel", "meta"]  # enum ggml_backend_dev_type


@dataclass(frozen=True)
class Device:
    """One device: ``name`` as GGML names it (``CPU``, ``CUDA0``, ``Metal``, ``Vulkan0``),
    ``description`` as its driver does (``NVIDIA H200``), the ``backend`` registry entry it
    belongs to (``CPU``, ``CUDA``, ``RPC``...), its ``kind``, and its memory in bytes at the time
    it was read (``free`` of ``total``)."""

    name: str
    description: str
    backend: str
    kind: Kind
    free: int
    total: int

    def label(self) -> str:
        """``CUDA0 (NVIDIA H200)``; the name alone when the description says nothing more."""
        if not self.description or self.description == self.name:
            return self.name
        return f"{self.name} ({self.description})"
