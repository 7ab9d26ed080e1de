"""Hostile JSON schemas against a real ``pollama serve``, on both engines, through every field
that takes one (``format`` on /api/generate and /api/chat, ``response_format`` on
/v1/chat/completions, ``text.format`` on /v1/responses, a forced tool's ``parameters``), sent
with the official clients: each is a 400 naming the keyword, the server stays up, its log stays
small and free of tracebacks. (Before the bounds, the first one killed the process: SIGSEGV.)"""

from __future__ import annotations

import json
import shutil

import httpx
import ollama
import openai
import pytest

from conftest import SMOLLM2
from ggufcopy import with_chat_template
from serverproc import ServerProcess
from test_server_tools import TEMPLATES, _gguf_blob, _install

SMOL = "smollm2:135m"

HOSTILE = [
    ({"type": "array", "items": {"type": "string"}, "maxItems": 100_000}, '"maxItems" is 100000'),
    ({"type": "string", "maxLength": 100_000}, '"maxLength" is 100000'),
    ({"type": "string", "pattern": "^a{0,100000}$"}, '"pattern" repeats 100000 times'),
    ({"type": "string", "pattern": "^a{1000000000}$"}, '"pattern" repeats 1000000000 times'),
    ({"type": "array", "minItems": 10**9}, '"minItems" is 1000000000'),
    ({"type": "string", "minLength": 10**9}, '"minLength" is 1000000000'),
    ({"enum": [f"value {i}" for i in range(20_000)]}, "enum values and anyOf/oneOf branches add up to 20000"),
    ({"anyOf": [{"const": i} for i in range(10_000)]}, "add up to 10000"),
    ({"type": "string", "pattern": "^[" + "".join(chr(0x4E00 + i) for i in range(20_000)) + "]+$"},
     '"pattern" is 20005 characters'),
]
PERSON = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
          "required": ["name", "age"]}


@pytest.fixture(scope="module", params=["old", "new"])
def server(request, tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    copy = with_chat_template(SMOLLM2, tmp_path_factory.mktemp("gguf") / "smol-qwen.gguf",
                              (TEMPLATES / "qwen2.5.jinja").read_text())
    _install(models, "smoltools", _gguf_blob(models, copy))
    env = {"OLLAMA_CONTEXT_LENGTH": "1024", "OLLAMA_NEW_ENGINE": "1" if request.param == "new" else "0"}
    proc = ServerProcess(env, models_dir=str(models)).start()
    yield proc
    assert proc.proc.poll() is None, proc.log()  # alive after everything above
    log = proc.log()
    assert proc.stop() == 0, proc.last_log
    assert "Traceback" not in log and len(log) < 64 * 1024, log[-4000:]


def _refused(call, keyword: str) -> None:
    with pytest.raises((ollama.ResponseError, openai.BadRequestError)) as err:
        call()
    assert err.value.status_code == 400
    assert keyword in str(err.value), str(err.value)[:500]


@pytest.mark.parametrize("schema, keyword", HOSTILE, ids=[k.split(",")[0] for _, k in HOSTILE])
def test_hostile_schemas_are_400s_naming_the_keyword(server, schema, keyword):
    ol = ollama.Client(host=server.url, timeout=60)
    oa = openai.OpenAI(base_url=server.url + "/v1", api_key="x", timeout=60, max_retries=0)
    hi = [{"role": "user", "content": "hi"}]
    _refused(lambda: ol.generate(model=SMOL, prompt="hi", format=schema), keyword)
    _refused(lambda: ol.chat(model=SMOL, messages=hi, format=schema), keyword)
    _refused(lambda: oa.chat.completions.create(model=SMOL, messages=hi, response_format={
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}), keyword)
    _refused(lambda: oa.responses.create(model=SMOL, input="hi", text={
        "format": {"type": "json_schema", "name": "x", "schema": schema}}), keyword)
    tool = {"type": "function", "function": {"name": "f", "parameters": {
        "type": "object", "properties": {"x": schema}, "required": ["x"]}}}
    _refused(lambda: oa.chat.completions.create(model="smoltools", messages=hi, tools=[tool],
                                                tool_choice="required"), keyword)
    assert httpx.get(server.url + "/api/version", timeout=5).status_code == 200


def test_a_schema_within_the_bounds_still_constrains(server):
    r = ollama.Client(host=server.url, timeout=120).generate(
        model=SMOL, prompt="Describe a person as JSON.", format=PERSON, options={"temperature": 0, "num_predict": 40})
    person = json.loads(r.response)
    assert set(person) == {"name", "age"} and len(person["name"]) <= 12 and isinstance(person["age"], int)
