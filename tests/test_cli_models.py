"""The model commands as a user types them (issue 9): pull (with progress bars on a terminal),
run pulling a missing model, create from a Modelfile, show's flags, cp, rm, push, /save; against
a registry of our own on 127.0.0.1 (tests/registry.py) and real models."""

from __future__ import annotations

import re
import sys

import pexpect
import pytest

from tests.conftest import STORIES, TINYSTORIES
from tests.registry import LocalRegistry
from tests.test_cli import ANSI, cli_env, run_cli, spawn_repl


@pytest.fixture(scope="module")
def registry():
    reg = LocalRegistry().start()
    reg.add_model("library", "stories", "latest", STORIES, extra={"license": b"Stories license"})
    reg.add_model("library", "tiny", "latest", TINYSTORIES)
    yield reg
    reg.stop()


def models_dir(home):
    return home / ".ollama" / "models"


def blob_names(home) -> set[str]:
    blobs = models_dir(home) / "blobs"
    return {p.name for p in blobs.iterdir()} if blobs.is_dir() else set()


def test_pull_list_cp_rm(_isolated_home, registry):
    name = registry.name("library", "stories", "latest")
    out = run_cli(["pull", "--insecure", name], _isolated_home)
    assert out.returncode == 0, out.stderr
    lines = out.stderr.splitlines()
    assert lines[0] == "pulling manifest" and lines[-1] == "success"
    assert re.search(r"^pulling [0-9a-f]{12}: 100% 1\.2 MB$", out.stderr, re.M), out.stderr
    assert "verifying sha256 digest" in lines and "writing manifest" in lines
    assert name in run_cli(["list"], _isolated_home).stdout

    out = run_cli(["cp", name, "mine"], _isolated_home)
    assert out.returncode == 0 and f"copied '{name}' to 'mine'" in out.stdout
    before = blob_names(_isolated_home)
    out = run_cli(["rm", name], _isolated_home)
    assert out.returncode == 0 and f"deleted '{name}'" in out.stdout
    assert blob_names(_isolated_home) == before  # "mine" still uses every blob
    out = run_cli(["rm", "mine"], _isolated_home)
    assert out.returncode == 0
    assert blob_names(_isolated_home) == set()  # the last user gone: every blob pruned
    out = run_cli(["rm", "mine"], _isolated_home)
    assert out.returncode == 1 and out.stderr.strip() == 'Error: model "mine" not found'


def test_pull_draws_a_bar_per_layer_on_a_terminal(_isolated_home, registry):
    child = pexpect.spawn(sys.executable, ["-m", "cli.main", "pull", "--insecure",
                                           registry.name("library", "tiny", "latest")],
                          env=cli_env(_isolated_home), encoding="utf-8", timeout=60, dimensions=(40, 120))
    child.expect(pexpect.EOF)
    child.close()
    text = ANSI.sub("", child.before)
    assert child.exitstatus == 0, text
    assert re.search(r"pulling [0-9a-f]{12}: +100% ━+", text), text
    assert "success" in text


def test_pull_errors_are_one_line(_isolated_home, registry):
    out = run_cli(["pull", "--insecure", registry.name("library", "stories", "nope")], _isolated_home)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1] == "Error: pull model manifest: file does not exist"
    out = run_cli(["pull", registry.name("library", "stories", "latest")], _isolated_home)  # https
    assert out.returncode == 1 and out.stderr.splitlines()[-1].startswith("Error: pull model manifest:")
    out = run_cli(["push", "stories"], _isolated_home)
    assert out.returncode == 1 and out.stderr.count("\n") == 1 and "not supported" in out.stderr


