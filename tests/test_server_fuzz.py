"""Fuzz every operation of the server's OpenAPI schema with schemathesis: no request may get a 5xx.

Generated bodies keep their shapes and values, with two nudges so the run stays short: a body's
``model`` is stories260K (1.2 MB, so loads and generations take milliseconds; other names are
covered by the error tests) and generation lengths are capped.
"""

from __future__ import annotations

import re

import httpx
import pytest
import schemathesis
from schemathesis import GenerationMode
from hypothesis import HealthCheck, Phase, given, settings

from conftest import STORIES
from registry import LocalRegistry
from serverproc import ServerProcess
from test_store_safety import canary_tree, snapshot_outside

STORIES_PATH = str(STORIES)
GENERATING = {"/api/generate", "/api/chat", "/v1/chat/completions", "/v1/completions", "/v1/messages",
              "/v1/messages/count_tokens", "/v1/responses"}
REGISTRY = LocalRegistry()  # pulls go here (404 for what it lacks), never to the internet


@pytest.fixture(scope="module")
def fuzz_server():
    proc = ServerProcess({"OLLAMA_NUM_PARALLEL": "2", "OLLAMA_CONTEXT_LENGTH": "256",
                          "OLLAMA_MAX_LOADED_MODELS": "2"}).start()
    # files beside the store that a name escaping it would hit (see test_store_safety)
    home = proc.models.parent
    proc.canaries = canary_tree(home)
    proc.prompt_cache = home / ".pollama" / "cache" / "kv"  # the prompt store's own files (hex names only)
    proc.outside = snapshot_outside(home, proc.models, ignore=(proc.log_path.name,), allowed=(proc.prompt_cache,))
    REGISTRY.start()
    yield proc
    REGISTRY.stop()
    code = proc.stop()
    assert code == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def _cases() -> list:
    """(operation, mode) pairs from the app's schema, built in-process (calls go to the server).
    Negative cases (bodies that break the schema) only exist for operations that take a body."""
    from runner.server.app import create_app

    loaded = schemathesis.openapi.from_dict(create_app().openapi())
    out = []
    for result in loaded.get_all_operations():
        operation = result.ok()
        out.append(pytest.param(operation, GenerationMode.POSITIVE,
                                id=f"{operation.method.upper()} {operation.path}"))
        if operation.body:
            out.append(pytest.param(operation, GenerationMode.NEGATIVE,
                                    id=f"{operation.method.upper()} {operation.path} (negative)"))
    return out


def tame(path: str, body: object) -> None:
    """Point generation at the tiny model and keep generations short (in place)."""
    if not isinstance(body, dict):
        return
    # store operations (copy, delete, show) keep their generated names: the canaries watch them
    if path in GENERATING or path.startswith(("/api/embed", "/v1/embed")):
        body["model"] = STORIES_PATH
    if path in ("/api/pull", "/api/push"):
        for key in ("model", "name"):  # the fuzzed name, on our registry
            if isinstance(body.get(key), str) and body[key]:
                body[key] = f"{REGISTRY.host}/library/{body[key]}"
        body["insecure"] = True
    if path in ("/api/generate", "/api/chat"):
        options = body.get("options")
        if not isinstance(options, dict):
            options = body["options"] = {}
        options["num_predict"] = 8
    if path in ("/v1/chat/completions", "/v1/completions", "/v1/messages"):
        body["max_tokens"] = 8
        body.pop("max_completion_tokens", None)
    if path == "/v1/responses":
        body["max_output_tokens"] = 8


#: generated requests per operation and mode: the default run's, and the slow run's deeper pass
EXAMPLES, DEEP_EXAMPLES = 25, 120


@pytest.mark.parametrize("operation, mode", _cases())
def test_no_server_errors(operation, mode, fuzz_server):
    fuzz(operation, mode, fuzz_server, EXAMPLES)


@pytest.mark.slow
@pytest.mark.parametrize("operation, mode", _cases())
def test_no_server_errors_deeper(operation, mode, fuzz_server):
    """The same stream of requests, further: 120 each rather than 25."""
    fuzz(operation, mode, fuzz_server, DEEP_EXAMPLES)


def fuzz(operation, mode, fuzz_server, examples: int) -> None:
    @settings(max_examples=examples, deadline=None, derandomize=True, database=None,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck))
    @given(case=operation.as_strategy(generation_mode=mode))
    def check(case) -> None:
        tame(case.path, case.body)
        response = case.call(base_url=fuzz_server.url, timeout=60)
        assert response.status_code < 500, (case.method, case.path, case.body, response.text)
        if response.status_code >= 400 and response.text:
            error = response.json().get("error")
            if case.path.startswith("/v1/messages"):  # Anthropic's shape
                assert response.json().get("type") == "error", response.text
                assert isinstance(error, dict) and set(error) == {"type", "message"}, response.text
            elif case.path.startswith("/v1/"):  # OpenAI's shape
                assert isinstance(error, dict) and isinstance(error.get("message"), str), response.text
                assert set(error) == {"message", "type", "param", "code"}, response.text
            else:
                assert isinstance(error, str), response.text

    check()


def test_no_fuzzed_name_reached_outside_the_store(fuzz_server):
    home = fuzz_server.models.parent
    assert snapshot_outside(home, fuzz_server.models, ignore=(fuzz_server.log_path.name,),
                            allowed=(fuzz_server.prompt_cache,)) == fuzz_server.outside
    # what the prompt store wrote there is named by its keys, never by anything a request named
    assert all(re.fullmatch(r"[0-9a-f]{64}(\.page)?\.kv", p.name) for p in fuzz_server.prompt_cache.glob("*"))
    for path, data in fuzz_server.canaries.items():
        assert path.read_bytes() == data


def test_server_still_answers_after_the_fuzz(fuzz_server):
    r = httpx.post(fuzz_server.url + "/api/generate", timeout=60, json={
        "model": STORIES_PATH, "prompt": "Once", "stream": False, "options": {"num_predict": 4}})
    assert r.status_code == 200 and r.json()["eval_count"] == 4
