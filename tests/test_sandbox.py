"""The render budget (runner/template/sandbox.py) as the Jinja sandbox and the Go interpreter use it: CPU
time stops a render about when it is spent, whatever one step costs; one request's renders share
one budget across threads (its feature probes and its prompt); a render cannot take gigabytes of
memory in many values that are each within the size limit."""

from __future__ import annotations

import gc
import threading
import time
import tracemalloc
from itertools import count

import pytest

from runner.template import go as gotemplate, prompt, features as templatefeatures
from runner.api import ChatTemplate, InvalidRequest, Message
from runner.template.sandbox import BudgetExceeded, RenderBudget, RenderLimits, sharing

HI = [Message("user", "hi")]


@pytest.fixture(autouse=True)
def _collected():
    """Each test here times a render by its thread's CPU: in the whole suite the process holds
    ~700k objects, and a full collection of them (0.5-0.65 s, measured in a suite run) falling
    inside a render once took one of these over its bound in CI. Collected first, the next full
    collection is far off (it waits for a quarter as many new long-lived objects)."""
    gc.collect()


FOREVER = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}"
_unique = count()


def _fresh(source: str) -> str:
    """``source`` as a template no test rendered before (the feature cache does not know it)."""
    return source + f"{{# {next(_unique)} {time.monotonic_ns()} #}}"


def test_an_overrun_stops_about_when_the_budget_is_spent_however_dear_a_step():
    """Each step here sizes a namespace of 100000 items (milliseconds): a check every so many
    steps would let the render run seconds past its budget."""
    dear = "{% set ns = namespace(items=range(100000)|list) %}{% for i in range(100000) %}{{ [ns]|length }}{% endfor %}"
    t0 = time.thread_time()
    with pytest.raises(BudgetExceeded, match="time budget"):
        prompt.render(dear, HI, limits=RenderLimits(cpu_seconds=0.5))
    assert time.thread_time() - t0 < 0.5 + 0.15


def test_a_budget_shared_across_threads_is_one_allowance():
    """What a render spent in one thread is gone for a budget made inside ``sharing`` in another
    (the server probes a request's template in one thread and renders its prompt in another)."""
    budget = RenderBudget(RenderLimits(cpu_seconds=0.3))
    errors: list[BaseException] = []

    def first() -> None:
        try:
            prompt.render(FOREVER, HI, budget=budget)
        except BaseException as err:  # noqa: BLE001 - handed to the test
            errors.append(err)

    thread = threading.Thread(target=first)
    thread.start()
    thread.join()
    assert isinstance(errors[0], BudgetExceeded) and budget.cpu_spent >= 0.3
    t0 = time.thread_time()
    with sharing(budget):
        with pytest.raises(BudgetExceeded):
            prompt.render("{{ messages[0].content }}", HI, budget=RenderBudget())
        with pytest.raises(BudgetExceeded):
            prompt.render(FOREVER, HI, cancel=threading.Event())
    assert time.thread_time() - t0 < 0.1
    assert prompt.render("{{ messages[0].content }}", HI) == "hi"  # outside: a budget of its own


def test_a_shared_budget_also_stops_on_the_request_cancel_event():
    from runner.api import Cancelled

    cancel = threading.Event()
    cancel.set()
    with sharing(RenderBudget(cancel=cancel)):
        with pytest.raises(Cancelled):
            prompt.render(FOREVER, HI, budget=RenderBudget())


def test_feature_probes_draw_on_the_request_budget():
    """Probing a template under ``sharing`` spends the request's budget; probes that spend a
    whole budget mark the template (cached: refused at once next time), probes cut short by a
    budget spent before them are not cached."""
    slow = ChatTemplate("jinja", _fresh(FOREVER), "test")
    budget = RenderBudget(RenderLimits(cpu_seconds=0.3))
    with sharing(budget):
        found = templatefeatures.features(slow)
    assert "time budget" in found.over_budget and found.tools is None and budget.cpu_spent >= 0.3
    t0 = time.thread_time()
    assert templatefeatures.features(slow) is found  # cached: no render
    assert time.thread_time() - t0 < 0.05

    other = ChatTemplate("jinja", _fresh(FOREVER), "test")
    spent = RenderBudget(RenderLimits(cpu_seconds=0.3))
    with pytest.raises(BudgetExceeded):
        prompt.render(FOREVER, HI, budget=spent)
    with sharing(spent), pytest.raises(BudgetExceeded):
        templatefeatures.features(other)  # no budget left: not the template's fault
    assert templatefeatures.features.cache_info().currsize > 0
    fresh = RenderBudget(RenderLimits(cpu_seconds=0.3))
    with sharing(fresh):
        assert templatefeatures.features(other).over_budget  # probed anew, not a cached failure
    assert fresh.cpu_spent >= 0.3


