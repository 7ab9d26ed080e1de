"""Image files named in a prompt, as Ollama's ``run`` finds them (cmd/interactive.go's
``extractFileNames`` / ``normalizeFilePath``): a path that starts with ``/``, ``./``, ``~/``, ``\\``
or a drive letter and ends in ``.png``, ``.jpg``, ``.jpeg`` or ``.webp`` (any case), with escaped
(``\\ ``) or ``%20`` spaces, or wrapped in quotes. Each image found is attached to the message
and its path taken out of the text.

Unlike Ollama (which skips a path it cannot open), a named image that does not exist is an error:
one line, and the turn is not sent. On a model without vision the prompt is left as it is, unless
it names an image file that exists: that is the clear "no vision" error.
"""

from __future__ import annotations

import os
import re

from runner.api import Image, NoVision
from runner.images import read_image_file

# Ollama's pattern, plus ``~/``, and not inside a word or URL ("https://x/a.png", "1/2.png").
IMAGE_PATH = re.compile(r"(?<![\w:/.~\\])(?:[a-zA-Z]:)?(?:\./|~/|/|\\)[\S\\ ]+?\.(?i:jpg|jpeg|png|webp)\b")
_ESCAPES = {"\\ ": " ", "\\(": "(", "\\)": ")", "\\[": "[", "\\]": "]", "\\{": "{", "\\}": "}",
            "\\$": "$", "\\&": "&", "\\;": ";", "\\'": "'", "\\\\": "\\", "\\*": "*", "\\?": "?",
            "\\~": "~", "%20": " "}
_ESCAPE = re.compile("|".join(re.escape(k) for k in _ESCAPES))


def normalize_path(path: str) -> str:
    """Undo the shell escapes a pasted or dragged-in path carries (one pass, left to right)."""
    return _ESCAPE.sub(lambda m: _ESCAPES[m.group(0)], path)


def find_paths(text: str) -> list[str]:
    """The image paths ``text`` names, as written. A match that names no file (unescaped spaces
    make the pattern start too early: "see /tmp and ./x.png") gives way to the longest match
    inside it that does, else to the shortest one (the path the message names)."""
    out = []
    for match in IMAGE_PATH.finditer(text):
        candidates = [match.group(0)]
        while (inner := IMAGE_PATH.search(candidates[-1], 1)) is not None:
            candidates.append(inner.group(0))
        existing = [c for c in candidates if os.path.isfile(os.path.expanduser(normalize_path(c)))]
        out.append(existing[0] if existing else candidates[-1])
    return out


def attach_images(text: str, vision: bool) -> tuple[str, list[Image], list[str]]:
    """``text`` without the image paths it names, the images read from them, and the paths (for
    "Added image" lines). Raises InvalidRequest (a missing or unreadable file, not an image) or
    NoVision (an existing image for a model without vision)."""
    found = find_paths(text)
    if not vision:
        if any(os.path.isfile(os.path.expanduser(normalize_path(p))) for p in found):
            raise NoVision()
        return text, [], []
    images: list[Image] = []
    added: list[str] = []
    for written in found:
        path = normalize_path(written)
        images.append(read_image_file(path))
        added.append(path)
        for quoted in (f"'{path}'", f"'{written}'", f'"{path}"', f'"{written}"', written):
            text = text.replace(quoted, "")
    return text.strip(), images, added
