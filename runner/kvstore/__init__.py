"""The prompt store (issue 25): KV states of sequences kept beyond the slots, found by prefix.

- :mod:`.key`: the model :class:`~.key.Fingerprint` and :func:`~.key.chain`, the block hashes
  a state is filed and found under (exact to the input at its end);
- :mod:`.ram`: :class:`~.ram.RamStore`, the host-memory tier, bounded by ``OLLAMA_CACHE_RAM``.

The engines export and import a sequence's state through :class:`runner.loop.slots.KvOps`
(``export_seq``/``import_seq``). This package imports nothing else of ``runner``'s: the loop will
hold a store, so the store must not reach back into the loop.
"""
