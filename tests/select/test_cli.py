"""The CLI shell: fa probe / fa doctor / fa install options, JSON shape and exit codes
(0 ok/ok-jit, 1 fallback or no wheel, 2 usage)."""

from __future__ import annotations

import copy
import json
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from buildtool.cli import app
from buildtool.compat.choose import Request
from buildtool.compat.doctor import build_report, render
from buildtool.compat.env import env_from_json
from buildtool.compat.wheel_index import load_index
from buildtool.core import kernels_src

ENVS = Path(__file__).parent / "envs"
runner = CliRunner()


def env_file(tmp_path: Path, case: str) -> Path:
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps(json.loads((ENVS / f"{case}.json").read_text())["env"]))
    return path


def doctor(*args: str):
    return runner.invoke(app, ["doctor", *args])


@pytest.mark.parametrize(
    ("case", "rc"),
    [
        ("a100-ngc-24.10", 0),
        ("future-sm130-new-driver", 0),
        ("v100-sm70", 1),
        ("torch-missing", 1),  # a GPU, and nothing here runs on it: 1
        ("cpu-only-torch", 0),  # no NVIDIA GPU: the answer (fallback, no-gpu) is the command's success
        ("macos-arm64", 0),
    ],
)
def test_doctor_exit_codes(tmp_path: Path, index_dir: Path, case: str, rc: int):
    result = doctor("--env", str(env_file(tmp_path, case)), "--wheels", str(index_dir), "--json")
    assert result.exit_code == rc, result.output


def test_doctor_answers_fp16_and_bf16_when_no_dtype_is_given(tmp_path: Path, index_dir: Path):
    """A T4 runs fp16 from SASS and has no bf16 kernels: the verdict is fp16's ok, and bf16's fallback
    with dtype-unsupported is said for bf16 alone (doctor once answered bf16 only: "fallback")."""
    env = str(env_file(tmp_path, "t4-colab-bf16"))
    result = doctor("--env", env, "--wheels", str(index_dir), "--json")
    out = json.loads(result.stdout)
    assert (result.exit_code, out["verdict"], out["dtype"], out["codes"]) == (0, "ok", "fp16", [])
    answers = {a["dtype"]: a for a in out["dtypes"]}
    assert (answers["fp16"]["verdict"], answers["fp16"]["runtime"]["path"]) == ("ok", "sass")
    assert (answers["bf16"]["verdict"], answers["bf16"]["codes"]) == ("fallback", ["dtype-unsupported"])
    assert out["gpus"][0]["dtypes"]["bf16"]["reasons"][0]["code"] == "dtype-unsupported"
    assert out["gpus"][0]["dtypes"]["fp16"]["path"] == "sass"
    text = " ".join(doctor("--env", env, "--wheels", str(index_dir)).stdout.split())
    assert text.startswith("verdict: ok for fp16 (our kernels run from SASS on this GPU); bf16: fallback")
    assert "fp16: SASS for sm 7.5" in text
    assert "bf16: fallback to torch SDPA dtype-unsupported no bf16 kernels for sm 7.5" in text


def test_doctor_json_shape(tmp_path: Path, index_dir: Path, index_data: dict):
    env = str(env_file(tmp_path, "t4-colab-bf16"))
    result = doctor("--env", env, "--wheels", str(index_dir), "--dtype", "bf16", "--json")
    out = json.loads(result.stdout)
    assert result.exit_code == 1
    assert out["verdict"] == "fallback"
    assert out["codes"] == ["dtype-unsupported"]
    assert out["selected"] == "fa_attn-0.1.0+cu12torch2.5cxx11abifalse-py3-none-manylinux_2_28_x86_64.whl"
    assert out["runtime"]["path"] == "fallback"
    assert out["runtime"]["reasons"][0]["code"] == "dtype-unsupported"
    assert len(out["wheels"]) == len(index_data["wheels"])
    for wheel in out["wheels"]:
        assert set(wheel) >= {"file", "fits", "reasons"}
        assert wheel["fits"] == (not wheel["reasons"])
        assert all(set(r) >= {"code", "message"} for r in wheel["reasons"])


