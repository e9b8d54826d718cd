"""`python -m fa_attn.check` is for machines with the wheel alone: without a GPU its fix must not send
the user to `fa check --emulate` as if it ran there (the emulator is fa's source, which the wheel does not
hold); `fa check`, run from a checkout, still offers it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

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


def test_the_wheels_check_asks_for_its_own_json_when_a_unit_fails(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A failure's footer tells the user how to share the report: on a wheel-only machine that is
    `python -m fa_attn.check --json`, not `fa check --json` (fa-toolchain's command, absent there)."""
    from fa_attn.verify import check

    failed = check.UnitReport("fwd_fp16_d64", 0, "fwd", "fp16", 64, "fail", "[blocks] max error 1.0")
    report = check.CheckReport("fail", [{"index": 0}], [failed], [])
    # No GPU here: the report a GPU run with one failing unit gives.
    monkeypatch.setattr(check, "check_gpus", lambda **_: report)
    assert check.main([]) == 1
    wheel = capsys.readouterr().out
    assert "share it: attach `python -m fa_attn.check --json > check.json`" in wheel
    assert "`fa check" not in wheel
    # `fa check` (the toolchain, which has `fa`) keeps its own command.
    assert any("`fa check --json > check.json`" in line for line in check.footer(report))
