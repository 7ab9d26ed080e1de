"""The lazy tool-call grammar of ``tool_choice: "auto"``: free text until the model writes the
call's tag anywhere in its answer, then the call is constrained. Unit level with SmolLM2's real
vocabulary (both ways the engines drive a llama.cpp sampler), and end to end on both engines."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from conftest import SMOLLM2, load
from runner.api import Message, Request, Tool, ToolChoice
from runner.sample.grammar import GrammarSampler, VocabOnly, init_sampler
from runner.sample.lazygrammar import TagTrigger
from runner.sample.toolgrammar import tool_call_grammar
from runner.reply.toolcalls import ToolSyntax
from runner.template.prompt import request_template

QWEN = ToolSyntax("<tool_call>\n", "\n</tool_call>")
WEATHER = Tool("get_weather", "Get the current weather in a city",
               {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]})
TEXT = "Sure, I can help with that. Let me look up the weather for you.\n\n"
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'


@pytest.fixture(scope="module")
def vocab():
    v = VocabOnly(str(SMOLLM2))
    yield v
    v.close()


def tokens(vocab, text: str) -> list[int]:
    import llama_cpp as L

    data = text.encode()
    out = (L.llama_token * (len(data) + 8))()
    n = L.llama_tokenize(vocab.vocab, data, len(data), out, len(out), False, True)
    return list(out[:n])


def piece(vocab, token: int) -> bytes:
    import ctypes

    import llama_cpp as L

    buf = ctypes.create_string_buffer(64)
    n = L.llama_token_to_piece(vocab.vocab, token, buf, 64, 0, True)
    return buf.raw[:n]


def test_trigger_finds_the_tag_anywhere_and_keeps_only_a_few_tokens(vocab):
    toks = tokens(vocab, TEXT * 20 + "Here: <tool_call>\n{")
    trigger = TagTrigger(b"<tool_call>", re.compile(rb"[ \n]{0,2}"))
    fired = None
    for i, tok in enumerate(toks):
        out = trigger.accept(tok, piece(vocab, tok))
        assert len(trigger._recent) <= len(b"<tool_call>")  # never more than a partial tag's tokens
        if out is not None:
            fired = i, out
            break
    assert fired is not None
    at, replay = fired
    # it fires on the token that completes the tag, and replays from the token where the tag starts
    assert b"".join(piece(vocab, t) for t in toks[: at + 1]).endswith(b"<tool_call>")
    assert b"".join(piece(vocab, t) for t in replay).strip() == b"<tool_call>"
    assert trigger.accept(toks[at + 1], piece(vocab, toks[at + 1])) is None  # once only


def test_trigger_gives_up_when_the_completing_token_says_more():
    trigger = TagTrigger(b"<tool_call>", re.compile(rb"[ \n]{0,2}"))
    assert trigger.accept(1, b"text <tool") is None
    assert trigger.accept(2, b"_call>") == [1, 2]
    trigger = TagTrigger(b"<tool_call>", re.compile(rb"[ \n]{0,2}"))
    assert trigger.accept(1, b"<toolbox> <tool_") is None  # a near miss, then a partial tag
    assert trigger.accept(2, b"call>Hello") == []  # the grammar would reject "Hello": not started
    assert trigger.accept(3, b"<tool_call>") is None


def _greedy_step(sampler: GrammarSampler, vocab, want: int) -> int:
    logits = np.zeros(vocab.n_vocab, dtype=np.float32)
    logits[want] = 10.0
    token = sampler.sample(logits, lambda values: int(np.argmax(values)))
    sampler.accept(token)
    return token


def test_new_engine_path_text_is_free_then_the_call_is_constrained(vocab, grammars):
    grammar = tool_call_grammar(QWEN, [WEATHER], ToolChoice(), None, grammars)
    assert grammar.tag == "<tool_call>" and grammar.trigger is None
    sampler = GrammarSampler(vocab, grammar)
    try:
        for tok in tokens(vocab, TEXT * 30 + "<tool_call>\n"):  # any text goes, however long
            assert _greedy_step(sampler, vocab, tok) == tok
        hello = tokens(vocab, "Hello")[0]
        forced = _greedy_step(sampler, vocab, hello)  # after the tag, "Hello" is not a call
        assert forced != hello and piece(vocab, forced) in (b"{", b'{"', b" ", b"\n")
        rest = CALL.split("\n", 1)[1]
        rest = rest[len(piece(vocab, forced)):] if rest.startswith(piece(vocab, forced).decode()) else rest
        for tok in tokens(vocab, rest):
            assert _greedy_step(sampler, vocab, tok) == tok, piece(vocab, tok)
    finally:
        sampler.close()


def test_old_engine_path_the_sampler_works_in_a_chain(vocab, grammars):
    import llama_cpp as L

    chain = L.llama_sampler_chain_init(L.llama_sampler_chain_default_params())
    L.llama_sampler_chain_add(chain, init_sampler(vocab.vocab, tool_call_grammar(QWEN, [WEATHER], ToolChoice(), None, grammars)))
    L.llama_sampler_chain_add(chain, L.llama_sampler_init_greedy())
    data = (L.llama_token_data * vocab.n_vocab)()

    def sample(want: int) -> int:
        for i in range(vocab.n_vocab):
            data[i].id, data[i].logit, data[i].p = i, (10.0 if i == want else 0.0), 0.0
        arr = L.llama_token_data_array(data, vocab.n_vocab, -1, False)
        L.llama_sampler_apply(chain, arr)
        token = data[arr.selected].id
        L.llama_sampler_accept(chain, token)
        return token

    try:
        for tok in tokens(vocab, TEXT + "<tool_call>\n"):
            assert sample(tok) == tok
        hello = tokens(vocab, "Hello")[0]
        assert sample(hello) != hello
    finally:
        L.llama_sampler_free(chain)  # frees the lazy sampler (and its grammar) through its callback


# ------------------------------------------------------------------------------- end to end
TEMPLATES = Path(__file__).parent / "data" / "templates"
ADD = Tool("add", "Add two numbers", {"type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                                      "required": ["a", "b"]})
# two earlier turns where the assistant says a sentence, then calls: SmolLM2 follows the pattern
SHOTS = [Message("user", "What is the weather in Rome?"),
         Message("assistant", "Sure, let me check the weather in Rome.\n<tool_call>\n"
                              '{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>'),
         Message("tool", "20 degrees", tool_name="get_weather"),
         Message("assistant", "It is 20 degrees in Rome."),
         Message("user", "What is 2 plus 2?"),
         Message("assistant", 'Sure, let me add them.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 2}}'
                              "\n</tool_call>"),
         Message("tool", "4", tool_name="add"),
         Message("assistant", "2 plus 2 is 4.")]


@pytest.mark.parametrize("engine", ["old", "new"])
def test_a_call_after_text_is_well_formed(engine):
    """SmolLM2 (Ollama's qwen2.5 Go template) answers with a sentence, then a call. Parsed only,
    the call names a tool that does not exist and stays content; with the lazy grammar, the
    sentence streams as it was and the call after it is well formed."""
    r = load(SMOLLM2, engine, num_ctx=1024)
    template = (TEMPLATES / "ollama-qwen2.5.gotmpl").read_text()

    def reply(grammar: bool):
        request = Request(messages=SHOTS + [Message("user", "How warm is it in New York City?")], chat_template=request_template(template),
                          tools=[WEATHER, ADD], tool_grammar=grammar)
        request.options.temperature = 0
        request.options.repeat_penalty = 1.1  # Ollama's old default: without it SmolLM2 writes no call
        request.options.num_predict = 50
        chunks = list(r.stream(request))
        return "".join(c.text for c in chunks), [c for chunk in chunks for c in chunk.tool_calls or []]

    try:
        loose, loose_calls = reply(False)
        text, calls = reply(True)
    finally:
        r.close()
    assert not loose_calls and "<tool_call>" in loose  # a broken call, given back as text
    sentence = loose.split("<tool_call>")[0]
    # the same text before the tag, unconstrained (the whitespace before the tag is the call's)
    assert sentence.strip() and text == sentence.rstrip()
    assert [(c.name, set(c.arguments)) for c in calls] == [("get_weather", {"city"})]
    assert isinstance(calls[0].arguments["city"], str)
