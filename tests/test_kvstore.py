"""The prompt store's keys and RAM tier (runner.kvstore), on plain data: no model."""

from __future__ import annotations

import dataclasses
import os

import pytest

from runner import config
from runner.kvstore.key import BLOCK, Fingerprint, chain, file_identity
from runner.kvstore.ram import RamStore
from runner.loop.slots import ImageInput

FP = Fingerprint(engine="old", engine_version="0.3.36", model="sha256-" + "ab" * 32, projector="",
                 kv_cache_type="f16", flash_attention=False, num_ctx=2048, layout="streams=1")


def tokens(n: int, start: int = 100) -> list[int]:
    return list(range(start, start + n))


# ------------------------------------------------------------------------------------- keys
def test_same_prefix_same_hashes():
    a, b = chain(FP, tokens(50)), chain(FP, tokens(40) + [7] * 30)
    assert a.prefixes[:3] == b.prefixes[:3]  # the first 32 inputs (two blocks) are shared
    assert a.prefixes[3] == chain(FP, tokens(48)).prefixes[3]
    c = chain(FP, tokens(33) + [1] * 20)
    assert c.prefixes[:3] == a.prefixes[:3] and c.prefixes[3] != a.prefixes[3]  # differs at input 33


def test_one_changed_input_changes_its_block_and_every_later_one():
    base = tokens(80)
    changed = list(base)
    changed[20] = 9999
    a, b = chain(FP, base), chain(FP, changed)
    assert a.prefixes[:2] == b.prefixes[:2]
    assert all(x != y for x, y in zip(a.prefixes[2:], b.prefixes[2:]))


@pytest.mark.parametrize("field,value", [("engine", "new"), ("engine_version", "0.3.37"),
                                         ("model", "sha256-" + "cd" * 32), ("projector", "x"),
                                         ("kv_cache_type", "q8_0"), ("flash_attention", True),
                                         ("num_ctx", 4096), ("layout", "streams=2")])
def test_another_fingerprint_shares_no_hash(field, value):
    other = dataclasses.replace(FP, **{field: value})
    a, b = chain(FP, tokens(70)), chain(other, tokens(70))
    assert not set(a.prefixes + (a.tail,)) & set(b.prefixes + (b.tail,))


def test_exact_tail_key():
    c = chain(FP, tokens(37))
    assert c.n == 37 and len(c.prefixes) == 3 and c.tail is not None
    assert c.key() == c.tail == chain(FP, tokens(37)).key()
    assert c.key() != chain(FP, tokens(36)).key() and c.key() != chain(FP, tokens(38)).key()
    # the key of any prefix equals the key of that prefix hashed alone
    for n in (0, 1, 15, 16, 17, 32, 36, 37):
        assert c.key_at(n) == chain(FP, tokens(n)).key()
    # a full block is keyed by its block hash, never by a tail hash
    assert chain(FP, tokens(32)).tail is None and chain(FP, tokens(32)).key() == c.prefixes[2]


def test_images_hash_by_identity_not_source():
    def image(digest: str, source) -> list:
        return [ImageInput(digest, i, 20, source=source) for i in range(20)]

    d1, d2 = "11" * 32, "22" * 32
    a = chain(FP, [1, 2, 3] + image(d1, object()) + [4, 5])
    b = chain(FP, [1, 2, 3] + image(d1, "another decode of the same image") + [4, 5])
    c = chain(FP, [1, 2, 3] + image(d2, object()) + [4, 5])
    assert a.prefixes == b.prefixes and a.key() == b.key()
    assert a.prefixes[0] == c.prefixes[0] and a.prefixes[1] != c.prefixes[1] and a.key() != c.key()
    # an image position is never the token with the same bytes
    assert chain(FP, [ImageInput(d1, 0, 1)]).key() != chain(FP, [0]).key()


def test_file_identity(tmp_path):
    blob = tmp_path / ("sha256-" + "0f" * 32)
    blob.write_bytes(b"gguf")
    assert file_identity(str(blob)) == blob.name  # a store blob: its digest, wherever the store is
    loose = tmp_path / "model.gguf"
    loose.write_bytes(b"gguf")
    first = file_identity(str(loose))
    loose.write_bytes(b"gguf, changed")
    assert file_identity(str(loose)) != first
    assert file_identity(None) == ""


def test_fingerprint_of_a_load():
    class Info:
        path, projector = str(__file__), None

    class Load:
        kv_cache_type, flash_attention, num_ctx = "f16", True, 1024

    fp = Fingerprint.of("old", "0.3.36", Info, Load, layout="streams=2")
    assert fp.model == file_identity(__file__) and fp.projector == "" and fp.flash_attention
    assert fp.digest == Fingerprint.of("old", "0.3.36", Info, Load, layout="streams=2").digest
    assert fp.digest != Fingerprint.of("old", "0.3.36", Info, Load, layout="streams=1").digest


