"""The REPL (reference §4.3): prompt-toolkit input, history, \"\"\" multi-line, slash commands, Ctrl-C."""

from __future__ import annotations

import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Iterator

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings

import runner
from runner.api import Chunk, InvalidRequest, Message, Options, PollamaError, Request, coerce_option
from runner.template.features import features

from . import imagefiles, render

HELP = """Available Commands:
  /set            Set session variables
  /show           Show model information
  /load <model>   Load a session or model
  /save <model>   Save your current session
  /clear          Clear session context
  /bye            Exit
  /?, /help       Help for a command
  /? shortcuts    Help for keyboard shortcuts

Use \"\"\" to begin a multi-line message.
"""

HELP_SET = """Available Commands:
  /set parameter ...     Set a parameter
  /set system <string>   Set system message
  /set history           Enable history
  /set nohistory         Disable history
  /set wordwrap          Enable wordwrap
  /set nowordwrap        Disable wordwrap
  /set format json       Enable JSON mode
  /set noformat          Disable formatting
  /set verbose           Show LLM stats
  /set quiet             Disable LLM stats
  /set think [level]     Enable thinking (level: high, medium or low)
  /set nothink           Disable thinking
"""

HELP_PARAMETERS = """Available Parameters:
  /set parameter seed <int>             Random number seed
  /set parameter num_predict <int>      Max number of tokens to predict
  /set parameter top_k <int>            Pick from top k num of tokens
  /set parameter top_p <float>          Pick token based on sum of probabilities
  /set parameter min_p <float>          Pick token based on top token probability * min_p
  /set parameter num_ctx <int>          Set the context size
  /set parameter num_keep <int>         Tokens to keep when the context shifts
  /set parameter temperature <float>    Set creativity level
  /set parameter repeat_penalty <float> How strongly to penalize repetitions
  /set parameter repeat_last_n <int>    Set how far back to look for repetitions
  /set parameter stop <string> <string> ...   Set the stop parameters
"""

HELP_SHOW = """Available Commands:
  /show info         Show details for this model
  /show parameters   Show parameters for this model
  /show system       Show system message
  /show template     Show prompt template
"""

HELP_SHORTCUTS = """Available keyboard shortcuts:
  Ctrl + a            Move to the beginning of the line (Home)
  Ctrl + e            Move to the end of the line (End)
   Alt + b            Move back (left) one word
   Alt + f            Move forward (right) one word
  Ctrl + k            Delete the sentence after the cursor
  Ctrl + u            Delete the sentence before the cursor
  Ctrl + w            Delete the word before the cursor

  Ctrl + l            Clear the screen
  Ctrl + c            Stop the model from responding
  Ctrl + d            Exit ollama (/bye)
"""

PARAMETER_NAMES = (
    "num_ctx", "num_keep", "num_predict", "temperature", "top_k", "top_p", "min_p", "seed",
    "repeat_penalty", "repeat_last_n", "stop",
)


class _EmptyInterrupt(Exception):
    """Ctrl-C on an empty line."""


def stream_response(chunks: Iterator[Chunk], writer: render.StreamWriter,
                    hide_thinking: bool = False) -> tuple[str, Chunk | None, str]:
    """Print a streamed answer (spinner until the first token), its reasoning dimmed between
    "Thinking..." and "...done thinking." unless ``hide_thinking``; return the answer's text,
    the last chunk and the reasoning."""
    parts: list[str] = []
    thoughts: list[str] = []
    final = None
    thinking = False
    spinner = render.Spinner().start()
    try:
        for chunk in chunks:
            if chunk.thinking:
                thoughts.append(chunk.thinking)
                if not hide_thinking:
                    spinner.stop()
                    if not thinking:
                        writer.write_dim("Thinking...\n")
                        thinking = True
                    writer.write_dim(chunk.thinking)
            if chunk.text:
                spinner.stop()
                if thinking:
                    writer.write_dim("\n...done thinking.\n\n")
                    thinking = False
                writer.write(chunk.text)
                parts.append(chunk.text)
            if chunk.done:
                final = chunk
    finally:
        spinner.stop()
        if hasattr(chunks, "close"):
            chunks.close()  # cancels the sequence when we stop early (Ctrl-C)
    if thinking:
        writer.write_dim("\n...done thinking.\n\n")
    writer.end()
    return "".join(parts), final, "".join(thoughts)


def parse_think(value: str | None) -> bool | str | None:
    """``--think`` (true), ``--think=high|medium|low``, ``--think=false``; None when not given.
    Raises PollamaError for anything else."""
    if value is None:
        return None
    level = value.strip().lower()
    if level in ("true", ""):
        return True
    if level == "false":
        return False
    if level in ("high", "medium", "low"):
        return level
    raise InvalidRequest(f"invalid value for --think: {value!r} (use high, medium or low)")


