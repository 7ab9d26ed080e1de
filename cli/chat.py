"""The REPL (reference §4.3): prompt-toolkit input, history, \"\"\" multi-line, slash commands, Ctrl-C."""

from __future__ import annotations

import os
import shlex
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterator

from prompt_toolkit import PromptSession
from prompt_toolkit.history import FileHistory, InMemoryHistory
from prompt_toolkit.key_binding import KeyBindings

import runner
from runner import prepare
from runner.api import Chunk, Message, PollamaError, Request, coerce_option

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
  /set parameter draft_num_predict <int> Most tokens drafted per step (0: no speculative decoding)
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
    "repeat_penalty", "repeat_last_n", "stop", "draft_num_predict",
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


def attach_images(text: str, vision: bool) -> tuple[str, list]:
    """The prompt without the image paths it names and the images, with Ollama's "Added image"
    line for each on stderr. Raises PollamaError (one line) for a missing file or no vision."""
    text, images, paths = imagefiles.attach_images(text, vision)
    for path in paths:
        render.notice(f"Added image '{path}'")
    return text, images


@dataclass
class Session:
    """One REPL: the model (resolved once), its runner, and what the user has set. Each turn is
    prepared as every request is (:func:`runner.prepare.prepare`): the model's MESSAGEs and
    SYSTEM come from there, so ``history`` holds only this session's turns."""

    model: runner.ResolvedModel
    runner: runner.Runner
    options: dict = field(default_factory=dict)  # parameters by name: the model's, then the user's
    system: str | None = None
    history: list[Message] = field(default_factory=list)
    verbose: bool = False
    wordwrap: bool = True
    format: str | None = None
    think: bool | str | None = None
    hide_thinking: bool = False

    def print_history(self) -> None:
        """The conversation so far (a model's MESSAGEs), as Ollama shows it at the start."""
        for message in self.model.defaults.messages:
            if message.role == "user":
                print(f">>> {message.content}")
            elif message.role == "assistant":
                print(f"{message.content}\n")

    def check_think(self, think: bool | str | None) -> None:
        """Refuse ``think`` for a model that does not reason, as a turn would (Ollama's message)."""
        prepare.prepare(self.model, Request(think=think), self.options)

    def chat(self, text: str) -> None:
        text, images = attach_images(text, self.model.info.vision)
        turn = Message("user", text, images=images)
        request = Request(messages=[*self.history, turn], system=self.system, format=self.format, think=self.think)
        prepare.prepare(self.model, request, self.options)
        t0 = time.perf_counter_ns()
        writer = render.StreamWriter(wordwrap=self.wordwrap)
        answer, final, thought = stream_response(self.runner.stream(request), writer, self.hide_thinking)
        self.history += [turn, Message("assistant", answer, thinking=thought)]
        if self.verbose and final is not None and final.metrics is not None:
            final.metrics.total_duration = time.perf_counter_ns() - t0
            render.print_metrics(final.metrics, self.runner.engine, self.runner.offload.devices)

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
            self.history = []
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
                options = prepare.options(self.model, {**self.options, name: value})  # the ranges rule
                if name == "num_ctx" and value != self.options.get("num_ctx"):
                    new = runner.load(self.model, options)
                    self.runner.close()
                    self.runner = new
            except PollamaError as err:
                print(f"Couldn't set parameter: {err}")
                return
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
                think = prepare.think_level(args[1] if len(args) > 1 else True, "think") if what == "think" else False
                self.check_think(think)
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
                ("template", self.model.template.describe()),
            ]
            print("  Model")
            for key, value in rows:
                print(f"    {key:<20}{value}")
            print(f"\n  Runner\n    {'engine':<20}{self.runner.engine}\n    {'num_ctx':<20}{self.runner.num_ctx}"
                  f"\n    {'devices':<20}{self.runner.offload.devices}\n")
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
            print(self.model.template.show())
        else:
            print(HELP_SHOW)

    def _save(self, args: list[str]) -> None:
        """A new model: this one, with the session's system message, parameters and conversation."""
        from runner import config, store
        from runner.store.create import CreateSpec, create

        if len(args) != 1:
            print("Usage:\n  /save <modelname>")
            return
        messages = [*self.model.defaults.messages, *self.history]  # a new model's MESSAGEs replace its base's
        spec = CreateSpec(model=args[0], system=self.system, parameters=dict(self.options),
                          messages=[{"role": m.role, "content": m.content} for m in messages])
        name = self.model.name
        if store.looks_like_path(name) and not store.is_default_name(name):
            spec.from_file = Path(name).expanduser()
        else:
            spec.from_ = name
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
                model = runner.resolve(args[0])
                new = runner.load(model, prepare.options(model, self.options))
        except PollamaError as err:
            render.error(str(err))
            return
        self.runner.close()
        self.runner, self.model, self.history = new, model, []


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
