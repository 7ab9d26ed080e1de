"""The new engine's KV cache (Ollama's ``kvcache/``).

- :mod:`.cache`: the :class:`Cache` protocol and the errors (the layout a backend wants,
  ``CacheConfig``, is the tensor layer's: :mod:`runner.ml`);
- :mod:`.cells`: :class:`CellTable`, the plain-Python/NumPy bookkeeping (cells, ranges, masks,
  sliding window, copy-prefix sharing, removal with renumbering) that the tensor side applies;
- :mod:`.wrapper`: :class:`WrapperCache`, several caches behind one (SWA + global layers);
- :mod:`.snapshot`: the byte format of an exported sequence (``Cache.export_seq``/``import_seq``).
"""

from __future__ import annotations

from .cache import Batch, Cache, KvCacheError, KvCacheFull, LayerShape, NotSupported
from .cells import (
    INT32_MAX,
    CacheGeometry,
    CellInfo,
    CellTable,
    ForwardPlan,
    ShiftChunk,
    ShiftPlan,
    cache_geometry,
    round_down,
    round_up,
)
from .wrapper import WrapperCache

__all__ = [
    "INT32_MAX",
    "Batch",
    "Cache",
    "CacheGeometry",
    "CellInfo",
    "CellTable",
    "ForwardPlan",
    "KvCacheError",
    "KvCacheFull",
    "LayerShape",
    "NotSupported",
    "ShiftChunk",
    "ShiftPlan",
    "WrapperCache",
    "cache_geometry",
    "round_down",
    "round_up",
]