def test_doctor_options_change_the_answer(tmp_path: Path, index_dir: Path):
    env = str(env_file(tmp_path, "t4-colab-bf16"))
    result = doctor(
        "--env",
        env,
        "--wheels",
        str(index_dir),
        "--dtype",
        "fp16",
        "--head-dim",
        "64",
        "--backward",
        "--json",
    )
    out = json.loads(result.stdout)
    assert result.exit_code == 0
    tiles = kernels_src.tiles()
    assert out["runtime"] == {
        "path": "sass",
        "arch": "7.5",
        "head_dim": 64,
        "reasons": [],
        "passed_over": [],
        "then": None,
        "tiles": {d: tiles.default_tile("7.5", d, 64).label for d in ("fwd", "bwd")},
        "notes": [],
    }


def test_doctor_reads_a_file_url(tmp_path: Path, index_dir: Path):
    result = doctor(
        "--env", str(env_file(tmp_path, "rtx5090-sm120")), "--index", index_dir.as_uri(), "--json"
    )
    assert result.exit_code == 0
    assert json.loads(result.stdout)["runtime"]["arch"] == "12.0"


def test_doctor_on_this_machine_explains_the_fallback(index_dir: Path):
    # This machine (and CI) has no NVIDIA GPU: calls fall back, and doctor says why; that answer is
    # the command's success (exit 0), the verdict still says fallback.
    result = doctor("--wheels", str(index_dir), "--json")
    out = json.loads(result.stdout)
    assert result.exit_code == 0
    assert out["verdict"] == "fallback"
    assert "no-gpu" in out["codes"]
    assert all(r["fix"] for r in out["because"])


def test_bad_env_file_is_usage_error(tmp_path: Path, index_dir: Path):
    bad = tmp_path / "bad.json"
    bad.write_text(
        json.dumps(
            {
                "os": "linux",
                "arch": "x86_64",
                "glibc": "2.35",
                "python": "3.11",
                "torch": None,
                "driver": None,
                "gpus": [{"name": "A100", "sm": "80"}],
            }
        )
    )
    result = doctor("--env", str(bad), "--wheels", str(index_dir))
    assert result.exit_code == 2
    assert "gpus[0].sm" in result.output
    assert "8.6" in result.output
    bad.write_text("{not json")
    result = doctor("--env", str(bad), "--wheels", str(index_dir))
    output = " ".join(result.output.split())  # rich wraps long paths at the terminal width
    assert result.exit_code == 2
    assert "not JSON" in output
    assert "line 1" in output


@pytest.mark.parametrize(
    "args",
    [
        ["--wheels", "/nonexistent/wheels"],
        ["--wheels", ".", "--index", "http://127.0.0.1:9/"],
        ["--dtype", "fp8"],
        ["--head-dim", "0"],
    ],
)
def test_usage_errors(args: list[str], index_dir: Path):
    result = doctor(*(args if "--wheels" in args else ["--wheels", str(index_dir), *args]))
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output


def test_probe_json_is_a_valid_env():
    result = runner.invoke(app, ["probe", "--json"])
    assert result.exit_code == 0
    env_from_json(json.loads(result.stdout))


def test_human_report_has_a_fix_under_each_reason(index_dir: Path):
    env = env_from_json(json.loads((ENVS / "p100-torch113.json").read_text())["env"])
    console = Console(record=True, width=160)
    render(build_report(env, load_index(str(index_dir)), Request()), console)
    text = console.export_text()
    assert "verdict: no-wheel" in text
    assert "torch-version-mismatch" in text
    assert "arch-unsupported" in text
    because = text.split("because:")[1].split("\n\n")[0].strip().splitlines()
    assert [line.strip().startswith("fix:") for line in because] == [False, True, False, True]


@pytest.mark.parametrize("name", ["../../evil.whl", "sub/dir.whl", "fa_attn.tar.gz"])
def test_index_file_names_must_be_plain_wheel_names(tmp_path: Path, name: str, index_data: dict):
    index = copy.deepcopy(index_data)
    index["wheels"][0]["file"] = name
    (tmp_path / "index.json").write_text(json.dumps(index))
    result = doctor("--wheels", str(tmp_path))
    assert result.exit_code == 2
    assert "wheels[0].file" in result.output


