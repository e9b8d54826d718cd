"""`fa install` at 80 columns wraps its sentences between words, never inside a file name or path
(issue 37's page broke `fa-⏎attn==0.1.0`; install broke `...x86_64.w⏎hl`), and indents what wraps under
its item. The real CLI in a child process, on the release-shaped fixture index (a dry run reads no
wheel)."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.select.fixture_index import fixture_index

REPO = Path(__file__).resolve().parents[2]


def test_a_dry_run_never_breaks_a_path_and_indents_what_wraps(tmp_path: Path) -> None:
    wheels = tmp_path / "a_folder_with_a_rather_long_name_as_a_users_home_might_have" / "wheels"
    wheels.mkdir(parents=True)
    (wheels / "index.json").write_text(json.dumps(fixture_index()))
    env = {**os.environ, "COLUMNS": "80", "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "kernels")])}
    done = subprocess.run(
        [sys.executable, "-m", "buildtool.cli", "install", "--dry-run", "--wheels", str(wheels)],
        capture_output=True,
        text=True,
        env=env,
        cwd=tmp_path,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    chosen = next(line.split()[2] for line in lines if line.startswith("would install "))
    assert chosen.endswith(".whl"), lines
    path = str(wheels / chosen)
    assert any(path in line for line in lines), lines  # the path whole, on one line
    for line in lines:
        words = line.split()
        assert len(line) <= 80 or len(words) == 1 or any(len(w) > 60 for w in words), line
    starts = {"would install", "from", "chosen:", "fa_attn", "dry run:", "warning:", "note:"}
    for before, line in itertools.pairwise(lines):
        if not any(line.lstrip().startswith(s) for s in starts):  # a wrapped line: further in
            indent = len(line) - len(line.lstrip())
            assert indent > len(before) - len(before.lstrip()) or indent >= 2, (before, line)
