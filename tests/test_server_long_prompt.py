"""A long prompt beside a short request, through a real ``pollama serve`` (two slots), on both
engines: the short answer does not wait for the long prompt's evaluation.

A 10 MB prompt delayed a small generate by seconds: cut to the context, its 2,048 tokens went in
512-token chunks, and each token of the short answer rode in one of them (on a CPU a batch costs
about its size, so 12 tokens took as long as the whole long prompt). The 10 MB cost only ~1 s to
read and tokenize; the wait was the batching, which any long prompt shows. While a sequence is
generating (or about to), another's prompt now goes in chunks of ``SHARED_PROMPT_CHUNK`` (64)
tokens, so the short answer is done first. The order of the two answers is the test (not a time,
which a busy machine stretches): before, the long prompt's four chunks ended before the short
answer's thirteen batches did."""

from __future__ import annotations

import threading
import time

import httpx
import pytest

from serverproc import ServerProcess

SMOL = "smollm2:135m"


@pytest.mark.parametrize("engine", [pytest.param("old", marks=pytest.mark.slow), "new"])  # the loop's rule: one engine by default
def test_a_short_answer_does_not_wait_for_a_long_prompt(engine):
    env = {"OLLAMA_NUM_PARALLEL": "2", "OLLAMA_CONTEXT_LENGTH": "2048", "OLLAMA_NEW_ENGINE": "1" if engine == "new" else "0"}
    with ServerProcess(env) as server:
        assert httpx.post(server.url + "/api/generate", json={"model": SMOL}, timeout=120).status_code == 200
        finished: list[str] = []

        def generate(name: str, prompt: str, num_predict: int) -> None:
            r = httpx.post(server.url + "/api/generate", timeout=300, json={
                "model": SMOL, "prompt": prompt, "stream": False,
                "options": {"num_predict": num_predict, "temperature": 0, "stop": []}})
            assert r.status_code == 200, r.text[:200]
            assert r.json()["eval_count"] == num_predict
            finished.append(name)

        long = threading.Thread(target=generate, args=("long", "word " * 1_900, 1))
        long.start()
        time.sleep(0.3)  # its first 512-token chunk is being evaluated (a second or more)
        generate("short", "Write a poem about the sea.", 12)
        long.join()
        assert finished == ["short", "long"]
        log = server.log()
    assert "Traceback" not in log
