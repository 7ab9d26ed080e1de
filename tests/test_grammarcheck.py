"""Schemas become grammars in a child process (runner/sample/grammarcheck.py): what would take
the process down, or take long, costs the child, and the caller gets one line."""

from __future__ import annotations

import os
import threading
import time

import pytest

from runner.api import Cancelled, InvalidRequest
from runner.sample.grammarcheck import GrammarCheck

# 20,000 nested groups: llama.cpp's recursive parser overflows an 8 MiB stack (SIGSEGV)
CRASHES = "root ::= " + '("a" ' * 20_000 + ")?" * 20_000 + "\n"


def test_a_schema_becomes_a_compiled_grammar_in_the_order_given(grammars):
    gbnf = grammars.schema_gbnf({"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "string"}},
                                 "required": ["b", "a"]}, "format")
    assert 'root ::= "{" space b-kv "," space a-kv "}" space' in gbnf  # the keys in the order given


def test_a_grammar_that_kills_the_compiler_is_one_line_and_we_live(grammars):
    with pytest.raises(InvalidRequest) as err:
        grammars.compiled(CRASHES, "format")
    assert str(err.value) == "the grammar for format does not compile: the grammar compiler failed on it (signal 11)"
    # the next job gets a fresh child
    assert "root ::=" in grammars.schema_gbnf({"type": "integer"}, "format")


def test_a_schema_the_converter_refuses_is_one_short_line(grammars):
    with pytest.raises(InvalidRequest) as err:
        grammars.schema_gbnf({"type": "string", "pattern": "a" * 900}, "format")  # no ^...$
    message = str(err.value)
    assert message.startswith("invalid JSON schema in format: ") and "\n" not in message and len(message) < 300


def test_a_grammar_llama_cpp_refuses_says_why(grammars):
    with pytest.raises(InvalidRequest) as err:
        grammars.compiled('root ::= "a" (', "format")
    assert str(err.value).startswith("the grammar for format does not compile: ")
    assert "\n" not in str(err.value) and len(str(err.value)) < 300


def test_time_limit_and_cancel_kill_the_child():
    check = GrammarCheck(timeout=0.001)
    try:
        with pytest.raises(InvalidRequest, match="took longer than 0.001 s"):
            check.compiled('root ::= "x"\n', "format")
        check.timeout = 30
        cancel = threading.Event()
        threading.Timer(0.02, cancel.set).start()
        started = time.monotonic()
        with pytest.raises(Cancelled):
            check.compiled(CRASHES * 2, "format", cancel)  # slower than 20 ms to start and parse
        assert time.monotonic() - started < 5
        assert check._idle == []  # nothing half-done is kept
    finally:
        check.close()


def test_answers_are_remembered_and_children_reused():
    check = GrammarCheck()
    try:
        check.schema_gbnf({"type": "boolean"}, "format")
        (child,) = check._idle
        check.timeout = 0  # a child asked now would be out of time at once: the answer is remembered
        assert "root ::=" in check.schema_gbnf({"type": "boolean"}, "format")
        check.timeout = 10
        check.schema_gbnf({"type": "number"}, "format")
        assert check._idle == [child]
    finally:
        check.close()
    assert child.poll() is not None  # close ends the children
    with pytest.raises(InvalidRequest):
        check.schema_gbnf({"type": "null"}, "format")
    assert os.getpid()  # and this process is still here
