"""The prompt store's disk tier (issue 25): files that survive a restart, checked whole, bounded.

Unit tests over plain bytes (the tier keeps engine states opaque); the engines' states through it
are tested in tests/test_kvstore_restart.py.
"""

from __future__ import annotations

import multiprocessing
import os
from pathlib import Path

import pytest

from runner.kvstore.disk import PAGE_SUFFIX, SUFFIX, DiskStore
from runner.kvstore.key import Fingerprint, chain
from runner.kvstore.ram import Hit, RamStore
from runner.kvstore.store import PromptStore, Tiers

FP = Fingerprint(engine="old", engine_version="test", model="m", projector="", kv_cache_type="f16",
                 flash_attention=False, num_ctx=4096)
OTHER = Fingerprint(engine="old", engine_version="test", model="other", projector="", kv_cache_type="f16",
                    flash_attention=False, num_ctx=4096)


def tokens(n: int, start: int = 0) -> list[int]:
    return list(range(start, start + n))


def state_for(inputs: list[int]) -> bytes:
    """A stand-in engine state that names its inputs (so a wrong restore shows)."""
    return b"".join(t.to_bytes(4, "little") for t in inputs) * 8


class Rows:
    """A pager over :func:`rows_for`'s states: ``width`` bytes a position, cut and joined at any one."""

    def __init__(self, width: int = 8) -> None:
        self.w = width

    def split_state(self, state, bounds, held=()):
        w = self.w
        if len(state) != bounds[-1] * w:
            return None
        return [None if i in held else state[a * w : b * w] for i, (a, b) in enumerate(zip(bounds, bounds[1:]))]

    def join_states(self, parts):
        w = self.w
        return b"".join(p[0][p[1] * w : p[2] * w] if isinstance(p, tuple) else p for p in parts)

    def page_state(self, state, lo, hi):
        return bytes(state[lo * self.w : hi * self.w])


