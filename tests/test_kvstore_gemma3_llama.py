"""A sliding-window model's sequence state on the old engine: gemma-3-270m (window 512) exported and
imported past its window (LlamaKv.export_seq/import_seq, runner/engines/llamacpp/kvstate.py).

The context has 1024 cells a stream for the global layers and a ring of 768 (512 + num_batch 64,
padded to 256) for the window's. The baseline is the live sequence fed the same batches, as for
SmolLM2 (tests/test_kvstore_llama.py): a restore must continue bit for bit like it. A recompute of
the same inputs from an empty slot (other batches) is the yardstick llama.cpp's own layout is held
to: gemma's logits move by a logit or two under batch rounding alone.
"""

from __future__ import annotations

import ctypes
import dataclasses

import llama_cpp as L
import numpy as np
import pytest

import runner
from runner import config
from runner.api import Message, Options, Request
from runner.engines.llamacpp.engine import LlamaEngine
from runner.engines.llamacpp.kvstate import relay_window
from runner.kvstore.key import Fingerprint
from runner.kvstore.ram import RamStore
from runner.kvstore.store import PromptStore
from runner.loop.slots import InputCache

from test_gemma3 import gemma3  # noqa: F401  (fetches gemma-3-270m once per session)
from kvturns import evaluate, greedy

pytestmark = pytest.mark.slow

NUM_CTX, NUM_BATCH, SLOTS = 1024, 64, 3
RING = 768
# prose that does not repeat, so the model's next token is not a copy
TEXT = (
    "The survey ship reached the outer moon in late autumn, when the ice fields were quiet and the "
    "long shadows of the ridges lay across the plain for most of the day. Marta had spent eleven years "
    "preparing for this landing, first as a student who drew maps of places nobody had seen, then as "
    "an engineer who argued about drill bits and heat shields with people twice her age. Now she stood "
    "at the window of the descent module and could not think of a single thing to say. The pilot, an "
    "old man named Idris who had flown cargo between the inner stations for most of his life, hummed a "
    "song from his childhood and tapped the console whenever the altitude readout changed. Below them "
    "the surface was the colour of weak tea, streaked with pale lines where the crust had cracked and "
    "frozen again. Somewhere under those lines, the instruments said, there was liquid water, salty and "
    "dark and perhaps not empty. The mission planners had chosen a landing site near a fracture that "
    "vented vapour every few hours; if anything lived down there, its traces might be carried up and "
    "frozen into the frost around the vent. Marta thought about her grandmother, who had kept bees in a "
    "village without electricity and who had asked, when Marta left for the academy, whether the stars "
    "had flowers. She had laughed then. She did not laugh now. The module shuddered as the engines "
    "throttled up, dust and ice blew outward in a widening ring, and then there was a soft bump and a "
    "silence so complete that she could hear her own pulse. Idris stopped humming. For a long moment "
    "neither of them moved. Then he unbuckled, stretched his arms above his head, and said that in "
    "forty years of flying he had never once landed anywhere that did not already have a name. Marta "
    "opened the logbook, wrote the date and the time, and left the space for the name empty. Outside, "
    "the vapour plume rose from the fracture, thin and white against the black sky, and drifted slowly "
    "toward the horizon where the gas giant hung enormous and banded, filling a quarter of the sky. "
    "They spent the first night checking seals, charging batteries and arguing gently about whether to "
    "walk to the vent before or after the scheduled rest. The rules said after. Idris said the rules "
    "had been written by people who had never seen a plume. In the morning the rover would not start, "
    "and the argument was settled for them: Marta spent six hours on her back under the chassis with a "
    "torch in her teeth, tracing a fault through a harness that had been assembled, according to its "
    "label, on a Tuesday in a factory she had once toured as a child. When the motor finally turned over "
    "she lay there in the dust and laughed until her visor fogged. "
    "The walk to the vent took most of the second day. The ground was harder than the models had "
    "promised, a crust of grey ice glazed with something that crunched like sugar, and every few hundred "
    "metres they had to stop while the rover's wheels found a way around a ridge too steep to climb. "
    "Idris talked the whole time: about his daughter, who repaired water pumps on a farming station and "
    "refused to visit him; about a cargo run in his twenties when a valve had frozen shut and he had "
    "thawed it with his own breath through a borrowed glove; about the proper way to brew coffee in low "
    "gravity, which he claimed nobody alive except himself understood. Marta listened with half her "
    "attention and watched the instruments with the other half. The readings changed slowly, then all at "
    "once. Near the fracture the frost was streaked with faint orange, and the spectrometer, after a "
    "long and anxious pause, reported compounds that the briefing had listed under the heading of "
    "results we do not expect but would very much like. She did not say anything for a while. Idris, "
    "for once, was silent too. They took samples in the way they had practised a hundred times in the "
    "training hall, sealed them, labelled them, photographed the site from every side, and then sat on "
    "the rover's step and watched the plume rise and thin and vanish into the dark. On the way back the "
    "radio brought a message from the orbiter: the relay would be out of line of sight for nine hours, "
    "the weather model predicted a venting event larger than any yet recorded, and mission control "
    "recommended that the crew remain inside the module until further notice. Idris read it aloud, "
    "folded his hands behind his head, and said that for the first time in his life he was glad to be "
    "told to stay at home. Marta laughed, and then, because there was nothing else to do, she began to "
    "write the report, choosing each word as carefully as if someone a thousand years from now would "
    "read it and want to know exactly what it had been like to be the first."
)
TURN = " Now tell the story again from the pilot's point of view, in a few short sentences:"


