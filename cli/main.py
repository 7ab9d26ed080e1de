"""The ``pollama`` command line. Presentation only: everything else is ``runner``."""

from __future__ import annotations

import logging
import sys
import time
from typing import List, Optional

import typer

import runner
from runner import config, prepare, store
from runner.api import Message, PollamaError, Request, coerce_option

from . import render
from .app import app
from .chat import Session, attach_images, repl, stream_response

def _setup_logging(cfg: config.Config) -> None:
    level = logging.DEBUG if cfg.debug else logging.WARNING
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    if cfg.debug < 2:  # the native libraries' chatter only at OLLAMA_DEBUG=2
        for native in ("llama.cpp", "ggml"):
            logging.getLogger(native).setLevel(logging.WARNING)


def _fail(message: str, code: int = 1) -> "typer.Exit":
    render.error(message)
    return typer.Exit(code)


def _parse_options(pairs: list[str]) -> dict:
    values: dict = {}
    for pair in pairs:
        name, sep, raw = pair.partition("=")
        name = name.strip()
        if not sep or not name:
            raise _fail(f"invalid option {pair!r}: use NAME=VALUE")
        try:
            value = coerce_option(name, raw)
        except PollamaError as err:
            raise _fail(str(err))
        if name == "stop":
            values.setdefault("stop", []).extend(value)
        else:
            values[name] = value
    return values


def _split_model_and_prompt(args: list[str], cfg: config.Config) -> tuple[str | None, list[str]]:
    """``run [MODEL] [PROMPT...]``: the first word is the model when it can name one.

    A first word that names a model (the default's name, a .gguf path, anything that parses as a
    store name by Ollama's rules, a registry host with a port included) is the model, and so is a
    single word with a ``/`` in it that fails to parse (``host/../../x``): it was meant as a name,
    and resolving it gives the user the invalid-name error instead of a chat about it. Anything
    else (it has spaces, say) starts the prompt and the default model runs.
    """
    if not args:
        return None, []
    first = args[0]
    if first == "":
        return None, args[1:]
    if store.is_default_name(first) or store.looks_like_path(first) or store.is_name(first):
        return first, args[1:]
    if "/" in first and not any(c.isspace() for c in first):
        return first, args[1:]
    return None, args


@app.command(context_settings={"allow_interspersed_args": True})
def run(
    args: Optional[List[str]] = typer.Argument(None, metavar="[MODEL] [PROMPT]...",
                                               help="Model (default smollm2:135m) and prompt"),
    verbose: bool = typer.Option(False, "--verbose", help="Show timings for the response"),
    nowordwrap: bool = typer.Option(False, "--nowordwrap", help="Don't wrap words to the next line automatically"),
    format: Optional[str] = typer.Option(None, "--format", help='Response format (e.g. "json")'),
    think: bool = typer.Option(False, "--think", help="Enable thinking (--think=high|medium|low for a level, "
                                                      "--think=false to turn it off)"),
    think_level: Optional[str] = typer.Option(None, "--think-level", hidden=True),
    hidethinking: bool = typer.Option(False, "--hidethinking", help="Think, but don't show the thinking"),
    option: List[str] = typer.Option([], "--option", "-o", metavar="NAME=VALUE",
                                     help="Model option, e.g. -o num_ctx=8192 -o temperature=0 (repeatable)"),
    insecure: bool = typer.Option(False, "--insecure", help="Use an insecure registry when the model is pulled"),
    mmproj: Optional[str] = typer.Option(None, "--mmproj", metavar="PROJ.gguf",
                                         help="Vision projector for a .gguf model (llama.cpp's flag): "
                                              "image paths in the prompt are attached"),
) -> None:
    """Run a model: a chat REPL on a terminal, or a one-shot answer to PROMPT (or piped stdin).
    Image files named in the prompt (./cat.png, ~/a.jpg) go to a model with vision."""
    t0 = time.perf_counter_ns()  # a one-shot's total_duration counts its load, as Ollama's does
    cfg = config.load()
    _setup_logging(cfg)
    if format not in (None, "", "json"):
        raise _fail(f'invalid format "{format}": only "json" is supported')
    name, words = _split_model_and_prompt(list(args or []), cfg)
    user_options = _parse_options(option)
    from .store_cmds import resolve_or_pull

    try:
        given = (think_level or "true") if think_level is not None else True if think else None  # bare --think=: on
        thinks = prepare.think_level(given, "--think")
        model = resolve_or_pull(cfg, name, insecure, mmproj)
        options = prepare.options(model, user_options)
    except PollamaError as err:
        raise _fail(str(err))
    except KeyboardInterrupt:
        raise typer.Exit(130)
    prompts = list(words)
    interactive = True
    if not sys.stdin.isatty():
        piped = sys.stdin.read()
        prompts = [piped] + prompts if piped else prompts
        interactive = False
    if prompts:
        interactive = False
    if not sys.stdout.isatty():
        interactive = False
    try:
        with render.Spinner(enabled=interactive or None):
            loaded = runner.load(model, options, cfg)
    except PollamaError as err:
        raise _fail(str(err))
    try:
        if interactive:
            session = Session(model=model, runner=loaded, options={**model.defaults.params, **user_options},
                              verbose=verbose, wordwrap=not nowordwrap, format=format or None,
                              system=model.defaults.system, think=thinks, hide_thinking=hidethinking)
            session.check_think(thinks)
            session.print_history()
            repl(session, nohistory=cfg.nohistory)
            loaded = session.runner
            return
        text = " ".join(prompts)
        if not text.strip():
            prepare.prepare(model, Request(think=thinks), user_options)  # what a turn would refuse
            return  # nothing to say: the model was loaded (Ollama's preload), done
        text, images = attach_images(text, model.info.vision)
        writer = render.StreamWriter(wordwrap=not nowordwrap)
        if model.defaults.messages:  # the model's MESSAGEs start the conversation: a chat turn
            request = Request(messages=[Message("user", text, images=images)], format=format or None, think=thinks)
        else:
            request = Request(prompt=text, images=images, format=format or None, think=thinks)
        prepare.prepare(model, request, user_options)
        _, final, _ = stream_response(loaded.stream(request), writer, hidethinking)
        if verbose and final is not None and final.metrics is not None:
            final.metrics.load_duration = loaded.load_duration
            final.metrics.total_duration = time.perf_counter_ns() - t0
            render.print_metrics(final.metrics, loaded.engine, loaded.offload.devices)
    except PollamaError as err:
        raise _fail(str(err))
    except KeyboardInterrupt:
        raise typer.Exit(130)
    finally:
        loaded.close()


