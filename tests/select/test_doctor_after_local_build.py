"""README's quickest first look is `fa build --local`, which writes wheels/local/ (never the release's
wheels/); README's next command is `fa doctor`, which reads wheels/. Run there, doctor (and install)
said "neither index.json nor any .whl file here (run fa build)": the build the user had just run. Now
they name the index below and the option that reads it. The real CLI in-process, in a folder laid
out as `fa build --local` leaves it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from buildtool.cli import app
from tests.select.fixture_index import fixture_index

runner = CliRunner()


@pytest.mark.parametrize("command", [["doctor"], ["install", "--dry-run"]])
def test_an_empty_wheels_folder_points_at_the_local_build_below_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, command: list[str]
) -> None:
    (tmp_path / "wheels" / "local").mkdir(parents=True)
    (tmp_path / "wheels" / "local" / "index.json").write_text(json.dumps(fixture_index()))
    monkeypatch.chdir(tmp_path)
    done = runner.invoke(app, command, env={"COLUMNS": "80"})
    assert done.exit_code == 2, done.output
    said = done.output.split("\n", 1)[1]  # after the command's first line (what it is doing)
    assert "run fa build" not in said
    assert "fix: read it with --wheels wheels/local" in said, said


def test_an_empty_folder_with_no_index_below_still_says_run_fa_build(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "wheels" / "logs").mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    done = runner.invoke(app, ["doctor"], env={"COLUMNS": "80"})
    assert done.exit_code == 2, done.output
    assert "neither index.json nor any .whl file here (run fa build)" in done.output


@pytest.mark.parametrize("layout", ["local-only", "interrupted"])
def test_install_build_takes_a_wheels_folder_without_an_index_as_nothing_built_yet(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str
) -> None:
    """`fa install --build` builds when nothing fits; a wheels/ folder holding no index (only --local's
    wheels/local/, or the logs of a build stopped before its index) is that case, as no folder is. It
    was refused with exit 2 before the build was considered."""
    (tmp_path / "wheels" / "logs").mkdir(parents=True)
    if layout == "local-only":
        (tmp_path / "wheels" / "local").mkdir()
        (tmp_path / "wheels" / "local" / "index.json").write_text(json.dumps(fixture_index()))
    monkeypatch.chdir(tmp_path)
    args = ["install", "--build", "--dry-run", "--cuda", "12", "--arch", "8.0"]
    with_folder = runner.invoke(app, args, env={"COLUMNS": "80"})
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    without = runner.invoke(app, args, env={"COLUMNS": "80"})
    assert (with_folder.exit_code, with_folder.stdout) == (without.exit_code, without.stdout), (
        with_folder.output
    )
    assert "--build builds the wheel this machine needs" in with_folder.stdout


def test_install_build_still_refuses_a_wheels_folder_that_is_not_there(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    done = runner.invoke(app, ["install", "--build", "--dry-run", "--wheels", "no-such-folder"])
    assert done.exit_code == 2, done.output
    assert "no-such-folder: no such directory" in done.output
