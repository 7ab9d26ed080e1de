"""Commands that change the model store (pull, create, cp, rm, push), registered on the app.

Like ``list`` and ``show`` they work on OLLAMA_MODELS directly (no server needed); a running
``pollama serve`` sees the result at its next request.
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterator, List, Optional

import typer

import runner
from runner import config, store
from runner.model import ggufmeta
from runner.api import PollamaError
from runner.store.create import CreateSpec, create as create_model
from runner.store.modelfile import parse as parse_modelfile, read as read_modelfile
from runner.store.progress import Progress
from runner.remote.upstream import RemoteSpec, is_url
from runner.store.pull import pull as pull_model

from . import render
from .app import app


def _fail(message: str, code: int = 1) -> typer.Exit:
    render.error(message)
    return typer.Exit(code)


def show_progress(events: Iterator[Progress]) -> None:
    """Draw a store change's progress until it ends; its errors raise (PollamaError)."""
    with render.ProgressView() as view:
        try:
            for event in events:
                view.update(event.status, event.digest, event.total, event.completed)
        finally:
            if hasattr(events, "close"):
                events.close()


def pull_with_progress(cfg: config.Config, name: str, insecure: bool) -> None:
    show_progress(pull_model(cfg, name, insecure=insecure))


@app.command()
def pull(
    model: str = typer.Argument(..., help="Model to pull: [host[:port]/][namespace/]model[:tag]"),
    insecure: bool = typer.Option(False, "--insecure", help="Use an insecure registry (plain http)"),
) -> None:
    """Pull a model from a registry (registry.ollama.ai, hf.co, or your own)."""
    cfg = config.load()
    try:
        pull_with_progress(cfg, model, insecure)
    except PollamaError as err:
        raise _fail(str(err))
    except KeyboardInterrupt:
        raise typer.Exit(130)


@app.command()
def push(
    model: str = typer.Argument(..., help="Model to push"),
    insecure: bool = typer.Option(False, "--insecure", help="Use an insecure registry"),
) -> None:
    """Push a model to a registry (not supported: pollama does not publish models)."""
    raise _fail(f'push is not supported: pollama does not publish models (use "ollama push {model}")')


def spec_from_modelfile(name: str, path: Path) -> CreateSpec:
    """A create request from a Modelfile; FROM a path is relative to the Modelfile's folder.
    Raises PollamaError (a Modelfile that is not a regular file of at most 1 MiB included)."""
    parsed = parse_modelfile(read_modelfile(path))
    spec = CreateSpec(model=name, template=parsed.template, system=parsed.system,
                      parameters=parsed.parameters, messages=parsed.messages,
                      license=parsed.license or None)
    urls = [value for value, _ in parsed.froms if is_url(value)]
    if urls:  # a remote model: every FROM names an upstream (replicas)
        if len(urls) != len(parsed.froms):
            line = next(number for value, number in parsed.froms if not is_url(value))
            raise _fail(f"Modelfile line {line}: a remote model's FROM lines must all be http(s):// URLs")
        spec.remote = RemoteSpec(urls, parsed.upstream_model)
        return spec
    if parsed.upstream_model:
        raise _fail("PARAMETER upstream_model is for remote models (FROM http(s)://...)")
    model_from: tuple[str, int] | None = None
    for value, number in parsed.froms:  # a FROM that is a projector file names the projector
        found = path.parent / Path(value).expanduser()
        if found.is_file() and _is_projector_file(found):
            spec.projector_file = found
        else:
            model_from = (value, number)  # of the others, the last one wins
    if model_from is None:
        raise _fail(f"Modelfile line {parsed.from_line}: FROM {parsed.from_} is a vision projector: FROM the model too")
    if parsed.draft is not None:
        found = path.parent / Path(parsed.draft).expanduser()
        if store.looks_like_path(parsed.draft) or found.is_file():
            if not found.is_file():
                raise _fail(f"Modelfile line {parsed.draft_line}: DRAFT {parsed.draft}: no such file")
            spec.draft_file = found
        else:
            spec.draft_from = parsed.draft
    source, line = model_from
    candidate = path.parent / Path(source).expanduser()  # an absolute path stays as it is
    if store.is_default_name(source):
        spec.from_ = source
    elif store.looks_like_path(source) or candidate.is_file():
        if not candidate.is_file():
            raise _fail(f"Modelfile line {line}: FROM {source}: no such file")
        spec.from_file = candidate
    else:
        spec.from_ = source
    return spec


def _is_projector_file(path: Path) -> bool:
    try:
        return ggufmeta.read_gguf_header(path).architecture == "clip"
    except PollamaError:
        return False  # not a GGUF: the model's FROM, whose import says what is wrong


@app.command()
def create(
    model: str = typer.Argument(..., help="Name of the new model"),
    file: Optional[Path] = typer.Option(None, "--file", "-f", help='Name of the Modelfile (default "Modelfile")'),
    quantize: Optional[str] = typer.Option(None, "--quantize", "-q", help="Quantize the model (not supported)"),
) -> None:
    """Create a model from a Modelfile."""
    cfg = config.load()
    path = file or Path("Modelfile")
    try:
        spec = spec_from_modelfile(model, path)
        spec.quantize = quantize or ""
        show_progress(create_model(cfg, spec))
    except PollamaError as err:
        raise _fail(str(err))
    except KeyboardInterrupt:
        raise typer.Exit(130)


@app.command("cp")
def copy(
    source: str = typer.Argument(..., help="Model to copy"),
    destination: str = typer.Argument(..., help="New name"),
) -> None:
    """Copy a model (a new name for the same blobs)."""
    cfg = config.load()
    try:
        store.copy(cfg, source, destination)
    except PollamaError as err:
        raise _fail(str(err))
    print(f"copied '{source}' to '{destination}'")


@app.command("rm")
def remove(models: List[str] = typer.Argument(..., help="Models to remove")) -> None:
    """Remove models (and the blobs no other model uses)."""
    cfg = config.load()
    for name in models:
        try:
            store.delete(cfg, name)
        except PollamaError as err:
            raise _fail(str(err))
        print(f"deleted '{name}'")


def resolve_or_pull(cfg: config.Config, model: str | None, insecure: bool,
                    projector: str | None = None) -> runner.ResolvedModel:
    """``pollama run NAME``: :func:`runner.resolve`, the model pulled first when the store does
    not have it (Ollama's behaviour; a path or the default model is never pulled)."""
    try:
        return runner.resolve(model, cfg, projector=projector)
    except PollamaError as err:
        missing = isinstance(err, store.ModelNotFound)
        if not (missing and model and store.is_name(model) and not store.is_default_name(model)
                and not store.looks_like_path(model)):
            raise
    pull_with_progress(cfg, model, insecure)
    return runner.resolve(model, cfg, projector=projector)
