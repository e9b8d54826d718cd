"""`fa doctor` says, per GPU, whether the installed wheel was verified there by `fa check` (its newest
verification record for this wheel, GPU, driver and torch), when, which units failed and which file said
so; a record of another wheel, driver or torch is ignored and counted; without a record it says to run
`fa check`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import pytest
from fa_attn.verify import record as records
from typer.testing import CliRunner

from buildtool.cli import app
from tests.select.test_cli import env_file

runner = CliRunner()


def a100(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[Path, dict, dict[str, str]]:
    """The A100 machine's env file, its description, and its record key's fields (no wheel installed)."""
    monkeypatch.setenv(records.RECORDS_ENV, str(tmp_path / "records"))
    env = env_file(tmp_path, "a100-ngc-24.10")
    described = json.loads(env.read_text())
    gpu = described["gpus"][0]
    mine = {"wheel": "", "gpu": gpu["name"], "sm": gpu["sm"], "driver": described["driver"]["version"],
            "torch": described["torch"]["version"]}  # fmt: skip
    return env, described, mine


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
    described = json.loads(env.read_text())
    driver, torch = described["driver"]["version"], described["torch"]["version"]
    key = records.RecordKey("", gpu["name"], gpu["sm"], driver, torch)
    path = records.write(records.Record(key, "2026-11-25T03:00:00Z", "fa check", units))
    out = doctor(env, index_dir).stdout
    assert "verified 2026-11-25T03:00:00Z: 1/2 units FAILED (sm_80/bwd_bf16_d128)" in out
    assert f"from{path}" in "".join(out.split())  # (rich wraps the long path)
    check = json.loads(doctor(env, index_dir, "--json").stdout)["gpus"][0]["check"]
    assert check == {
        "verified": True,
        "when": "2026-11-25T03:00:00Z",
        "by": "fa check",
        "units": 2,
        "failed": ["sm_80/bwd_bf16_d128"],
        "record": str(path),
        "ignored": {},
    }


@pytest.mark.parametrize(
    ("field", "value", "why"),
    [("wheel", "ab" * 32, "another wheel"), ("driver", "550.54.15", "another driver"),
     ("torch", "2.5.0", "another torch")],
)  # fmt: skip
def test_doctor_ignores_a_record_made_for_another_machine(
    tmp_path: Path, index_dir: Path, monkeypatch: pytest.MonkeyPatch, field: str, value: str, why: str
) -> None:
    env, _, mine = a100(tmp_path, monkeypatch)
    units = {"sm_80/fwd_bf16_d128": records.UnitResult("pass", max_err=1e-3, bound=4e-3)}
    records.write(
        records.Record(records.RecordKey(**{**mine, field: value}), "2099-01-01", "someone else", units)
    )
    out = " ".join(doctor(env, index_dir).stdout.split())
    assert "2099" not in out
    assert "not verified on this GPU yet: run `fa check`" in out
    assert f"ignored records not for this machine: 1 for {why}" in out


def test_doctor_ignores_a_record_others_can_write(
    tmp_path: Path, index_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, _, mine = a100(tmp_path, monkeypatch)
    units = {"sm_80/fwd_bf16_d128": records.UnitResult("pass", max_err=1e-3, bound=4e-3)}
    records.write(records.Record(records.RecordKey(**mine), "2099-01-01", "someone else", units)).chmod(0o666)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        out = doctor(env, index_dir).stdout
    assert "2099" not in out
    (warned,) = [w for w in seen if w.category.__name__ == "RecordWarning"]  # (doctor's copy of the class)
    assert "writable by other users" in str(warned.message)


def test_two_gpus_of_one_model_each_show_their_own_record(
    tmp_path: Path, index_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    env, described, mine = a100(tmp_path, monkeypatch)
    uuids = ("GPU-00000000-1111-2222-3333-444444444444", "GPU-99999999-1111-2222-3333-444444444444")
    described["gpus"] = [{**described["gpus"][0], "uuid": uuid} for uuid in uuids]
    env.write_text(json.dumps(described))
    failed = {"sm_80/fwd_bf16_d128": records.UnitResult("fail", "out: error 0.3 > bound 0.004", 0.3, 0.004)}
    gpu0 = records.RecordKey(**mine, uuid=records.normal_uuid(uuids[0]))
    records.write(records.Record(gpu0, "2026-11-25T03:00:00Z", "fa check", failed))
    checks = [g["check"] for g in json.loads(doctor(env, index_dir, "--json").stdout)["gpus"]]
    assert checks[0]["failed"] == ["sm_80/fwd_bf16_d128"]
    assert (checks[1]["verified"], checks[1]["ignored"]) == (False, {"another GPU of this model": 1})
