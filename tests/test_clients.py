"""The client libraries users reach pollama with, used with their defaults (issue: safe drop-in, §3).

LangChain's ``ChatOllama``/``OllamaEmbeddings`` and llama-index's ``Ollama`` send every option they
know, ``null`` when unset, including options Ollama dropped (``mirostat``, ``tfs_z``, ...); the
server must take them as Ollama does.
"""

from __future__ import annotations

import httpx
import pytest

from conftest import STORIES
from serverproc import ServerProcess

SMOL = "smollm2:135m"


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess({"OLLAMA_CONTEXT_LENGTH": "1024"}).start()
    yield proc
    assert proc.stop() == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def test_langchain_chat_and_embeddings(server):
    from langchain_ollama import ChatOllama, OllamaEmbeddings

    chat = ChatOllama(model=SMOL, base_url=server.url, temperature=0, num_predict=8)
    answer = chat.invoke("What is the capital of France?")
    assert answer.content and answer.usage_metadata["output_tokens"] == 8
    streamed = "".join(chunk.content for chunk in chat.stream("What is the capital of France?"))
    assert streamed == answer.content

    embeddings = OllamaEmbeddings(model=SMOL, base_url=server.url)
    vectors = embeddings.embed_documents(["a cat", "a dog"])
    assert len(vectors) == 2 and len(vectors[0]) == 576
    assert embeddings.embed_query("a cat") == pytest.approx(vectors[0], abs=1e-5)


def test_llama_index_complete_and_chat(server):
    from llama_index.core.llms import ChatMessage
    from llama_index.llms.ollama import Ollama

    llm = Ollama(model=SMOL, base_url=server.url, request_timeout=120, temperature=0,
                 additional_kwargs={"num_predict": 8})
    completion = llm.complete("Once upon a time")
    assert completion.text
    reply = llm.chat([ChatMessage(role="user", content="Say hello.")])
    assert reply.message.content
    streamed = "".join(part.delta or "" for part in llm.stream_complete("Once upon a time"))
    assert streamed == completion.text


def test_dropped_and_null_options_are_ignored(server):
    """What those clients send, on the wire: a 200, the options that exist still applied."""
    body = {"model": str(STORIES), "prompt": "Once", "stream": False,
            "options": {"num_predict": 3, "temperature": None, "mirostat": 0, "mirostat_eta": 0.1,
                        "mirostat_tau": 5.0, "tfs_z": 1.0, "penalize_newline": True, "low_vram": False,
                        "numa": None, "f16_kv": True, "no_such_option": 1, "stop": None}}
    r = httpx.post(server.url + "/api/generate", json=body, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["eval_count"] == 3
    r = httpx.post(server.url + "/api/embed", json={"model": str(STORIES), "input": "x",
                                                  "options": {"mirostat": None, "tfs_z": 1.0}}, timeout=60)
    assert r.status_code == 200, r.text
    # a known option with a value of the wrong type is still the client's error
    body["options"] = {"num_predict": "many"}
    r = httpx.post(server.url + "/api/generate", json=body, timeout=60)
    assert r.status_code == 400 and "num_predict" in r.json()["error"]
    server.stop_log = server.log()
    assert server.stop_log.count("ignoring option 'mirostat'") == 1  # logged once, not per request