# -------------------------------------------------------------------------------------- RAM
def test_lookup_exact_and_by_block():
    store = RamStore(1 << 20)
    saved = tokens(40)
    assert store.put(chain(FP, saved), b"state", 5)
    assert store.lookup(chain(FP, saved)).n == 40  # the whole state: exact tail
    assert store.lookup(chain(FP, saved + [1, 2, 3])).n == 40
    hit = store.lookup(chain(FP, saved[:37] + [5, 5, 5, 5]))
    assert hit.n == 32 and hit.entry.n == 40  # shares two whole blocks; the caller cuts back to 32
    assert store.lookup(chain(FP, saved[:10])) is None  # shorter than one block and not exact
    assert store.lookup(chain(dataclasses.replace(FP, num_ctx=1), saved)) is None
    assert store.lookup(chain(FP, [0] + saved)) is None


def test_short_state_found_by_its_exact_tail():
    store = RamStore(1 << 20)
    store.put(chain(FP, tokens(5)), b"s", 1)
    assert store.lookup(chain(FP, tokens(9))).n == 5
    assert store.lookup(chain(FP, tokens(4))) is None


def test_longest_wins_and_extended_states_are_dropped():
    store = RamStore(1 << 20)
    store.put(chain(FP, tokens(20)), b"short", 5)
    store.put(chain(FP, tokens(20, start=5000)), b"other", 5)
    store.put(chain(FP, tokens(50)), b"long", 4)  # extends the first: it goes
    assert len(store) == 2
    hit = store.lookup(chain(FP, tokens(60)))
    assert hit.n == 50 and hit.entry.state == b"long"
    assert store.lookup(chain(FP, tokens(20))).n == 16  # the long state, cut back to a block
    taken = store.take(hit.entry.key)
    assert taken is hit.entry and store.lookup(chain(FP, tokens(60))) is None and len(store) == 1


def test_lru_order_and_get():
    entry_cost = RamStore(1 << 20)
    entry_cost.put(chain(FP, tokens(16)), b"", 1000)
    cost = entry_cost.used
    store = RamStore(3 * cost)
    keys = []
    for i in range(3):
        c = chain(FP, tokens(16, start=1000 * (i + 1)))
        store.put(c, i, 1000)
        keys.append(c.key())
    assert store.get(keys[0]) is not None  # 0 is now the most recently used
    store.put(chain(FP, tokens(16, start=9000)), 3, 1000)
    assert store.get(keys[1]) is None and store.get(keys[0]) is not None and store.get(keys[2]) is not None


def test_bound_holds_under_a_stream_of_distinct_states():
    limit = 1 << 20
    store = RamStore(limit)
    sizes = [7_000, 130_000, 1, 64_000, 300_000]
    kept_last = 0
    for i in range(400):
        c = chain(FP, tokens(1 + i % 97, start=100_000 * (i + 1)))
        assert store.put(c, bytes(1), sizes[i % len(sizes)])
        assert store.used <= limit
        assert store.lookup(c).n == c.n  # the newest is always kept
        kept_last = len(store)
    assert 3 <= kept_last < 400
    assert store.used == sum(e.nbytes for e in store._entries.values())
    assert not store.put(chain(FP, tokens(3)), b"", limit)  # larger than the whole bound: refused
    assert store.used <= limit


def test_off_keeps_nothing():
    store = RamStore(0)
    assert not store.put(chain(FP, tokens(20)), b"x", 1)
    assert store.lookup(chain(FP, tokens(20))) is None and store.used == 0


def test_config_cache_ram():
    assert config.load({}).cache_ram == config.DEFAULT_CACHE_RAM == 1024
    assert config.load({"OLLAMA_CACHE_RAM": "0"}).cache_ram == 0
    assert config.load({"OLLAMA_CACHE_RAM": "64"}).cache_ram_bytes == 64 << 20
    assert config.load({"OLLAMA_CACHE_RAM": "lots"}).cache_ram == config.DEFAULT_CACHE_RAM


def test_new_engine_says_unsupported():
    from runner.engines.ggml.kv import CacheKv

    class FakeCache:
        removed: list = []

        def remove(self, seq, begin, end):
            self.removed.append((seq, begin, end))

    kv = CacheKv(FakeCache())
    assert kv.export_seq(0) is None
    assert not kv.import_seq(1, b"state") and kv.cache.removed == [(1, 0, None)]  # the slot is left empty
