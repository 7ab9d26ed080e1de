"""The server's scheduler with fake runners: sharing, reloads, eviction, keep-alive, the queue bound.

The model names resolve for real (the .gguf paths of the test models); loading is a fake that
records what was loaded and closed, so these run in milliseconds.
"""

from __future__ import annotations

import asyncio
import dataclasses
import threading

import pytest

from conftest import STORIES, TINYSTORIES
import runner
from runner import config
from runner import LoadOptions
from runner.api import ModelInfo, Options, ServerBusy
from runner.server.scheduler import BUSY_MESSAGE, Scheduler

# resolved: the scheduler keys models by the real path of their file (shared/ may be a symlink)
A, B, C = str(STORIES.resolve()), str(TINYSTORIES.resolve()), "smollm2:135m"


class FakeRunner:
    engine = "fake"
    load_duration = 1

    def __init__(self, info: ModelInfo, plan: LoadOptions, cfg: config.Config, log: list) -> None:
        self.info = info
        self.num_ctx = plan.num_ctx
        self.num_parallel = plan.num_parallel
        self.closed = threading.Event()
        self.log = log
        log.append(("load", info.name, self.num_ctx))

    def close(self) -> None:
        self.closed.set()
        self.log.append(("close", self.info.name))


def make(log: list, **cfg_values) -> Scheduler:
    cfg = dataclasses.replace(config.load({}), **cfg_values)
    return Scheduler(cfg, load=lambda model, plan, cfg: FakeRunner(model.info, plan, cfg, log))


def resolve(s: Scheduler, name: str):
    """A request's model, as the service resolves it (``runner.resolve`` of a network name)."""
    return runner.resolve(name, s.cfg, from_network=True)


def run(coro):
    return asyncio.run(coro)


async def settle() -> None:
    for _ in range(20):
        await asyncio.sleep(0.01)


def test_requests_share_one_runner_and_reload_on_new_load_options():
    log: list = []

    async def scenario():
        s = make(log)
        m1 = await s.acquire(resolve(s, A), Options(), None)
        m2 = await s.acquire(resolve(s, A), Options(temperature=0.1), None)  # sampling options: same runner
        assert m1 is m2 and m1.refs == 2
        s.release(m1)
        s.release(m2)
        m3 = await s.acquire(resolve(s, A), Options(num_ctx=256), None)  # load-time option: reload
        assert m3 is not m1 and m1.runner.closed.is_set()
        s.release(m3)
        await s.close()

    run(scenario())
    assert [e[0] for e in log] == ["load", "close", "load", "close"]  # unload, then load


def test_reload_waits_for_the_model_to_go_idle():
    log: list = []

    async def scenario():
        s = make(log)
        busy = await s.acquire(resolve(s, A), Options(), None)
        waiter = asyncio.ensure_future(s.acquire(resolve(s, A), Options(num_ctx=128), None))
        await settle()
        assert not waiter.done() and not busy.runner.closed.is_set()
        s.release(busy)
        fresh = await asyncio.wait_for(waiter, 5)
        assert busy.runner.closed.is_set() and fresh.runner.num_ctx == 128
        s.release(fresh)
        await s.close()

    run(scenario())


def test_max_loaded_models_unloads_the_least_recently_used_idle_model():
    log: list = []

    async def scenario():
        s = make(log, max_loaded_models=2)
        for name in (A, B):
            s.release(await s.acquire(resolve(s, name), Options(), None))
        s.release(await s.acquire(resolve(s, A), Options(), None))  # A is now the most recently used
        s.release(await s.acquire(resolve(s, C), Options(), None))
        loaded = {m.name for m in s.loaded.values()}
        assert loaded == {A, "smollm2:135m"}
        await s.close()

    run(scenario())
    assert ("close", B) in log


def test_a_busy_model_is_not_evicted():
    log: list = []

    async def scenario():
        s = make(log, max_loaded_models=1)
        busy = await s.acquire(resolve(s, A), Options(), None)
        waiter = asyncio.ensure_future(s.acquire(resolve(s, B), Options(), None))
        await settle()
        assert not waiter.done() and A in s.loaded
        s.release(busy)
        other = await asyncio.wait_for(waiter, 5)
        assert list(s.loaded) == [other.key] and busy.runner.closed.is_set()
        s.release(other)
        await s.close()

    run(scenario())


def test_keep_alive_zero_unloads_when_idle_and_negative_never_expires():
    log: list = []

    async def scenario():
        s = make(log)
        m = await s.acquire(resolve(s, A), Options(), 0)
        assert A in {x.name for x in s.loaded.values()}
        s.release(m)
        assert m.key not in s.loaded  # out of service at once
        await settle()
        assert m.runner.closed.is_set()
        forever = await s.acquire(resolve(s, B), Options(), -1)
        s.release(forever)
        assert forever.timer is None and forever.expires_at.year > 2200
        short = await s.acquire(resolve(s, C), Options(), 0.05)
        s.release(short)
        await asyncio.sleep(0.2)
        assert short.runner.closed.is_set() and short.key not in s.loaded
        await s.close()

    run(scenario())


def test_queue_bound_answers_busy():
    log: list = []

    async def scenario():
        s = make(log, num_parallel=1, max_queue=1)
        first = await s.acquire(resolve(s, A), Options(), None)  # holds the only slot
        second = await s.acquire(resolve(s, A), Options(), None)  # waits in the runner's queue
        with pytest.raises(ServerBusy, match="maximum pending requests exceeded") as info:
            await s.acquire(resolve(s, A), Options(), None)
        assert str(info.value) == BUSY_MESSAGE and info.value.status == 503
        s.release(second)
        third = await s.acquire(resolve(s, A), Options(), None)  # room again
        for m in (first, third):
            s.release(m)
        await s.close()

    run(scenario())


def test_a_client_leaving_mid_load_does_not_leak_the_runner():
    log: list = []
    gate = threading.Event()

    def slow_load(info, plan, cfg):
        gate.wait(5)
        return FakeRunner(info, plan, cfg, log)

    async def scenario():
        cfg = dataclasses.replace(config.load({}))
        s = Scheduler(cfg, load=slow_load)
        task = asyncio.ensure_future(s.acquire(resolve(s, A), Options(), 0))
        await settle()
        task.cancel()
        await settle()
        gate.set()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if log and log[-1][0] == "close":
                break
        assert [e[0] for e in log] == ["load", "close"]  # keep_alive 0: unloaded once loaded
        assert not s.loaded
        await s.close()

    run(scenario())


def test_shutdown_refuses_new_requests():
    log: list = []

    async def scenario():
        s = make(log)
        s.release(await s.acquire(resolve(s, A), Options(), None))
        await s.close()
        assert not s.loaded and log[-1][0] == "close"
        with pytest.raises(Exception, match="shutting down"):
            await s.acquire(resolve(s, A), Options(), None)

    run(scenario())
