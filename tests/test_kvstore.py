"""The prompt store's keys and RAM tier (runner.kvstore), on plain data: no model."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

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
    assert hit.n == 37 and hit.entry.n == 40  # exact to the input; the caller cuts back to 37
    assert store.lookup(chain(FP, saved[:10])).n == 10  # less than a block is found too
    assert store.lookup(chain(dataclasses.replace(FP, num_ctx=1), saved)) is None
    assert store.lookup(chain(FP, [0] + saved)) is None


def test_short_state_found_by_its_exact_tail():
    store = RamStore(1 << 20)
    store.put(chain(FP, tokens(5)), b"s", 1)
    assert store.lookup(chain(FP, tokens(9))).n == 5
    assert store.lookup(chain(FP, tokens(4))).n == 4
    assert store.lookup(chain(FP, [1] + tokens(4))) is None


def test_lookup_ignores_image_sources_and_keeps_none():
    store = RamStore(1 << 20)
    image = [ImageInput("33" * 32, i, 20, source=bytearray(10_000)) for i in range(20)]
    store.put(chain(FP, [1, 2] + image + [3]), b"s", 1)
    entry = store.lookup(chain(FP, [1, 2] + [ImageInput("33" * 32, i, 20) for i in range(20)] + [3, 4])).entry
    assert entry.n == 23 and all(getattr(x, "source", None) is None for x in entry.inputs)
    other = [ImageInput("44" * 32, i, 20) for i in range(20)]
    assert store.lookup(chain(FP, [1, 2] + other)).n == 2


def test_longest_wins_and_extended_states_are_dropped():
    store = RamStore(1 << 20)
    store.put(chain(FP, tokens(20)), b"short", 5)
    store.put(chain(FP, tokens(20, start=5000)), b"other", 5)
    store.put(chain(FP, tokens(50)), b"long", 4)  # extends the first: it goes
    assert len(store) == 2
    hit = store.lookup(chain(FP, tokens(60)))
    assert hit.n == 50 and hit.entry.state == b"long"
    assert store.lookup(chain(FP, tokens(20))).n == 20  # the long state, to be cut back to 20
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


def test_config_cache_tiers():
    default = config.load({})
    assert (default.cache_ram, default.cache_disk) == (1024, 8192)  # MiB: on by default, both tiers
    assert default.cache_dir == Path(config.DEFAULT_CACHE_DIR).expanduser()
    assert config.load({"OLLAMA_CACHE_RAM": "0"}).cache_ram == 0
    assert config.load({"OLLAMA_CACHE_RAM": "64"}).cache_ram_bytes == 64 << 20
    assert config.load({"OLLAMA_CACHE_RAM": "lots"}).cache_ram == config.DEFAULT_CACHE_RAM
    assert config.load({"POLLAMA_CACHE_DISK": "0"}).cache_disk_bytes == 0
    assert config.load({"POLLAMA_CACHE_DIR": "~/elsewhere"}).cache_dir == Path.home() / "elsewhere"


def test_a_new_engine_cache_without_export_says_unsupported():
    from runner.engines.ggml.kv import CacheKv

    class FakeCache:  # a cache that cannot export (our causal and wrapper caches can)
        state_layout = ""
        removed: list = []

        def remove(self, seq, begin, end):
            self.removed.append((seq, begin, end))

    kv = CacheKv(FakeCache())
    assert kv.state_layout == "" and kv.export_seq(0) is None  # so the runner builds no store
    assert not kv.import_seq(1, b"state") and kv.cache.removed == [(1, 0, None)]  # the slot is left empty


# ------------------------------------------------------------------- the slot cache's use
class StateKv:
    """A KV memory that holds, per sequence, the inputs it was given (the slot cache's bookkeeping
    mirrored), and exports/imports them: enough to see what the slot cache saves and restores."""

    state_layout = "fake"

    def __init__(self, refuse: bool = False) -> None:
        self.held: dict[int, int] = {}  # seq -> positions held
        self.exports: list[int] = []
        self.imports: list[tuple[int, int]] = []
        self.refuse = refuse

    def seq_rm(self, seq, begin, end):
        assert end is None
        self.held[seq] = min(self.held.get(seq, 0), begin)
        return True

    def seq_cp(self, src, dst, length):
        self.held[dst] = length

    def shift(self, seq, keep, discard, length):
        return False

    def can_resume(self, seq, pos):
        return True

    def export_seq(self, seq, start=0):
        assert not start  # its states are kept whole: the store holds no pages of them
        self.exports.append(seq)
        return bytearray(b"%d" % self.held.get(seq, 0))

    def import_seq(self, seq, state):
        self.held[seq] = 0
        if self.refuse:
            return False
        self.imports.append((seq, int(state)))
        self.held[seq] = int(state)
        return True


def store_cache(kv, slots: int = 1, multi_user: bool = False):
    from runner.kvstore.store import PromptStore
    from runner.loop.slots import InputCache

    return InputCache(kv, kv_size=1024 * slots, num_slots=slots, multi_user=multi_user,
                      store=PromptStore(FP, RamStore(1 << 20)))


def run_turn(cache, prompt, answer=()):
    """Claim a slot for ``prompt``, "evaluate" the rest and ``answer``, release; what was cached."""
    slot, rest = cache.load_slot(list(prompt))
    cached = len(prompt) - len(rest)
    slot.inputs.extend(rest)
    slot.inputs.extend(answer)
    cache.kv.held[slot.id] = len(slot.inputs)
    cache.release(slot)
    return cached


def test_an_evicted_conversation_comes_back_from_the_store():
    kv = StateKv()
    cache = store_cache(kv)
    a, b = tokens(100), tokens(90, start=5000)
    assert run_turn(cache, a, [7, 8]) == 0
    assert run_turn(cache, b, [9]) == 0  # B takes the only slot: A's 102 inputs are saved
    assert kv.exports == [0] and cache.store.holds(a + [7, 8])
    assert run_turn(cache, a + [7, 8] + tokens(10, start=300)) == 102  # A returns: restored
    assert kv.imports == [(0, 102)] and kv.exports == [0, 0]  # B was saved before the import
    assert not cache.store.holds(a + [7, 8]) and cache.store.holds(b + [9])  # A moved into the slot
    assert run_turn(cache, b + [9, 1]) == 91  # and B comes back too


def test_the_store_restores_to_the_input_and_never_the_whole_prompt():
    kv = StateKv()
    cache = store_cache(kv)
    a = tokens(50)
    run_turn(cache, a)
    run_turn(cache, tokens(60, start=5000))
    assert run_turn(cache, a[:45] + [1, 2]) == 45
    assert kv.held[0] == 47  # restored 50, cut to 45, then the 2 new ones
    run_turn(cache, tokens(60, start=9000))
    assert run_turn(cache, a[:45] + [1, 2]) == 46  # the whole prompt is stored: one is evaluated


def test_a_gain_under_a_block_is_evaluated_and_the_state_stays_stored():
    kv = StateKv()
    cache = store_cache(kv)
    a = tokens(100)
    run_turn(cache, a)
    run_turn(cache, tokens(60, start=5000))  # A to the store
    assert run_turn(cache, a[:10] + tokens(40, start=9000)) == 0  # shares 10 with A: not worth a restore
    assert kv.imports == [] and cache.store.holds(a)  # A stays stored for A
    assert run_turn(cache, a + [1]) == 100


def test_a_slot_keeping_most_of_its_inputs_is_not_saved():
    kv = StateKv()
    cache = store_cache(kv)
    run_turn(cache, tokens(100), [5])
    run_turn(cache, tokens(100) + [6, 7])  # an edited last token: the slot keeps 100 of 101
    assert kv.exports == []


def test_a_refused_state_is_forgotten_and_the_prompt_evaluated():
    kv = StateKv(refuse=True)
    cache = store_cache(kv)
    a = tokens(40)
    run_turn(cache, a)
    run_turn(cache, tokens(40, start=5000))
    assert run_turn(cache, a + [1]) == 0
    assert not cache.store.holds(a) and kv.held[0] == 41


def test_short_slots_and_scratch_jobs():
    kv = StateKv()
    cache = store_cache(kv)
    run_turn(cache, tokens(10))  # shorter than a block: not worth a save
    run_turn(cache, tokens(30, start=5000))
    assert kv.exports == []
    slot, _ = cache.load_slot([], cache_prompt=False)  # an embedding job takes the slot
    assert kv.exports == [0] and cache.store.holds(tokens(30, start=5000))
    cache.release(slot)


# ------------------------------------------------------------------------------------- pages
class Rows:
    """A pager over a stand-in state format: per position 8 bytes naming its input (what the
    engines' formats are to the store: per-cell rows that cut at any position and join back)."""

    ROW = 8

    def __init__(self):
        self.cut = 0  # positions cut so far
        self.joins = 0

    def split_state(self, state, bounds, held=()):
        if len(state) != bounds[-1] * self.ROW:
            return None  # not positions 0..n-1: kept whole
        parts = [None if i in held else bytes(state[a * self.ROW : b * self.ROW])
                 for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]
        self.cut += sum(len(p) // self.ROW for p in parts if p is not None)
        return parts

    def join_states(self, parts):
        self.joins += 1
        self.joined = parts
        parts = [p[0][p[1] * self.ROW : p[2] * self.ROW] if isinstance(p, tuple) else p for p in parts]
        if any(len(p) % self.ROW for p in parts):
            raise ValueError("not rows")
        return b"".join(parts)

    def page_state(self, state, lo, hi):
        return bytes(state[lo * self.ROW : hi * self.ROW])


def rows_for(inputs: list[int]) -> bytes:
    return b"".join(t.to_bytes(8, "little") for t in inputs)


def paged_store(limit: int = 1 << 20):
    from runner.kvstore.store import PromptStore

    return PromptStore(FP, RamStore(limit), pager=Rows())


SYSTEM = tokens(3 * BLOCK + 5, start=7000)  # a system prompt: 3 blocks and 5 inputs


def test_a_shared_prefix_is_stored_once():
    store = paged_store()
    a, b = SYSTEM + tokens(40, start=100), SYSTEM + tokens(30, start=500)
    assert store.save(a, rows_for(a))
    assert store.ram.pages() == 6  # ceil(93 / 16): five blocks and a tail
    used_a = store.ram.used
    assert store.save(b, rows_for(b))
    # b's 83 inputs are 6 pages; the 3 blocks of the system prompt are a's
    assert store.ram.pages() == 6 + 6 - 3
    alone = paged_store()
    alone.save(b, rows_for(b))
    assert store.ram.used < used_a + alone.ram.used
    # the shared pages' entries and rows (a page's rows count with its save's group: b's holds
    # only its 35 inputs after the system prompt's blocks)
    shared = sum(e.nbytes for e in alone.ram._entries.values() if e.end <= 3 * BLOCK) + 3 * BLOCK * Rows.ROW
    assert store.ram.used == used_a + alone.ram.used - shared  # counted once
    for conv in (a, b):  # each comes back whole, to the input
        found = store.lookup(conv + [1, 2])
        assert (found.n, found.state_n, found.source, found.whole) == (len(conv), len(conv), "ram", False)
        assert found.state == rows_for(conv)
        store.forget(found)  # pages stay: another conversation shares them
        assert store.holds(conv)
    found = store.lookup(SYSTEM + [9, 9])  # a third conversation with the same system prompt
    assert found.n == len(SYSTEM) and found.state_n >= len(SYSTEM)
    assert found.state[: len(SYSTEM) * 8] == rows_for(SYSTEM)


def test_a_growing_conversation_cuts_only_its_new_pages():
    store = paged_store()
    a = SYSTEM + tokens(40, start=100)  # 93 inputs: 5 blocks and a tail
    assert store.save(a, rows_for(a)) and store.pager.cut == 93
    longer = a + tokens(20, start=900)  # the next turn: 113 inputs, 7 blocks and a tail
    assert store.save(longer, rows_for(longer))
    assert store.pager.cut == 93 + 33  # blocks 5 and 6 and the tail; the first five are held
    found = store.lookup(longer + [1])
    assert found.n == len(longer) and found.state == rows_for(longer)


def test_a_save_s_pages_are_one_group_and_join_in_one_piece():
    store = paged_store()
    a = tokens(100)  # 6 blocks and a tail of 4: 7 pages, one group
    assert store.save(a, rows_for(a))
    found = store.lookup(a + [1, 2])
    assert found.state == rows_for(a) and store.pager.joins == 0  # the group itself: nothing to join
    longer = a + tokens(50, start=900)  # 150 inputs: the tail's block and 3 more pages, a second group
    assert store.save(longer, rows_for(longer)) and store.pager.cut == 100 + 54
    found = store.lookup(longer + [1])
    assert found.state == rows_for(longer) and store.pager.joins == 1
    assert [p[1:] for p in store.pager.joined] == [(0, 96), (0, 54)]  # one piece per group, not per page
    found = store.lookup(a[:40] + [7])  # a prefix of the first group: a range of it
    assert (found.n, found.state_n) == (40, 48) and found.state == rows_for(a[:48])


def test_pages_serve_to_the_input_and_tails_are_replaced():
    store = paged_store()
    a = tokens(50)
    store.save(a, rows_for(a))
    found = store.lookup(a[:45] + [5, 5, 5])  # shares 45: blocks 0-1 and 13 of block 2
    assert (found.n, found.state_n) == (45, 48) and found.state == rows_for(a[:48])
    found = store.lookup(a[:40])  # the prompt ends inside a stored block
    assert (found.n, found.state_n) == (40, 48)
    assert store.lookup([1] + a) is None
    assert store.ram.pages() == 4  # 3 blocks, a tail of 2
    longer = a + tokens(20, start=900)  # the conversation's next turn: 70 inputs
    store.save(longer, rows_for(longer))
    assert store.ram.pages() == 5  # the tail of 2 went (the 70 serve it); 4 blocks, a tail of 6
    found = store.lookup(a + [3])
    assert (found.n, found.state_n) == (50, 64)


def test_pages_are_evicted_from_the_ends_of_chains():
    page = RamStore(1 << 20)
    page.put_pages(chain(FP, tokens(BLOCK)), [(b"x" * 1000, 1000)])
    cost = page.used
    store = RamStore(8 * cost)
    shared = tokens(2 * BLOCK, start=5000)
    a, b = shared + tokens(2 * BLOCK, start=100), shared + tokens(2 * BLOCK, start=200)
    for conv in (a, b):
        assert store.put_pages(chain(FP, conv), [(b"x" * 1000, 1000)] * 4) == 4
    assert store.pages() == 6 and store.used == 6 * cost
    c = tokens(3 * BLOCK, start=300)
    assert store.put_pages(chain(FP, c), [(b"x" * 1000, 1000)] * 3) == 3  # evicts a's last page first
    assert store.pages() == 8
    assert store.lookup(chain(FP, a)).n == 3 * BLOCK  # a lost only its end
    assert store.lookup(chain(FP, b)).n == 4 * BLOCK
    assert store.touch(store.lookup(chain(FP, a)))  # a is used again: b is now the oldest
    d = tokens(4 * BLOCK, start=400)
    assert store.put_pages(chain(FP, d), [(b"x" * 1000, 1000)] * 4) == 4
    assert store.used <= store.limit and store.pages() == 8
    # b's two pages went, then c's (the oldest chains, from their ends); the shared ones stayed
    assert store.lookup(chain(FP, b)).n == 2 * BLOCK and store.lookup(chain(FP, a)).n == 3 * BLOCK
    assert store.lookup(chain(FP, c)).n == BLOCK
    # removing a page removes the pages after it: unreachable without it
    gone = store.drop([(chain(FP, shared).prefixes[1], False)])
    assert len(gone) == 3 and store.lookup(chain(FP, a)) is None and store.pages() == 5  # d and c stay


def test_the_bound_holds_for_pages_under_a_stream_of_conversations():
    limit = 200_000
    store = paged_store(limit)
    for k in range(60):
        conv = SYSTEM + tokens(10 + 7 * (k % 9), start=10_000 * (k + 1))
        assert store.save(conv, rows_for(conv))
        assert store.ram.used <= limit
        assert store.lookup(conv).n == len(conv)  # the newest is always whole
        entries = list(store.ram._entries.values())
        groups = {id(e.state.group): e.state.group for e in entries}  # every page is a span of its save's
        assert all(g.live == sum(e.state.group is g for e in entries) for g in groups.values())
        # each group counted once, as long as one of its pages is held
        assert store.ram.used == sum(e.nbytes for e in entries) + sum(g.nbytes for g in groups.values())
    too_long = tokens(limit // 8)
    assert not store.save(too_long, rows_for(too_long))  # larger than the whole bound: refused
    assert store.ram.used <= limit


def test_states_the_engine_does_not_cut_are_kept_whole():
    store = paged_store()
    a = tokens(40)
    assert store.save(a, b"a window: not one row per position")
    assert store.ram.pages() == 0 and len(store.ram) == 1
    found = store.lookup(a + [1])
    assert found.whole and found.state == b"a window: not one row per position"
    store.forget(found)  # a whole state moves into the slot
    assert store.lookup(a) is None


def test_pages_that_do_not_join_are_dropped():
    class Refusing(Rows):
        def join_states(self, parts):
            raise ValueError("another layout")

    from runner.kvstore.store import PromptStore

    store = PromptStore(FP, RamStore(1 << 20), pager=Refusing())
    a = tokens(40)
    store.save(a, rows_for(a))
    assert store.lookup(a[:20]) is None and store.ram.pages() == 0  # two of the save's three pages: a join


def test_the_slot_cache_restores_pages_of_another_conversations_prefix():
    class RowsKv(StateKv):
        """StateKv whose states are rows (one per position held) that the store cuts into pages."""

        def export_seq(self, seq, start=0):
            self.exports.append((seq, start))
            return rows_for(list(range(start, self.held.get(seq, 0))))

        def import_seq(self, seq, state):
            self.held[seq] = len(state) // 8
            self.imports.append((seq, len(state) // 8))
            return True

    from runner.kvstore.store import PromptStore
    from runner.loop.slots import InputCache

    kv = RowsKv()
    cache = InputCache(kv, kv_size=1024, num_slots=1, multi_user=False,
                       store=PromptStore(FP, RamStore(1 << 20), pager=Rows()))
    a, b = SYSTEM + tokens(80, start=100), SYSTEM + tokens(80, start=500)  # 133 inputs, 9 pages each
    run_turn(cache, a)
    assert run_turn(cache, b) == len(SYSTEM)  # from the slot; a (keeping less than half) to the store
    run_turn(cache, tokens(40, start=9000))  # b to the store: only its own pages are new
    assert kv.exports == [(0, 0), (0, 3 * BLOCK)] and kv.imports == []  # b's from its own pages on
    assert cache.store.ram.pages() == 9 + 9 - 3
    assert run_turn(cache, a + [1]) == len(a) and run_turn(cache, b + [1]) == len(b)
    assert kv.imports == [(0, len(a)), (0, len(b))]
    # a came back and lost the slot again: exported from its first page the store lacks (the
    # block its tail page held), not whole
    assert kv.exports[-1] == (0, len(a) // BLOCK * BLOCK)