def test_run_pulls_a_missing_model_first(_isolated_home, registry):
    """The first word is the model even with a registry host:port in it, never the prompt."""
    name = registry.name("library", "stories", "latest")
    out = run_cli(["run", "--insecure", name, "Once upon a time", "-o", "num_predict=8", "-o", "temperature=0"],
                  _isolated_home)
    assert out.returncode == 0, out.stderr
    assert "pulling manifest" in out.stderr and "success" in out.stderr
    assert out.stdout.strip()
    assert name in run_cli(["list"], _isolated_home).stdout
    again = run_cli(["run", name, "Once upon a time", "-o", "num_predict=8", "-o", "temperature=0"], _isolated_home)
    assert again.returncode == 0 and "pulling" not in again.stderr  # in the store now
    assert again.stdout == out.stdout
    out = run_cli(["run", "--insecure", registry.name("library", "nope", "latest"), "hi"], _isolated_home)
    assert out.returncode == 1
    assert out.stderr.splitlines()[-1] == "Error: pull model manifest: file does not exist"


MODELFILE = '''# a comment
FROM ./weights/stories.gguf
PARAMETER temperature 0
PARAMETER stop "<end>"
PARAMETER stop User:
parameter num_predict 6
SYSTEM """You tell
tiny stories."""
TEMPLATE """{{ .System }} {{ .Prompt }}"""
MESSAGE user Tell me about Lily.
MESSAGE assistant """Lily had a red ball."""
LICENSE "Be kind"
'''


def test_create_from_a_modelfile_then_show_its_parts(_isolated_home, tmp_path):
    (tmp_path / "weights").mkdir()
    (tmp_path / "weights" / "stories.gguf").write_bytes(STORIES.read_bytes())
    (tmp_path / "Modelfile").write_text(MODELFILE)
    out = run_cli(["create", "storyteller", "-f", str(tmp_path / "Modelfile")], _isolated_home)
    assert out.returncode == 0, out.stderr
    assert "parsing GGUF" in out.stderr and out.stderr.splitlines()[-1] == "success"
    show = lambda flag: run_cli(["show", "storyteller", flag], _isolated_home).stdout  # noqa: E731
    assert show("--system") == "You tell\ntiny stories.\n"
    assert show("--template") == "{{ .System }} {{ .Prompt }}\n"
    assert show("--license") == "Be kind\n"
    params = show("--parameters")
    assert re.search(r'^stop +"<end>"$', params, re.M) and re.search(r'^stop +"User:"$', params, re.M)
    assert re.search(r"^temperature +0", params, re.M)
    modelfile = show("--modelfile")
    assert 'MESSAGE user """Tell me about Lily."""' in modelfile
    assert 'MESSAGE assistant """Lily had a red ball."""' in modelfile
    assert "FROM " in modelfile and "PARAMETER num_predict 6" in modelfile
    # the GGUF was copied into the store: removing the source changes nothing
    (tmp_path / "weights" / "stories.gguf").unlink()
    out = run_cli(["run", "storyteller", "--verbose", "Once"], _isolated_home)
    assert out.returncode == 0, out.stderr
    primed = int(re.search(r"prompt eval count:\s+(\d+)", out.stderr).group(1))
    # the model's MESSAGEs start the conversation: the prompt holds them
    out = run_cli(["run", str(STORIES), "--verbose", "-o", "num_predict=6", "Once"], _isolated_home)
    plain = int(re.search(r"prompt eval count:\s+(\d+)", out.stderr).group(1))
    assert primed > plain + 10


