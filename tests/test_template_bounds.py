"""Hostile templates against a real ``pollama serve``: a request's ``template`` or a GGUF's chat
template that would render forever or build gigabytes is a 400 within the render budget (2 s of
CPU), or stops when its client leaves; other clients are served meanwhile."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
import pytest

from conftest import STORIES
from serverproc import ServerProcess

FOREVER = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
HUGE = "{{ 'x' * 10**9 }}"


@pytest.fixture(scope="module")
def server():
    proc = ServerProcess({"OLLAMA_NUM_PARALLEL": "1"}).start()
    yield proc
    code = proc.stop()
    assert code == 0, proc.last_log
    assert "Traceback" not in proc.last_log, proc.last_log


def _generate(url: str, template: str | None = None, timeout: float = 60) -> httpx.Response:
    body = {"model": str(STORIES), "prompt": "Once upon a time", "stream": False,
            "options": {"num_predict": 8, "temperature": 0}}
    if template is not None:
        body["template"] = template
    return httpx.post(url + "/api/generate", json=body, timeout=timeout)


def test_a_template_that_renders_forever_is_a_400_and_others_are_served(server):
    assert _generate(server.url).status_code == 200  # the model is loaded
    done: dict[str, float] = {}
    result: dict[str, httpx.Response] = {}

    def hostile() -> None:
        result["hostile"] = _generate(server.url, FOREVER)
        done["hostile"] = time.monotonic()

    t0 = time.monotonic()
    caller = threading.Thread(target=hostile)
    caller.start()
    time.sleep(0.3)
    other = _generate(server.url)
    done["other"] = time.monotonic()
    caller.join(60)
    assert other.status_code == 200 and other.json()["eval_count"] == 8
    response = result["hostile"]
    assert response.status_code == 400
    assert "time budget" in response.json()["error"] and "\n" not in response.json()["error"]
    assert done["other"] < done["hostile"], "the other client waited for the hostile render"
    assert done["hostile"] - t0 < 30


def test_a_template_that_builds_gigabytes_is_a_400(server):
    response = _generate(server.url, HUGE)
    assert response.status_code == 400
    assert "characters" in response.json()["error"]


def test_a_client_that_leaves_stops_its_render(server):
    with pytest.raises(httpx.ReadTimeout):
        _generate(server.url, FOREVER, timeout=httpx.Timeout(30, read=0.4))
    deadline = time.monotonic() + 1.2  # well inside the 2 s CPU budget the render would run
    while "template rendering cancelled" not in server.log() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "template rendering cancelled" in server.log()


def test_a_gguf_chat_template_is_bounded_too(server, tmp_path: Path):
    import gguf
    from gguf.scripts.gguf_new_metadata import MetadataDetails, copy_with_new_metadata

    path = tmp_path / "stories-hostile-template.gguf"
    reader = gguf.GGUFReader(str(STORIES))
    arch = reader.get_field(gguf.Keys.General.ARCHITECTURE).contents()
    writer = gguf.GGUFWriter(str(path), arch)
    template = MetadataDetails(gguf.GGUFValueType.STRING, FOREVER)
    copy_with_new_metadata(reader, writer, {gguf.Keys.Tokenizer.CHAT_TEMPLATE: template}, [])
    body = {"model": str(path), "messages": [{"role": "user", "content": "hi"}], "stream": False}
    response = httpx.post(server.url + "/api/chat", json=body, timeout=60)
    assert response.status_code == 400
    assert "time budget" in response.json()["error"]
