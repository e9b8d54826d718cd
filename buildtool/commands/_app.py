"""The typer application behind `fa` (buildtool/cli.py): a group whose commands are loaded by name
from commands.COMMANDS when they run or when help lists them, the `--version` option, and the one place
an FaError becomes its message and exit code."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path
from typing import Annotated, Any

import typer
import typer.core
import typer.main

from buildtool.commands import COMMANDS, DISTRIBUTION, SUMMARIES, print_error
from buildtool.commands._options import check_argv
from buildtool.errors import EXIT_FAILED, FaError

# Help and usage errors as plain text (click's layout), not rich's panels: typer's rich formatting
# imports rich and markdown-it, which cost `fa --help` more than everything else it does (issue 37:
# 0.55 s of CPU; bench/install/probe_time.py). One look for every command's help.
MARKUP = None


@functools.cache
def _load(name: str) -> Any:
    """The click command of `name`: its module's register() on an app of its own."""
    module = importlib.import_module(f"buildtool.commands.{COMMANDS[name]}")
    own = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=MARKUP)
    own.callback()(lambda: None)  # a group even with one command, so the command is taken by name
    module.register(own)
    command = typer.main.get_command(own).get_command(None, name)  # type: ignore[attr-defined]
    _no_flag_metavars(command)
    return command


def _no_flag_metavars(command: Any) -> None:
    """A flag takes no value, but typer's help shows each with a "<bool>" placeholder: blank them, the
    --help option's too (click makes that one when help is asked for)."""
    for param in command.params:
        if getattr(param, "is_flag", False):
            param.metavar = " "
    make_help = command.get_help_option

    def help_option(ctx: Any) -> Any:
        option = make_help(ctx)
        if option is not None:
            option.metavar = " "
        return option

    command.get_help_option = help_option
    for sub in getattr(command, "commands", {}).values():  # a group's own commands (fa ci render)
        _no_flag_metavars(sub)


class _Commands(typer.core.TyperGroup):
    _listing = False  # while `fa --help` lists the commands: their summaries, no module imported

    def list_commands(self, ctx: Any) -> list[str]:  # noqa: ARG002 (click's signature)
        return list(COMMANDS)

    def get_command(self, ctx: Any, cmd_name: str) -> Any:  # noqa: ARG002 (click's signature)
        if cmd_name not in COMMANDS:
            return None
        if self._listing:
            return typer.core.TyperCommand(cmd_name, help=SUMMARIES[cmd_name])
        return _load(cmd_name)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False

    def get_params(self, ctx: Any) -> list[Any]:
        params: list[Any] = super().get_params(ctx)  # with --help, which click adds here
        for param in params:
            if getattr(param, "is_flag", False):
                param.metavar = " "  # see _no_flag_metavars
        return params

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        try:
            check_argv(args)  # before click echoes a 100 KB value back
        except FaError as error:
            print_error(error)
            raise typer.Exit(error.exit_code) from None
        result: list[str] = super().parse_args(ctx, args)
        return result

    def invoke(self, ctx: Any) -> Any:  # a click Context (typer vendors click from 0.29 on)
        try:
            status = super().invoke(ctx)
        except FaError as error:
            print_error(error)
            raise typer.Exit(error.exit_code) from None
        if isinstance(status, int) and not isinstance(status, bool) and status:
            raise typer.Exit(status)
        return status


def _print_version(value: bool) -> None:
    if not value:
        return
    import importlib.metadata

    where = Path(__file__).resolve().parent.parent
    try:
        typer.echo(f"fa {importlib.metadata.version(DISTRIBUTION)} from {where}")
    except importlib.metadata.PackageNotFoundError:
        typer.echo(f"fa: {DISTRIBUTION} is not installed (running from {where}); `pip install .` installs it")
        raise typer.Exit(EXIT_FAILED) from None
    raise typer.Exit()


@functools.cache
def make_app() -> typer.Typer:
    app = typer.Typer(
        cls=_Commands, no_args_is_help=True, pretty_exceptions_enable=False, rich_markup_mode=MARKUP
    )

    @app.callback()
    def main(
        version: Annotated[
            bool,
            typer.Option(
                "--version", callback=_print_version, is_eager=True, help="Show fa's version and exit."
            ),
        ] = False,
    ) -> None:
        """Build, choose and install fused attention kernels for PyTorch."""

    return app
