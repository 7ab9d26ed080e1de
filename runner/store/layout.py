"""Where things live in the model store, and the one check every store path goes through.

Ollama's layout (reference §7.1)::

    $OLLAMA_MODELS/manifests/<host>/<namespace>/<model>/<tag>   JSON manifest
    $OLLAMA_MODELS/blobs/sha256-<64 hex>                        content-addressed layers

Every path the store reads, writes or removes comes from :meth:`Layout.inside`, which proves it
lies inside ``OLLAMA_MODELS`` (after ``..`` and symbolic links are resolved). Names and digests are
validated before they become paths; this check is the second line, so that no future caller can
reach outside the store by accident.

A file is written under a fresh temporary name in its final folder (:meth:`Layout.temporary`)
and renamed into place when whole. Changes to the set of manifests, with the blob pruning that
follows them, hold the store's lock (:meth:`Layout.locked`), so that a prune never removes a blob
that a concurrent change has just named.
"""

from __future__ import annotations

import fcntl
import os
import re
import secrets
from contextlib import contextmanager
from pathlib import Path
from typing import Iterable, Iterator

from ..api import InvalidRequest
from .names import Name

_DIGEST = re.compile(r"^sha256[:-]([0-9a-fA-F]{64})$")


class OutsideStore(InvalidRequest):
    """A path built from a request would lie outside the model store."""


def digest_hex(digest: str) -> str | None:
    """The 64 lowercase hex digits of ``sha256:<hex>`` / ``sha256-<hex>``, or None."""
    match = _DIGEST.match(digest or "") if isinstance(digest, str) else None
    return match.group(1).lower() if match else None


class Layout:
    def __init__(self, root: Path, what: str = "model store") -> None:
        """``root``: the folder every path stays in; ``what``: its name in errors (the prompt
        store's disk tier checks its paths with a layout of its own)."""
        self.root = Path(root).expanduser()
        self.what = what

    def inside(self, *parts: str) -> Path:
        """``root/parts...``, proven to stay inside the store.

        Each part must be one plain path component (not empty, ``.`` or ``..``, no separator or
        NUL), and the path with symbolic links resolved must lie below the resolved root.
        Raises :class:`OutsideStore`.
        """
        for part in parts:
            self._component(part)
        root = self.root.resolve()
        path = root.joinpath(*parts)
        real = path.resolve()
        if real != root and root not in real.parents:
            raise OutsideStore(f"{'/'.join(parts)} lies outside the {self.what}")
        return path

    def entries(self, folder: tuple[str, ...], names: Iterable[str]) -> list[Path]:
        """``root/folder.../name`` for each of ``names``, the folder proven inside the store
        once (:meth:`inside`) and each name one plain component: for many files of one folder
        at once (the prompt store marks a conversation's pages used together). A name's own
        symbolic link is not resolved: use these paths only with calls that do not follow it
        (``os.utime(..., follow_symlinks=False)``, ``lstat``, ``unlink``)."""
        where = self.inside(*folder)
        out = []
        for name in names:
            self._component(name)
            out.append(where / name)
        return out

    def _component(self, part: str) -> None:
        """Raise :class:`OutsideStore` unless ``part`` is one plain path component (not empty,
        ``.`` or ``..``, no separator or NUL)."""
        if (not isinstance(part, str) or part in ("", ".", "..") or "/" in part
                or os.sep in part or "\x00" in part):
            raise OutsideStore(f"invalid {self.what} path component {part!r}")

    def recheck(self, path: Path) -> Path:
        """``path`` (one this layout made) checked again, just before it is written or removed."""
        try:
            parts = Path(path).relative_to(self.root.resolve()).parts
        except ValueError:
            raise OutsideStore(f"{path} lies outside the {self.what}") from None
        return self.inside(*parts)

    @property
    def manifests(self) -> Path:
        return self.inside("manifests")

    @property
    def blobs(self) -> Path:
        return self.inside("blobs")

    def manifest(self, name: Name) -> Path:
        return self.inside("manifests", *name.parts())

    def blob(self, digest: str) -> Path:
        """The blob file of ``digest`` (``sha256:<hex>`` or ``sha256-<hex>``). Raises
        :class:`OutsideStore` for anything else."""
        hex_digest = digest_hex(digest)
        if hex_digest is None:
            raise OutsideStore(f"invalid blob digest {digest!r}")
        return self.inside("blobs", f"sha256-{hex_digest}")

    def partial(self, digest: str) -> Path:
        """Where ``digest``'s download or upload grows until it is verified (``sha256-<hex>-partial``)."""
        hex_digest = digest_hex(digest)
        if hex_digest is None:
            raise OutsideStore(f"invalid blob digest {digest!r}")
        return self.inside("blobs", f"sha256-{hex_digest}-partial")

    def temporary(self, folder: Path, kind: str) -> Path:
        """A fresh name in ``folder`` (a store folder) for a file that is written whole, then
        renamed into place: ``.<kind>-<16 random hex>``, checked like every store path. Each
        writer gets its own, so writers of the same file never share (or remove) each other's."""
        return self.recheck(Path(folder) / f".{kind}-{secrets.token_hex(8)}")

    @contextmanager
    def locked(self) -> Iterator[None]:
        """Hold the store's change lock: an exclusive ``flock`` on ``.pollama-lock`` in the
        store's root. A manifest change (write, delete) and the blob pruning that follows it run
        under it. Threads and processes alike wait for it (each holder opens the file anew, and
        flock locks of separate opens exclude each other); it is not reentrant."""
        path = self.inside(".pollama-lock")
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    def relative_manifest(self, path: Path) -> tuple[str, ...]:
        """A manifest file's parts below ``manifests/`` (host, namespace, model, tag)."""
        return path.relative_to(self.manifests).parts