def test_doctor_reads_manifests_when_there_is_no_index(tmp_path: Path):
    from tests.select.tiny_wheels import build_wheelhouse

    house = build_wheelhouse(tmp_path / "w", "2.5", False)
    (house / "index.json").unlink()
    result = doctor("--env", str(env_file(tmp_path, "aws-a10g-pypi-torch")), "--wheels", str(house), "--json")
    out = json.loads(result.stdout)
    assert result.exit_code == 0
    assert out["variant"] == "cu12torch2.5cxx11abifalse"
    assert len(out["wheels"]) == len(list(house.glob("*.whl")))


def test_installer_commands_never_touch_dependencies():
    from buildtool.compat.install import Installer

    pip = Installer(python="/venv/bin/python", uv=None).install("/tmp/x.whl", target=Path("/t"))
    assert pip[:4] == ["/venv/bin/python", "-m", "pip", "install"]
    assert "--no-deps" in pip
    assert "--no-index" in pip
    assert "--isolated" in pip  # no PIP_TARGET, PIP_USER or pip.conf sends the files elsewhere
    assert pip[pip.index("--target") + 1] == "/t"
    uv = Installer(python="/venv/bin/python", uv="/usr/bin/uv").install("/tmp/x.whl", target=Path("/t"))
    assert uv[:5] == ["/usr/bin/uv", "pip", "install", "--python", "/venv/bin/python"]
    assert {"--no-deps", "--no-index", "--target"} <= set(uv)
    assert uv[-1] == "/tmp/x.whl"


def test_the_human_report_names_variants_and_groups_wheels_that_share_their_reasons(
    index_dir: Path, index_data: dict
):
    env = env_from_json(json.loads((ENVS / "torch-missing.json").read_text())["env"])
    report = build_report(env, load_index(str(index_dir)), Request())
    console = Console(record=True, width=80)
    render(report, console)
    text = console.export_text()
    # Without --all the other wheels are a count, with the way to list them.
    aarch64 = sum(w.get("platform") == "aarch64" for w in index_data["wheels"])
    others = len(index_data["wheels"]) - aarch64
    count = f"0 fit here, {others} do not, {aarch64} for other CPUs not counted (fa doctor --all lists"
    assert count in " ".join(text.split())
    assert "cu12torch" not in text
    everything = Console(record=True, width=80)
    render(report, everything, show_all=True)
    full = everything.export_text()
    assert ".whl" not in full  # variants at 80 columns; the file names are in --json
    table = full.split("Wheels in")[1].split("\nFixes")[0]
    assert re.search(r"\b\d+ wheels:", table)
    assert table.count("torch-missing") < len(index_data["wheels"]) / 4
    assert "aarch64" in table
    assert all(len(line) <= 80 for line in full.splitlines())


def test_doctor_prints_the_pip_and_uv_lines_of_the_chosen_wheel(tmp_path: Path, index_dir: Path):
    env = str(env_file(tmp_path, "torch29-below-stable-floor"))
    out = json.loads(doctor("--env", env, "--wheels", str(index_dir), "--json").stdout)
    base = index_dir.resolve().as_uri()
    assert (out["variant"], out["install"]["index"]) == ("cu12torch2.9", "cu12-torch2.9")
    assert out["install"]["pip"] == f"pip install --index-url {base}/cu12-torch2.9/simple/ fa-attn==0.1.0"
    assert out["install"]["uv"] == f"uv pip install --index-url {base}/cu12-torch2.9/simple/ fa-attn==0.1.0"
    assert '[[tool.uv.index]]\nname = "fa-cu12-torch2.9"' in out["install"]["uv_pyproject"]


def test_doctor_lines_are_never_wrapped_and_say_when_the_pages_are_missing(tmp_path: Path, index_dir: Path):
    # index_dir holds index.json only (no fa index pages): the lines are printed with what to run first
    env = str(env_file(tmp_path, "ngc-torch212-stable-abi"))
    text = doctor("--env", env, "--wheels", str(index_dir)).stdout
    pip = f"pip install --index-url {index_dir.resolve().as_uri()}/cu12/simple/ fa-attn==0.1.0"
    assert pip in text.splitlines()
    assert "is missing: run fa index on the wheel folder first" in text


def test_doctor_names_no_line_when_no_wheel_installs(tmp_path: Path, index_dir: Path):
    out = json.loads(
        doctor("--env", str(env_file(tmp_path, "torch-missing")), "--wheels", str(index_dir), "--json").stdout
    )
    assert out["install"] is None