def attach_images(text: str, vision: bool) -> tuple[str, list]:
    """The prompt without the image paths it names and the images, with Ollama's "Added image"
    line for each on stderr. Raises PollamaError (one line) for a missing file or no vision."""
    text, images, paths = imagefiles.attach_images(text, vision)
    for path in paths:
        render.notice(f"Added image '{path}'")
    return text, images


def check_think(model: str | None, loaded: runner.Runner, think: bool | str | None) -> None:
    """Refuse ``think`` for a model that does not reason (Ollama's message)."""
    if think not in (None, False) and features(runner.model_template(loaded.info)).thinking is None:
        raise InvalidRequest(f'"{model or loaded.info.name}" does not support thinking')


@dataclass
class Session:
    model: str | None
    runner: runner.Runner
    options: dict = field(default_factory=dict)  # user-set parameters, by name
    system: str | None = None
    messages: list[Message] = field(default_factory=list)
    verbose: bool = False
    wordwrap: bool = True
    format: str | None = None
    think: bool | str | None = None
    hide_thinking: bool = False
    projector: str | None = None  # --mmproj: the vision projector of the model given by path
    load: Callable[..., runner.Runner] = runner.load

    def print_history(self) -> None:
        """The conversation so far (a model's MESSAGEs), as Ollama shows it at the start."""
        for message in self.messages:
            if message.role == "user":
                print(f">>> {message.content}")
            elif message.role == "assistant":
                print(f"{message.content}\n")

    def request_options(self) -> Options:
        return Options().merged(self.options)

    def chat(self, text: str) -> None:
        msgs = list(self.messages)
        if self.system:
            msgs = [Message("system", self.system)] + [m for m in msgs if m.role != "system"]
        text, images = attach_images(text, self.runner.info.vision)
        msgs.append(Message("user", text, images=images))
        request = Request(messages=msgs, options=self.request_options(), format=self.format, think=self.think)
        writer = render.StreamWriter(wordwrap=self.wordwrap)
        answer, final, thought = stream_response(self.runner.chat(request), writer, self.hide_thinking)
        self.messages.append(Message("user", text, images=images))
        self.messages.append(Message("assistant", answer, thinking=thought))
        if self.verbose and final is not None and final.metrics is not None:
            render.print_metrics(final.metrics, self.runner.engine)

    # --------------------------------------------------------------------------- commands
    def command(self, line: str) -> bool:
        """Run a slash command; False means exit."""
        words = line.split()
        cmd, args = words[0], words[1:]
        if cmd in ("/bye", "/exit"):
            return False
        if cmd in ("/?", "/help"):
            topic = args[0] if args else ""
            print({"set": HELP_SET, "/set": HELP_SET, "show": HELP_SHOW, "/show": HELP_SHOW,
                   "shortcuts": HELP_SHORTCUTS}.get(topic, HELP))
        elif cmd == "/set":
            self._set(line, args)
        elif cmd == "/show":
            self._show(args)
        elif cmd == "/clear":
            self.messages = []
            print("Cleared session context")
        elif cmd == "/load":
            self._load(args)
        elif cmd == "/save":
            self._save(args)
        else:
            print(f"Unknown command '{cmd}'. Type /? for help")
        return True

    def _set(self, line: str, args: list[str]) -> None:
        if not args:
            print(HELP_SET)
            return
        what = args[0]
        if what == "parameter":
            if len(args) < 3:
                print(HELP_PARAMETERS)
                return
            name = args[1]
            try:
                values = shlex.split(line.split(name, 1)[1]) if name == "stop" else args[2:]
            except ValueError:
                values = args[2:]
            if name not in PARAMETER_NAMES:
                print(f"Couldn't set parameter: unknown parameter '{name}'")
                return
            try:
                value = coerce_option(name, values if name == "stop" else values[0])
            except PollamaError as err:
                print(f"Couldn't set parameter: {err}")
                return
            if name == "num_ctx" and value != self.options.get("num_ctx"):
                try:
                    new = self.load(self.model, Options().merged({**self.options, "num_ctx": value}),
                                    projector=self.projector)
                except PollamaError as err:
                    print(f"Couldn't set parameter: {err}")
                    return
                self.runner.close()
                self.runner = new
            self.options[name] = value
            shown = ", ".join(repr(v) for v in value) if name == "stop" else values[0]
            print(f"Set parameter '{name}' to '{shown}'")
        elif what == "system":
            text = line.split("system", 1)[1].strip()
            if text.startswith('"""') and text.endswith('"""') and len(text) >= 6:
                text = text[3:-3].strip()
            self.system = text or None
            print("Set system message.")
        elif what in ("verbose", "quiet"):
            self.verbose = what == "verbose"
            print("Set 'verbose' mode." if self.verbose else "Set 'quiet' mode.")
        elif what in ("wordwrap", "nowordwrap"):
            self.wordwrap = what == "wordwrap"
            print("Set 'wordwrap' mode." if self.wordwrap else "Set 'nowordwrap' mode.")
        elif what == "format":
            if len(args) > 1 and args[1] == "json":
                self.format = "json"
                print("Set format to 'json' mode.")
            else:
                print(f"Invalid or missing format. For 'json' mode use '/set format json'")
        elif what == "noformat":
            self.format = None
            print("Disabled format.")
        elif what in ("think", "nothink"):
            try:
                think = parse_think(args[1] if len(args) > 1 else "true") if what == "think" else False
                check_think(self.model, self.runner, think)
            except PollamaError as err:
                print(f"Couldn't set think: {err}")
                return
            self.think = think
            level = f" (level {think})" if isinstance(think, str) else ""
            print(f"Set 'think' mode{level}." if think else "Set 'nothink' mode.")
        elif what in ("history", "nohistory"):
            print(f"Set '{what}' mode.")
        else:
            print(f"Unknown command '/set {what}'. Type /? for help")

    def _show(self, args: list[str]) -> None:
        info = self.runner.info
        what = args[0] if args else ""
        if what == "info":
            rows = [
                ("architecture", info.architecture),
                ("parameters", info.metadata.get("general.size_label") or "unknown"),
                ("context length", info.context_length),
                ("embedding length", info.embedding_length),
                ("quantization", info.quantization),
                ("template", runner.model_template(info).describe()),
            ]
            print("  Model")
            for key, value in rows:
                print(f"    {key:<20}{value}")
            print(f"\n  Runner\n    {'engine':<20}{self.runner.engine}\n    {'num_ctx':<20}{self.runner.num_ctx}\n")
        elif what == "parameters":
            if not self.options:
                print("No parameters were specified for this model.")
            else:
                print("User defined parameters:")
                for name, value in self.options.items():
                    shown = " ".join(value) if isinstance(value, list) else value
                    print(f"{name:<15} {shown}")
        elif what == "system":
            print(self.system or "No system message was specified for this model.")
        elif what == "template":
            print(runner.model_template(info).show())
        else:
            print(HELP_SHOW)

    def _save(self, args: list[str]) -> None:
        """A new model: this one, with the session's system message, parameters and conversation."""
        from runner import config, store
        from runner.store.create import CreateSpec, create

        if len(args) != 1:
            print("Usage:\n  /save <modelname>")
            return
        spec = CreateSpec(model=args[0], system=self.system, parameters=dict(self.options),
                          messages=[{"role": m.role, "content": m.content} for m in self.messages])
        if self.model and store.looks_like_path(self.model) and not store.is_default_name(self.model):
            spec.from_file = Path(self.model).expanduser()
        else:
            spec.from_ = self.model or store.DEFAULT_MODEL
        try:
            for _ in create(config.load(), spec):
                pass
        except PollamaError as err:
            render.error(str(err))
            return
        print(f"Created new model '{args[0]}'")

    def _load(self, args: list[str]) -> None:
        if len(args) != 1:
            print("Usage:\n  /load <modelname>")
            return
        print(f"Loading model '{args[0]}'")
        try:
            with render.Spinner():
                new = self.load(args[0], self.request_options())
        except PollamaError as err:
            render.error(str(err))
            return
        self.runner.close()
        self.runner, self.model, self.messages, self.projector = new, args[0], [], None


