"""`fa --help` lists the commands from commands.SUMMARIES, importing none of them (issue 37: it loaded
every command, the build pipeline and the doctor, for 0.94 s of CPU); each summary is the first
paragraph of its command's own help, so the two cannot drift apart."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from buildtool.commands import COMMANDS, SUMMARIES
from buildtool.commands._app import _load


@pytest.mark.parametrize("name", list(COMMANDS))
def test_each_summary_is_the_first_paragraph_of_its_commands_help(name: str) -> None:
    assert SUMMARIES[name] == _load(name).help.split("\n\n")[0]


def test_top_level_help_imports_no_command() -> None:
    script = """
import json, sys
sys.argv = ["fa", "--help"]
from buildtool import cli
try:
    cli.main()
except SystemExit:
    pass
print(json.dumps(sorted(m for m in sys.modules if m.startswith("buildtool."))))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True)
    modules = json.loads(done.stdout.splitlines()[-1])
    assert all(f"{name} " in done.stdout for name in COMMANDS)  # the listing itself
    loaded = [m for m in modules if m.startswith(("buildtool.builder", "buildtool.compat"))]
    assert loaded == []
    assert not [m for m in modules if m.removeprefix("buildtool.commands.") in COMMANDS.values()]