def make_engine(gemma3, flash: bool, slots: int = SLOTS, num_ctx: int = NUM_CTX) -> LlamaEngine:
    cfg = dataclasses.replace(config.load({}), new_engine=False, flash_attention=flash)
    info = runner.resolve(str(gemma3), cfg).info
    options = Options().merged({"num_ctx": num_ctx, "num_batch": NUM_BATCH, "num_thread": 1})
    return LlamaEngine(info, runner.load_options(info, options, cfg, slots))


@pytest.fixture(scope="module")
def plain(gemma3):
    """Flash attention off (the default; V transposed in the state)."""
    e = make_engine(gemma3, False)
    yield e
    e.close()


@pytest.fixture(scope="module", params=[False, True], ids=["nofa", "fa"])
def engine(request, gemma3, plain):
    """Each V layout: the numerics are checked with flash attention off and on."""
    if not request.param:
        yield plain
        return
    e = make_engine(gemma3, True)
    yield e
    e.close()


def positions(engine: LlamaEngine, seq: int) -> tuple[int, int]:
    return L.llama_memory_seq_pos_min(engine.kv.mem, seq), L.llama_memory_seq_pos_max(engine.kv.mem, seq)


def conversation(engine: LlamaEngine, n_prompt: int, seq: int = 0) -> list[int]:
    """A prompt of ``n_prompt`` tokens and an 8-token greedy answer decoded into empty ``seq``."""
    engine.kv.seq_rm(seq, 0, None)
    prompt = engine.tokenize(TEXT)[:n_prompt]
    assert len(prompt) == n_prompt
    answer, _ = greedy(engine, evaluate(engine, prompt, 0, seq), n_prompt, seq, 8)
    return prompt + answer


def test_a_sliding_window_model_exports(engine):
    kv = engine.kv
    # the window's cells a stream as llama_kv_cache_iswa sizes them (were it another number, the
    # imports below would not land where the live ring is, and would not decode bit for bit)
    assert kv.window == 512 and kv.ring == RING
    assert kv.state_layout


def test_a_conversation_past_the_window_resumes_bit_for_bit(engine):
    """800 + 8 tokens: the ring has wrapped (cells 0..39 hold positions 768..807), the state holds
    the window [296, 808) and the import lays it out as the live ring, fillers in the gap."""
    kv = engine.kv
    for seq in range(SLOTS):
        kv.seq_rm(seq, 0, None)
    inputs = conversation(engine, 800)
    n = len(inputs)
    assert positions(engine, 0) == (n - RING, n - 1)  # the live ring: the window and older cells
    state = kv.export_seq(0)
    assert state is not None
    assert kv.split_state(state, [*range(0, n, 16), n]) is None  # a window is kept whole, not as pages
    assert kv.import_seq(1, state)
    assert kv.oldest(1) == n - 512  # its own from the window's first position: fillers below
    assert positions(engine, 1)[1] == n - 1

    turn = engine.tokenize(TURN, add_special=False)
    live = evaluate(engine, turn, n, 0)
    live_tokens, live_rows = greedy(engine, live, n + len(turn), 0, 24)
    restored = evaluate(engine, turn, n, 1)
    tokens, rows = greedy(engine, restored, n + len(turn), 1, 24)
    assert np.array_equal(restored, live)
    assert tokens == live_tokens
    assert all(np.array_equal(a, b) for a, b in zip(rows, live_rows))

    # the same slot, emptied, gets the state back (an immutable copy imports too)
    assert kv.import_seq(0, bytes(state))
    assert np.array_equal(evaluate(engine, turn, n, 0), live)

    # the yardstick: a recompute from an empty slot (other batches) and llama.cpp's own layout
    kv.seq_rm(2, 0, None)
    evaluate(engine, inputs, 0, 2)
    recompute = evaluate(engine, turn, n, 2)
    kv.seq_rm(1, 0, None)
    buf = (ctypes.c_uint8 * len(state)).from_buffer(state)
    assert L.llama_state_seq_set_data(engine._ctx, buf, len(state), 1) == len(state)  # llama.cpp's own layout
    compact = evaluate(engine, turn, n, 1)
    batch_rounding = float(np.abs(live - recompute).max())
    assert 0 < batch_rounding < 3
    assert 0 < float(np.abs(compact - live).max()) < 2 * batch_rounding  # rounding, not lost cells


