"""ci.yml, which runs on every push, is linted as release.yml is (issue 37: zizmor found unpinned actions,
persisted credentials and broad permissions in it): zizmor (offline, pedantic) and actionlint find
nothing, and every action the release also uses is at the commit action_pins.json pins."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from buildtool.release import pins
from tests.ci.test_release_supply_chain import _linter

CI_YML = Path(__file__).resolve().parents[2] / ".github" / "workflows" / "ci.yml"


@pytest.mark.parametrize("linter", ["zizmor", "actionlint"])
def test_linters_find_nothing_in_ci_yml(linter: str) -> None:
    args = ["--offline", "--no-progress", "--persona=pedantic"] if linter == "zizmor" else []
    done = subprocess.run(
        [_linter(linter), *args, str(CI_YML)], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stdout + done.stderr


def test_actions_the_release_pins_are_at_its_commits() -> None:
    used = dict(re.findall(r"uses:\s*([\w./-]+)@(\S+)", CI_YML.read_text(encoding="utf-8")))
    pinned = pins.load()
    shared = used.keys() & pinned.keys()
    assert shared, used  # checkout and setup-python at least
    assert {name: used[name] for name in shared} == {name: pinned[name].sha for name in shared}
