"""The Modelfile (reference §7.2): parsed into what ``/api/create`` takes.

One instruction per line, the keyword in any case; ``#`` starts a comment line::

    FROM <store name | path to a .gguf, relative to the Modelfile>
    FROM <path to a vision projector .gguf>   (another FROM: the model's ``projector`` layer)
    FROM <http(s):// URL of an upstream server>   (a remote model; several FROM URLs: replicas)
    PARAMETER <name> <value>        (repeatable; several ``stop`` lines accumulate)
    PARAMETER upstream_model <name> (a remote model: the model's name on its upstream)
    TEMPLATE <text>                 (Ollama's Go template)
    SYSTEM <text>
    MESSAGE <system|user|assistant> <text>
    LICENSE <text>                  (repeatable)
    DRAFT <path to a .gguf | store name>   (a draft model: the model's ``draft`` layer)
    ADAPTER <path>                  (refused: pollama applies no LoRA adapters)

A text is the rest of the line, a ``"quoted"`` string, or a ``\"\"\"`` block that may span lines.
Any error names its line: ``Modelfile line 3: ...``.

A Modelfile is read (:func:`read`) only when it is a regular file of at most
:data:`MAX_MODELFILE_BYTES` (1 MiB): ``-f /dev/zero`` or ``-f`` a FIFO is refused at once instead
of filling memory or waiting forever. Real ones are far smaller: a chat template is a few KiB (the
longest, with tools, some tens of KiB), a long SYSTEM prompt or license text tens of KiB.
"""

from __future__ import annotations

import errno
import io
import json
import os
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator

from ..api import InvalidRequest, coerce_option

if TYPE_CHECKING:
    from . import StoredModel
    from .layout import Layout

COMMANDS = ("from", "parameter", "template", "system", "message", "license", "adapter", "draft")
ROLES = ("system", "user", "assistant")


class ModelfileError(InvalidRequest):
    """A Modelfile that cannot be read; the message names the line."""


@dataclass
class Modelfile:
    from_: str = ""
    from_line: int = 0
    froms: list[tuple[str, int]] = field(default_factory=list)  # every FROM (value, line): the
    # CLI tells a projector file (a clip GGUF) from the model; of the others, the last one wins
    parameters: dict[str, Any] = field(default_factory=dict)
    template: str | None = None
    system: str | None = None
    messages: list[dict[str, str]] = field(default_factory=list)
    license: list[str] = field(default_factory=list)
    upstream_model: str = ""  # PARAMETER upstream_model: a remote model's name on its upstream
    draft: str | None = None  # DRAFT: a draft model (runner.loop.draftmodel), a path or a store name
    draft_line: int = 0


UPSTREAM_MODEL = "upstream_model"
MAX_MODELFILE_BYTES = 1 << 20


def read(path: Path) -> str:
    """The text of the Modelfile at ``path``: a regular file of UTF-8 text, at most
    :data:`MAX_MODELFILE_BYTES`, newlines as Python's text mode reads them. Raises ModelfileError
    (``cannot read PATH: ...``) for anything else, at once: a FIFO or a device is never read."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO's open never waits
    except OSError as err:
        raise ModelfileError(f"cannot read {path}: {err.strerror or err}") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = os.strerror(errno.EISDIR) if stat.S_ISDIR(mode) else "not a regular file"
            raise ModelfileError(f"cannot read {path}: {kind}")
        chunks: list[bytes] = []
        size = 0
        while size <= MAX_MODELFILE_BYTES:
            chunk = os.read(fd, MAX_MODELFILE_BYTES + 1 - size)
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
    except OSError as err:
        raise ModelfileError(f"cannot read {path}: {err.strerror or err}") from None
    finally:
        os.close(fd)
    if size > MAX_MODELFILE_BYTES:
        raise ModelfileError(f"cannot read {path}: larger than 1 MiB (a Modelfile is text: "
                             "FROM a .gguf file rather than pasting one in)")
    try:
        text = b"".join(chunks).decode("utf-8")
    except UnicodeDecodeError:
        raise ModelfileError(f"cannot read {path}: not UTF-8 text") from None
    return io.StringIO(text, newline=None).read()  # \r\n and \r become \n, as in text mode


def _error(line: int, message: str) -> ModelfileError:
    return ModelfileError(f"Modelfile line {line}: {message}")


def _text(rest: str, number: int, lines: Iterator[tuple[int, str]]) -> str:
    """The value at the start of ``rest``: a \"\"\" block (more lines taken from ``lines``), a
    quoted string, or the rest of the line."""
    rest = rest.strip()
    if rest.startswith('"""'):
        body = rest[3:]
        if '"""' in body:
            text, _, after = body.partition('"""')
            if after.strip():
                raise _error(number, f'unexpected text after the closing """: {after.strip()!r}')
            return text
        parts = [body]
        for _, line in lines:
            if '"""' in line:
                text, _, after = line.partition('"""')
                if after.strip():
                    raise _error(number, f'unexpected text after the closing """: {after.strip()!r}')
                parts.append(text)
                return "\n".join(parts)
            parts.append(line)
        raise _error(number, 'unterminated """ (no closing """ before the end of the file)')
    if len(rest) >= 2 and rest.startswith('"') and rest.endswith('"'):
        return rest[1:-1].replace('\\"', '"')
    return rest


