"""What a load asks of the machine is decided before anything is allocated (runner/loading/plan.py):
an oversized num_ctx or OLLAMA_NUM_PARALLEL fails in a moment with one line on both engines, a
real server refuses it and keeps serving without keeping the memory, and a quantized KV cache
that does not fit the model's heads is refused the same way by both engines."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import gguf
import httpx
import numpy as np
import pytest

import runner
from runner import config
from runner.prepare import checked as checked_options
from runner.api import InvalidRequest, Options
from tests.conftest import STORIES, TINYSTORIES
from tests.serverproc import ServerProcess
from tests.test_cli import cli_env

SAFETY_AS = 8 << 30  # address space for the processes under test: a regression fails, it cannot eat the machine


def write_kv_hungry_model(path: Path) -> Path:
    """A tiny llama (8 MB) whose KV cache is huge: 4 layers of 16 K/V heads of 512 features take
    128 KiB per token, so 2^20 tokens need 128 GiB. Trained context 2^24, so num_ctx is only
    bounded by pollama's own clamp. The vocabulary spells every byte."""
    n_layer, n_embd, n_head, head_dim, n_ff = 4, 32, 16, 512, 64
    w = gguf.GGUFWriter(str(path), "llama")
    w.add_context_length(1 << 24)
    w.add_embedding_length(n_embd)
    w.add_block_count(n_layer)
    w.add_feed_forward_length(n_ff)
    w.add_head_count(n_head)
    w.add_head_count_kv(n_head)
    w.add_key_length(head_dim)
    w.add_value_length(head_dim)
    w.add_rope_dimension_count(head_dim)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_tokenizer_model("llama")
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["\u2581"]
    w.add_token_list(tokens)
    w.add_token_scores([0.0] * len(tokens))
    w.add_token_types([2, 3, 3] + [6] * 256 + [1])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    rng = np.random.default_rng(0)

    def t(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.02).astype(np.float16)

    w.add_tensor("token_embd.weight", t(len(tokens), n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32))
    width = n_head * head_dim
    for i in range(n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", np.ones(n_embd, np.float32))
        w.add_tensor(f"blk.{i}.ffn_norm.weight", np.ones(n_embd, np.float32))
        for name, shape in (("attn_q", (width, n_embd)), ("attn_k", (width, n_embd)), ("attn_v", (width, n_embd)),
                            ("attn_output", (n_embd, width)), ("ffn_gate", (n_ff, n_embd)),
                            ("ffn_up", (n_ff, n_embd)), ("ffn_down", (n_embd, n_ff))):
            w.add_tensor(f"blk.{i}.{name}.weight", t(*shape))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


@pytest.fixture(scope="module")
def hungry(tmp_path_factory) -> Path:
    return write_kv_hungry_model(tmp_path_factory.mktemp("hungry") / "hungry.gguf")


# Runs ``argv`` under an address-space limit and prints its peak RSS as the last line of stderr.
# A process's peak RSS counts the pages of the process it was forked from (fork copies the page
# tables; exec keeps the high-water mark), so measuring `pollama` as pytest's own child would count
# pytest's memory; this small launcher is the parent whose pages it inherits instead.
_MEASURE = """
import os, resource, sys
resource.setrlimit(resource.RLIMIT_AS, (int(sys.argv[1]), resource.getrlimit(resource.RLIMIT_AS)[1]))
pid = os.posix_spawn(sys.argv[2], sys.argv[2:], os.environ)
_, status, usage = os.wait4(pid, 0)
print(f"peak-rss {usage.ru_maxrss * 1024}", file=sys.stderr)
sys.exit(os.waitstatus_to_exitcode(status))
"""


def run_measured(args: list[str], home, **env) -> tuple[int, str, float, int]:
    """(exit status, stderr, seconds, peak RSS in bytes) of ``pollama ARGS``."""
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", _MEASURE, str(SAFETY_AS), sys.executable, "-m", "cli.main", *args],
                          capture_output=True, env=cli_env(home, **env))
    stderr, _, last = proc.stderr.decode(errors="replace").rstrip("\n").rpartition("\n")
    assert last.startswith("peak-rss "), proc.stderr
    return proc.returncode, stderr, time.monotonic() - t0, int(last.split()[1])


def _one_line(stderr: str) -> str:
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, stderr
    return lines[0]


# ----------------------------------------------------------------------------------- the rule
def test_option_ranges_are_one_rule():
    opts = checked_options(Options(num_ctx=2**31 - 1, num_batch=2**40, num_thread=10**6, top_k=2**40))
    assert opts.num_ctx == 1 << 20 and opts.num_batch == 1 << 20 and opts.top_k == 2**31 - 1
    plan = runner.load_options(runner.resolve(None).info, opts, config.load({}))  # num_thread: the load's rule
    assert plan.num_thread == 4 * (os.cpu_count() or 1)
    with pytest.raises(InvalidRequest, match="temperature"):
        checked_options(Options(temperature=float("inf")))


