"""The `fa` command as installed: `fa --version`, shell completion, and help text for every command and
option (typer's --help is the reference a user reads)."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest
import typer
from typer.testing import CliRunner

from buildtool.cli import DISTRIBUTION, app

runner = CliRunner()


def commands(group: Any, prefix: str = "fa") -> list[tuple[str, Any]]:
    """Every command under a group, as (its command line, the command); typer's click is its own. Asked
    through click's list_commands/get_command: fa's group loads each command's module on demand."""
    found: list[tuple[str, Any]] = []
    for name in group.list_commands(None):
        command = group.get_command(None, name)
        path = f"{prefix} {name}"
        found.append((path, command))
        found += commands(command, path) if hasattr(command, "list_commands") else []
    return found


def test_version_is_the_installed_distributions():
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0
    assert result.output.startswith(f"fa {importlib.metadata.version(DISTRIBUTION)} from ")


def test_every_command_and_option_has_help():
    root = typer.main.get_command(app)
    listed = commands(root)
    assert {path for path, _ in listed} >= {"fa build", "fa index", "fa probe", "fa doctor", "fa install",
                                            "fa ci", "fa ci render"}  # fmt: skip
    missing = [path for path, command in listed if not (command.help or "").strip()]
    for path, command in [("fa", root), *listed]:
        missing += [f"{path} {p.opts[0]}" for p in command.params if not getattr(p, "help", None)]
    assert missing == []


@pytest.mark.parametrize("args", [["--help"], ["ci", "render", "--help"], ["build", "--help"]])
def test_help_runs(args):
    result = runner.invoke(app, args, prog_name="fa")
    assert result.exit_code == 0 and "Usage: fa" in result.output


def test_shell_completion_is_on():
    result = runner.invoke(app, ["--show-completion", "bash"], prog_name="fa")
    assert result.exit_code == 0 and "_FA_COMPLETE" in result.output
    assert "--install-completion" in runner.invoke(app, ["--help"], prog_name="fa").output


def test_the_version_has_one_source() -> None:
    import importlib.metadata

    import fa_attn
    from fa_attn._version import __version__

    assert fa_attn.__version__ == __version__  # a source checkout: the universal manifest's
    assert importlib.metadata.version("fa-toolchain") == __version__  # pyproject reads the same file
