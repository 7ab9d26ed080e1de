"""The batch loop over an :class:`~runner.loop.engine.Engine`: admission, batching, context shift
and release (:mod:`.runner`), the slot cache both engines share (:mod:`.slots`), request ->
sequence (:mod:`.sequence`), sampled token -> text chunks (:mod:`.output`, :mod:`.text`,
:mod:`.replies`), where decodes run (:mod:`.pipeline`), and embedding lanes (:mod:`.embedding`).
"""
