"""Speculative decoding (issue 26): guess a sequence's next tokens cheaply, verify them in one
decode, keep what the model agrees with.

- :mod:`.drafter`: the :class:`~.drafter.Drafter` protocol, one per sequence: its guesses; and
  :class:`~.drafter.DraftSource`, what hands drafters out (a draft model:
  :mod:`runner.loop.draftmodel`, which drives a second engine).
- :mod:`.ngram`: prompt lookup (llama.cpp's ngram-simple): the continuation of the most recent
  earlier occurrence of the sequence's last tokens.
- :mod:`.pool`: the n-gram pool a model's sequences share (llama.cpp's ngram-mod): what followed
  each 24-token run in any prompt or answer, so a repeated answer is drafted from the first.
- :mod:`.controller`: :class:`~.controller.Speculation`, how deep to draft: the cost of a decode
  by rows against the sequence's acceptance so far (draft only when it pays).
- :mod:`.verify`: the verification of a drafted batch: the sequence's own sampler decides each
  row in order, the draft stands up to the first disagreement.

The batch loop (:mod:`runner.loop.runner`) uses them; nothing here imports an engine (a draft
model's is handed in by :func:`runner.load`).
"""
