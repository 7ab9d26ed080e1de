"""Which template a model's prompts use, end to end: a store model whose manifest carries a Go
TEMPLATE layer (as `ollama pull`/`create` lay it out), through `pollama run` and a real
`pollama serve`; a model with the same GGUF and no TEMPLATE next to it; a request's own template;
and gemma-3-270m, whose GGUF has no chat template, with llama.cpp's built-in."""

from __future__ import annotations

import hashlib
import json
import re
import sys
from pathlib import Path

import httpx
import pexpect
import pytest

from runner.template import ollama as ollamatemplate
from runner.api import Message, Options, Request
from runner.template.sandbox import RenderBudget
from runner.template.prompt import request_template
from tests.conftest import SMOLLM2, collect, load
from tests.serverproc import ServerProcess
from tests.test_template_builtins import gemma3_path, llama_cpp_apply  # noqa: F401 (a fixture)
from tests.test_cli import cli_env, run_cli

# ChatML as a Go template, with no default system prompt (SmolLM2's Jinja writes one): the two
# render differently, so a prompt's tokens say which template made it.
GO_TEMPLATE = """{{- if .System }}<|im_start|>system
{{ .System }}<|im_end|>
{{ end }}
{{- range .Messages }}{{ if ne .Role "system" }}<|im_start|>{{ .Role }}
{{ .Content }}<|im_end|>
{{ end }}{{ end }}<|im_start|>assistant
"""


def _blob(models: Path, data: bytes) -> dict:
    digest = hashlib.sha256(data).hexdigest()
    (models / "blobs").mkdir(parents=True, exist_ok=True)
    path = models / "blobs" / f"sha256-{digest}"
    if not path.exists():
        path.write_bytes(data)
    return {"digest": f"sha256:{digest}", "size": len(data)}


def install(models: Path, name: str, gguf: Path, template: str | None = None) -> None:
    """A store model as Ollama lays it out: the GGUF blob and, if given, a template layer."""
    layers = [{"mediaType": "application/vnd.ollama.image.model", **_blob(models, gguf.read_bytes())}]
    if template is not None:
        layers.append({"mediaType": "application/vnd.ollama.image.template", **_blob(models, template.encode())})
    config = _blob(models, b"{}")
    manifest = {"schemaVersion": 2, "mediaType": "application/vnd.docker.distribution.manifest.v2+json",
                "config": {"mediaType": "application/vnd.docker.container.image.v1+json", **config},
                "layers": layers}
    path = models / "manifests" / "registry.ollama.ai" / "library" / name / "latest"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(manifest))


@pytest.fixture(scope="module")
def models(tmp_path_factory) -> Path:
    models = tmp_path_factory.mktemp("models")
    install(models, "gotmpl", SMOLLM2, GO_TEMPLATE)
    install(models, "samegguf", SMOLLM2)  # the same blob, no TEMPLATE: the GGUF's Jinja
    return models


@pytest.fixture(scope="module")
def smol():
    r = load(None)
    yield r
    r.close()


def go_prompt(messages: list[Message]) -> str:
    return ollamatemplate.render(GO_TEMPLATE, messages, RenderBudget())


@pytest.mark.slow
def test_pollama_run_uses_the_store_template(models, smol, tmp_path):
    question = "Name a color."
    expected = smol.tokenize(go_prompt([Message("user", question)]))
    jinja = smol.tokenize(smol.render_chat([Message("user", question)]))
    assert expected != jinja
    out = run_cli(["run", "gotmpl", question, "--verbose", "-o", "temperature=0", "-o", "num_predict=8"],
                  tmp_path, OLLAMA_MODELS=str(models))
    assert out.returncode == 0, out.stderr
    counts = re.search(r"prompt eval count:\s+(\d+) token", out.stdout + out.stderr)
    assert counts and int(counts.group(1)) == len(expected)
    # the same prompt, in process, gives the same greedy answer
    answer, _ = collect(smol.stream(Request(prompt=question, chat_template=request_template(GO_TEMPLATE),
                                              options=Options(temperature=0, num_predict=8))))
    assert answer.strip() and answer.strip() in out.stdout
    # the model next to it, with the same GGUF, keeps the GGUF's template
    out = run_cli(["run", "samegguf", question, "--verbose", "-o", "temperature=0", "-o", "num_predict=1"],
                  tmp_path, OLLAMA_MODELS=str(models))
    counts = re.search(r"prompt eval count:\s+(\d+) token", out.stdout + out.stderr)
    assert out.returncode == 0 and counts and int(counts.group(1)) == len(jinja)
    # pollama show says which
    shown = run_cli(["show", "gotmpl"], tmp_path, OLLAMA_MODELS=str(models))
    assert "Go template (the model's TEMPLATE)" in shown.stdout
    shown = run_cli(["show", "--template", "gotmpl"], tmp_path, OLLAMA_MODELS=str(models))
    assert shown.stdout == GO_TEMPLATE + "\n"


def test_the_repl_shows_and_uses_the_store_template(models, tmp_path):
    child = pexpect.spawn(sys.executable, ["-m", "cli.main", "run", "gotmpl", "--verbose", "-o", "temperature=0",
                                     "-o", "num_predict=4"], env=cli_env(tmp_path, OLLAMA_MODELS=str(models)),
                          encoding="utf-8", timeout=120, dimensions=(40, 100))
    child.expect_exact(">>> ")
    child.sendline("/show template")
    child.expect_exact('{{ if ne .Role "system" }}')
    child.sendline("/show info")
    child.expect(r"template\s+Go template \(the model's TEMPLATE\)")
    child.sendline("Hi")
    child.expect(r"prompt eval count:\s+(\d+) token")
    child.expect_exact(">>> ")
    child.sendline("/bye")
    child.expect(pexpect.EOF)


