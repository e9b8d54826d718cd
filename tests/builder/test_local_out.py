"""`fa build --local` never replaces a wheel that holds more than it builds (issue 37: it replaced the
release all-wheel in wheels/ with one holding only this torch's binding): its own folder, wheels/local/,
by default, and a refusal naming the file when --out points at a folder whose all-wheel holds more."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.builder.conftest import fa_command
from tests.select.fixture_index import all_wheel_index

REPO = Path(__file__).resolve().parents[2]


def _fa(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        fa_command(*args), cwd=cwd, capture_output=True, text=True, timeout=300, check=False
    )


def test_local_builds_into_its_own_folder_by_default(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    (tmp_path / "wheels" / "local").write_text("a file where --local's folder goes")
    done = _fa("build", "--local", cwd=tmp_path)
    said = " ".join(done.stderr.split())
    assert done.returncode == 1, done.stderr
    assert f"cannot create the folder {Path('wheels') / 'local'}" in said, done.stderr


def test_local_refuses_to_replace_an_all_wheel_that_holds_more(tmp_path: Path) -> None:
    release = tmp_path / "wheels"
    release.mkdir()
    index = all_wheel_index()
    (release / "index.json").write_text(json.dumps(index))
    entry = next(e for e in index["all_wheels"] if e["platform"] == "x86_64")
    wheel = release / entry["file"]
    wheel.write_bytes(b"the release all-wheel")
    done = _fa("build", "--local", "--matrix", str(REPO / "matrix.yaml"), "--out", str(release), cwd=tmp_path)
    said = " ".join(done.stderr.split())
    assert done.returncode == 2, done.stderr
    assert f"{wheel} holds {len(entry['bindings'])} bindings" in said, done.stderr
    assert "fix: build into another folder (--out wheels/local" in said
    assert wheel.read_bytes() == b"the release all-wheel"
