"""The Typer app every command module registers on, with the root options (``--version``).

It lives apart from the commands so that ``main``, ``server_cmds`` and ``store_cmds`` each import
it and nothing imports back: ``cli.main`` imports the other two after its own commands, which
keeps ``pollama --help`` listing run, list, show first.
"""

from __future__ import annotations

import typer

from runner.version import pollama_version

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Large language model runner: ollama run, rebuilt in Python.",
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _print_version(value: bool) -> None:
    if value:
        print(f"pollama version {pollama_version()}")
        raise typer.Exit()


@app.callback()
def root(
    version: bool = typer.Option(False, "--version", "-v", callback=_print_version, is_eager=True,
                                 help="Show pollama's version and exit"),
) -> None:
    """Large language model runner: ollama run, rebuilt in Python."""
