"""Model resolution and the one-line errors of a bad model (issue: Models)."""

from __future__ import annotations

import hashlib
import json
import shutil

import gguf
import numpy as np
import pytest

import runner
from runner import config, store
from runner.api import InvalidModel, ModelNotFound
from tests.conftest import SMOLLM2, STORIES


def test_default_model_by_no_name_and_by_name():
    for name in (None, "", "smollm2:135m"):
        m = store.lookup(name)
        assert m.path == SMOLLM2 and m.name == "smollm2:135m"


def test_path(tmp_path):
    m = store.lookup(str(STORIES))
    assert m.path == STORIES.resolve()


def test_missing_file_and_model():
    with pytest.raises(ModelNotFound, match="no such file"):
        store.lookup("/nonexistent/model.gguf")
    with pytest.raises(ModelNotFound, match='model "nosuch:latest" not found|model "nosuch" not found'):
        store.lookup("nosuch")


def install_in_store(models_dir, name: str, tag: str, gguf_path) -> str:
    """Lay a GGUF out the way `ollama pull` does (reference §7.1)."""
    data = gguf_path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    (models_dir / "blobs").mkdir(parents=True, exist_ok=True)
    (models_dir / "blobs" / f"sha256-{digest}").write_bytes(data)
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
        "config": {"digest": "sha256:" + "0" * 64, "size": 2, "mediaType": "application/vnd.docker.container.image.v1+json"},
        "layers": [{"mediaType": "application/vnd.ollama.image.model", "digest": f"sha256:{digest}", "size": len(data)}],
    }
    path = models_dir / "manifests" / "registry.ollama.ai" / "library" / name / tag
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))
    return digest


def test_ollama_store_layout(tmp_path):
    models = tmp_path / "models"
    digest = install_in_store(models, "stories", "latest", STORIES)
    cfg = config.load({"OLLAMA_MODELS": str(models)})
    for name in ("stories", "stories:latest", "library/stories:latest", "registry.ollama.ai/library/stories:latest"):
        m = store.lookup(name, cfg)
        assert m.path.name == f"sha256-{digest}" and m.name == "stories:latest"
    assert [m.name for m in store.list_models(cfg)] == ["stories:latest"]
    with pytest.raises(ModelNotFound):
        store.lookup("stories:other", cfg)
    # the store model runs
    r = runner.load(runner.resolve("stories", cfg), cfg=cfg)
    try:
        assert r.info.name == "stories:latest"
    finally:
        r.close()


def test_not_a_gguf(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_text("hello")
    with pytest.raises(InvalidModel, match="not a GGUF file"):
        runner.load(runner.resolve(str(bad)))


@pytest.mark.parametrize("keep", [3, 100, 100_000, None])
def test_truncated(tmp_path, keep):
    data = STORIES.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: keep if keep is not None else len(data) - 1000])
    with pytest.raises(InvalidModel, match="truncated|not a GGUF"):
        runner.load(runner.resolve(str(cut)))


def test_architecture_llama_cpp_cannot_load(tmp_path):
    path = tmp_path / "alien.gguf"
    w = gguf.GGUFWriter(str(path), "alienarch")
    w.add_block_count(1)
    w.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(InvalidModel, match="alienarch"):
        runner.load(runner.resolve(str(path)))
