"""Errors end every command the same way: `error: <message>` on stderr, printed as plain text, and the
exit code the error carries (buildtool/errors.py: 1 failed or no fit, 2 bad input)."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildtool.builder.binding import BindingError
from buildtool.builder.compile import CompileError
from buildtool.builder.matrix import MatrixError
from buildtool.builder.package import PackageError
from buildtool.builder.platform_tag import PlatformTagError
from buildtool.builder.pypi import CatalogError
from buildtool.builder.toolkits import ToolkitError
from buildtool.builder.torch_headers import HeaderError
from buildtool.cli import app
from buildtool.compat.env import EnvError
from buildtool.compat.install import InstallError
from buildtool.compat.wheel_index import WheelIndexError
from buildtool.core.fetch import FetchError
from buildtool.core.wheel_file import WheelDirError
from buildtool.errors import EXIT_FAILED, EXIT_USAGE, FaError, InputError, bad_input

runner = CliRunner()
MARKUP_PATH = "no[/b]such[red]dir"  # rich would fail on [/b] or colour the rest if it read markup


@pytest.mark.parametrize(
    ("error", "code"),
    [
        (MatrixError, EXIT_USAGE),
        (EnvError, EXIT_USAGE),
        (WheelIndexError, EXIT_USAGE),
        (CatalogError, EXIT_FAILED),
        (CompileError, EXIT_FAILED),
        (BindingError, EXIT_FAILED),
        (ToolkitError, EXIT_FAILED),
        (HeaderError, EXIT_FAILED),
        (FetchError, EXIT_FAILED),
        (PackageError, EXIT_FAILED),
        (PlatformTagError, EXIT_FAILED),
        (WheelDirError, EXIT_FAILED),
        (InstallError, EXIT_FAILED),
    ],
)
def test_every_error_carries_its_exit_code(error: type[FaError], code: int):
    assert issubclass(error, FaError)
    assert error.exit_code == code


def test_bad_input_names_the_file_the_field_and_the_fix():
    error = InputError("matrix.yaml", 'archs."12"[3]', "got '8'", 'write it like "8.6"')
    assert str(error) == 'matrix.yaml: archs."12"[3]: got \'8\'\n  fix: write it like "8.6"'
    assert error.exit_code == EXIT_USAGE
    assert bad_input("--env a.json", None, "not JSON", "write it like fa probe --json") == (
        "--env a.json: not JSON\n  fix: write it like fa probe --json"
    )


def test_notes_follow_the_message():
    error = FaError("g++ failed").with_note("(finished work is cached)")
    assert error.text() == "g++ failed\n(finished work is cached)"


@pytest.mark.parametrize(
    "args",
    [
        ["doctor", "--wheels", MARKUP_PATH],
        ["index", MARKUP_PATH],
        ["build", "--dry-run", "--matrix", MARKUP_PATH],
        ["ci", "render", "--check", "--matrix", MARKUP_PATH],
    ],
)
def test_user_text_is_printed_as_is(tmp_path: Path, args: list[str], monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, args)
    assert result.exit_code == EXIT_USAGE, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    said, _, error = result.stderr.partition("\n")  # the command's first line (commands.say), if any
    assert said.startswith("error: ") or (said.startswith(f"fa {args[0]}: ") and error.startswith("error: "))
    assert MARKUP_PATH in result.stderr
