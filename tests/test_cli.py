"""`pollama run` as a user runs it: a REPL in a pseudo-terminal, one-shot via argv and stdin,
and one-line errors."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pexpect
import pytest

from tests.conftest import SMOLLM2, STORIES

ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


def cli_env(home, **extra) -> dict:
    env = dict(os.environ)
    env.update(HOME=str(home), PROMPT_TOOLKIT_NO_CPR="1", TERM="xterm", COLUMNS="100", LINES="40")
    for name in ("OLLAMA_NEW_ENGINE", "OLLAMA_NUM_PARALLEL", "OLLAMA_CONTEXT_LENGTH", "OLLAMA_HOST"):
        env.pop(name, None)
    env.update(extra)
    return env


def run_cli(args, home, stdin=None, **extra):
    return subprocess.run([sys.executable, "-m", "cli.main", *args], input=stdin, capture_output=True,
                          text=True, timeout=180, env=cli_env(home, **extra))


def spawn_repl(home, *args, **extra):
    child = pexpect.spawn(sys.executable, ["-m", "cli.main", "run", *args], env=cli_env(home, **extra),
                          encoding="utf-8", timeout=120, dimensions=(40, 100))
    child.expect_exact(">>> ")
    return child


def metrics(child) -> dict:
    child.expect(r"prompt eval count:\s+(\d+) token")
    prompt = int(child.match.group(1))  # the whole prompt, as Ollama reports it
    child.expect(r"prompt cache:\s+(\d+) token")
    cached = int(child.match.group(1))
    evaluated = prompt - cached
    child.expect(r"eval count:\s+(\d+) token")
    produced = int(child.match.group(1))
    child.expect(r"engine:\s+(\w+)")
    return {"evaluated": evaluated, "cached": cached, "eval": produced, "engine": child.match.group(1)}


@pytest.mark.parametrize("new_engine", ["", "1"], ids=["old", "new"])
def test_repl_conversation_keeps_the_cache_warm(_isolated_home, new_engine):
    child = spawn_repl(_isolated_home, "--verbose", "-o", "temperature=0", "-o", "num_predict=24",
                       OLLAMA_NEW_ENGINE=new_engine)
    child.sendline("What is the capital of France?")
    turn1 = metrics(child)
    assert turn1["engine"] == ("new" if new_engine else "old")
    assert turn1["cached"] == 0 and turn1["evaluated"] > 20
    child.expect_exact(">>> ")
    child.sendline("And of Spain?")
    turn2 = metrics(child)
    # only the new message (and the end of turn 1's answer) is evaluated
    assert turn2["evaluated"] <= 16, turn2
    assert turn2["cached"] >= turn1["evaluated"] + turn1["eval"] - 2, (turn1, turn2)
    child.expect_exact(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0


def test_repl_commands_and_keys(_isolated_home):
    child = spawn_repl(_isolated_home, "-o", "temperature=0")
    child.sendline("/set parameter num_predict 8")
    child.expect_exact("Set parameter 'num_predict' to '8'")
    child.sendline("/set parameter nonsense 1")
    child.expect("Couldn't set parameter")
    child.sendline("/show info")
    child.expect("architecture\\s+llama")
    child.sendline("/show parameters")
    child.expect("num_predict\\s+8")
    child.sendline("/set system You are a pirate.")
    child.expect_exact("Set system message.")
    child.sendline("/show system")
    child.expect_exact("You are a pirate.")
    child.sendline("/frobnicate")
    child.expect_exact("Unknown command '/frobnicate'. Type /? for help")
    child.sendline("/?")
    child.expect_exact("/bye")
    # Ctrl-C on an empty line explains how to leave
    child.expect_exact(">>> ")
    child.sendcontrol("c")
    child.expect_exact("Use Ctrl + d or /bye to exit.")
    # a multi-line message
    child.sendline('"""Say')
    child.expect_exact("... ")
    child.sendline('hello"""')
    child.expect_exact(">>> ")
    child.sendline("/clear")
    child.expect_exact("Cleared session context")
    child.sendline("/load /nonexistent/model.gguf")
    child.expect("no such file")
    child.sendline("/show info")
    child.expect("architecture\\s+llama")  # the old model is still loaded
    child.expect_exact(">>> ")  # keys typed between prompts go to the tty driver, not the REPL
    child.sendcontrol("d")
    child.expect(pexpect.EOF)


