"""`python -m fa_attn.check` is for machines with the wheel alone: without a GPU its fix must not send
the user to `fa check --emulate` as if it ran there (the emulator is fa's source, which the wheel does not
hold); `fa check`, run from a checkout, still offers it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "kernels"), "FA_CHECK_RECORDS": "/nonexistent-fa-check"}


def fix_of(*argv: str) -> str:
    done = subprocess.run(
        [sys.executable, *argv, "--json"], capture_output=True, text=True, env=ENV, cwd=REPO, check=False
    )
    assert done.returncode == 1, done.stderr
    return str(json.loads(done.stdout)["fix"])


def test_the_wheels_check_suggests_nothing_that_needs_a_checkout() -> None:
    wheel = fix_of("-m", "fa_attn.check")
    assert wheel.startswith("run it where nvidia-smi lists a GPU")
    assert "--emulate" not in wheel
    assert "fa check" not in wheel  # the fa command is the checkout's tool, not the wheel's
    assert "fa check --emulate" in fix_of("-m", "buildtool.cli", "check")