@app.command("list")
def list_models(prefix: Optional[str] = typer.Argument(None, help="Only models whose name starts with this")) -> None:
    """List models: the default model and those in the model store (OLLAMA_MODELS)."""
    from .tables import list_table

    cfg = config.load()
    rows = []
    try:
        default = store.lookup(None, cfg)
        rows.append(default)
    except PollamaError:
        pass
    rows.extend(store.list_models(cfg))
    if prefix:
        rows = [m for m in rows if m.name.startswith(prefix)]
    print(list_table(rows))


@app.command()
def show(
    model: str = typer.Argument(..., help="Model name or .gguf path"),
    license: bool = typer.Option(False, "--license", help="Show license of a model"),
    modelfile: bool = typer.Option(False, "--modelfile", help="Show Modelfile of a model"),
    parameters: bool = typer.Option(False, "--parameters", help="Show parameters of a model"),
    template: bool = typer.Option(False, "--template", help="Show template of a model"),
    system: bool = typer.Option(False, "--system", help="Show system message of a model"),
    verbose: bool = typer.Option(False, "--verbose", "-v", help="Show all metadata"),
) -> None:
    """Show information about a model (read from the store and its GGUF; no server needed)."""
    from runner.store.modelfile import show as shown_of

    from .tables import show_text

    flags = [name for name, on in (("license", license), ("modelfile", modelfile), ("parameters", parameters),
                                   ("template", template), ("system", system)) if on]
    if len(flags) > 1:
        raise _fail("only one of '--license', '--modelfile', '--parameters', '--system', or '--template' can be specified")
    cfg = config.load()
    try:
        resolved = runner.resolve(model, cfg)
    except PollamaError as err:
        raise _fail(str(err))
    stored, info = resolved.stored, resolved.info
    if flags == ["template"]:  # the template prompts are rendered with, whichever kind it is
        print(resolved.template.show())
        return
    if flags:
        shown = shown_of(store.Layout(cfg.models), stored, info.chat_template or "",
                         str(info.metadata.get("general.license") or ""))
        text = getattr(shown, flags[0])
        if text:
            print(text)
        elif flags[0] == "system":
            print("No system message was specified for this model.")
        return
    try:
        devices = runner.placement(resolved, prepare.options(resolved, None), cfg).devices
    except PollamaError as err:
        devices = f"unknown ({err})"
    print(show_text(resolved, verbose, devices))



# after run, list and show, so that --help lists those first
from . import server_cmds  # noqa: E402,F401  (registers serve, ps, stop on the app)
from . import store_cmds  # noqa: E402,F401  (registers pull, push, create, cp, rm on the app)


def main() -> None:
    """The ``pollama`` command. ``--think=LEVEL`` is Ollama's spelling of an optional value, which
    click cannot parse without eating the next word (the prompt) after a bare ``--think``: it is
    passed on as ``--think-level``. A malformed environment variable (whichever command reads it
    first) ends the command with one line naming it. Under ``python -m cli.main`` this module is
    ``__main__``; its commands register on :data:`cli.app.app` all the same, the one app called here."""
    args = [("--think-level=" + a[len("--think="):]) if a.startswith("--think=") else a for a in sys.argv[1:]]
    try:
        app(args=args, prog_name="pollama")
    except config.ConfigError as err:  # a malformed environment variable: one line, not a traceback
        render.error(str(err))
        sys.exit(1)


if __name__ == "__main__":
    main()
