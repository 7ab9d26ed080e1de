"""Pure parsers of a model's output, each with its syntax derived from the chat template:
reasoning (:mod:`.thinking`) and tool calls (:mod:`.toolcalls`; answers that are only a JSON call,
:mod:`.jsoncalls`). Testable without a model; the batch loop chains them per request
(:mod:`runner.loop.replies`).
"""
