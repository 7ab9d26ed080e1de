"""The prompt store (issue 25): KV states of sequences kept beyond the slots, found by prefix.

- :mod:`.key`: the model :class:`~.key.Fingerprint` and :func:`~.key.chain`, the block hashes
  a state is filed and found under (exact to the input at its end);
- :mod:`.pages`: the :class:`~.pages.Pager` an engine cuts its states into per-block pages with
  (and joins them back), so a prefix two conversations share is kept once; a save's new pages
  are spans of one state (a :class:`~.pages.Group`), so a restore joins one piece per save;
- :mod:`.ram`: :class:`~.ram.RamStore`, the host-memory tier of pages (and whole states, for
  sliding windows), bounded by ``OLLAMA_CACHE_RAM``, least recently used pages out;
- :mod:`.disk`: :class:`~.disk.DiskStore`, the disk tier (``POLLAMA_CACHE_DIR``, bounded by
  ``POLLAMA_CACHE_DISK``), a file per page, written off the loop, checked whole before a restore;
- :mod:`.store`: the process's :class:`~.store.Tiers` and a load's :class:`~.store.PromptStore`.

The engines export and import a sequence's state through :class:`runner.loop.slots.KvOps`
(``export_seq``/``import_seq``, and ``split_state``/``join_states``/``page_state`` for pages). Of ``runner``
this package uses only the checked paths of :mod:`runner.store` (layout, atomic writes): the loop
holds a store, so the store must not reach back into the loop.
"""
