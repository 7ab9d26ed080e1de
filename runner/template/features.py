"""What a chat template supports, found by rendering probes through it, Jinja or Go alike: tool
calls (and their syntax), reasoning (and its tags), insert (a Go template's ``.Suffix``). From these come a model's
``capabilities`` (Ollama's ``/api/show`` list) and which requests it refuses.

The probes render in the sandbox like any prompt, all of a template's probes within one render
budget: the request's own when the caller shares it (:func:`runner.template.prompt.sharing`: a server
request's probes and prompt together cost one budget), else a fresh one. A template that fails
on them supports nothing more than completion; one whose probes alone use up a whole budget is
marked (``over_budget``: the server refuses it at once). Results are cached per template text,
except probes cut short by the cancel event or by a budget that was partly spent before them
(they raise Cancelled / BudgetExceeded).
"""

from __future__ import annotations

import functools
import logging
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from . import ollama as ollamatemplate, prompt
from ..api import Cancelled, ChatTemplate, Message, ModelInfo, PollamaError, Tool
from ..reply import thinking, toolcalls
from ..reply.thinking import ThinkTags
from ..reply.toolcalls import ToolSyntax

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TemplateFeatures:
    tools: ToolSyntax | None = None  # None: the template does not render tools
    thinking: ThinkTags | None = None  # None: the model does not reason in tags
    insert: bool = False  # a Go template with .Suffix (fill-in-the-middle)
    over_budget: str = ""  # the time-budget error its probes ran into, alone (such a template is refused)


@functools.lru_cache(maxsize=64)
def features(template: ChatTemplate) -> TemplateFeatures:
    """The features of ``template`` (cached: the probes cost a few renders). Raises Cancelled
    when the budget's cancel event stops the probes, BudgetExceeded when a shared budget runs out
    before they could use a whole one (nothing is cached then)."""
    insert = False
    if template.kind == "go":
        try:
            insert = "suffix" in ollamatemplate.parse(template.source).identifiers()
        except PollamaError:
            return TemplateFeatures()
    elif template.kind != "jinja":
        return TemplateFeatures()

    budget = prompt.RenderBudget()

    def render_tools(messages: Sequence[Message], tools: Sequence[Tool], generation: bool) -> str:
        return prompt.render(template, messages, tools=tools, add_generation_prompt=generation, budget=budget)

    def render_think(messages: Sequence[Message], think: bool, generation: bool) -> str:
        return prompt.render(template, messages, think=think, add_generation_prompt=generation, budget=budget)

    def probe(derive: Callable[..., Any], *args: Any) -> Any:
        try:
            return derive(*args)
        except (prompt.BudgetExceeded, Cancelled):
            raise
        except PollamaError as err:
            log.debug("%s probe failed: %s", derive.__module__, err)
            return None

    spent = budget.cpu_spent
    try:
        tools = probe(toolcalls.derive, render_tools)
        tags = probe(thinking.derive, render_think, template.source)
    except prompt.BudgetExceeded as err:
        if budget.cpu_spent - spent < budget.cpu_limit:
            raise  # a shared budget, spent in part before: the probes did not have a whole one
        log.debug("probing the template ran out of time: %s", err)
        return TemplateFeatures(insert=insert, over_budget=str(err))
    return TemplateFeatures(tools=tools, thinking=tags, insert=insert)


def capabilities(info: ModelInfo, template: ChatTemplate) -> list[str]:
    """Ollama's capability names for a model whose prompts use ``template``:
    ``completion`` (or ``embedding`` for a model that pools), then ``tools``, ``thinking``,
    ``insert`` as its template allows, and ``vision`` when it has a projector."""
    pooling = info.metadata.get(f"{info.architecture}.pooling_type")
    out = ["embedding" if pooling not in (None, 0) else "completion"]
    found = features(template)
    if found.tools is not None:
        out.append("tools")
    if found.thinking is not None:
        out.append("thinking")
    if found.insert:
        out.append("insert")
    if info.vision:
        out.append("vision")
    return out
