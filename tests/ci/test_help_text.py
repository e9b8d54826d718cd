"""Every command's --help at 80 columns shows no "<bool>" placeholder for a flag (a flag takes no value)."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from buildtool.cli import app
from buildtool.commands import COMMANDS


@pytest.mark.parametrize("args", [[], *([name] for name in COMMANDS), ["ci", "render"]])
def test_help_shows_no_placeholder_for_flags(args: list[str]) -> None:
    result = CliRunner().invoke(app, [*args, "--help"], env={"COLUMNS": "80"}, terminal_width=80)
    assert result.exit_code == 0, result.output
    assert "--help" in result.output
    assert "<bool>" not in result.output