def test_a_window_that_has_not_wrapped_restores_with_fillers_below_it(engine):
    """600 + 8 tokens: the ring has not wrapped; cells 0..95 hold positions no later token sees,
    and the import puts fillers there so the window lands in the cells the live one holds."""
    kv = engine.kv
    for seq in range(2):
        kv.seq_rm(seq, 0, None)
    inputs = conversation(engine, 600)
    n = len(inputs)
    state = kv.export_seq(0)
    relaid, own = relay_window(state, kv.ring)
    assert own == n - 512 and len(relaid) > len(state)
    assert kv.import_seq(1, state)
    assert positions(engine, 1) == (0, n - 1) and kv.oldest(1) == n - 512
    turn = engine.tokenize(TURN, add_special=False)
    live = evaluate(engine, turn, n, 0)
    live_tokens, live_rows = greedy(engine, live, n + len(turn), 0, 16)
    restored = evaluate(engine, turn, n, 1)
    tokens, rows = greedy(engine, restored, n + len(turn), 1, 16)
    assert np.array_equal(restored, live) and tokens == live_tokens
    assert all(np.array_equal(a, b) for a, b in zip(rows, live_rows))


def test_the_window_is_the_rule_for_a_restored_prefix(plain):
    engine = plain
    """Through the slot cache and a RAM store: a conversation that returns at the end of its stored
    state resumes there; one that shares less of it is evaluated from position 0."""
    kv = engine.kv
    for seq in range(SLOTS):
        kv.seq_rm(seq, 0, None)
    fingerprint = Fingerprint(engine="old", engine_version=kv.state_layout, model="gemma-3-270m", projector="",
                              kv_cache_type="f16", flash_attention=False, num_ctx=NUM_CTX)
    store = PromptStore(fingerprint, RamStore(64 << 20))
    cache = InputCache(kv, NUM_CTX, 1, False, store)  # one slot: sequence 0

    def turn(prompt: list[int]) -> tuple[int, np.ndarray | None]:
        """load_slot, evaluate what it leaves, release; (inputs it took from the cache, logits)."""
        slot, rest = cache.load_slot(prompt)
        cached = len(prompt) - len(rest)
        logits = evaluate(engine, rest, cached, slot.id)
        slot.inputs = list(prompt)
        cache.release(slot)
        return cached, logits

    a = engine.tokenize(TEXT)[:700]
    other = engine.tokenize(TEXT[::-1])[:12]  # another conversation, too short to be stored
    more = engine.tokenize(TURN, add_special=False)
    assert turn(a)[0] == 0
    assert turn(other)[0] <= 1  # takes the slot (sharing at most BOS): a goes to the store
    assert store.holds(a)

    # a's next turn: restored at the end of its state, continuing like a warm slot would
    cached, logits = turn(a + more)
    assert cached == len(a)
    assert not store.holds(a)  # it lives in the slot now
    evaluate(engine, a, 0, 1)  # sequence 1: a warm slot fed the same batches
    assert np.array_equal(logits, evaluate(engine, more, len(a), 1))

    # edited before its end: the window cannot serve the shorter prefix, so it is recomputed
    assert turn(other)[0] <= 1  # a + more goes to the store
    assert store.holds(a + more)
    edited = a[:650] + engine.tokenize(" And then the radio crackled.", add_special=False)
    slot, rest = cache.load_slot(edited)
    assert len(rest) == len(edited) and slot.inputs == []  # from position 0, not from cells that are gone
    assert store.holds(a + more)  # the state stays stored for the conversation it serves
    assert positions(engine, slot.id) == (-1, -1)
    cache.release(slot)