def rows_for(inputs: list[int], width: int = 8) -> bytes:
    """A stand-in engine state the store pages: one row naming its input per position."""
    return b"".join(t.to_bytes(8, "little") * (width // 8) for t in inputs)


def store_on(folder: Path, disk_mib: float = 64, ram: int = 0, fp: Fingerprint = FP,
             paged: bool = False, width: int = 8) -> PromptStore:
    return PromptStore(fp, Tiers(RamStore(ram), DiskStore(folder, int(disk_mib * 2**20), 16)),
                       pager=Rows(width) if paged else None)


def files(folder: Path, suffix: str = SUFFIX) -> list[Path]:
    kv = folder / "kv"
    return sorted(p for p in kv.iterdir() if p.name.endswith(suffix)) if kv.is_dir() else []


def test_a_saved_state_is_found_after_a_restart(tmp_path):
    a = store_on(tmp_path)
    conv = tokens(100)
    assert a.save(conv, state_for(conv))
    assert a.flush(10)
    b = store_on(tmp_path)  # another process: nothing in memory, the folder only
    found = b.lookup(conv + [7, 8, 9])
    assert found is not None and found.source == "disk"
    assert (found.n, found.state_n, bytes(found.state)) == (100, 100, state_for(conv))
    shorter = b.lookup(conv[:50] + [999])  # shares 50 inputs: served to the input, cut by the slot
    assert shorter is not None and shorter.n == 50 and shorter.state_n == 100
    assert b.lookup([999] + conv) is None
    assert store_on(tmp_path, fp=OTHER).lookup(conv) is None  # another model never reads it
    (path,) = files(tmp_path)  # a conversation's tokens are in it: the user's alone
    assert (path.stat().st_mode & 0o777, path.parent.stat().st_mode & 0o777) == (0o600, 0o700)


def test_ram_wins_a_tie_and_disk_serves_what_ram_lost(tmp_path):
    s = store_on(tmp_path, ram=1 << 20)
    conv = tokens(64)
    s.save(conv, state_for(conv))
    s.flush(10)
    found = s.lookup(conv + [1])
    assert found is not None and found.source == "ram"
    s.forget(found)  # imported into a slot: RAM lets it go, the file stays
    again = s.lookup(conv + [1])
    assert again is not None and again.source == "disk" and bytes(again.state) == state_for(conv)


def test_a_longer_state_replaces_the_file_it_extends(tmp_path):
    s = store_on(tmp_path)
    turn1 = tokens(40)
    turn2 = turn1 + tokens(30, 500)
    s.save(turn1, state_for(turn1))
    s.flush(10)
    s.save(turn2, state_for(turn2))
    s.flush(10)
    assert len(files(tmp_path)) == 1
    found = store_on(tmp_path).lookup(turn1 + [3])
    assert found is not None and found.n == 40 and found.state_n == 70


@pytest.mark.parametrize("damage", ["truncate", "flip", "garbage", "rename", "version"])
def test_damaged_files_are_ignored_and_removed(tmp_path, damage):
    s = store_on(tmp_path)
    conv = tokens(48)
    s.save(conv, state_for(conv))
    s.flush(10)
    (path,) = files(tmp_path)
    data = bytearray(path.read_bytes())
    if damage == "truncate":
        path.write_bytes(data[: len(data) - 100])
    elif damage == "flip":
        data[len(data) // 2] ^= 0x40  # inside the state: only the checksum sees it
        path.write_bytes(data)
    elif damage == "garbage":
        path.write_bytes(os.urandom(len(data)))
    elif damage == "rename":  # a whole, valid file under another state's name: foreign
        path.rename(path.with_name("ab" * 32 + SUFFIX))
        path = path.with_name("ab" * 32 + SUFFIX)
    elif damage == "version":
        data[4] = 99
        path.write_bytes(data)
    fresh = store_on(tmp_path)
    assert fresh.lookup(conv + [1]) is None
    assert not path.exists()
    assert files(tmp_path) == []


def test_the_disk_bound_holds_under_a_stream_of_conversations(tmp_path):
    limit_mib = 0.25
    s = store_on(tmp_path, disk_mib=limit_mib)
    for k in range(40):
        conv = tokens(200, 10_000 * k)
        s.save(conv, state_for(conv))  # 6.4 KB each: ~40 fit, the bound keeps fewer
        s.flush(10)
        on_disk = sum(p.stat().st_size for p in files(tmp_path))
        assert on_disk <= limit_mib * 2**20
        assert s.tiers.disk.used <= limit_mib * 2**20
    newest = tokens(200, 10_000 * 39)
    assert s.lookup(newest).n == 200  # the newest survive, the oldest went
    assert s.lookup(tokens(200, 0)) is None
    assert 0 < len(files(tmp_path)) < 40


def test_a_state_beyond_the_bound_is_not_written(tmp_path):
    s = store_on(tmp_path, disk_mib=0.01)
    conv = tokens(2000)
    assert not s.save(conv, state_for(conv))
    assert s.flush(10)
    assert files(tmp_path) == []


def test_a_symlinked_folder_out_of_the_cache_is_refused(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    root = tmp_path / "cache"
    root.mkdir()
    (root / "kv").symlink_to(outside)
    s = store_on(root)
    conv = tokens(32)
    s.save(conv, state_for(conv))
    s.flush(10)
    assert list(outside.iterdir()) == []  # nothing written through the link
    assert s.lookup(conv) is None


def _writer(folder: str, worker: int, rounds: int, paged: bool = False) -> None:
    s = store_on(Path(folder), disk_mib=0.1, paged=paged)  # ~30 states of 3.3 KB: both evict, each other's too
    for k in range(rounds):
        shared = tokens(64)  # both servers save the same conversation, and their own ones
        s.save(shared, (rows_for if paged else state_for)(shared))
        own = (tokens(40) if paged else []) + tokens(100, 1000 * (worker * rounds + k + 1))  # a shared start
        s.save(own, (rows_for if paged else state_for)(own))
        s.lookup(shared + [5])
    s.flush(30)


@pytest.mark.parametrize("paged", [False, True], ids=["whole", "pages"])
def test_two_servers_on_one_folder_do_not_corrupt_each_other(tmp_path, paged):
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_writer, args=(str(tmp_path), w, 30, paged)) for w in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(60)
        assert p.exitcode == 0
    reader = store_on(tmp_path, disk_mib=1)  # larger: reading must not evict
    reader.tiers.disk.refresh()
    assert len(reader.tiers.disk) == len(files(tmp_path)) > 0  # every file left is whole and valid
    assert sum(p.stat().st_size for p in files(tmp_path)) <= 2 * 0.1 * 2**20  # each kept within its bound
    assert not [p for p in (tmp_path / "kv").iterdir() if p.name.startswith(".")]  # no temporary left
    for entry in list(reader.tiers.disk._index._entries.values()):  # each reads back whole, the state its inputs say
        read = reader.tiers.disk.read(Hit((entry,), entry.n))
        assert read is not None and bytes(read[1][0]) == (rows_for if paged else state_for)(list(entry.inputs))


def test_another_servers_new_file_is_found(tmp_path):
    a, b = store_on(tmp_path), store_on(tmp_path)
    assert b.lookup(tokens(40)) is None  # b has scanned the (empty) folder
    conv = tokens(40)
    a.save(conv, state_for(conv))
    a.flush(10)
    found = b.lookup(conv)
    assert found is not None and found.source == "disk"


def test_saves_never_wait_for_the_disk(tmp_path, monkeypatch):
    from runner.kvstore import disk as disk_mod

    s = store_on(tmp_path)
    monkeypatch.setattr(disk_mod, "PENDING_LIMIT", 10_000)
    gate = __import__("threading").Event()
    real_write = DiskStore.write

    def slow_write(self, chain_, state, *calm):
        gate.wait(10)
        return real_write(self, chain_, state, *calm)

    monkeypatch.setattr(DiskStore, "write", slow_write)
    first, second = tokens(300), tokens(300, 5000)
    assert s.save(first, state_for(first))  # queued: the writer waits on the gate
    assert not s.tiers.disk.save_later(chain(FP, second), state_for(second))  # over the pending bound: dropped
    assert not s.flush(0.05)
    gate.set()
    assert s.flush(10)
    assert len(files(tmp_path)) == 1


def test_the_writer_keeps_out_of_a_prompt_s_way_for_a_bounded_time(tmp_path, monkeypatch):
    """While a load serves a prompt (a request waits for its first token), no file is started;
    the save is written once the prompt is served, or after HOLD seconds whatever happens."""
    from runner.kvstore import disk as disk_mod

    s = store_on(tmp_path, paged=True)
    owner = object()
    monkeypatch.setattr(disk_mod, "HOLD", 30.0)
    DiskStore.hold(owner, True)
    try:
        conv = tokens(40)
        assert s.save(conv, rows_for(conv))
        assert not s.flush(0.3) and files(tmp_path) == []  # held: nothing written yet
        DiskStore.hold(owner, False)
        assert s.flush(10) and len(files(tmp_path)) == 3  # written once the prompt was served
        monkeypatch.setattr(disk_mod, "HOLD", 0.2)
        DiskStore.hold(owner, True)  # a load that serves prompts without a pause
        other = tokens(40, 900)
        assert s.save(other, rows_for(other))
        assert s.flush(10) and len(files(tmp_path)) == 6  # written anyway after HOLD
    finally:
        DiskStore.hold(owner, False)


# ------------------------------------------------------------------------------------- pages
SYSTEM = tokens(3 * 16 + 5, 7000)  # a system prompt: 3 blocks and 5 inputs


def test_pages_on_disk_share_a_system_prompt_and_survive_a_restart(tmp_path):
    s = store_on(tmp_path, paged=True)
    a, b = SYSTEM + tokens(80, 100), SYSTEM + tokens(80, 500)  # 133 inputs: 9 pages each
    assert s.save(a, rows_for(a)) and s.save(b, rows_for(b))
    assert s.flush(10)
    assert len(files(tmp_path, PAGE_SUFFIX)) == len(files(tmp_path)) == 9 + 9 - 3  # the system prompt once
    modes = {(p.stat().st_mode & 0o777) for p in files(tmp_path)}
    assert modes == {0o600} and (tmp_path / "kv").stat().st_mode & 0o777 == 0o700
    used = s.tiers.disk.used
    fresh = store_on(tmp_path, paged=True)  # another process: the folder only
    for conv in (a, b):
        found = fresh.lookup(conv + [1])
        assert (found.source, found.n, found.state_n, found.whole) == ("disk", 133, 133, False)
        assert bytes(found.state) == rows_for(conv)
    assert fresh.tiers.disk.used == used
    found = fresh.lookup(SYSTEM + [1, 2, 3])
    assert found.n == len(SYSTEM) and bytes(found.state)[: 8 * len(SYSTEM)] == rows_for(SYSTEM)


def test_a_longer_state_on_disk_replaces_its_tail_page(tmp_path):
    s = store_on(tmp_path, paged=True)
    turn1 = tokens(40)
    turn2 = turn1 + tokens(30, 500)
    s.save(turn1, rows_for(turn1))
    s.flush(10)
    assert len(files(tmp_path)) == 3  # 2 blocks, a tail of 8
    s.save(turn2, rows_for(turn2))
    s.flush(10)
    assert len(files(tmp_path)) == 5  # 4 blocks, a tail of 6: the old tail went
    found = store_on(tmp_path, paged=True).lookup(turn1 + [3])
    assert found is not None and (found.n, found.state_n) == (40, 48)


@pytest.mark.parametrize("damage", ["truncate", "flip", "missing", "foreign"])
def test_a_damaged_page_ends_the_restore_before_it(tmp_path, damage):
    s = store_on(tmp_path, paged=True)
    conv = tokens(100)  # 7 pages
    s.save(conv, rows_for(conv))
    s.flush(10)
    fourth = tmp_path / "kv" / (chain(FP, conv).prefixes[4].hex() + PAGE_SUFFIX)  # inputs 48..63
    data = bytearray(fourth.read_bytes())
    fresh = store_on(tmp_path, paged=True)
    assert fresh.lookup([0]) is not None  # scanned while whole
    if damage == "truncate":
        fourth.write_bytes(data[:-10])
    elif damage == "flip":
        data[-7] ^= 0x40  # inside the state (before the 4-byte CRC): only the checksum sees it
        fourth.write_bytes(data)
    elif damage == "missing":
        fourth.unlink()  # another server evicted it
    elif damage == "foreign":  # another page's whole, valid file under this name
        other = tmp_path / "kv" / (chain(FP, conv).prefixes[5].hex() + PAGE_SUFFIX)
        fourth.write_bytes(other.read_bytes())
    found = fresh.lookup(conv + [1])
    assert found is not None and (found.n, found.state_n) == (48, 48)  # the three pages before it
    assert bytes(found.state) == rows_for(conv[:48])
    assert not fourth.exists()
    assert len(files(tmp_path)) == 3  # the pages after it went too: unreachable without it
    assert fresh.lookup(conv + [1]).n == 48


def test_the_disk_bound_holds_for_pages(tmp_path):
    limit_mib = 0.05
    s = store_on(tmp_path, disk_mib=limit_mib, paged=True)
    for k in range(40):
        conv = SYSTEM + tokens(60, 10_000 * (k + 1))
        s.save(conv, rows_for(conv))
        s.flush(10)
        assert sum(p.stat().st_size for p in files(tmp_path)) <= limit_mib * 2**20
        assert s.tiers.disk.used <= limit_mib * 2**20
        assert s.lookup(conv).n == len(conv)  # the newest is whole
    assert s.lookup(SYSTEM + tokens(60, 10_000)).n == len(SYSTEM)  # the oldest kept only the shared start
    assert len(files(tmp_path)) == len(s.tiers.disk)  # no file the index lost


@pytest.mark.parametrize("paged", [False, True])
def test_the_folder_stays_within_the_bound_while_a_save_is_written(tmp_path, monkeypatch, paged):
    # states large against the index's overhead, as a real model's are (SmolLM2: ~22 KiB a
    # position), so a full index is a full folder: a file written before the index evicts for it
    # would go past the bound until the save is indexed (a server's /api/ps could see it)
    limit = 2**20
    seen: list[int] = []
    write_file = DiskStore._write_file

    def checked(self, name, header, state):  # the folder the moment each file lands, before it is indexed
        write_file(self, name, header, state)
        seen.append(sum(p.stat().st_size for p in (tmp_path / "kv").iterdir() if not p.name.startswith(".")))

    monkeypatch.setattr(DiskStore, "_write_file", checked)
    width = 1024
    s = store_on(tmp_path, disk_mib=limit / 2**20, paged=paged, width=width)
    for k in range(30):
        conv = tokens(60 + 17 * (k % 5), 10_000 * k)  # 60-128 KiB each: ~10 fit
        assert s.save(conv, rows_for(conv, width) if paged else state_for(conv) * (width // 32))
        assert s.flush(10)
        assert s.lookup(conv).n == len(conv)
    assert 0.9 * limit < max(seen) <= limit  # full, never over, not even for a moment
    assert len(files(tmp_path, PAGE_SUFFIX if paged else SUFFIX)) == len(s.tiers.disk)
