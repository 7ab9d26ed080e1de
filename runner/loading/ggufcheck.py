"""Can the engines load this GGUF without crashing? The rules, in one place, each with its reason.

llama.cpp trusts much of a model's metadata: some values it checks with ``GGML_ASSERT``, which
aborts the whole process (a server with it), and the new engine's model code divides by head
counts and hands shapes to GGML, whose own asserts abort too. :func:`check_model` runs every rule
of :data:`RULES` on the header (``runner.model.ggufmeta``) before either engine sees the file, so a
malformed file gets one clear line (``InvalidModel``, a 400 in the server) instead.

The structure of the file (truncation, tensor offsets, types, dims, counts) is checked by
``ggufmeta.read_gguf_header`` as GGML's reader checks it; the rules here are about what the
metadata means. A rule is a function of :class:`Facts` returning the problem (one phrase) or
None; its docstring says why the rule exists. Rules that are specific to an architecture name it.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..api import InvalidModel
from ..model.ggufmeta import GGUFHeader, read_array

MAX_LAYERS = 512  # llama.cpp's LLAMA_MAX_LAYERS
MAX_EXPERTS = 1024  # llama.cpp's LLAMA_MAX_EXPERTS
ROPE_SCALING_TYPES = ("none", "linear", "yarn", "longrope")
NO_VOCAB_TOKENIZERS = ("none", "no_vocab")  # llama.cpp's tokenizer models without a token list
# Architectures whose tensors these rules know (the new engine's): llama.cpp's graph for them
# asserts that K and V heads have one size and that RoPE turns whole heads.
LLAMA_LIKE = ("llama", "qwen2")

_LAYER = re.compile(r"^blk\.(\d+)\.")
_ATTENTION = re.compile(r"^blk\.(\d+)\.attn_(q|k|v|qkv)\.weight$")


class Facts:
    """The header, with the few derived values the rules share."""

    def __init__(self, header: GGUFHeader, path: Path) -> None:
        self.header = header
        self.path = path
        self.arch = header.metadata.get("general.architecture")
        self.tensors = header.tensors
        self._arrays: dict[str, list] = {}

    def key(self, suffix: str) -> str:
        return f"{self.arch}.{suffix}"

    def value(self, suffix: str, default: Any = None) -> Any:
        return self.header.metadata.get(self.key(suffix), default)

    def has(self, suffix: str) -> bool:
        return self.key(suffix) in self.header.types

    @property
    def n_layer(self) -> int:
        """block_count (valid once the block_count rule has passed)."""
        return int(self.value("block_count"))

    def array(self, key: str) -> list:
        if key not in self._arrays:
            self._arrays[key] = read_array(self.path, key) or []
        return self._arrays[key]

    def per_layer(self, suffix: str, default: int) -> list[int]:
        """A value that is one integer or one per layer (an array of block_count integers; valid
        once the per_layer_values rule has passed)."""
        if self.key(suffix) in self.header.array_lengths:
            return [int(v) for v in self.array(self.key(suffix))]
        return [int(self.value(suffix, default))] * self.n_layer

    def attention_layers(self) -> list[int]:
        """The layers that have attention projections (Q, K, V or fused QKV)."""
        layers = {int(m.group(1)) for name in self.tensors if (m := _ATTENTION.match(name))}
        return sorted(layers)

    @property
    def n_embd(self) -> int:
        """embedding_length (valid once the embedding_length rule has passed)."""
        return int(self.value("embedding_length"))

    @property
    def n_head_max(self) -> int:
        return max(self.per_layer("attention.head_count", 0), default=0)

    def head_sizes(self) -> tuple[int, int]:
        """(K head size, V head size): key_length/value_length, else embedding_length / heads."""
        n_head = self.n_head_max
        default = int(self.value("embedding_length")) // n_head if n_head else 0
        return int(self.value("attention.key_length", default)), int(self.value("attention.value_length", default))


Rule = Callable[[Facts], "str | None"]
RULES: list[Rule] = []


def rule(fn: Rule) -> Rule:
    RULES.append(fn)
    return fn


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# ---------------------------------------------------------------------------------------- rules
@rule
def has_weights(f: Facts) -> str | None:
    """A file without tensors (a tokenizer-only GGUF such as llama.cpp's ggml-vocab-*.gguf) has
    nothing to run: llama.cpp fails on the first missing tensor and the reader would call the file
    truncated."""
    if not f.tensors:
        return "it has no weights (a vocabulary-only GGUF holds just a tokenizer), so it cannot be run"
    return None


# GGML types that no kernel multiplies or gathers (their mul_mat/get_rows crash the process):
# the 8-bit activation types and plain integers.
NOT_WEIGHT_TYPES = ("q8_1", "q8_K", "i8", "i16", "i32", "i64", "f64")
_ELEMENTWISE = re.compile(r"(norm\.weight|\.bias)$")


@rule
def weight_types(f: Facts) -> str | None:
    """GGML crashes (SIGSEGV or GGML_ASSERT) when a weight has a type it cannot multiply or
    gather (integers, f64, the 8-bit activation types), and when a norm weight or a bias, which
    are added or multiplied element by element, is anything but F32."""
    for t in f.tensors.values():
        if t.type_name in NOT_WEIGHT_TYPES:
            return f"tensor {t.name!r} has type {t.type_name}, which GGML cannot compute with"
        if _ELEMENTWISE.search(t.name) and t.type_name != "f32":
            return f"tensor {t.name!r} has type {t.type_name}; norm weights and biases must be f32"
    return None


@rule
def architecture(f: Facts) -> str | None:
    """Both engines pick their model code by ``general.architecture``."""
    if not isinstance(f.arch, str) or not f.arch:
        return "general.architecture is missing"
    return None


@rule
def block_count(f: Facts) -> str | None:
    """llama.cpp aborts (GGML_ASSERT) unless 1 <= block_count <= 512 (LLAMA_MAX_LAYERS); the new
    engine builds that many layers."""
    n = f.value("block_count")
    if n is None:
        return f"{f.key('block_count')} is missing"
    if not _is_int(n) or not 1 <= n <= MAX_LAYERS:
        return f"{f.key('block_count')} is {n!r}; it must be between 1 and {MAX_LAYERS}"
    return None


@rule
def layers_within_block_count(f: Facts) -> str | None:
    """Tensors of a layer past block_count: llama.cpp refuses them ("wrong number of tensors"),
    the new engine would silently drop the layers."""
    beyond = [int(m.group(1)) for name in f.tensors if (m := _LAYER.match(name)) and int(m.group(1)) >= f.n_layer]
    if beyond:
        return f"it has weights for layer {max(beyond)} but {f.key('block_count')} is {f.n_layer}"
    return None


@rule
def per_layer_values(f: Facts) -> str | None:
    """Head counts, feed-forward widths and experts used are counts, given once or once per layer:
    an array must have one entry per layer (llama.cpp refuses others; the new engine would index
    past its end)."""
    for suffix in ("attention.head_count", "attention.head_count_kv", "feed_forward_length", "expert_used_count"):
        key = f.key(suffix)
        if key in f.header.array_lengths:
            values = f.array(key)
            if len(values) != f.n_layer:
                return f"{key} has {len(values)} entries for {f.n_layer} layers"
            if not all(_is_int(v) and v >= 0 for v in values):
                return f"{key} must hold counts"
        elif key in f.header.types:
            value = f.value(suffix)
            if not _is_int(value) or value < 0:
                return f"{key} is {value!r}; it must be a count"
    return None


@rule
def nextn_layers(f: Facts) -> str | None:
    """llama.cpp aborts (GGML_ASSERT) when more multi-token-prediction layers than layers are
    declared."""
    n = f.value("nextn_predict_layers", 0)
    if not _is_int(n) or not 0 <= n <= f.n_layer:
        return f"{f.key('nextn_predict_layers')} is {n!r}; it must be between 0 and {f.n_layer}"
    return None


@rule
def experts(f: Facts) -> str | None:
    """llama.cpp aborts (GGML_ASSERT) on an inconsistent mixture of experts: at most 1024
    experts, some but not more than all of them used per token, expert groups that divide them."""
    n_expert = f.value("expert_count", 0)
    groups = f.value("expert_group_count", 0)
    group_used = f.value("expert_group_used_count", 0)
    for name, v in (("expert_count", n_expert), ("expert_group_count", groups), ("expert_group_used_count", group_used)):
        if not _is_int(v) or v < 0:
            return f"{f.key(name)} is {v!r}; it must be a count"
    if n_expert > MAX_EXPERTS:
        return f"{f.key('expert_count')} is {n_expert}; at most {MAX_EXPERTS} are supported"
    used = max(f.per_layer("expert_used_count", 0), default=0)
    if n_expert == 0:
        if used or groups:
            return f"{f.key('expert_used_count')} or expert_group_count is set but the model has no experts"
        return None
    if not 0 < used <= n_expert:
        return f"{f.key('expert_used_count')} is {used}; it must be between 1 and expert_count {n_expert}"
    if groups >= n_expert:
        return f"{f.key('expert_group_count')} is {groups}; it must be below expert_count {n_expert}"
    if groups > 1 and (n_expert % groups or not 0 < group_used < groups):
        return f"expert groups ({groups} groups, {group_used} used) do not divide {n_expert} experts"
    return None


@rule
def rope_scaling_type(f: Facts) -> str | None:
    """llama.cpp aborts (GGML_ASSERT) on a RoPE scaling type it does not know."""
    kind = f.value("rope.scaling.type")
    if kind is not None and kind not in ROPE_SCALING_TYPES:
        return f"{f.key('rope.scaling.type')} is {kind!r}; it must be one of {', '.join(ROPE_SCALING_TYPES)}"
    return None


@rule
def norm_epsilon(f: Facts) -> str | None:
    """GGML's normalisation kernels abort (GGML_ASSERT eps >= 0) at the first token when the
    epsilon is negative or not a number."""
    for suffix in ("attention.layer_norm_rms_epsilon", "attention.layer_norm_epsilon"):
        eps = f.value(suffix)
        if eps is not None and (isinstance(eps, (str, bool)) or not math.isfinite(eps) or eps < 0):
            return f"{f.key(suffix)} is {eps!r}; it must be a small non-negative number"
    return None


@rule
def embedding_length(f: Facts) -> str | None:
    """The width of every layer; both engines size weights and attention heads from it."""
    n = f.value("embedding_length")
    if n is None:
        return f"{f.key('embedding_length')} is missing"
    if not _is_int(n) or n < 1:
        return f"{f.key('embedding_length')} is {n!r}; it must be at least 1"
    return None


@rule
def attention_heads(f: Facts) -> str | None:
    """Each K/V head serves head_count / head_count_kv query heads: the attention kernels abort
    (GGML_ASSERT in mul_mat) when it does not divide, and the engines divide by both counts."""
    layers = f.attention_layers()
    if not layers:
        return None
    heads = f.per_layer("attention.head_count", 0)
    if f.key("attention.head_count_kv") in f.header.types:
        kv_heads = f.per_layer("attention.head_count_kv", 0)
    else:
        kv_heads = heads
    for i in layers:
        if not f.has("attention.head_count"):
            return f"{f.key('attention.head_count')} is missing"
        if heads[i] < 1:
            return f"{f.key('attention.head_count')} is {heads[i]} for layer {i}, which has attention weights"
        if kv_heads[i] < 1 or heads[i] % kv_heads[i]:
            return (f"{f.key('attention.head_count_kv')} is {kv_heads[i]} for layer {i}; it must divide "
                    f"{f.key('attention.head_count')} {heads[i]}")
    return None


@rule
def head_size(f: Facts) -> str | None:
    """Attention works on heads of key_length (else embedding_length / head_count) features: a
    head of zero features makes both engines divide by zero or build empty tensors. llama and
    qwen2 graphs in llama.cpp also assert that K and V heads have one size."""
    if not f.attention_layers():
        return None
    for suffix in ("attention.key_length", "attention.value_length"):
        v = f.value(suffix)
        if v is not None and (not _is_int(v) or v < 1):
            return f"{f.key(suffix)} is {v!r}; it must be at least 1"
    k, v = f.head_sizes()
    if k < 1 or v < 1:
        return (f"attention heads would have no features ({f.key('embedding_length')} "
                f"{f.value('embedding_length')} over {f.n_head_max} heads)")
    if f.arch in LLAMA_LIKE and k != v:
        return f"key heads have {k} features and value heads {v}; {f.arch} needs them equal"
    return None


def _padded(shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(shape) + (1,) * (4 - len(shape))


@rule
def llama_shapes(f: Facts) -> str | None:
    """The new engine hands these weights to GGML's matrix products, which abort (GGML_ASSERT)
    on shapes that do not fit; llama.cpp refuses them. For llama and qwen2 every weight must have
    the shape the hyperparameters give it."""
    if f.arch not in LLAMA_LIKE:
        return None
    n_embd = f.n_embd
    hk, hv = f.head_sizes()
    heads = f.per_layer("attention.head_count", 0)
    kv_heads = f.per_layer("attention.head_count_kv", 0) if f.has("attention.head_count_kv") else heads
    n_ff = f.per_layer("feed_forward_length", 0)
    want: dict[str, tuple[int, ...]] = {"output_norm.weight": (n_embd,)}
    for i in range(f.n_layer):
        q, k, v = hk * heads[i], hk * kv_heads[i], hv * kv_heads[i]
        want.update({
            f"blk.{i}.attn_norm.weight": (n_embd,), f"blk.{i}.ffn_norm.weight": (n_embd,),
            f"blk.{i}.attn_q.weight": (n_embd, q), f"blk.{i}.attn_q.bias": (q,),
            f"blk.{i}.attn_k.weight": (n_embd, k), f"blk.{i}.attn_k.bias": (k,),
            f"blk.{i}.attn_v.weight": (n_embd, v), f"blk.{i}.attn_v.bias": (v,),
            f"blk.{i}.attn_output.weight": (hv * heads[i], n_embd), f"blk.{i}.attn_output.bias": (n_embd,),
            f"blk.{i}.ffn_gate.weight": (n_embd, n_ff[i]), f"blk.{i}.ffn_up.weight": (n_embd, n_ff[i]),
            f"blk.{i}.ffn_down.weight": (n_ff[i], n_embd),
        })
    for name, shape in want.items():
        t = f.tensors.get(name)
        if t is not None and _padded(t.shape) != _padded(shape):
            return f"{name} has shape {list(t.shape)}; the hyperparameters give it {list(shape)}"
    return None


@rule
def rope_dimensions(f: Facts) -> str | None:
    """RoPE turns pairs of features within one head: GGML aborts (GGML_ASSERT) when the count is
    odd or larger than the head, and the new engine hangs on zero. llama.cpp's llama graph needs
    it to be exactly the head size."""
    n = f.value("rope.dimension_count")
    if n is None or not f.attention_layers():
        return None
    k, _ = f.head_sizes()
    if not _is_int(n) or n < 2 or n % 2 or n > k:
        return f"{f.key('rope.dimension_count')} is {n!r}; it must be even and between 2 and the head size {k}"
    if f.arch in LLAMA_LIKE and n != k:
        return f"{f.key('rope.dimension_count')} is {n}; {f.arch} turns whole heads of {k} features"
    return None


@rule
def vocabulary(f: Facts) -> str | None:
    """Token ids index the embedding rows: a vocabulary larger than the embedding table makes
    GGML read past it (GGML_ASSERT in get_rows), and llama.cpp refuses other sizes. The
    per-token arrays (scores, types) must cover every token."""
    model = f.header.metadata.get("tokenizer.ggml.model")
    n_tokens = f.header.array_lengths.get("tokenizer.ggml.tokens")
    if n_tokens is None:
        if model in NO_VOCAB_TOKENIZERS:
            return None
        return "it has no vocabulary (tokenizer.ggml.tokens)"
    if n_tokens < 1:
        return "its vocabulary (tokenizer.ggml.tokens) is empty"
    for key in ("tokenizer.ggml.scores", "tokenizer.ggml.token_type"):
        n = f.header.array_lengths.get(key)
        if n is not None and n < n_tokens:
            return f"{key} has {n} entries for {n_tokens} tokens"
    n_embd = f.n_embd
    for name in ("token_embd.weight", "output.weight"):
        t = f.tensors.get(name)
        if t is not None and (len(t.shape) != 2 or t.shape != (n_embd, n_tokens)):
            return (f"{name} has shape {list(t.shape)}, but the model has {n_tokens} tokens of "
                    f"{n_embd} features ([{n_embd}, {n_tokens}])")
    return None


@rule
def unique_tokens(f: Facts) -> str | None:
    """llama.cpp aborts (GGML_ASSERT) when two tokens have the same text (an empty token counts
    as "[EMPTY_<id>]", as llama.cpp names it)."""
    if "tokenizer.ggml.tokens" not in f.header.array_lengths:
        return None
    tokens = read_array(f.path, "tokenizer.ggml.tokens", errors=None) or []  # raw bytes, as llama.cpp compares
    if len(set(tokens)) == len(tokens) and b"" not in tokens:
        return None
    seen: set[bytes] = set()
    for i, raw in enumerate(tokens):
        raw = raw or f"[EMPTY_{i}]".encode()
        if raw in seen:
            text = raw.decode("utf-8", "replace")
            return f"its vocabulary has the token {text!r} twice (id {i})"
        seen.add(raw)
    return None


# ------------------------------------------------------------------------------------ the check
def problems(header: GGUFHeader, path: Path) -> Iterator[str]:
    """Every rule's problem, in order; later rules may assume the earlier ones passed, so only
    the first is meaningful."""
    facts = Facts(header, path)
    for check in RULES:
        problem = check(facts)
        if problem is not None:
            yield problem
            return


def check_model(header: GGUFHeader, path: str | Path) -> None:
    """Raise InvalidModel (one line naming the file) when a rule fails."""
    path = Path(path)
    for problem in problems(header, path):
        raise InvalidModel(f"{path.name} cannot be loaded: {problem}")
