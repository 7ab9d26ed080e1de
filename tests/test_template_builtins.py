"""llama.cpp's built-in chat templates, for GGUFs without one: our renderings equal llama.cpp's
own (``llama_chat_apply_template`` by name, through llama-cpp-python), and gemma-3-270m, whose
GGUF carries no template, gets the gemma one."""

from __future__ import annotations

import ctypes
from pathlib import Path

import llama_cpp
import pytest

from runner.template import builtins as chattemplates, prompt
from runner.api import Message, Options, Request

GEMMA3 = Path("/root/.cache/pollama-test-models/gemma-3-270m-q4_k_m.gguf")
FETCH_GEMMA3 = Path(__file__).resolve().parents[2] / "shared" / "models" / "fetch-gemma3.sh"


def llama_cpp_apply(name: str, messages: list[Message], add_ass: bool = True) -> str | None:
    """llama.cpp's rendering of ``messages`` with its built-in ``name`` (None: it has no such one)."""
    chat = (llama_cpp.llama_chat_message * len(messages))()
    keep = []
    for i, m in enumerate(messages):
        role, content = m.role.encode(), m.content.encode()
        keep += [role, content]
        chat[i].role, chat[i].content = role, content
    size = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(messages), add_ass, None, 0)
    if size < 0:
        return None
    buf = ctypes.create_string_buffer(size + 1)
    size = llama_cpp.llama_chat_apply_template(name.encode(), chat, len(messages), add_ass, buf, size + 1)
    return buf.raw[:size].decode()


def llama_cpp_names() -> set[str]:
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    names = (ctypes.c_char_p * n)()
    llama_cpp.llama_chat_builtin_templates(names, n)
    return {name.decode() for name in names}


CONVERSATIONS = [
    [Message("user", "Hello")],
    [Message("system", "  You are terse. \n"), Message("user", " Hi there \n"),
     Message("assistant", "\n Hello! How can I help? "), Message("user", "Tell me a joke.")],
    [Message("user", "a"), Message("assistant", "b"), Message("user", "c"), Message("assistant", "d"),
     Message("user", "e")],
    [Message("system", "S1"), Message("system", "S2"), Message("user", "u")],
    [Message("user", 'ünïcödé 日本 <tag> & "q"\t\v\f')],
    [Message("system", "only a system message")],
]


def test_every_builtin_is_one_llama_cpp_has():
    assert set(chattemplates.NAMES) <= llama_cpp_names()
    assert set(chattemplates.BY_ARCHITECTURE.values()) <= set(chattemplates.NAMES)
    for required in ("gemma", "chatml", "llama3", "mistral-v7", "mistral-v3", "phi3", "zephyr", "llama2"):
        assert required in chattemplates.NAMES


@pytest.mark.parametrize("name", chattemplates.NAMES)
def test_a_builtin_renders_as_llama_cpp_does(name):
    for conversation in CONVERSATIONS:
        for add_ass in (True, False):
            expected = llama_cpp_apply(name, conversation, add_ass)
            assert chattemplates.apply(name, conversation, add_ass) == expected, (name, conversation, add_ass)


# The built-ins where a conversation's next turn extends this turn's prompt with the answer
# (the answer written as the model wrote it: no surrounding spaces, which gemma/llama3 trim).
PREFIX_STABLE = ["chatml", "gemma", "llama3", "phi3", "phi4", "zephyr", "falcon3", "deepseek",
                 "command-r", "llama4", "granite", "exaone3"]  # vicuna, openchat: a space between


@pytest.mark.parametrize("name", PREFIX_STABLE)
def test_a_builtin_turn_extends_the_last_prompt_and_answer(name):
    turn1 = [Message("system", "Be brief."), Message("user", "Hi")]
    p1 = chattemplates.apply(name, turn1)
    turn2 = turn1 + [Message("assistant", "Hello!"), Message("user", "Bye")]
    p2 = chattemplates.apply(name, turn2)
    assert p2.startswith(p1 + "Hello!"), (p1, p2)
    assert p2 == llama_cpp_apply(name, turn2)


def test_architectures_map_to_their_builtin():
    assert chattemplates.for_architecture("gemma3") == "gemma"
    assert chattemplates.for_architecture("gemma2") == "gemma"
    assert chattemplates.for_architecture("qwen2") == "chatml"
    assert chattemplates.for_architecture("phi3") == "phi3"
    # llama is many formats (and many base models): no guess
    assert chattemplates.for_architecture("llama") is None


@pytest.fixture(scope="module")
def gemma3_path() -> Path:
    if not GEMMA3.is_file():
        import subprocess

        subprocess.run(["bash", str(FETCH_GEMMA3)], check=True)
    return GEMMA3


@pytest.mark.slow
def test_gemma3_without_a_template_chats_with_the_gemma_builtin(gemma3_path):
    """gemma-3-270m's GGUF has no tokenizer.chat_template: its prompts are llama.cpp's gemma
    built-in, and turn 2 reuses turn 1's prompt and answer from the cache."""
    import runner
    from tests.conftest import collect

    r = runner.load(runner.resolve(str(gemma3_path)), Options(num_ctx=512))
    try:
        assert r.info.chat_template is None
        chosen = r.prompter.template  # the loaded model's, chosen by runner.resolve
        assert (chosen.kind, chosen.source) == ("builtin", "gemma")
        assert "gemma3" in chosen.describe()
        msgs = [Message("system", "Answer in one word."), Message("user", "What color is the sky?")]
        assert r.render_chat(msgs) == llama_cpp_apply("gemma", msgs)
        opts = Options(temperature=0, num_predict=12)
        answer, final = collect(r.stream(Request(messages=msgs, options=opts)))
        assert answer.strip()
        msgs2 = msgs + [Message("assistant", answer), Message("user", "And grass?")]
        assert r.render_chat(msgs2) == llama_cpp_apply("gemma", msgs2)
        _, final2 = collect(r.stream(Request(messages=msgs2, options=opts)))
        # the cache hit: turn 1's prompt (and the answer, as far as gemma's trim keeps it) is reused
        p1 = len(r.tokenize(r.render_chat(msgs)))
        assert final2.metrics.prompt_cached_count >= p1
    finally:
        r.close()