# Each builds 100 values of about a megabyte, each within the size limit (1 MiB plus 4x the
# input): without a bound on all a render builds, 100 MB here, gigabytes with a longer template.
_MB = "'x' * 1000000"
JINJA_HOARDS = {
    "list literal": "{{ [" + ", ".join([_MB] * 100) + "]|length }}",
    "call arguments": "{{ namespace(" + ", ".join(f"a{i}={_MB}" for i in range(100)) + ") is defined }}",
    "variables": "".join(f"{{% set a{i} = {_MB} %}}" for i in range(100)),
    "recursion": "{% macro f(n) %}{% set big = " + _MB + " %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
    "replace filter": "{% set b = 'b' * 100000 %}{{ ('a' * 1000)|replace('a', b)|length }}",
    "repeated format field": "{% set b = " + _MB + " %}{{ ('{0}' * 100).format(b)|length }}",
    "repeated % key": "{% set b = " + _MB + " %}{{ (('%(a)s' * 100) % {'a': b})|length }}",
}
_GO_MB = '{{ $s := printf "%1000000s" "" }}'
GO_HOARDS = {
    "variables": "".join(f'{{{{ $a{i} := printf "%1000000s" "" }}}}' for i in range(100)),
    "html of many": _GO_MB + "{{ html " + " ".join(["$s"] * 100) + " }}",
    "js of many": _GO_MB + "{{ js " + " ".join(["$s"] * 100) + " }}",
    "urlquery of many": _GO_MB + "{{ urlquery " + " ".join(["$s"] * 100) + " }}",
    "printf extra arguments": _GO_MB + '{{ printf "" ' + " ".join(["$s"] * 100) + " }}",
}


def _peak(render) -> int:
    tracemalloc.start()
    try:
        with pytest.raises(InvalidRequest, match="characters"):
            render()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("name", list(JINJA_HOARDS))
def test_a_jinja_template_cannot_hoard_memory(name):
    peak = _peak(lambda: prompt.render(JINJA_HOARDS[name], HI))
    assert peak < 48e6, f"{peak / 1e6:.0f} MB"


@pytest.mark.parametrize("name", list(GO_HOARDS))
def test_a_go_template_cannot_hoard_memory(name):
    peak = _peak(lambda: gotemplate.render(GO_HOARDS[name], {}, RenderBudget(), 100))
    assert peak < 48e6, f"{peak / 1e6:.0f} MB"


def test_many_go_variables_cost_no_more_per_use():
    """As many variables and uses as fit in a template's 64 KiB (1700 of each) render well
    inside the budget: a use does not scan the variables declared before it, parsing (the last
    one declared) or running (the first). (Scanning cost 3.3 s for 10,000 before texts were
    bounded; at this size it costs ~0.1 s, so this guards the size, not the scan.)"""
    n = 1700
    source = "".join(f"{{{{$v{i} := {i}}}}}" for i in range(n)) + f"{{{{ $v{n - 1} }}}}{{{{ $ }}}}" * n
    t0 = time.thread_time()
    out = gotemplate.render(source, "d", RenderBudget(), len(source))
    assert out == f"{n - 1}d" * n
    assert time.thread_time() - t0 < 0.5


def test_go_variables_keep_their_scopes():
    source = ("{{ $x := 1 }}{{ if true }}{{ $x := 2 }}{{ $x = 3 }}{{ $x }}{{ end }}{{ $x }}"
              "{{ range $i, $x := . }}{{ $i }}{{ $x }}{{ $x = 9 }}{{ $x }}{{ end }}{{ $x }}"
              "{{ range $x, $x := . }}{{ $x }}{{ end }}")
    assert gotemplate.render(source, ["a", "b"], RenderBudget(), 100) == "310a91b91ab"


def test_a_long_conversation_through_ollamas_llama_template_is_well_inside_the_budget():
    """Ollama's templates find the last message with ``slice $.Messages $i`` for each message:
    a copy of the rest of the list, which must not cost its whole size each time."""
    from pathlib import Path

    from runner.template import ollama as ollamatemplate

    source = (Path(__file__).parent / "data" / "templates" / "ollama-llama3.1.gotmpl").read_text()
    messages = [Message("user" if i % 2 == 0 else "assistant", f"m{i}") for i in range(6001)]
    t0 = time.thread_time()
    out = ollamatemplate.render(source, messages, RenderBudget())
    assert out.count("<|start_header_id|>user<|end_header_id|>") == 3001
    assert time.thread_time() - t0 < 1.0