# ------------------------------------------------------------------------------------ the CLI
@pytest.mark.parametrize("engine", ["old", "new"])
@pytest.mark.parametrize("options,env", [
    (["-o", "num_ctx=2147483647"], {}),
    (["-o", f"num_ctx={1 << 20}"], {"OLLAMA_NUM_PARALLEL": "8"}),
], ids=["num_ctx_2^31", "parallel_8"])
def test_cli_refuses_a_cache_the_machine_cannot_hold_at_once(hungry, _isolated_home, engine, options, env):
    code, stderr, seconds, rss = run_measured(["run", str(hungry), "hi", *options], _isolated_home,
                                              OLLAMA_NEW_ENGINE="1" if engine == "new" else "0", **env)
    assert code == 1, stderr
    line = _one_line(stderr)
    assert "GiB of memory available" in line and "num_ctx 1048576" in line, line
    assert seconds < 15, seconds  # a Python start and a header read, no allocation
    assert rss < 500 << 20, rss / 2**20


@pytest.mark.parametrize("engine", ["old", "new"])
def test_cli_runs_a_sensible_context_of_the_same_model(hungry, _isolated_home, engine):
    code, stderr, _, _ = run_measured(["run", str(hungry), "hi", "-o", "num_ctx=256", "-o", "num_predict=2"],
                                      _isolated_home, OLLAMA_NEW_ENGINE="1" if engine == "new" else "0")
    assert code == 0, stderr


# ------------------------------------------------------------------------------- KV cache type
@pytest.mark.parametrize("engine", ["old", "new"])
def test_quantized_kv_cache_that_does_not_fit_the_heads_is_refused(_isolated_home, engine):
    """TinyStories-656K has heads of 16 features, q8_0 blocks of 32: llama.cpp refuses, GGML would abort."""
    code, stderr, _, _ = run_measured(["run", str(TINYSTORIES), "hi", "-o", "num_predict=2"], _isolated_home,
                                      OLLAMA_NEW_ENGINE="1" if engine == "new" else "0",
                                      OLLAMA_FLASH_ATTENTION="1", OLLAMA_KV_CACHE_TYPE="q8_0")
    assert code == 1, stderr
    line = _one_line(stderr)
    assert "OLLAMA_KV_CACHE_TYPE=q8_0" in line and "16 features" in line, line


@pytest.mark.parametrize("engine", ["old", "new"])
@pytest.mark.parametrize("kv_type", ["q8_0", "q4_0"])
def test_quantized_kv_cache_runs_where_it_fits(hungry, _isolated_home, engine, kv_type):
    code, stderr, _, _ = run_measured(["run", str(hungry), "hi", "-o", "num_ctx=256", "-o", "num_predict=2"],
                                      _isolated_home, OLLAMA_NEW_ENGINE="1" if engine == "new" else "0",
                                      OLLAMA_FLASH_ATTENTION="1", OLLAMA_KV_CACHE_TYPE=kv_type)
    assert code == 0, stderr


# ---------------------------------------------------------------------------------- the server
def _status(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field}")


@pytest.mark.parametrize("engine", ["old", "new"])
def test_server_refuses_an_oversized_context_keeps_serving_and_gives_the_memory_back(hungry, engine):
    server = ServerProcess({"OLLAMA_NEW_ENGINE": "1" if engine == "new" else "0"}).start()
    pid = server.proc.pid
    limit = _status(pid, "VmSize") + (6 << 30)  # a regression fails there instead of eating the machine
    resource.prlimit(pid, resource.RLIMIT_AS, (limit, limit))
    try:
        with httpx.Client(base_url=server.url, timeout=120) as http:
            ok = {"model": str(STORIES), "prompt": "Once", "stream": False,
                  "options": {"num_predict": 2, "num_ctx": 256}}
            assert http.post("/api/generate", json=ok).status_code == 200
            before = _status(pid, "VmRSS")
            for options in ({"num_ctx": 2**31 - 1}, {"num_ctx": 1 << 20, "num_batch": 1 << 20}):
                t0 = time.monotonic()
                r = http.post("/api/generate", json={"model": str(hungry), "prompt": "hi", "stream": False,
                                                     "options": options})
                assert r.status_code >= 400, r.text
                error = r.json()["error"]
                assert "GiB of memory available" in error and "\n" not in error, error
                assert time.monotonic() - t0 < 5
            after = _status(pid, "VmRSS")
            assert after - before < 100 << 20, (before / 2**20, after / 2**20)
            r = http.post("/api/generate", json=ok)
            assert r.status_code == 200 and r.json()["done"], r.text
    finally:
        code = server.stop()
    assert code == 0, server.last_log
    assert "Traceback" not in server.last_log, server.last_log