@pytest.fixture(scope="module")
def server(models):
    proc = ServerProcess({"OLLAMA_NUM_PARALLEL": "1"}, models_dir=str(models)).start()
    yield proc
    code = proc.stop()
    assert code == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def _generate(url: str, model: str, prompt: str, **extra) -> httpx.Response:
    body = {"model": model, "prompt": prompt, "stream": False, "options": {"num_predict": 2, "temperature": 0},
            **extra}
    return httpx.post(url + "/api/generate", json=body, timeout=120)


@pytest.mark.slow
def test_serve_uses_each_models_template_though_they_share_a_runner(server, smol):
    question = "Name a color."
    go = smol.tokenize(go_prompt([Message("user", question)]))
    jinja = smol.tokenize(smol.render_chat([Message("user", question)]))
    for model, expected in (("gotmpl", go), ("samegguf", jinja), ("gotmpl", go)):
        reply = _generate(server.url, model, question)
        assert reply.status_code == 200, reply.text
        body = reply.json()
        assert body["prompt_eval_count"] == len(expected) and body["context"][: len(expected)] == expected, model
    # one runner served both (they share the GGUF)
    ps = httpx.get(server.url + "/api/ps", timeout=30).json()["models"]
    assert len(ps) == 1
    # a conversation through /api/chat renders .Messages with the Go template
    msgs = [Message("system", "Be brief."), Message("user", "Hi"), Message("assistant", "Hello!"),
            Message("user", "Name a color.")]
    body = {"model": "gotmpl", "stream": False, "options": {"num_predict": 2, "temperature": 0},
            "messages": [{"role": m.role, "content": m.content} for m in msgs]}
    reply = httpx.post(server.url + "/api/chat", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    assert reply.json()["prompt_eval_count"] == len(smol.tokenize(go_prompt(msgs)))


def test_serve_takes_a_go_template_in_the_request(server, smol):
    reply = _generate(server.url, "samegguf", "Name a color.", template="<|im_start|>user\n{{ .Prompt }}!!")
    assert reply.status_code == 200, reply.text
    expected = smol.tokenize("<|im_start|>user\nName a color.!!")
    assert reply.json()["context"][: len(expected)] == expected
    bad = _generate(server.url, "samegguf", "Name a color.", template="{{ if .Prompt }}{{ .Prompt }}")
    assert bad.status_code == 400
    error = bad.json()["error"]
    assert "invalid template" in error and "unexpected EOF" in error and "\n" not in error
    failing = _generate(server.url, "samegguf", "x", template="{{ index .Prompt 99 }}")
    assert failing.status_code == 400 and "index out of range" in failing.json()["error"]


def test_api_show_says_which_template(server, gemma3_path, tmp_path):
    shown = httpx.post(server.url + "/api/show", json={"model": "gotmpl"}, timeout=60).json()
    assert shown["template"] == GO_TEMPLATE and 'TEMPLATE """' + GO_TEMPLATE in shown["modelfile"]
    shown = httpx.post(server.url + "/api/show", json={"model": "samegguf"}, timeout=60).json()
    assert shown["template"].startswith("{% for message in messages %}") or "{%" in shown["template"]
    shown = httpx.post(server.url + "/api/show", json={"model": str(gemma3_path)}, timeout=60).json()
    assert 'llama.cpp built-in template "gemma"' in shown["template"]
    assert "TEMPLATE" not in shown["modelfile"]
    # and without a server
    out = run_cli(["show", str(gemma3_path)], tmp_path)
    assert re.search(r'template\s+llama.cpp built-in template "gemma" \(for architecture gemma3\)', out.stdout)
    out = run_cli(["show", "--template", str(gemma3_path)], tmp_path)
    assert out.stdout.startswith('llama.cpp built-in template "gemma"')


@pytest.mark.slow
def test_serve_renders_gemma3_with_the_gemma_builtin(server, gemma3_path):
    """gemma-3-270m carries no template: its prompt is llama.cpp's gemma built-in (with BOS)."""
    import llama_cpp

    vocab = llama_cpp.Llama(str(gemma3_path), vocab_only=True, verbose=False)
    try:
        text = llama_cpp_apply("gemma", [Message("user", "Why is the sky blue?")])
        expected = vocab.tokenize(text.encode(), add_bos=True, special=True)
    finally:
        vocab.close()
    reply = _generate(server.url, str(gemma3_path), "Why is the sky blue?")
    assert reply.status_code == 200, reply.text
    assert reply.json()["context"][: len(expected)] == expected


def test_a_go_template_conversation_hits_the_cache(smol):
    """Turn 2's prompt extends turn 1's prompt and answer with the Go template: only the new
    message is evaluated."""
    opts = Options(temperature=0, num_predict=8)
    msgs = [Message("user", "Name a color.")]
    answer, first = collect(smol.stream(Request(messages=msgs, chat_template=request_template(GO_TEMPLATE), options=opts)))
    msgs2 = msgs + [Message("assistant", answer), Message("user", "And an animal?")]
    _, second = collect(smol.stream(Request(messages=msgs2, chat_template=request_template(GO_TEMPLATE), options=opts)))
    turn1 = first.metrics.prompt_tokens + first.metrics.eval_count
    assert second.metrics.prompt_cached_count >= turn1 - 1, (first.metrics, second.metrics)
    assert second.metrics.prompt_tokens == len(smol.tokenize(go_prompt(msgs2)))
