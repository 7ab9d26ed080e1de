"""Malformed GGUF files (tests/malformed_gguf.py) never kill, hang or confuse: `pollama run` and
`pollama show` exit 1 with one line, and a real `pollama serve` answers 400 and keeps serving, on
both engines. The rules live in runner/model/ggufmeta.py (structure) and runner/loading/ggufcheck.py (meaning).
"""

from __future__ import annotations

import subprocess
import sys

import httpx
import pytest

import runner
from runner import config, store
from runner.model import ggufmeta
from tests.conftest import STORIES, TINYSTORIES
from tests.malformed_gguf import generate
from tests.serverproc import ServerProcess
from tests.test_cli import cli_env

# Cases that reach an engine: the header is sound and the rules pass, but the engine itself
# refuses (a layer's weights are missing). Every other case is refused before loading.
ENGINE_REFUSES = {"block_count_6"}

# One case per kind of damage, for the subprocess CLI runs (each costs a Python start).
CLI_CASES = ["cut_vocab", "cut_data_middle", "offset_misaligned", "type_unknown", "type_f16_norm",
             "tensor_count_huge", "dims_overflow", "block_count_513", "head_count_kv_3", "rope_dims_odd",
             "norm_eps_negative", "experts_too_many", "vocab_only", "vocab_duplicate_token", "block_count_6"]


@pytest.fixture(scope="module")
def cases(tmp_path_factory):
    return generate(STORIES, tmp_path_factory.mktemp("malformed"))


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


def test_the_type_table_is_ggmls():
    from runner.ml.ggml import bindings as g

    for type_id in range(g.GGML_TYPE.COUNT):
        block, size = g.ggml_blck_size(type_id), g.ggml_type_size(type_id)
        if block == 0:
            assert type_id not in ggufmeta.GGML_TYPES
        else:
            assert ggufmeta.GGML_TYPES[type_id][1:] == (block, size), type_id


def test_every_case_is_refused_before_loading(cases):
    """model_info (what `show`, the scheduler and every load run first) refuses each case with
    one line that names the file, except the ones only an engine can judge."""
    passed, bad = [], {}
    for name, path in cases.items():
        try:
            runner.model_info(store.lookup(str(path), config.load({})))
            passed.append(name)
        except runner.InvalidModel as err:
            message = str(err)
            if "\n" in message or path.name not in message:
                bad[name] = message
    assert set(passed) == ENGINE_REFUSES and not bad, (passed, bad)


def test_vocab_only_file_has_its_own_message(cases):
    vocab = STORIES.parents[1] / "vocab" / "ggml-vocab-llama-spm.gguf"
    for path in (cases["vocab_only"], vocab):
        with pytest.raises(runner.InvalidModel, match="no weights .*vocabulary-only") as err:
            runner.model_info(store.lookup(str(path), config.load({})))
        assert "truncated" not in str(err.value)


def test_ggml_reader_errors_stay_off_stderr(cases):
    """GGML's own reader explains a refusal on stderr; the new engine turns it into its error."""
    code = ("import sys\nfrom runner.model.gguf_weights import GGUFFile, GGUFError\n"
            "try:\n    GGUFFile.open(sys.argv[1])\nexcept GGUFError as err:\n    print(err)\n")
    out = subprocess.run([sys.executable, "-c", code, str(cases["offset_misaligned"])],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stderr == "", out.stderr
    assert "has offset 1, expected 0" in out.stdout


def _cli_runs() -> list:
    """(name, engine) pairs: a case refused before loading is refused the same way whichever
    engine is picked, so the default run tries it on one engine; both run every case with -m slow."""
    return [pytest.param(name, engine, marks=() if name in ENGINE_REFUSES or engine == "old" else pytest.mark.slow,
                         id=f"{name}-{engine}")
            for name in CLI_CASES for engine in ("old", "new")]


@pytest.mark.parametrize("name, engine", _cli_runs())
def test_cli_run_is_one_line(cases, _isolated_home, name, engine):
    out = subprocess.run([sys.executable, "-m", "cli.main", "run", str(cases[name]), "hi"],
                         capture_output=True, text=True, timeout=120,
                         env=cli_env(_isolated_home, OLLAMA_NEW_ENGINE="1" if engine == "new" else "0"))
    assert out.returncode == 1, (out.returncode, out.stderr)
    line = _one_line(out.stderr)
    assert "Traceback" not in line and cases[name].name in line


@pytest.mark.parametrize("name", ["cut_tensor_infos", "offset_past_end", "block_count_0", "vocab_only"])
def test_cli_show_is_one_line(cases, _isolated_home, name):
    out = subprocess.run([sys.executable, "-m", "cli.main", "show", str(cases[name])],
                         capture_output=True, text=True, timeout=120, env=cli_env(_isolated_home))
    assert out.returncode == 1, out.stderr
    assert cases[name].name in _one_line(out.stderr)


@pytest.fixture(scope="module", params=["old", "new"])
def server(request):
    proc = ServerProcess({"OLLAMA_NEW_ENGINE": "1" if request.param == "new" else "0",
                          "OLLAMA_CONTEXT_LENGTH": "256"}).start()
    yield proc
    code = proc.stop()
    assert code == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def test_server_answers_400_to_every_case_and_keeps_serving(server, cases):
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for name, path in cases.items():
            for route, body in (("/api/generate", {"model": str(path), "prompt": "hi", "stream": False}),
                                ("/api/show", {"model": str(path)})):
                if route == "/api/show" and name in ENGINE_REFUSES:
                    continue  # the header is fine: show shows it
                r = http.post(route, json=body)
                assert r.status_code == 400, (name, route, r.status_code, r.text)
                error = r.json()["error"]
                assert isinstance(error, str) and "\n" not in error and path.name in error, (name, error)
        r = http.post("/api/generate", json={"model": str(STORIES), "prompt": "Once", "stream": False,
                                              "options": {"num_predict": 3, "temperature": 0}})
        assert r.status_code == 200 and r.json()["done"], r.text


def test_server_refuses_text_an_spm_vocabulary_cannot_spell(server):
    """TinyStories-656K's vocabulary lacks 179 of the 256 byte tokens: llama.cpp aborted the whole
    server (std::out_of_range in byte_to_token) on a prompt with "é"; both engines answer 400."""
    with httpx.Client(base_url=server.url, timeout=60) as http:
        for prompt in ("héllo", "smile 🙂"):
            r = http.post("/api/generate", json={"model": str(TINYSTORIES), "prompt": prompt, "stream": False,
                                                  "options": {"num_predict": 2}})
            assert r.status_code == 400 and "the vocabulary has no token for byte" in r.json()["error"], r.text
        r = http.post("/api/generate", json={"model": str(TINYSTORIES), "prompt": "Once upon a time", "stream": False,
                                              "options": {"num_predict": 2}})
        assert r.status_code == 200, r.text
