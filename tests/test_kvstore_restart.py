"""Conversations survive the process (issue 25's disk tier): a runner that unloads writes its
slots' states to ``POLLAMA_CACHE_DIR``; the next runner of the same model and settings, in this
process or another, restores them instead of evaluating the conversation again.

The baseline is the next turn on a runner whose slot stayed warm: the restored turn must cache as
much and give the same greedy tokens with bitwise equal log-probabilities.
"""

from __future__ import annotations

import dataclasses
import re

import runner
from runner import config
from runner.api import Message, Options
from tests.conftest import fresh_cache_dir
from tests.test_cli import run_cli
from kvturns import turn

DOC = ("The lighthouse keeper climbed the spiral stairs every evening, counting the steps as his father "
       "had taught him. There were one hundred and twelve of them, worn smooth by a century of boots. ") * 4


def load(cache_dir, cache_ram: int = 0, cache_disk: int = 64, engine: str = "old"):
    cfg = dataclasses.replace(config.load({}), new_engine=engine == "new", cache_ram=cache_ram,
                              cache_disk=cache_disk, cache_dir=cache_dir)
    r = runner.load(runner.resolve(None, cfg), Options().merged({"num_ctx": 2048, "num_thread": 1}), cfg,
                    num_parallel=1)
    assert r.engine == engine
    return r


def test_a_conversation_resumes_from_disk_after_an_unload():
    folder = fresh_cache_dir()
    warm = load(fresh_cache_dir(), cache_disk=0)  # no store: its slot simply stays warm
    try:
        a = [Message("user", "Read this and tell me how many steps there were.\n\n" + DOC)]
        first = load(folder)
        answer, m1, _ = turn(first, a)
        assert turn(warm, a)[0] == answer and m1.prompt_eval_count > 100
        first.close()  # the unload writes the slot to disk before it returns
        assert list((folder / "kv").glob("*.kv"))

        second = load(folder)  # another load: nothing in its slot, the folder only
        try:
            a2 = a + [Message("assistant", answer), Message("user", "And who taught him to count them?")]
            want_text, want, want_lp = turn(warm, a2)
            got_text, got, got_lp = turn(second, a2)
            assert (got.prompt_cache_source, want.prompt_cache_source) == ("disk", "slot")
            assert got.prompt_cached_count == want.prompt_cached_count > m1.prompt_eval_count
            assert got.prompt_eval_count == want.prompt_eval_count
            assert got_text == want_text
            assert got_lp == want_lp  # bitwise
        finally:
            second.close()
    finally:
        warm.close()


def test_other_settings_never_read_the_files():
    folder = fresh_cache_dir()
    a = [Message("user", "Tell me about the lighthouse.\n\n" + DOC)]
    first = load(folder)
    turn(first, a)
    first.close()
    cfg = dataclasses.replace(config.load({}), new_engine=False, cache_ram=0, cache_disk=64, cache_dir=folder)
    other = runner.load(runner.resolve(None, cfg), Options().merged({"num_ctx": 1024, "num_thread": 1}), cfg,
                        num_parallel=1)  # another context: another fingerprint
    try:
        _, m, _ = turn(other, a)
        assert m.prompt_cached_count == 0 and m.prompt_cache_source == ""
    finally:
        other.close()


def test_pollama_run_twice_prefills_once(_isolated_home):
    """Two one-shots in two processes on one long document: the second restores the first's
    prompt from disk (``--verbose`` says so) and answers the same."""
    prompt = "How many steps were there? Answer from the text.\n\n" + DOC
    args = ["run", "--verbose", "-o", "temperature=0", "-o", "num_predict=8", "-o", "num_thread=1", prompt]
    first = run_cli(args, _isolated_home)
    assert first.returncode == 0, first.stderr
    assert re.search(r"prompt cache:\s+0 token", first.stderr)
    second = run_cli(args, _isolated_home)
    assert second.returncode == 0, second.stderr
    match = re.search(r"prompt eval count:\s+(\d+) token.*prompt cache:\s+(\d+) token\(s\) \(disk\)", second.stderr,
                      re.S)
    assert match, second.stderr
    assert int(match.group(2)) == int(match.group(1)) - 1  # all but the one input a reply needs evaluated
    assert second.stdout == first.stdout
    assert list((_isolated_home / ".pollama" / "cache" / "kv").glob("*.kv"))