def test_fillers_stay_below_the_window_through_cuts_copies_and_shifts(gemma3):
    """num_ctx 768: the ring is the whole stream, so llama.cpp can shift this context too."""
    engine = make_engine(gemma3, False, num_ctx=768)
    try:
        kv = engine.kv
        assert kv.ring == 768 and kv.shiftable
        inputs = conversation(engine, 600)
        n = len(inputs)
        own = n - 512
        assert kv.import_seq(1, kv.export_seq(0)) and kv.oldest(1) == own
        kv.seq_cp(1, 2, n)  # a fork holds the same fillers
        assert kv.oldest(2) == own and not kv.can_resume(2, n - 1) and kv.can_resume(2, n)
        assert kv.seq_rm(2, n - 10, None) and not kv.can_resume(2, n - 10)
        assert kv.seq_rm(2, 0, None) and kv.oldest(2) == -1  # emptied: nothing of its own, no fillers
        assert kv.shift(1, 4, 200, n)  # [4, 204) dropped: fillers and the window's first cells
        assert kv.oldest(1) == 4 < own  # what moved down to 4 is the window's
        assert kv.shift(1, 4, 50, n - 200)  # the window's own cells only: the floor stays
        assert kv.oldest(1) == 4
        kv.seq_rm(1, 0, None)
        assert kv.oldest(1) == -1 and 1 not in kv._own
    finally:
        engine.close()


def test_states_that_are_not_a_window_import_as_saved(plain):
    engine = plain
    """relay_window leaves what it does not recognise to llama.cpp: a damaged state is refused."""
    kv = engine.kv
    conversation(engine, 100)
    state = kv.export_seq(0)
    assert relay_window(state, kv.ring) == (state, 0)  # short: already in ring order
    assert relay_window(state[:-1], kv.ring) is None
    assert not kv.import_seq(1, state[: len(state) // 2])
    assert positions(engine, 1) == (-1, -1)


def test_an_evicted_conversation_resumes_from_ram_like_its_warm_slot(gemma3):
    """The batch loop with OLLAMA_CACHE_RAM on, one slot: A (longer than the window) is evicted by
    B and restored for its next turn, which caches as much and gives the same greedy tokens with
    bitwise equal log-probabilities as a runner whose slot kept A."""
    def load(cache_ram: int):
        cfg = dataclasses.replace(config.load({}), new_engine=False, cache_ram=cache_ram)
        options = Options().merged({"num_ctx": 2048, "num_batch": NUM_BATCH, "num_thread": 1})  # a ring of 768
        return runner.load(runner.resolve(str(gemma3), cfg), options, cfg, num_parallel=1)

    def turn(r, messages):
        request = Request(messages=messages, options=Options().merged(dict(temperature=0.0, repeat_penalty=1.0,
                                                                          num_predict=12)),
                          logprobs=True, top_logprobs=4)
        text, logprobs, final = [], [], None
        for chunk in r.stream(request):
            text.append(chunk.text)
            logprobs.extend((lp.token, lp.logprob, [(t.token, t.logprob) for t in lp.top_logprobs])
                            for lp in chunk.logprobs or [])
            final = chunk if chunk.done else final
        return "".join(text), final.metrics, logprobs

    stored, plain = load(64), load(0)
    try:
        assert stored.cache.store is not None  # a sliding-window model gets a store now
        a = [Message("user", "Read this story and tell me who flew the ship.\n\n" + TEXT)]
        answer, first, _ = turn(plain, a)
        assert turn(stored, a)[0] == answer and first.prompt_eval_count > RING  # the ring wraps
        turn(stored, [Message("user", "What is the capital of France?")])  # B takes the slot: A to RAM
        assert stored.cache.store.used > 0

        a2 = a + [Message("assistant", answer), Message("user", "And what did Marta write in the logbook?")]
        want_text, want, want_lp = turn(plain, a2)  # A's slot is still warm
        got_text, got, got_lp = turn(stored, a2)  # A is restored from RAM
        assert got.prompt_cached_count == want.prompt_cached_count > first.prompt_eval_count
        assert got_text == want_text and got_lp == want_lp  # bitwise
    finally:
        stored.close()
        plain.close()
