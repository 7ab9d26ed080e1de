"""Shared fixtures: the real test models (DESIGN.md § Models) and runner loading per engine."""

from __future__ import annotations

import atexit
import dataclasses
import os
import shutil
import tempfile
from pathlib import Path

import pytest

import runner
from runner import config
from runner.api import Options
from runner.store import default_model_path

SHARED = Path(__file__).resolve().parents[1].parent / "shared"
if not SHARED.is_dir():  # CI clones main with shared/ beside it; a checkout may have it inside
    SHARED = Path(__file__).resolve().parents[1] / "shared"
MODELS = SHARED / "models"
STORIES = MODELS / "stories260K.gguf"
TINYSTORIES = MODELS / "TinyStories-656K-Q8_0.gguf"
SMOLLM2 = default_model_path()

# Engines every behaviour test runs on. The new engine joins once it runs these models.
ENGINES = ["old", "new"]

# The prompt store's disk tier of in-process runners (config.load({}) reads no environment, and a
# module's fixtures load before a test's HOME is swapped): a folder of this session's, never ~.
_CACHE_ROOT = Path(tempfile.mkdtemp(prefix="pollama-test-kv-"))
atexit.register(shutil.rmtree, _CACHE_ROOT, ignore_errors=True)
config.DEFAULT_CACHE_DIR = str(_CACHE_ROOT / "default")


def fresh_cache_dir() -> Path:
    """A new, empty prompt cache folder (one per load, so no test restores another's prompts)."""
    return Path(tempfile.mkdtemp(dir=_CACHE_ROOT))


def load(model: str | os.PathLike | None, engine: str = "old", *, num_parallel: int = 1,
         multiuser: bool = False, pipeline: bool = False, **options):
    """Load a real model on one engine with test-friendly options (temperature 0 unless given);
    ``pipeline``: decode on a compute thread, the next batch built meanwhile."""
    cfg = dataclasses.replace(config.load({}), new_engine=(engine == "new"), multiuser_cache=multiuser,
                              pipeline=pipeline, cache_dir=fresh_cache_dir())
    options.setdefault("num_ctx", 2048)
    resolved = runner.resolve(None if model is None else str(model), cfg)
    r = runner.load(resolved, Options().merged(options), cfg, num_parallel=num_parallel)
    assert r.engine == engine, f"asked for the {engine} engine, got {r.engine}"
    return r


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    """Never touch the user's ~/.ollama or ~/.pollama."""
    home = tmp_path_factory.mktemp("home")
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("OLLAMA_MODELS", str(home / ".ollama" / "models"))
    for name in ("OLLAMA_NEW_ENGINE", "OLLAMA_NUM_PARALLEL", "OLLAMA_CONTEXT_LENGTH", "OLLAMA_MULTIUSER_CACHE",
                 "OLLAMA_HOST", "OLLAMA_KEEP_ALIVE", "OLLAMA_MAX_QUEUE", "OLLAMA_DEBUG"):
        monkeypatch.delenv(name, raising=False)
    yield home


@pytest.fixture(params=ENGINES)
def engine(request) -> str:
    return request.param


@pytest.fixture(scope="session")
def grammars():
    """Converts schemas and checks grammars in child processes, as a loaded runner does."""
    from runner.sample.grammarcheck import GrammarCheck

    check = GrammarCheck()
    yield check
    check.close()


def collect(chunks):
    """(text, final chunk) of a stream."""
    text, final = [], None
    for chunk in chunks:
        text.append(chunk.text)
        if chunk.done:
            final = chunk
    return "".join(text), final
