"""`fa doctor` says, per GPU, whether the installed wheel was verified there by `fa check` (its newest
verification record), when, and which units failed; without a record it says to run `fa check`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fa_attn.verify import record as records
from typer.testing import CliRunner

from buildtool.cli import app
from tests.select.test_cli import env_file

runner = CliRunner()


def doctor(env: Path, index_dir: Path, *extra: str):
    return runner.invoke(app, ["doctor", "--env", str(env), "--wheels", str(index_dir), *extra])


def test_doctor_shows_the_newest_record_per_gpu(
    tmp_path: Path, index_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path / "records"))
    env = env_file(tmp_path, "a100-ngc-24.10")
    gpu = json.loads(env.read_text())["gpus"][0]
    out = doctor(env, index_dir).stdout
    assert "not verified on this GPU yet: run `fa check`" in out

    units = {
        "sm_80/fwd_bf16_d128": records.UnitResult("pass", max_err=1e-3, bound=4e-3),
        "sm_80/bwd_bf16_d128": records.UnitResult("fail", "dq: error 0.3 > bound 0.004", 0.3, 0.004),
    }
    key = records.RecordKey("", gpu["name"], gpu["sm"], "550.54.15", "2.5.0")
    records.write(records.Record(key, "2026-11-25T03:00:00Z", "fa check", units))
    out = doctor(env, index_dir).stdout
    assert "verified 2026-11-25T03:00:00Z: 1/2 units FAILED (sm_80/bwd_bf16_d128)" in out
    check = json.loads(doctor(env, index_dir, "--json").stdout)["gpus"][0]["check"]
    assert check == {
        "verified": True,
        "when": "2026-11-25T03:00:00Z",
        "by": "fa check",
        "units": 2,
        "failed": ["sm_80/bwd_bf16_d128"],
    }
