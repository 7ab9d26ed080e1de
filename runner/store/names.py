"""Model names, parsed exactly as Ollama parses them (``types/model/name.go``).

A name is ``[host/][namespace/]model[:tag]``; missing parts take Ollama's defaults
(``registry.ollama.ai``, ``library``, ``latest``). The string is cut from the right: the tag after
the last ``:`` when that ``:`` comes after the last ``/``, then the model after the last ``/``,
then the namespace after the next ``/``; whatever is left is the host (a ``scheme://`` prefix
dropped). A separator with nothing on one side makes the name invalid.

Each part must match its pattern (so no part can be empty, ``.``, ``..``, or hold a separator,
which is what keeps a name inside the store's ``manifests/`` tree):

=========  ==========================================  ===========
part       pattern                                      length
=========  ==========================================  ===========
host       ``[A-Za-z0-9_][A-Za-z0-9_.:-]*``             1 to 350
namespace  ``[A-Za-z0-9_][A-Za-z0-9_-]*``               1 to 80
model      ``[A-Za-z0-9_][A-Za-z0-9_.-]*``              1 to 80
tag        ``[A-Za-z0-9_][A-Za-z0-9_.-]*``              1 to 80
=========  ==========================================  ===========
"""

from __future__ import annotations

import re
from dataclasses import dataclass

DEFAULT_HOST = "registry.ollama.ai"
DEFAULT_NAMESPACE = "library"
DEFAULT_TAG = "latest"

_PARTS = {
    "host": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.:\-]*"), 350),
    "namespace": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_\-]*"), 80),
    "model": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"), 80),
    "tag": (re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.\-]*"), 80),
}


class InvalidName(ValueError):
    """The string is not a model name by Ollama's rules."""


@dataclass(frozen=True)
class Name:
    host: str
    namespace: str
    model: str
    tag: str

    def parts(self) -> tuple[str, str, str, str]:
        """The manifest's path below ``manifests/``: host, namespace, model, tag."""
        return (self.host, self.namespace, self.model, self.tag)

    def display(self) -> str:
        """Ollama's ``DisplayShortest``: default host and namespace left out, the tag kept."""
        if self.host != DEFAULT_HOST:
            return f"{self.host}/{self.namespace}/{self.model}:{self.tag}"
        if self.namespace != DEFAULT_NAMESPACE:
            return f"{self.namespace}/{self.model}:{self.tag}"
        return f"{self.model}:{self.tag}"

    def __str__(self) -> str:
        return self.display()


def _cut_last(text: str, sep: str) -> tuple[str, str] | None:
    """(before, after) at the last ``sep``, or None; an empty side is invalid."""
    i = text.rfind(sep)
    if i < 0:
        return None
    before, after = text[:i], text[i + 1:]
    if not before or not after:
        raise InvalidName(text)
    return before, after


def parse_name(text: str) -> Name:
    """The :class:`Name` ``text`` spells, defaults filled in. Raises :class:`InvalidName`."""
    if not isinstance(text, str):
        raise InvalidName(repr(text))
    rest, tag = text, DEFAULT_TAG
    if rest.rfind(":") > rest.rfind("/"):
        cut = _cut_last(rest, ":")
        assert cut is not None
        rest, tag = cut
    host, namespace = DEFAULT_HOST, DEFAULT_NAMESPACE
    cut = _cut_last(rest, "/")
    if cut is None:
        model = rest
    else:
        rest, model = cut
        cut = _cut_last(rest, "/")
        if cut is None:
            namespace = rest
        else:
            host, namespace = cut
            host = host.split("://", 1)[-1]
    name = Name(host, namespace, model, tag)
    for kind, value in zip(_PARTS, name.parts()):
        pattern, longest = _PARTS[kind]
        if len(value) > longest or not pattern.fullmatch(value):
            raise InvalidName(text)
    return name


def is_name(text: str) -> bool:
    try:
        parse_name(text)
    except InvalidName:
        return False
    return True


def name_from_parts(parts: tuple[str, ...]) -> Name | None:
    """A manifest's path below ``manifests/`` as a Name, or None when it is not a valid one."""
    if len(parts) != 4:
        return None
    name = Name(*parts)
    try:
        return name if parse_name("/".join(parts[:3]) + ":" + parts[3]) == name else None
    except InvalidName:
        return None
