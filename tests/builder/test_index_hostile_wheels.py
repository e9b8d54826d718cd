"""`fa index` lists only wheels `fa install` would install: one holding files outside fa_attn/ (torch/,
scripts, data), a zip slip, a link or a zip bomb is refused by name (exit 1), and nothing is written.
Round three: they were listed, although install refuses them, so every page pointed at them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.select.test_install_hostile_wheels import CASES, _dist_info, hostile_house

REPO = Path(__file__).resolve().parents[2]
KINDS = [
    "another package",
    "scripts",
    "a .pth",
    "a .. path",
    "a symlink",
    "a compression bomb",
    "a member RECORD omits",
]


@pytest.mark.parametrize("kind", KINDS)
def test_fa_index_refuses_what_fa_install_refuses(tmp_path: Path, kind: str):
    spec, member, problem = CASES[kind]
    data = _dist_info().removesuffix(".dist-info") + ".data"
    spec = {**spec, "extra": {k.replace("{data}", data): v for k, v in spec.get("extra", {}).items()}}
    house = hostile_house(tmp_path / "house", **spec)
    (house / "index.json").unlink()  # fa index writes it, from the wheels alone
    before = sorted(p.name for p in house.iterdir())
    done = subprocess.run(
        [sys.executable, "-m", "buildtool.cli", "index", str(house)],
        cwd=REPO, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    said = " ".join(done.stderr.split())
    assert done.returncode == 1, done.stderr
    assert member.replace("{data}", data) in said
    assert problem in said
    assert "nothing indexed" in said
    assert "Traceback" not in said
    assert sorted(p.name for p in house.iterdir()) == before