def parse(text: str) -> Modelfile:
    """Parse a Modelfile's text. Raises ModelfileError naming the line."""
    out = Modelfile()
    lines = iter(enumerate(text.replace("\r\n", "\n").split("\n"), start=1))
    for number, line in lines:
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        keyword, _, rest = stripped.partition(" ")
        if "\t" in keyword:
            keyword, _, more = keyword.partition("\t")
            rest = more + " " + rest
        command = keyword.lower()
        if command not in COMMANDS:
            raise _error(number, f'unknown instruction "{keyword}": use one of '
                         + ", ".join(c.upper() for c in COMMANDS))
        if command == "parameter":
            name, _, value = rest.strip().partition(" ")
            if not name or not value.strip():
                raise _error(number, "PARAMETER needs a name and a value")
            raw = _text(value, number, lines)
            if name == UPSTREAM_MODEL:
                out.upstream_model = raw.strip()
                continue
            try:
                coerced = coerce_option(name, raw)
            except InvalidRequest as err:
                raise _error(number, str(err)) from None
            if name == "stop":
                out.parameters.setdefault("stop", []).extend(coerced)
            else:
                out.parameters[name] = coerced
            continue
        if command == "message":
            role, _, content = rest.strip().partition(" ")
            if role.lower() not in ROLES:
                raise _error(number, f'message role must be one of "system", "user", or "assistant", not "{role}"')
            out.messages.append({"role": role.lower(), "content": _text(content, number, lines)})
            continue
        value = _text(rest, number, lines)
        if command == "from":
            if not value:
                raise _error(number, "FROM needs a model name or a .gguf path")
            out.from_, out.from_line = value, number
            out.froms.append((value, number))
        elif command == "template":
            out.template = value
        elif command == "system":
            out.system = value
        elif command == "license":
            out.license.append(value)
        elif command == "draft":
            if not value:
                raise _error(number, "DRAFT needs a .gguf path or a model name")
            out.draft, out.draft_line = value, number
        elif command == "adapter":
            raise _error(number, "ADAPTER is not supported: pollama does not apply LoRA adapters")
    if not out.from_:
        raise ModelfileError("Modelfile has no FROM line")
    return out


# ------------------------------------------------------------------------- the other way
@dataclass
class Shown:
    """A model as ``show`` prints it (``pollama show --modelfile`` and ``/api/show``)."""

    modelfile: str
    parameters: str
    template: str
    system: str
    license: str
    messages: list[dict[str, str]]


def _quoted(text: str) -> str:
    return f'"""{text}"""'


def parameters_text(params: dict[str, Any]) -> str:
    """Ollama's ``parameters`` text: one ``name value`` line per value (``stop`` repeats)."""
    lines = []
    for name, value in params.items():
        for item in value if isinstance(value, list) else [value]:
            shown = json.dumps(item) if isinstance(item, str) else str(item).lower() if isinstance(item, bool) else item
            lines.append(f"{name:<30} {shown}")
    return "\n".join(lines)


def show(layout: "Layout", stored: "StoredModel", chat_template: str, gguf_license: str = "") -> Shown:
    """What ``show`` says of a model: its layers, else the GGUF's own template and license."""
    from . import model_defaults

    defaults = model_defaults(stored)
    licenses = _licenses(layout, stored) or ([gguf_license] if gguf_license else [])
    template = defaults.template or chat_template or ""
    lines = [
        '# Modelfile generated by "pollama show"',
        "# To build a new Modelfile based on this, replace FROM with:",
        f"# FROM {stored.name}",
        "",
    ]
    if stored.remote is not None:  # a remote model: its upstreams, and its name there
        lines += [f"FROM {url}" for url in stored.remote.hosts]
        lines.append(f"PARAMETER upstream_model {stored.remote.model}")
    else:
        lines.append(f"FROM {stored.path}")
    if "projector" in stored.layers:
        lines.append(f"FROM {stored.layers['projector']}")
    if "draft" in stored.layers:
        lines.append(f"DRAFT {stored.layers['draft']}")
    if template:
        lines.append(f"TEMPLATE {_quoted(template)}")
    if defaults.system:
        lines.append(f"SYSTEM {_quoted(defaults.system)}")
    for name, value in defaults.params.items():
        for item in value if isinstance(value, list) else [value]:
            lines.append(f"PARAMETER {name} {json.dumps(item) if isinstance(item, str) else item}")
    for message in defaults.messages:
        lines.append(f"MESSAGE {message.role} {_quoted(message.content)}")
    for text in licenses:
        lines.append(f"LICENSE {_quoted(text)}")
    return Shown(
        modelfile="\n".join(lines) + "\n",
        parameters=parameters_text(defaults.params),
        template=template,
        system=defaults.system or "",
        license="\n".join(licenses),
        messages=[{"role": m.role, "content": m.content} for m in defaults.messages],
    )


def _licenses(layout: "Layout", stored: "StoredModel") -> list[str]:
    """Every license layer's text (a model may carry several), in manifest order."""
    out: list[str] = []
    if stored.manifest is None:
        return out
    for layer in stored.manifest.get("layers") or []:
        if isinstance(layer, dict) and layer.get("mediaType") == "application/vnd.ollama.image.license":
            try:
                out.append(layout.blob(str(layer.get("digest", ""))).read_text())
            except (OSError, ValueError, InvalidRequest):
                continue
    return out