def test_create_from_a_store_model_and_show_falls_back_to_the_gguf(_isolated_home, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {STORIES}\n")
    assert run_cli(["create", "base", "-f", str(tmp_path / "Modelfile")], _isolated_home).returncode == 0
    (tmp_path / "Modelfile").write_text("FROM base\nSYSTEM Be brief.\n")
    out = run_cli(["create", "derived", "-f", str(tmp_path / "Modelfile")], _isolated_home)
    assert out.returncode == 0, out.stderr
    assert "using existing layer sha256:" in out.stderr
    assert run_cli(["show", "derived", "--system"], _isolated_home).stdout == "Be brief.\n"
    assert run_cli(["show", "base", "--system"], _isolated_home).stdout.startswith("No system message")


@pytest.mark.parametrize("text, message", [
    ("SYSTEM hi\n", "Modelfile has no FROM line"),
    ("FROM x\nFROBNICATE y\n", 'Modelfile line 2: unknown instruction "FROBNICATE"'),
    ("FROM x\nPARAMETER temperature hot\n", "Modelfile line 2: invalid value for option 'temperature'"),
    ("FROM x\n\nPARAMETER nonsense 1\n", "Modelfile line 3: invalid option provided: 'nonsense'"),
    ("FROM x\nMESSAGE robot hi\n", 'Modelfile line 2: message role must be one of'),
    ('FROM x\nSYSTEM """never\nclosed\n', 'Modelfile line 2: unterminated """'),
    ("FROM x\nADAPTER ./lora.gguf\n", "Modelfile line 2: ADAPTER is not supported"),
    ("FROM ./missing.gguf\n", "Modelfile line 1: FROM ./missing.gguf: no such file"),
    ("FROM nosuchbase\n", 'base model "nosuchbase" not found'),
    ("FROM /etc/passwd\n", "passwd is not a GGUF file"),  # only a GGUF is ever imported
])
def test_modelfile_errors_name_the_line(_isolated_home, tmp_path, text, message):
    (tmp_path / "Modelfile").write_text(text)
    out = run_cli(["create", "x", "-f", str(tmp_path / "Modelfile")], _isolated_home)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert out.stderr.splitlines()[-1].startswith(f"Error: {message}"), out.stderr
    assert not any(p.is_file() for p in models_dir(_isolated_home).rglob("*"))  # nothing written


def test_create_refuses_quantize_and_a_missing_modelfile(_isolated_home, tmp_path):
    (tmp_path / "Modelfile").write_text(f"FROM {STORIES}\n")
    out = run_cli(["create", "q", "-f", str(tmp_path / "Modelfile"), "-q", "q4_K_M"], _isolated_home)
    assert out.returncode == 1 and "quantize" in out.stderr and out.stderr.count("\n") == 1
    out = run_cli(["create", "q", "-f", str(tmp_path / "nothere")], _isolated_home)
    assert out.returncode == 1 and "cannot read" in out.stderr and out.stderr.count("\n") == 1


def test_save_in_the_repl_makes_a_model(_isolated_home):
    child = spawn_repl(_isolated_home, str(STORIES), "-o", "temperature=0", "-o", "num_predict=6")
    child.sendline("/set system You tell tiny stories.")
    child.expect_exact("Set system message.")
    child.sendline("Once upon a time")
    child.expect_exact(">>> ")
    child.sendline("/save saved")
    child.expect_exact("Created new model 'saved'")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    assert run_cli(["show", "saved", "--system"], _isolated_home).stdout == "You tell tiny stories.\n"
    modelfile = run_cli(["show", "saved", "--modelfile"], _isolated_home).stdout
    assert 'MESSAGE user """Once upon a time"""' in modelfile and "MESSAGE assistant" in modelfile
    assert "PARAMETER num_predict 6" in modelfile and "PARAMETER temperature 0" in modelfile
    # the saved conversation is shown when the model starts, and continues from there
    child = pexpect.spawn(sys.executable, ["-m", "cli.main", "run", "saved"], env=cli_env(_isolated_home),
                          encoding="utf-8", timeout=120, dimensions=(40, 100))
    child.expect_exact(">>> Once upon a time")
    child.expect_exact(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)


@pytest.mark.parametrize("word", ["registry.ollama.ai/../../x", "a/../b:c", "library//x"])
def test_run_with_a_bad_name_says_so_instead_of_chatting_about_it(_isolated_home, word):
    """A single word with a slash was meant as a model name: a bad one is one error line, not the
    default model answering a prompt that starts with it (and nothing is pulled)."""
    out = run_cli(["run", word, "hi"], _isolated_home)
    assert out.returncode == 1 and out.stdout == ""
    assert out.stderr.splitlines() == [f'Error: model "{word}" not found']