def _key_bindings() -> KeyBindings:
    kb = KeyBindings()

    @kb.add("c-c")
    def _(event) -> None:
        exc = KeyboardInterrupt if event.app.current_buffer.text else _EmptyInterrupt
        event.app.exit(exception=exc)

    return kb


def _history(nohistory: bool):
    if nohistory:
        return InMemoryHistory()
    path = Path(os.path.expanduser("~/.pollama/history"))
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        return FileHistory(str(path))
    except OSError:
        return InMemoryHistory()


def repl(session: Session, nohistory: bool) -> None:
    prompt = PromptSession(history=_history(nohistory), key_bindings=_key_bindings())
    placeholder = "Send a message (/? for help)"
    while True:
        try:
            line = prompt.prompt(">>> ", placeholder=placeholder)
        except _EmptyInterrupt:
            print("Use Ctrl + d or /bye to exit.")
            continue
        except KeyboardInterrupt:
            continue
        except EOFError:
            break
        if line.lstrip().startswith('"""'):
            text = line.lstrip()[3:]
            lines = [text] if text else []
            closed = text.endswith('"""') and len(text) >= 3
            if closed:
                lines = [text[:-3]]
            try:
                while not closed:
                    more = prompt.prompt("... ")
                    if more.rstrip().endswith('"""'):
                        lines.append(more.rstrip()[:-3])
                        closed = True
                    else:
                        lines.append(more)
            except (KeyboardInterrupt, _EmptyInterrupt):
                continue
            except EOFError:
                break
            line = "\n".join(lines)
        elif line.startswith("/"):
            if not session.command(line.strip()):
                break
            continue
        if not line.strip():
            continue
        try:
            session.chat(line)
        except KeyboardInterrupt:
            print()  # the cancelled turn is not kept
        except PollamaError as err:
            render.error(str(err))
