"""Hostile templates against a real ``pollama serve``: a request's ``template`` or a GGUF's chat
template that would render forever or build gigabytes is a 400 within the render budget (2 s of
CPU), or stops when its client leaves; other clients are served meanwhile."""

from __future__ import annotations

import os
import threading
import time
import uuid
from pathlib import Path

import httpx
import pytest

from conftest import STORIES
from serverproc import ServerProcess

FOREVER = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
GO_FOREVER = "{{ range 100000 }}{{ range 100000 }}{{ end }}{{ end }}"
HUGE = "{{ 'x' * 10**9 }}"
BUDGET = 2.0  # seconds of CPU: the README's render budget


def _fresh(template: str) -> str:
    """``template`` with a comment no other request sent: its features are probed anew."""
    comment = f"{{{{/* {uuid.uuid4().hex} */}}}}" if template.startswith("{{ range") else f"{{# {uuid.uuid4().hex} #}}"
    return template + comment


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


def _cpu_seconds(pid: int) -> float:
    """The CPU time a process has used (all its threads), from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _refusal(response: httpx.Response) -> str:
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "template error" in error and "time budget" in error and "\n" not in error, error
    return error


@pytest.mark.parametrize("template", [GO_FOREVER, FOREVER], ids=["go", "jinja"])
def test_a_hostile_template_costs_one_budget(server, template):
    """A first request with a template that loops forever: its feature probes and its prompt
    share one budget, so it costs the server 2 s of CPU (not a budget each) and is refused
    about then (on an idle machine: wall ≈ CPU); sent again, it is refused at once."""
    assert _generate(server.url).status_code == 200  # the model is loaded
    template = _fresh(template)
    for attempt, (most_cpu, most_wall) in enumerate([(BUDGET + 0.5, 2 * BUDGET), (0.3, 0.5)]):
        cpu, t0 = _cpu_seconds(server.proc.pid), time.monotonic()
        _refusal(_generate(server.url, template))
        wall, cpu = time.monotonic() - t0, _cpu_seconds(server.proc.pid) - cpu
        assert cpu < most_cpu and wall < most_wall, f"attempt {attempt}: {cpu:.2f} s of CPU, {wall:.2f} s"


@pytest.mark.parametrize("template", [GO_FOREVER, FOREVER], ids=["go", "jinja"])
def test_a_hostile_render_never_holds_up_the_server(server, template):
    """While a hostile template is probed and rendered, /api/version answers at once and a
    plain request from another client is served about as fast as alone (not after the render:
    alone it may take seconds on a busy machine, where llama.cpp's threads wait for cores)."""
    assert _generate(server.url).status_code == 200  # the model is loaded
    t0 = time.monotonic()
    assert _generate(server.url).status_code == 200
    alone = time.monotonic() - t0
    result: dict[str, object] = {}
    stop = threading.Event()
    latencies: list[float] = []

    def hostile() -> None:
        result["response"] = _generate(server.url, _fresh(template))
        stop.set()

    def version() -> None:
        with httpx.Client(base_url=server.url, timeout=30) as client:
            while not stop.is_set():
                t0 = time.monotonic()
                assert client.get("/api/version").status_code == 200
                latencies.append(time.monotonic() - t0)
                time.sleep(0.05)

    caller, poller = threading.Thread(target=hostile), threading.Thread(target=version)
    caller.start()
    time.sleep(0.2)
    poller.start()
    t0 = time.monotonic()
    other = _generate(server.url)
    beside = time.monotonic() - t0
    caller.join(60)
    stop.set()
    poller.join(30)
    assert isinstance(result["response"], httpx.Response)
    _refusal(result["response"])
    assert len(latencies) >= 5 and max(latencies) < 0.5, f"/api/version took up to {max(latencies):.2f} s"
    assert other.status_code == 200 and other.json()["eval_count"] == 8
    assert beside < 2 * alone + 1.0, f"a plain request took {beside:.2f} s beside the render, {alone:.2f} s alone"


def test_a_template_that_builds_gigabytes_is_a_400(server):
    response = _generate(server.url, HUGE)
    assert response.status_code == 400
    assert "characters" in response.json()["error"]


@pytest.mark.parametrize("template", ["{{ .Prompt }}" + "{{/* padding */}}" * 5000,
                                      "{{ messages }}" + "{# padding #}" * 6000], ids=["go", "jinja"])
def test_a_template_text_over_64_kib_is_a_400_at_once(server, template):
    started = time.monotonic()
    response = _generate(server.url, template)
    assert response.status_code == 400
    assert f"the template is {len(template)} characters, over the limit of 65536" in response.json()["error"]
    assert time.monotonic() - started < 1.5  # never compiled


# Loops forever on a real conversation, not on the feature probes' (which then pass at once).
SLY = "{% if messages[0].content != 'pollama probe question' %}" + FOREVER + "{% endif %}"


@pytest.mark.parametrize("template", [FOREVER, SLY], ids=["while-probing", "while-rendering"])
def test_a_client_that_leaves_stops_its_render(server, template):
    """Whether it leaves while its template's features are probed or while its prompt renders."""
    mark = len(server.log())
    with pytest.raises(httpx.ReadTimeout):
        _generate(server.url, _fresh(template), timeout=httpx.Timeout(30, read=0.4))
    deadline = time.monotonic() + 1.2  # well inside the 2 s CPU budget the render would run
    while "template rendering cancelled" not in server.log()[mark:] and time.monotonic() < deadline:
        time.sleep(0.05)
    assert "template rendering cancelled" in server.log()[mark:]


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
