"""The causal KV cache's bookkeeping (runner.kvcache.cells), ported from Ollama's
``kvcache/causal_test.go`` (reference §2.12), plus our own edge cases and a randomized check
against a direct, loop-by-loop model of the Go rules.

Each Go step does StartForward, Put, Get and compares the values, shape and exact mask. We have
no tensors here, so a tiny NumPy "store" plays the K storage: ``store[locs] = in`` for Put and
``store[start:start+length]`` for Get, and a shift adds the offset to the shifted rows (the Go
tests' ``shiftFn`` is ``key + shift``). That checks the same expected values, which pins down the
locations and the range; the tables also state the locations and range explicitly.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest

from runner.kvcache import (
    INT32_MAX,
    CacheGeometry,
    CellTable,
    KvCacheFull,
    NotSupported,
    ShiftPlan,
    WrapperCache,
    cache_geometry,
)

x = float("-inf")


# ----------------------------------------------------------------------------------- helpers
@dataclass
class Step:
    """One StartForward/Put/Get of a Go test case."""

    name: str
    seqs: list[int]
    pos: list[int]
    values: list[float]  # what Put stores, one row per token (flattened like Go's tensor)
    locs: list[int]  # the cell each token goes to
    start: int  # first cell of the Get view
    expected: list[float]  # what Get returns (flattened)
    mask: list[list[float]]  # (n_batch, length)


class FakeStore:
    """K storage as a (cells, row) float array: what Put/Get/shift do to values."""

    def __init__(self, cells: int, row: int = 1) -> None:
        self.data = np.zeros((cells, row), dtype=np.float32)
        self.row = row

    def put(self, locs: list[int], values: list[float]) -> None:
        self.data[locs] = np.asarray(values, dtype=np.float32).reshape(len(locs), self.row)

    def get(self, start: int, length: int) -> list[float]:
        return self.data[start : start + length].reshape(-1).tolist()

    def shift(self, plan: ShiftPlan) -> None:  # Go test shiftFn: key + shift
        if plan.cells:
            self.data[plan.cells] += np.asarray(plan.deltas, dtype=np.float32)[:, None]


def run_steps(table: CellTable, store: FakeStore, steps: list[Step]) -> None:
    for step in steps:
        plan = table.start_forward(step.pos, step.seqs)
        store.put(plan.locs, step.values)
        assert plan.locs == step.locs, step.name
        assert plan.start == step.start, step.name
        want_mask = np.asarray(step.mask, dtype=np.float32)
        assert plan.mask.dtype == np.float32
        assert plan.mask.shape == want_mask.shape, step.name
        np.testing.assert_array_equal(plan.mask, want_mask, err_msg=step.name)
        assert store.get(plan.start, plan.length) == step.expected, step.name


def go_table(
    max_sequences: int,
    capacity: int,
    max_batch: int,
    *,
    swa_window: int = 0,
    swa_memory: int = 0,
    chunk_size: int = 0,
) -> CellTable:
    return CellTable.for_cache(
        max_sequences,
        capacity,
        max_batch,
        swa_window=swa_window,
        swa_memory=swa_memory,
        chunk_size=chunk_size,
    )


# --------------------------------------------------------------------------- Go test scenarios
def test_store() -> None:
    table = go_table(1, 16, 16)
    first = [111, 211, 121, 221, 131, 231, 112, 212, 122, 222, 132, 232,
             113, 213, 123, 223, 133, 233, 114, 214, 124, 224, 134, 234]  # fmt: skip
    second = [115, 215, 125, 225, 135, 235]
    steps = [
        Step("FirstBatch", [0, 0, 0, 0], [0, 1, 2, 3], first, [0, 1, 2, 3], 0, first,
             [[0, x, x, x],
              [0, 0, x, x],
              [0, 0, 0, x],
              [0, 0, 0, 0]]),
        Step("SecondBatch", [0], [4], second, [4], 0, first + second,
             [[0, 0, 0, 0, 0]]),
    ]  # fmt: skip
    run_steps(table, FakeStore(table.size, row=6), steps)


def test_swa() -> None:
    table = go_table(1, 16, 16, swa_window=1)
    assert (table.size, table.swa_window, table.swa_memory) == (17, 1, 1)
    steps = [
        Step("FirstBatch", [0, 0, 0, 0], [0, 1, 2, 3], [1, 2, 3, 4], [0, 1, 2, 3], 0, [1, 2, 3, 4],
             [[0, x, x, x],
              [0, 0, x, x],
              [x, 0, 0, x],
              [x, x, 0, 0]]),
        # cells 0..2 fall out of the window (memory 1) and are reused
        Step("SecondBatch", [0, 0], [4, 5], [5, 6], [0, 1], 0, [5, 6, 3, 4],
             [[0, x, x, 0],
              [0, 0, x, x]]),
    ]  # fmt: skip
    run_steps(table, FakeStore(table.size), steps)
    assert table.seq_cells(0) == [0, 1, 3]
    assert table.seq_positions(0) == [4, 5, 3]


def test_swa_separate_batches() -> None:
    table = go_table(2, 16, 2, swa_window=1)
    # two sequences: memory = max(1, window + 1) = 2, size = 2 * 2 + 2
    assert (table.size, table.swa_window, table.swa_memory) == (6, 1, 2)
    steps = [
        Step("First seq 0", [0, 0], [0, 1], [1, 2], [0, 1], 0, [1, 2],
             [[0, x],
              [0, 0]]),
        Step("Second seq 0", [0, 0], [2, 3], [3, 4], [2, 3], 1, [2, 3, 4],
             [[0, 0, x],
              [x, 0, 0]]),
        Step("First seq 1", [1, 1], [0, 1], [5, 6], [0, 1], 0, [5, 6],
             [[0, x],
              [0, 0]]),
        Step("Second seq 1", [1, 1], [2, 3], [7, 8], [4, 5], 1, [6, 3, 4, 7, 8],
             [[0, x, x, 0, x],
              [x, x, x, 0, 0]]),
        Step("Third seq 0", [0, 0], [4, 5], [9, 10], [0, 1], 0, [9, 10, 3, 4],
             [[0, x, x, 0],
              [0, 0, x, x]]),
    ]  # fmt: skip
    run_steps(table, FakeStore(table.size), steps)


def test_swa_mem() -> None:
    table = go_table(1, 16, 16, swa_window=1, swa_memory=3)
    assert (table.size, table.swa_window, table.swa_memory) == (19, 1, 3)
    steps = [
        Step("FirstBatch", [0, 0, 0, 0], [0, 1, 2, 3], [1, 2, 3, 4], [0, 1, 2, 3], 0, [1, 2, 3, 4],
             [[0, x, x, x],
              [0, 0, x, x],
              [x, 0, 0, x],
              [x, x, 0, 0]]),
        # memory 3 keeps positions 1..3; only cell 0 is reused
        Step("SecondBatch", [0, 0], [4, 5], [5, 6], [0, 4], 0, [5, 2, 3, 4, 6],
             [[0, x, x, 0, x],
              [0, x, x, x, 0]]),
    ]  # fmt: skip
    run_steps(table, FakeStore(table.size), steps)


def test_chunked_attention() -> None:
    table = go_table(1, 16, 16, chunk_size=2)
    steps = [
        Step("FirstBatch", [0] * 4, [0, 1, 2, 3], [1, 2, 3, 4], [0, 1, 2, 3], 0, [1, 2, 3, 4],
             [[0, x, x, x],
              [0, 0, x, x],
              [x, x, 0, x],
              [x, x, 0, 0]]),
        Step("SecondBatch", [0] * 3, [4, 5, 6], [5, 6, 7], [4, 5, 6], 0, [1, 2, 3, 4, 5, 6, 7],
             [[x, x, x, x, 0, x, x],
              [x, x, x, x, 0, 0, x],
              [x, x, x, x, x, x, 0]]),
        Step("ThirdBatch", [0] * 2, [7, 8], [8, 9], [7, 8], 0, [1, 2, 3, 4, 5, 6, 7, 8, 9],
             [[x, x, x, x, x, x, 0, 0, x],
              [x, x, x, x, x, x, x, x, 0]]),
    ]  # fmt: skip
    run_steps(table, FakeStore(table.size), steps)


def test_sequences() -> None:
    table = go_table(1, 16, 16)
    steps = [
        Step("FirstBatch", [0, 0, 1, 1], [0, 1, 0, 1], [1, 2, 3, 4], [0, 1, 2, 3], 0, [1, 2, 3, 4],
             [[0, x, x, x],
              [0, 0, x, x],
              [x, x, 0, x],
              [x, x, 0, 0]]),
        Step("SecondBatch", [0, 1], [2, 2], [5, 6], [4, 5], 0, [1, 2, 3, 4, 5, 6],
             [[0, 0, x, x, 0, x],
              [x, x, 0, 0, x, 0]]),
    ]  # fmt: skip
    run_steps(table, FakeStore(table.size), steps)


def test_remove() -> None:
    table = go_table(1, 16, 16)
    store = FakeStore(table.size)
    run_steps(table, store, [
        Step("FirstBatch", [0, 0, 1, 1], [0, 1, 0, 1], [1, 2, 3, 4], [0, 1, 2, 3], 0, [1, 2, 3, 4],
             [[0, x, x, x],
              [0, 0, x, x],
              [x, x, 0, x],
              [x, x, 0, 0]]),
    ])  # fmt: skip

    shift = table.remove(0, 1, INT32_MAX)  # Go's "to the end"
    assert not shift and shift.cells == []
    store.shift(shift)
    assert table.seq_cells(0) == [0]
    run_steps(table, store, [
        Step("RemoveEnd", [0, 1], [1, 2], [5, 6], [1, 4], 0, [1, 5, 3, 4, 6],
             [[0, 0, x, x, x],
              [x, x, 0, 0, 0]]),
    ])  # fmt: skip

    shift = table.remove(0, 0, 1)
    assert shift.cells == [1] and shift.deltas == [-1] and shift.offset == -1
    store.shift(shift)
    assert table.seq_cells(0) == [1] and table.seq_positions(0) == [0]
    run_steps(table, store, [
        Step("RemoveMiddle", [0, 0], [1, 2], [7, 8], [0, 5], 0, [7, 4, 3, 4, 6, 8],
             [[0, 0, x, x, x, x],
              [0, 0, x, x, x, 0]]),
    ])  # fmt: skip


def test_copy() -> None:
    table = go_table(1, 16, 16)
    store = FakeStore(table.size)
    run_steps(table, store, [
        Step("FirstBatch", [0] * 4, [0, 1, 2, 3], [1, 2, 3, 4], [0, 1, 2, 3], 0, [1, 2, 3, 4],
             [[0, x, x, x],
              [0, 0, x, x],
              [0, 0, 0, x],
              [0, 0, 0, 0]]),
    ])  # fmt: skip
    table.copy_prefix(0, 1, 2)
    assert table.cell(0).sequences == (0, 1) and table.cell(2).sequences == (0,)
    assert table.seq_range(1) == (0, 1)
    run_steps(table, store, [
        Step("Copy", [1, 1], [3, 4], [5, 6], [4, 5], 0, [1, 2, 3, 4, 5, 6],
             [[0, 0, x, x, 0, x],
              [0, 0, x, x, 0, 0]]),
    ])  # fmt: skip


def test_can_resume() -> None:
    table = go_table(1, 16, 16, swa_window=4)
    table.start_forward([0, 1, 2, 3, 4], [0] * 5)
    # with window 4 nothing has slid out yet
    assert [table.can_resume(0, p) for p in range(5)] == [True] * 5
    table.start_forward([5], [0])  # position 0 falls out of memory
    assert [table.can_resume(0, p) for p in range(6)] == [False] * 5 + [True]


def test_can_resume_swa_mem() -> None:
    table = go_table(1, 16, 16, swa_window=4, swa_memory=5)
    table.start_forward(list(range(7)), [0] * 7)
    table.start_forward([7], [0])  # memory 5 behind position 7: positions 0, 1 dropped
    assert [table.can_resume(0, p) for p in range(8)] == [False] * 6 + [True, True]


# ------------------------------------------------------------------------------ our own cases
@pytest.mark.parametrize(
    "args, kwargs, want",
    [
        ((1, 16, 16), {}, CacheGeometry(16, None, None)),
        ((4, 2048, 512), {}, CacheGeometry(8192, None, None)),
        ((1, 16, 16), {"padding": 256}, CacheGeometry(256, None, None)),
        ((1, 16, 16), {"swa_window": 1}, CacheGeometry(17, 1, 1)),
        ((2, 16, 2), {"swa_window": 1}, CacheGeometry(6, 1, 2)),  # +1 with parallel sequences
        ((2, 16, 2), {"swa_window": 1, "swa_memory": 5}, CacheGeometry(12, 1, 5)),
        ((1, 16, 16), {"swa_window": 1, "swa_memory": 3}, CacheGeometry(19, 1, 3)),
        ((1, 16, 16), {"swa_window": 16}, CacheGeometry(16, 16, None)),  # memory >= capacity
        ((2, 16, 16), {"swa_window": 15}, CacheGeometry(32, 15, None)),  # 15 + 1 >= capacity
        ((1, 8192, 512), {"swa_window": 512, "padding": 256}, CacheGeometry(1024, 512, 512)),
        ((1, 8192, 512), {"swa_window": 1024, "swa_memory": 4096}, CacheGeometry(4608, 1024, 4096)),
    ],
)
def test_cache_geometry(args: tuple[int, int, int], kwargs: dict, want: CacheGeometry) -> None:
    assert cache_geometry(*args, **kwargs) == want


def test_cache_geometry_rejects_memory_below_window() -> None:
    with pytest.raises(ValueError, match="at least as large as the window"):
        cache_geometry(1, 16, 16, swa_window=4, swa_memory=2)
    with pytest.raises(ValueError):
        CellTable(16, swa_memory=4)  # memory without a window


def test_padding_rounds_range_and_size() -> None:
    table = CellTable(10, padding=4)
    assert table.size == 12
    table.start_forward([0, 1, 2, 3, 4], [0] * 5)
    plan = table.start_forward([5], [0])
    assert plan.locs == [5] and (plan.start, plan.length) == (0, 8)
    assert plan.mask.tolist() == [[0, 0, 0, 0, 0, 0, x, x]]  # padding cells are not the seq's
    table.remove(0, 0, INT32_MAX)
    table.start_forward([0, 1, 2, 3, 4, 5], [1] * 6)  # cells 0..5
    table.remove(1, 0, 5)  # only cell 5 left, shifted to position 0
    plan = table.start_forward([1], [1])  # lowest free cell is 0
    assert plan.locs == [0] and (plan.start, plan.length) == (0, 8)


def test_any_free_cells_no_contiguous_block_needed() -> None:
    table = CellTable(6)
    table.start_forward([0, 1, 2, 3, 4, 5], [0, 1, 0, 1, 0, 1])
    table.remove(0, 0, None)  # frees cells 0, 2, 4: no two are adjacent
    plan = table.start_forward([0, 1, 2], [2, 2, 2])
    assert plan.locs == [0, 2, 4] and (plan.start, plan.length) == (0, 5)
    assert plan.mask.tolist() == [[0, x, x, x, x], [0, x, 0, x, x], [0, x, 0, x, 0]]


def test_cache_full_changes_nothing() -> None:
    table = CellTable(4)
    table.start_forward([0, 1, 2], [0, 0, 0])
    with pytest.raises(KvCacheFull, match="could not find a kv cache slot"):
        table.start_forward([0, 1], [1, 1])
    assert table.sequences == [0] and table.free_cells == 1
    assert table.start_forward([3], [0]).locs == [3]


def test_restore_goes_back_to_its_cells_when_they_are_free() -> None:
    table = CellTable(8)
    table.start_forward([0, 1, 2], [0, 0, 0])
    table.start_forward([0, 1], [1, 1])  # seq 1 in cells 3, 4
    assert table.restore(1, [5, 6, 7], [5, 6, 7]) == [5, 6, 7]  # what seq 1 held is dropped first
    assert table.seq_cells(1) == [5, 6, 7] and table.seq_positions(1) == [5, 6, 7]
    assert table.free_cells == 2
    # a rotated layout (a sliding window's) comes back as it was: position 9 in cell 3
    assert table.restore(1, [7, 8, 9], [6, 7, 3]) == [6, 7, 3]
    assert table.seq_positions(1) == [9, 7, 8]  # in cell order
    # the next token goes where a live sequence's would: the lowest free cell
    assert table.start_forward([10], [1]).locs == [4]


def test_restore_elsewhere_takes_the_lowest_free_cells_in_position_order() -> None:
    table = CellTable(8)
    table.start_forward([0, 1, 2], [0, 0, 0])
    assert table.restore(1, [0, 1, 2], [0, 1, 2]) == [3, 4, 5]  # seq 0 holds those cells
    assert table.restore(2, [4, 9], [9, 1]) == [6, 7]  # cell 9 is outside, cell 1 taken
    assert table.free_cells == 0
    table.remove(1, 0, None)
    assert table.restore(2, [0, 1], [4, 4]) == [3, 4]  # a damaged layout (one cell twice) too


def test_restore_refuses_what_does_not_fit_and_leaves_the_sequence_empty() -> None:
    table = CellTable(6)
    table.start_forward([0, 1, 2], [0, 0, 0])
    table.start_forward([0], [1])
    with pytest.raises(KvCacheFull):
        table.restore(1, [0, 1, 2, 3], [0, 1, 2, 3])  # 3 free cells (seq 1's own included)
    assert table.sequences == [0] and table.free_cells == 3
    assert table.seq_positions(0) == [0, 1, 2]
    with pytest.raises(ValueError, match="ascending"):
        table.restore(1, [2, 1])
    with pytest.raises(ValueError, match="cells"):
        table.restore(1, [1, 2], [4])
    assert table.restore(0, []) == [] and table.sequences == []  # an empty state empties


def test_causal_except_and_set_causal() -> None:
    table = CellTable(8)
    plan = table.start_forward([0, 1, 2, 3], [0] * 4, causal_except=[1, 2])
    assert plan.mask.tolist() == [[0, x, x, x], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    mask = table.set_causal([])
    assert mask.tolist() == [[0, x, x, x], [0, 0, x, x], [0, 0, 0, x], [0, 0, 0, 0]]
    assert table.plan is plan and plan.mask is mask
    # the exemption never crosses sequences
    plan = table.start_forward([0, 1], [1, 1], causal_except=[0])
    assert (plan.start, plan.mask.tolist()) == (4, [[0, 0], [0, 0]])
    with pytest.raises(ValueError):
        table.set_causal([2])


def test_reserve_records_nothing() -> None:
    table = CellTable(8, padding=4)
    table.start_forward([0, 1], [0, 0])
    plan = table.start_forward([0, 1, 2], [0, 0, 0], reserve=True)
    assert plan.locs == [0, 1, 2] and (plan.start, plan.length) == (0, 8)
    assert plan.mask.shape == (3, 8)
    assert table.seq_cells(0) == [0, 1] and table.free_cells == 6


def test_remove_shared_cells_not_supported() -> None:
    table = CellTable(8)
    table.start_forward([0, 1, 2, 3], [0] * 4)
    table.copy_prefix(0, 1, 4)  # all four cells shared
    with pytest.raises(NotSupported, match="shared by multiple sequences"):
        table.remove(1, 1, 2)
    assert table.seq_positions(1) == [0, 1, 2, 3]  # nothing changed
    assert not table.remove(1, 2, None)  # to the end never shifts, shared or not
    assert table.seq_positions(1) == [0, 1] and table.seq_positions(0) == [0, 1, 2, 3]
    assert table.free_cells == 4


def test_copy_prefix_replaces_destination() -> None:
    table = CellTable(8)
    table.start_forward([0, 1, 2], [0, 0, 0])
    table.start_forward([0, 1, 2], [1, 1, 1])
    table.copy_prefix(0, 1, 2)  # seq 1's own cells 3..5 are released
    assert table.seq_cells(1) == [0, 1] and table.free_cells == 5
    table.copy_prefix(0, 1, 0)
    assert table.seq_cells(1) == [] and table.seq_range(1) is None
    table.copy_prefix(0, 0, 1)  # src == dst truncates
    assert table.seq_cells(0) == [0] and table.free_cells == 7
    assert table.cell(1).sequences == ()


def test_remove_middle_renumbers_and_plans_shift() -> None:
    table = CellTable(16)
    table.start_forward(list(range(10)), [0] * 10)
    plan = table.remove(0, 2, 6)  # keep 0, 1; 6..9 become 2..5
    assert table.seq_positions(0) == [0, 1, 2, 3, 4, 5]
    assert plan.cells == [6, 7, 8, 9] and plan.offset == -4
    chunks = plan.chunks(3)
    assert [(c.start, c.offsets.tolist()) for c in chunks] == [(6, [-4, -4, -4]), (9, [-4])]
    assert table.remove(0, 3, 3).cells == []  # empty range: no-op
    assert table.remove(7, 0, 1).cells == []  # unknown sequence: no-op


def test_shift_chunks_gaps() -> None:
    plan = ShiftPlan(seq=0, cells=[2, 3, 5, 9, 10], offset=-2)
    assert [(c.start, c.offsets.tolist()) for c in plan.chunks(4)] == [
        (2, [-2, -2, 0, -2]),
        (9, [-2, -2]),
    ]
    assert [(c.start, c.offsets.tolist()) for c in plan.chunks(100)] == [
        (2, [-2, -2, 0, -2, 0, 0, 0, -2, -2])
    ]


def test_can_resume_without_window_and_unknown_sequence() -> None:
    assert CellTable(4).can_resume(3, 100)
    table = CellTable(8, swa_window=2)
    assert not table.can_resume(0, 0)  # nothing stored for seq 0


def test_batch_validation() -> None:
    table = CellTable(4)
    with pytest.raises(ValueError):
        table.start_forward([], [])
    with pytest.raises(ValueError):
        table.start_forward([0, 1], [0])
    with pytest.raises(ValueError):
        table.start_forward([0], [0], causal_except=[1])


# --------------------------------------------------------- randomized check vs the Go rules
class GoModel:
    """A direct, loop-by-loop transcription of the rules of reference §2.4 over a list of cells
    (slow but obviously right), used as the oracle for random operation sequences."""

    def __init__(self, size: int, padding: int, window: int | None, memory: int | None,
                 chunk: int | None) -> None:  # fmt: skip
        self.size, self.padding, self.window, self.memory, self.chunk = (
            size, padding, window, memory, chunk)  # fmt: skip
        self.pos = [0] * size
        self.seqs: list[list[int]] = [[] for _ in range(size)]

    def seq_cells(self, seq: int) -> list[int]:
        return [i for i in range(self.size) if seq in self.seqs[i]]

    def start_forward(self, positions: list[int], seqs: list[int]):
        lo, hi = self.size, -1
        if self.memory is not None:
            lowest: dict[int, int] = {}
            for p, s in zip(positions, seqs):
                lowest[s] = min(p, lowest.get(s, p))
            for s in {s for cell in self.seqs for s in cell}:
                cells = self.seq_cells(s)
                low = lowest.get(s, max([0] + [self.pos[i] for i in cells]) + 1)
                for i in cells:
                    if self.pos[i] < low - self.memory:
                        self.seqs[i].remove(s)
                    elif s in lowest and self.pos[i] >= low - self.window:
                        lo, hi = min(lo, i), max(hi, i)
        else:
            for s in set(seqs):
                for i in self.seq_cells(s):
                    lo, hi = min(lo, i), max(hi, i)
        free = [i for i in range(self.size) if not self.seqs[i]]
        if len(free) < len(positions):
            raise KvCacheFull()
        locs = free[: len(positions)]
        for loc, p, s in zip(locs, positions, seqs):
            self.pos[loc], self.seqs[loc] = p, [s]
            lo, hi = min(lo, loc), max(hi, loc)
        start = lo // self.padding * self.padding
        stop = -(-(hi + 1) // self.padding) * self.padding
        mask = np.zeros((len(positions), stop - start), dtype=np.float32)
        for i, (p, s) in enumerate(zip(positions, seqs)):
            for j in range(start, stop):
                c = self.pos[j]
                if (s not in self.seqs[j] or c > p
                        or (self.chunk and c < p - p % self.chunk)
                        or (self.window is not None and c < p - self.window)):  # fmt: skip
                    mask[i, j - start] = -np.inf
        return locs, start, mask

    def copy_prefix(self, src: int, dst: int, length: int) -> None:
        for i in range(self.size):
            keep = src in self.seqs[i] and self.pos[i] < length
            if dst in self.seqs[i]:
                self.seqs[i].remove(dst)
            if keep:
                self.seqs[i].append(dst)

    def remove(self, seq: int, begin: int, end: int | None) -> list[int]:
        cells = self.seq_cells(seq)
        if end is not None and any(
            self.pos[i] >= end and len(self.seqs[i]) > 1 for i in cells
        ):
            raise NotSupported()
        shifted = []
        for i in cells:
            if self.pos[i] >= begin and (end is None or self.pos[i] < end):
                self.seqs[i].remove(seq)
            elif end is not None and self.pos[i] >= end:
                self.pos[i] += begin - end
                shifted.append(i)
        return shifted


@pytest.mark.parametrize(
    "size, padding, window, memory, chunk, n_seqs",
    [
        (32, 1, 0, 0, 0, 3),
        (32, 4, 0, 0, 0, 3),
        (40, 1, 3, 0, 0, 3),
        (40, 8, 2, 5, 0, 3),
        (32, 1, 0, 0, 3, 3),
        # one conversation: the one-token step's own sliding-window cleanup
        (40, 8, 2, 5, 0, 1),
        (24, 4, 3, 6, 0, 1),
        (32, 4, 0, 0, 0, 1),
    ],
)
def test_random_against_go_model(size: int, padding: int, window: int, memory: int,
                                 chunk: int, n_seqs: int) -> None:  # fmt: skip
    rng = random.Random(size * 1000 + padding * 100 + window * 10 + memory + chunk + n_seqs)
    table = CellTable(size, padding=padding, swa_window=window, swa_memory=memory,
                      chunk_size=chunk)  # fmt: skip
    model = GoModel(table.size, padding, table.swa_window, table.swa_memory, table.chunk_size)
    next_pos = {s: 0 for s in range(n_seqs)}

    def batch(seqs: list[int]) -> None:
        positions = []
        for s in seqs:
            positions.append(next_pos[s])
            next_pos[s] += 1
        try:
            want = model.start_forward(positions, seqs)
        except KvCacheFull:
            with pytest.raises(KvCacheFull):
                table.start_forward(positions, seqs)
            for s, p in zip(seqs, positions):
                next_pos[s] = min(next_pos[s], p)
            return
        plan = table.start_forward(positions, seqs)
        assert (plan.locs, plan.start) == (want[0], want[1])
        np.testing.assert_array_equal(plan.mask, want[2])

    for _ in range(300):
        op = rng.random()
        if op < 0.35:
            batch([rng.randrange(n_seqs) for _ in range(rng.randint(1, 4))])
        elif op < 0.6:  # decode steps of one sequence in a row (the one-token path reuses its mask)
            seq = rng.randrange(n_seqs)
            for _ in range(rng.randint(1, 12)):
                batch([seq])
        elif op < 0.7 and n_seqs > 1:
            src, dst = rng.sample(range(3), 2)
            length = rng.randint(0, next_pos[src])
            model.copy_prefix(src, dst, length)
            table.copy_prefix(src, dst, length)
            next_pos[dst] = length
        else:
            seq = rng.randrange(n_seqs)
            begin = rng.randint(0, next_pos[seq])
            to_end = begin == next_pos[seq] or rng.random() < 0.4
            end = None if to_end else rng.randint(begin + 1, next_pos[seq])
            try:
                shifted = model.remove(seq, begin, end)
            except NotSupported:
                with pytest.raises(NotSupported):
                    table.remove(seq, begin, end)
                model.remove(seq, 0, None)
                table.remove(seq, 0, None)
                next_pos[seq] = 0
                continue
            assert table.remove(seq, begin, end).cells == shifted
            next_pos[seq] = begin if end is None else next_pos[seq] - (end - begin)
        for i in range(table.size):
            info = table.cell(i)
            assert info.sequences == tuple(sorted(model.seqs[i]))
            if info.sequences:
                assert info.pos == model.pos[i]
        for s in range(n_seqs):
            assert table.can_resume(s, next_pos[s]) in (True, False)


# ------------------------------------------------------------------------------- the wrapper
class FakeCache:
    """Records calls; ``fail`` makes start_forward raise KvCacheFull."""

    def __init__(self, resume: bool = True, fail: bool = False) -> None:
        self.calls: list[tuple] = []
        self.resume, self.fail = resume, fail

    def set_layer(self, layer: int) -> None:
        self.calls.append(("set_layer", layer))

    def get(self, ctx):
        return ("k", id(self), "mask")

    def put(self, ctx, k, v) -> None:
        self.calls.append(("put", k))

    def set_config(self, config) -> None:
        self.calls.append(("set_config",))

    def init(self, backend, dtype, max_sequences, capacity, max_batch) -> None:
        self.calls.append(("init", max_sequences, capacity, max_batch))

    def close(self) -> None:
        self.calls.append(("close",))

    def start_forward(self, ctx, batch, reserve) -> None:
        if self.fail:
            raise KvCacheFull()
        self.calls.append(("start_forward", reserve))

    def copy_prefix(self, src, dst, length) -> None:
        self.calls.append(("copy_prefix", src, dst, length))

    def can_resume(self, seq, pos) -> bool:
        return self.resume

    def remove(self, seq, begin, end) -> None:
        self.calls.append(("remove", seq, begin, end))


@dataclass
class FakeBatch:
    positions: list[int]
    sequences: list[int]


def test_wrapper_fans_out() -> None:
    a, b = FakeCache(), FakeCache(resume=False)
    w = WrapperCache(a, b)
    w.init(None, "f16", 2, 16, 4)
    w.copy_prefix(0, 1, 3)
    w.remove(1, 2, None)
    w.set_layer(5)
    for c in (a, b):
        assert c.calls == [("init", 2, 16, 4), ("copy_prefix", 0, 1, 3), ("remove", 1, 2, None),
                           ("set_layer", 5)]  # fmt: skip
    assert not w.can_resume(0, 1)
    assert WrapperCache(FakeCache(), FakeCache()).can_resume(0, 1)
    w.set_layer_type(1)
    assert w.get(None)[1] == id(b)
    w.start_forward(None, FakeBatch([0], [0]), False)
    assert w.underlying is a  # start_forward resets the layer type
    with pytest.raises(IndexError):
        w.set_layer_type(2)


def test_wrapper_unwinds_on_failure() -> None:
    a, b = FakeCache(), FakeCache(fail=True)
    w = WrapperCache(a, b)
    with pytest.raises(KvCacheFull):
        w.start_forward(None, FakeBatch([4, 5], [0, 0]), False)
    assert a.calls == [("start_forward", False), ("remove", 0, 4, None), ("remove", 0, 5, None)]


def test_can_resume_swa_table_vs_full_table() -> None:
    """What a WrapperCache over an SWA and a full cache ANDs: only the SWA side says no."""
    swa, full = CellTable(16, swa_window=2), CellTable(16)
    for t in (swa, full):
        t.start_forward([0, 1, 2, 3, 4, 5], [0] * 6)
        t.start_forward([6], [0])
    assert full.can_resume(0, 1) and not swa.can_resume(0, 1)
    assert swa.can_resume(0, 7) and full.can_resume(0, 7)


def test_in_order_a_window_takes_the_same_cells_one_step_at_a_time_or_in_batches() -> None:
    """``in_order`` (the GGML backend's): a sliding window's only sequence takes the cells
    after its newest one, round the table, so a position lands in one cell however its tokens
    were batched (and attention sums the window in one order). Lowest-free would put position
    9 of one-token steps in a freed low cell, and a batch's in the cells after the window."""
    def table(in_order: bool = True) -> CellTable:
        geo = cache_geometry(1, 64, 8, swa_window=4, swa_memory=4)
        assert geo.size == 12  # memory 4 + batch 8
        return CellTable(geo.size, swa_window=4, swa_memory=4, in_order=in_order)

    steps, batches = table(), table()
    for p in range(40):
        steps.start_forward([p], [0])
    for p in range(0, 40, 5):  # 5 at a time, as a draft of 4 and its sampled token
        batches.start_forward(list(range(p, p + 5)), [0] * 5)
    where = {steps.cell(c).pos: c for c in steps.seq_cells(0)}
    assert where == {p: p % 12 for p in range(35, 40)}  # round the table
    assert {batches.cell(c).pos: c for c in batches.seq_cells(0)} == {p: p % 12 for p in range(31, 40)}
    rejected = table()
    for p in range(0, 30, 5):
        rejected.start_forward(list(range(p, p + 5)), [0] * 5)
        rejected.remove(0, p + 3, None)  # 2 of 4 guesses accepted: their cells freed again
        rejected.start_forward([p + 3, p + 4], [0, 0])
    assert {rejected.cell(c).pos: c for c in rejected.seq_cells(0)} == {p: p % 12 for p in range(24, 30)}
    plain = table(in_order=False)
    for p in range(10):
        plain.start_forward([p], [0])
    assert plain.cell(0).pos == 5  # lowest free: the general rule (Ollama's)
