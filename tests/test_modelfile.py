"""The Modelfile parser (runner/store/modelfile.py): a unit test of the grammar, no model needed."""

from __future__ import annotations

import pytest

from runner.store.modelfile import ModelfileError, parse


def test_instructions_quotes_and_blocks():
    parsed = parse(
        'from llama3.2\n'
        '# comment\n'
        '\n'
        'PARAMETER temperature 0.5\n'
        'PARAMETER stop "<|im_end|>"\n'
        'PARAMETER stop """User:"""\n'
        'Parameter num_ctx 4096\n'
        'SYSTEM """\nYou are\n  a pirate.\n"""\n'
        'TEMPLATE {{ .Prompt }}\n'
        'MESSAGE user "Hi"\n'
        'MESSAGE ASSISTANT """Arr,\nmatey."""\n'
        'LICENSE MIT\n'
        'LICENSE """two\nlines"""\n'
    )
    assert parsed.from_ == "llama3.2" and parsed.from_line == 1
    assert parsed.parameters == {"temperature": 0.5, "stop": ["<|im_end|>", "User:"], "num_ctx": 4096}
    assert parsed.system == "\nYou are\n  a pirate.\n"
    assert parsed.template == "{{ .Prompt }}"
    assert parsed.messages == [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Arr,\nmatey."}]
    assert parsed.license == ["MIT", "two\nlines"]


def test_crlf_and_a_later_from_wins():
    parsed = parse("FROM a\r\nFROM b\r\nSYSTEM hi\r\n")
    assert parsed.from_ == "b" and parsed.from_line == 2 and parsed.system == "hi"


@pytest.mark.parametrize("text, message", [
    ("", "Modelfile has no FROM line"),
    ("FROM\n", "Modelfile line 1: FROM needs"),
    ("FROM x\nPARAMETER temperature\n", "Modelfile line 2: PARAMETER needs a name and a value"),
    ('FROM x\nTEMPLATE """a""" b\n', 'Modelfile line 2: unexpected text after the closing """'),
    ('FROM x\n\n\nSYSTEM """a\nb\n', 'Modelfile line 4: unterminated """'),
    ("FROM x\nQUANTIZE q4_0\n", 'Modelfile line 2: unknown instruction "QUANTIZE"'),
    ("FROM x\nMESSAGE tool hi\n", "Modelfile line 2: message role must be one of"),
    ("FROM x\nADAPTER ./a.gguf\n", "Modelfile line 2: ADAPTER is not supported"),
    ("FROM x\nPARAMETER num_ctx big\n", "Modelfile line 2: invalid value for option 'num_ctx'"),
])
def test_errors_name_the_line(text, message):
    with pytest.raises(ModelfileError) as err:
        parse(text)
    assert str(err.value).startswith(message) and "\n" not in str(err.value)