def test_ctrl_c_cancels_an_answer_and_the_turn_is_not_kept(_isolated_home):
    child = spawn_repl(_isolated_home, "--verbose", "-o", "temperature=0", "-o", "num_predict=2000")
    child.sendline("Write a very long story about a dragon and a knight.")
    child.expect(r"knight\.[^\n]*\n")  # the echoed input line ends
    child.expect(r"\w+ \w+ \w+ \w+ \w+")  # the answer is streaming
    child.sendcontrol("c")
    child.expect_exact(">>> ")
    child.sendline("/set parameter num_predict 4")
    child.expect_exact(">>> ")
    child.sendline("Hi")
    m = metrics(child)
    # the cancelled turn is not in the history: the new prompt shares only the system prefix
    assert m["eval"] == 4
    child.sendline("/bye")
    child.expect(pexpect.EOF)


def test_one_shot_argv(_isolated_home):
    out = run_cli(["run", "smollm2:135m", "Say", "hello", "-o", "temperature=0", "-o", "num_predict=12"], _isolated_home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() and "\x1b" not in out.stdout
    # the same answer with the default model and a quoted prompt
    again = run_cli(["run", "Say hello", "-o", "temperature=0", "-o", "num_predict=12"], _isolated_home)
    assert again.stdout == out.stdout


def test_one_shot_stdin_is_prepended(_isolated_home):
    out = run_cli(["run", str(STORIES), "-o", "temperature=0", "-o", "num_predict=20", "--verbose"],
                  _isolated_home, stdin="Once upon a time")
    assert out.returncode == 0, out.stderr
    assert len(out.stdout.split()) > 3
    assert "eval count:           20 token(s)" in out.stderr
    assert "engine:               old" in out.stderr


@pytest.mark.parametrize(
    "args,message",
    [
        (["show", "nosuchmodel"], 'model "nosuchmodel" not found'),  # run pulls it: test_cli_models
        (["run", "/nonexistent/x.gguf", "hi"], "no such file"),
        (["run", "-o", "bogus=1", "hi"], "invalid option provided: 'bogus'"),
        (["run", "-o", "temperature=hot", "hi"], "invalid value for option 'temperature'"),
        (["run", "--format", "xml", "hi"], 'invalid format "xml"'),
    ],
)
def test_errors_are_one_line(_isolated_home, args, message):
    out = run_cli(args, _isolated_home)
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and message in lines[0], out.stderr


def test_bad_model_files_are_one_line(_isolated_home, tmp_path):
    (tmp_path / "not.gguf").write_text("hello")
    (tmp_path / "cut.gguf").write_bytes(STORIES.read_bytes()[:50_000])
    for name, message in (("not.gguf", "not a GGUF file"), ("cut.gguf", "truncated")):
        out = run_cli(["run", str(tmp_path / name), "hi"], _isolated_home)
        assert out.returncode == 1 and "Traceback" not in out.stderr
        assert message in out.stderr and len(out.stderr.strip().splitlines()) == 1


def test_new_engine_flag_on_unsupported_model_falls_back_with_a_notice(_isolated_home, tmp_path):
    import gguf
    import numpy as np

    # a gpt2-architecture GGUF llama.cpp can load but the new engine does not implement
    path = tmp_path / "gpt2.gguf"
    w = gguf.GGUFWriter(str(path), "gpt2")
    n_embd, n_vocab = 8, 5
    w.add_context_length(16); w.add_embedding_length(n_embd); w.add_block_count(1)
    w.add_head_count(2); w.add_feed_forward_length(16); w.add_layer_norm_eps(1e-5)
    w.add_tokenizer_model("gpt2"); w.add_tokenizer_pre("gpt-2")
    w.add_token_list(["a", "b", "c", "ab", "<|endoftext|>"]); w.add_token_types([1, 1, 1, 1, 3]); w.add_token_merges(["a b"])
    w.add_bos_token_id(4); w.add_eos_token_id(4)
    rng = np.random.default_rng(0)
    t = lambda *shape: rng.standard_normal(shape).astype(np.float32) * 0.1
    w.add_tensor("token_embd.weight", t(n_vocab, n_embd)); w.add_tensor("position_embd.weight", t(16, n_embd))
    w.add_tensor("output_norm.weight", np.ones(n_embd, np.float32)); w.add_tensor("output_norm.bias", t(n_embd))
    w.add_tensor("output.weight", t(n_vocab, n_embd))
    for name, shape in (("attn_norm.weight", (n_embd,)), ("attn_norm.bias", (n_embd,)), ("attn_qkv.weight", (3 * n_embd, n_embd)),
                        ("attn_qkv.bias", (3 * n_embd,)), ("attn_output.weight", (n_embd, n_embd)), ("attn_output.bias", (n_embd,)),
                        ("ffn_norm.weight", (n_embd,)), ("ffn_norm.bias", (n_embd,)), ("ffn_up.weight", (16, n_embd)),
                        ("ffn_up.bias", (16,)), ("ffn_down.weight", (n_embd, 16)), ("ffn_down.bias", (n_embd,))):
        w.add_tensor(f"blk.0.{name}", t(*shape))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    out = run_cli(["run", str(path), "abc", "-o", "num_predict=3", "--verbose"], _isolated_home, OLLAMA_NEW_ENGINE="1")
    assert out.returncode == 0, out.stderr
    notices = [ln for ln in out.stderr.splitlines() if "new engine" in ln]
    assert len(notices) == 1 and "gpt2" in notices[0]
    assert "engine:               old" in out.stderr


def test_store_model_parameters_and_system_apply(_isolated_home, tmp_path):
    """A model pulled with Ollama carries PARAMETER and SYSTEM layers: `run` honours them, and
    -o still wins over the model's parameters."""
    import hashlib
    import json

    from tests.test_store import install_in_store

    models = tmp_path / "models"
    install_in_store(models, "smol", "latest", SMOLLM2)
    manifest_file = models / "manifests" / "registry.ollama.ai" / "library" / "smol" / "latest"
    manifest = json.loads(manifest_file.read_text())
    for media, data in (("params", json.dumps({"num_predict": 3, "temperature": 0}).encode()),
                        ("system", b"You are a pirate.")):
        digest = hashlib.sha256(data).hexdigest()
        (models / "blobs" / f"sha256-{digest}").write_bytes(data)
        manifest["layers"].append({"mediaType": f"application/vnd.ollama.image.{media}",
                                   "digest": f"sha256:{digest}", "size": len(data)})
    manifest_file.write_text(json.dumps(manifest))
    out = run_cli(["run", "smol", "Hello", "--verbose"], _isolated_home, OLLAMA_MODELS=str(models))
    assert out.returncode == 0, out.stderr
    assert "eval count:           3 token(s)" in out.stderr
    out = run_cli(["run", "smol", "Hello", "--verbose", "-o", "num_predict=5"], _isolated_home, OLLAMA_MODELS=str(models))
    assert "eval count:           5 token(s)" in out.stderr
    child = spawn_repl(_isolated_home, "smol", OLLAMA_MODELS=str(models))
    child.sendline("/show system")
    child.expect_exact("You are a pirate.")
    child.expect_exact(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)


def test_version_is_pollamas_own(_isolated_home):
    result = run_cli(["--version"], _isolated_home)
    assert result.returncode == 0 and result.stdout.strip() == "pollama version 0.1.0"
