"""One request path: the same input gets the same verdict from `pollama run -o`, the REPL's
`/set parameter`, `/api/chat` and `/v1/chat/completions` (all of them go through
runner.prepare). The table's values are each written as a user would type them (CLI, REPL) and
as a JSON literal (the APIs: 1e999 is how JSON spells a number too big for a float).
"""

from __future__ import annotations

import httpx
import pexpect
import pytest

from tests.serverproc import ServerProcess
from tests.test_cli import ANSI, run_cli, spawn_repl

MODEL = "smollm2:135m"
OPENAI_NAME = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "num_predict": "max_tokens"}

# option, as typed, as a JSON literal, accepted
OPTIONS = [
    ("temperature", "inf", "1e999", False),
    ("temperature", "-inf", "-1e999", False),
    ("temperature", "warm", '"warm"', False),
    ("temperature", "0.5", "0.5", True),
    ("top_p", "1e999", "1e999", False),
    ("top_p", "0.9", "0.9", True),
    ("seed", "1.5", "1.5", False),
    ("seed", "42", "42", True),
    ("num_predict", "2.5", "2.5", False),
    ("num_predict", "2", "2", True),
]

# a think value, and what every way of asking answers for a model that does not reason: a value
# that is not a level is refused as such; "max" is a level (high), refused only for the model
THINK = [("loud", "invalid value"), ("max", "does not support thinking"), ("false", None)]


@pytest.fixture(scope="module")
def server():
    with ServerProcess({"OLLAMA_CONTEXT_LENGTH": "512"}) as proc:
        yield proc


def _ollama_chat(server, extra: str) -> httpx.Response:
    body = (f'{{"model": "{MODEL}", "stream": false, "messages": [{{"role": "user", "content": "hi"}}]'
            f'{extra}}}')
    return httpx.post(server.url + "/api/chat", content=body, headers={"Content-Type": "application/json"},
                      timeout=120)


def _openai_chat(server, extra: str) -> httpx.Response:
    body = f'{{"model": "{MODEL}", "messages": [{{"role": "user", "content": "hi"}}]{extra}}}'
    return httpx.post(server.url + "/v1/chat/completions", content=body,
                      headers={"Content-Type": "application/json"}, timeout=120)


def _short(name: str) -> str:
    return "" if name == "num_predict" else ', "num_predict": 1'


def _verdicts_of_the_apis(server, name: str, literal: str) -> dict[str, bool]:
    ollama = _ollama_chat(server, f', "options": {{"{name}": {literal}{_short(name)}}}')
    openai_extra = f', "{OPENAI_NAME[name]}": {literal}' + ("" if name == "num_predict" else ', "max_tokens": 1')
    openai = _openai_chat(server, openai_extra)
    for r in (ollama, openai):
        assert r.status_code in (200, 400), (name, literal, r.status_code, r.text)
    assert openai.status_code == 200 or openai.json()["error"]["type"] == "invalid_request_error", openai.text
    return {"/api/chat": ollama.status_code == 200, "/v1/chat/completions": openai.status_code == 200}


def test_options_get_one_verdict_everywhere(server, _isolated_home):
    child = spawn_repl(_isolated_home)
    try:
        for name, typed, literal, ok in OPTIONS:
            verdicts = _verdicts_of_the_apis(server, name, literal)
            extra = [] if name == "num_predict" else ["-o", "num_predict=1"]
            out = run_cli(["run", MODEL, "-o", f"{name}={typed}", *extra, "hi"], _isolated_home)
            assert "Traceback" not in out.stderr, out.stderr
            if not ok:
                assert len([ln for ln in out.stderr.splitlines() if ln.strip()]) == 1, out.stderr
            verdicts["pollama run -o"] = out.returncode == 0
            child.sendline(f"/set parameter {name} {typed}")
            got = child.expect_exact([f"Set parameter '{name}'", "Couldn't set parameter"])
            child.expect_exact(">>> ")
            verdicts["/set parameter"] = got == 0
            assert verdicts == dict.fromkeys(verdicts, ok), (name, typed, verdicts)
        child.sendline("/bye")
        child.expect(pexpect.EOF)
        assert "Traceback" not in ANSI.sub("", child.before or "")
    finally:
        child.close(force=True)


def test_think_values_get_one_verdict_everywhere(server, _isolated_home):
    child = spawn_repl(_isolated_home)
    try:
        for value, refusal in THINK:
            answers: dict[str, str | None] = {}
            flag = f"--think={value}"
            out = run_cli(["run", MODEL, flag, "-o", "num_predict=1", "hi"], _isolated_home)
            answers["pollama run --think"] = out.stderr.strip() if out.returncode else None
            child.sendline(f"/set think {value}" if value != "false" else "/set nothink")
            got = child.expect([r"Couldn't set think: ([^\r\n]*)", r"Set '(no)?think' mode"])
            answers["/set think"] = child.match.group(1) if got == 0 else None
            child.expect_exact(">>> ")
            as_json = "false" if value == "false" else f'"{value}"'
            r = _ollama_chat(server, f', "think": {as_json}, "options": {{"num_predict": 1}}')
            answers["/api/chat"] = r.json()["error"] if r.status_code == 400 else None
            effort = "none" if value == "false" else value
            r = _openai_chat(server, f', "reasoning_effort": "{effort}", "max_tokens": 1')
            answers["/v1/chat/completions"] = r.json()["error"]["message"] if r.status_code == 400 else None
            for where, answer in answers.items():
                if refusal is None:
                    assert answer is None, (value, where, answer)
                else:
                    assert answer is not None and refusal in answer, (value, where, answer)
        child.sendline("/bye")
        child.expect(pexpect.EOF)
    finally:
        child.close(force=True)


def test_a_one_shots_verbose_times_count_its_load(_isolated_home):
    """The runner fills counts and eval durations, the caller the load and the total: a
    one-shot's load is its model's load, and its total includes it (as Ollama's does)."""
    out = run_cli(["run", MODEL, "--verbose", "-o", "num_predict=4", "-o", "temperature=0", "hi"], _isolated_home)
    assert out.returncode == 0, out.stderr
    seconds = {}
    for line in (out.stdout + out.stderr).splitlines():
        key, _, value = line.partition(":")
        if key in ("total duration", "load duration", "prompt eval duration", "eval duration"):
            value = value.strip()
            scale = 1e-3 if value.endswith("ms") else 1e-6 if value.endswith("µs") else 1.0
            seconds[key] = float(value.rstrip("mµs")) * scale
    assert seconds["load duration"] > 0, out.stderr
    parts = seconds["load duration"] + seconds["prompt eval duration"] + seconds["eval duration"]
    assert seconds["total duration"] >= parts, seconds
