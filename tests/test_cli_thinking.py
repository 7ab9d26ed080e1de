"""`pollama run --think / --hidethinking`, `/set think` and `/set nothink` (SmolLM2 given
DeepSeek-R1's template, whose prompt opens the reasoning: what the model writes is thinking)."""

from __future__ import annotations

from pathlib import Path

import pexpect

from tests.conftest import SMOLLM2
from tests.test_cli import ANSI, run_cli, spawn_repl
from tests.test_template_selection import install

R1 = (Path(__file__).parent / "data" / "templates" / "deepseek-r1-distill-qwen.jinja").read_text()
FEW = ["-o", "temperature=0", "-o", "num_predict=10"]


def test_think_shows_the_reasoning_and_hidethinking_hides_it(_isolated_home):
    install(_isolated_home / ".ollama" / "models", "smolr1", SMOLLM2, R1)
    out = run_cli(["run", "smolr1", "--think", "What is 2+2?", *FEW], _isolated_home)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("Thinking...\n") and "...done thinking." in out.stdout
    thought = out.stdout.split("Thinking...\n", 1)[1].split("\n...done thinking.")[0]
    assert thought.strip()
    hidden = run_cli(["run", "smolr1", "--think=low", "--hidethinking", "What is 2+2?", *FEW], _isolated_home)
    assert hidden.returncode == 0, hidden.stderr
    assert "Thinking" not in hidden.stdout and thought.strip() not in hidden.stdout


def test_think_on_a_model_without_reasoning_is_one_line(_isolated_home):
    for args, message in ((["run", "smollm2:135m", "--think", "hi"], '"smollm2:135m" does not support thinking'),
                          (["run", "smollm2:135m", "--think=loud", "hi"], "invalid value for --think: 'loud'")):
        out = run_cli(args, _isolated_home)
        assert out.returncode == 1 and "Traceback" not in out.stderr
        lines = [ln for ln in out.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and message in lines[0], out.stderr


def test_set_think_and_nothink(_isolated_home):
    child = spawn_repl(_isolated_home)
    child.sendline("/set think")
    child.expect_exact('Couldn\'t set think: "smollm2:135m" does not support thinking')
    child.sendline("/set nothink")
    child.expect_exact("Set 'nothink' mode.")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    install(_isolated_home / ".ollama" / "models", "smolr1", SMOLLM2, R1)
    child = spawn_repl(_isolated_home, "smolr1", *FEW)
    child.sendline("/set think high")
    child.expect_exact("Set 'think' mode (level high).")
    child.sendline("What is 2+2?")
    child.expect_exact("Thinking...")  # dimmed on the terminal
    child.expect_exact("...done thinking.")
    child.expect_exact(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)
    assert "Traceback" not in ANSI.sub("", child.before or "")
