"""Every option value is checked at the edge: exit 2, one short message naming the option and what it
accepts, the value quoted and escaped, before any file is read. No traceback, whatever the value."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildtool.cli import app
from buildtool.commands._options import MAX_ARGUMENT_CHARS

runner = CliRunner()
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize(
    ("args", "option", "accepts"),
    [
        (["build", "--shard", "", "--dry-run"], "--shard", "--shard 1/3"),
        (["build", "--jobs", "0", "--dry-run"], "--jobs", "1 or more"),
        (["build", "--jobs", "-5", "--dry-run"], "--jobs", "1 or more"),
        (["build", "--local", "--cuda", "7", "--dry-run"], "--cuda", "one of 11, 12, 13"),
        (["install", "--jobs", "0", "--build", "--dry-run"], "--jobs", "1 or more"),
        (["install", "--build", "--arch", "99.9", "--dry-run"], "--arch", "one of 7.5, 8.0"),
        (["install", "--build", "--cuda", "7", "--dry-run"], "--cuda", "one of 11, 12, 13"),
        (
            ["install", "--build", "--cuda", "11", "--arch", "12.0", "--dry-run"],
            "--arch",
            "CUDA 11's toolkit",
        ),
        (["install", "--wait", "-1"], "--wait", "from 0"),
        (["install", "--wait", "inf"], "--wait", "from 0"),
        (["install", "--arch", "8.0"], "--arch", "only go with --build"),
        (["doctor", "--wheels", "x" * 300], "--wheels", "at most 255 bytes"),
        (["build", "--out", "o/" + "y" * 256, "--dry-run"], "--out", "at most 255 bytes"),
        (["build", "--matrix", "m" * 1000 + ".yaml", "--dry-run"], "--matrix", "at most 255 bytes"),
        (["install", "--wheels", "w" * 100_000], "--wheels", f"at most {MAX_ARGUMENT_CHARS} characters"),
        (["doctor", "--env", "e" * 300], "--env", "at most 255 bytes"),
        (["doctor", "--dtype", "fp8"], "--dtype", "one of fp16, bf16, fp32"),
        (["index", "d" * 300], "DIRECTORY", "at most 255 bytes"),
        (["build", "--platform", "p" * 3000, "--dry-run"], "--platform", "one of x86_64, aarch64"),
        (["build", f"--out={'o' * 50_000}"], "--out", f"at most {MAX_ARGUMENT_CHARS} characters"),
    ],
)
def test_a_bad_option_value_exits_2_naming_the_option(args: list[str], option: str, accepts: str):
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 2, result.output
    assert option in result.output
    assert accepts in result.output
    assert "Traceback" not in result.output
    assert len(result.output) < 2000


@pytest.mark.parametrize(
    "args",
    [
        ["doctor", "--wheels", "a\x1b[31mb"],
        ["doctor", "--env", "a\x1b[31mb"],
        ["doctor", "--dtype", "a\x1b[31mb"],
        ["index", "a\x1b[31mb"],
        ["build", "--matrix", "a\x1b[31mb", "--dry-run"],
    ],
)
def test_a_control_character_in_a_value_is_escaped_not_echoed(args: list[str]):
    result = runner.invoke(app, args, catch_exceptions=False)
    assert result.exit_code == 2
    assert "\x1b" not in result.output
    assert "a\\x1b[31mb" in result.output


def test_every_error_message_reaches_the_terminal_escaped_and_cut(capsys: pytest.CaptureFixture[str]):
    """The last guard, for a value no option check quoted: print_error escapes and caps each line."""
    from buildtool.commands import MAX_LINE_CHARS, print_error
    from buildtool.errors import FaError

    print_error(FaError("bad \x1b[2J" + "x" * 5000 + "\n  fix: y"))
    err = capsys.readouterr().err
    assert "\x1b" not in err
    assert "\\x1b[2J" in err
    assert max(len(line) for line in err.splitlines()) <= MAX_LINE_CHARS + len("error: ")
    assert err.endswith("  fix: y\n")


def test_cuda_given_twice_plans_each_wheel_once(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.chdir(REPO)
    result = runner.invoke(
        app,
        ["build", "--local", "--cuda", "12", "--cuda", "12", "--dry-run", "--json"],
        catch_exceptions=False,
    )
    assert result.exit_code == 0, result.output
    variants = [w["variant"] for w in json.loads(result.stdout)["wheels"]]
    assert len(variants) == len(set(variants))
    assert sum(v.startswith("cu12") for v in variants) == 1
