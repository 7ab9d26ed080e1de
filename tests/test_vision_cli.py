"""``pollama run`` with images as a user runs it: a path in the prompt is attached (one-shot and
the REPL, where turn 2 reuses the image's cached positions), ``--mmproj`` names the projector of a
.gguf, a Modelfile's second FROM stores it; errors are one line. gemma-3-270m with a random
gemma3 projector: the answers are junk text, only that tokens come out is checked."""

from __future__ import annotations

import io
import re

import pytest
from PIL import Image as PILImage

from tests.mmproj import write_mmproj
from tests.test_cli import metrics, run_cli, spawn_repl
from tests.test_gemma3 import gemma3  # noqa: F401  (the fixture)

pytestmark = pytest.mark.slow


@pytest.fixture
def files(tmp_path, gemma3):  # noqa: F811
    proj = write_mmproj(tmp_path / "proj.gguf")
    buf = io.BytesIO()
    PILImage.new("RGB", (80, 60), (250, 120, 0)).save(buf, "PNG")
    (tmp_path / "my cat.png").write_bytes(buf.getvalue())
    return gemma3, proj, tmp_path


def test_one_shot_attaches_the_image(_isolated_home, files):
    model, proj, folder = files
    out = run_cli(["run", str(model), "--mmproj", str(proj), "--verbose", "-o", "num_predict=8",
                   "-o", "temperature=0", f"describe {folder}/my\\ cat.png"], _isolated_home)
    assert out.returncode == 0, out.stderr
    assert f"Added image '{folder}/my cat.png'" in out.stderr
    # tokens came out (junk text, often blank lines: random projector weights)
    assert re.search(r"\neval count:\s+8 token", out.stderr), out.stderr
    prompt = int(re.search(r"prompt eval count:\s+(\d+) token", out.stderr).group(1))
    assert prompt > 16 and out.stdout


@pytest.mark.parametrize("args, message", [
    (["--mmproj", "{proj}", "describe ./nope.png"], "Error: no such image file: ./nope.png"),
    (["describe {folder}/my\\ cat.png"], "Error: this model is missing data required for image input"),
    (["--mmproj", "{model}", "hi"], "is not a vision projector"),
])
def test_errors_are_one_line(_isolated_home, files, args, message):
    model, proj, folder = files
    args = [a.format(proj=proj, folder=folder, model=model) for a in args]
    out = run_cli(["run", str(model), *args], _isolated_home)
    assert out.returncode == 1 and "Traceback" not in out.stderr
    assert message in out.stderr.strip().splitlines()[-1]


def test_repl_second_turn_reuses_the_image(_isolated_home, files):
    model, proj, folder = files
    child = spawn_repl(_isolated_home, str(model), "--mmproj", str(proj), "--verbose",
                       "-o", "temperature=0", "-o", "num_predict=4")
    child.sendline(f"what is '{folder}/my cat.png'?")
    child.expect_exact("Added image")
    turn1 = metrics(child)
    assert turn1["evaluated"] > 16  # the image's 16 positions and the text
    child.expect_exact(">>> ")
    child.sendline("and now?")
    turn2 = metrics(child)
    assert turn2["cached"] >= turn1["evaluated"] - 1 and turn2["evaluated"] < 16
    child.expect_exact(">>> ")
    child.sendline("/bye")
    child.expect(r"\$|$", timeout=30)


def test_modelfile_second_from_stores_the_projector(_isolated_home, files):
    model, proj, folder = files
    (folder / "Modelfile").write_text(f"FROM {model}\nFROM ./proj.gguf\n")
    out = run_cli(["create", "vis", "-f", str(folder / "Modelfile")], _isolated_home)
    assert out.returncode == 0, out.stderr
    shown = run_cli(["show", "vis"], _isolated_home)
    assert "vision" in shown.stdout
    modelfile = run_cli(["show", "vis", "--modelfile"], _isolated_home).stdout
    assert modelfile.count("\nFROM ") == 2
    out = run_cli(["run", "vis", "-o", "num_predict=4", f"describe {folder}/my\\ cat.png"], _isolated_home)
    assert out.returncode == 0 and "Added image" in out.stderr, out.stderr
    (folder / "Modelfile2").write_text("FROM ./proj.gguf\n")
    out = run_cli(["create", "bad", "-f", str(folder / "Modelfile2")], _isolated_home)
    assert out.returncode == 1 and "is a vision projector: FROM the model too" in out.stderr
