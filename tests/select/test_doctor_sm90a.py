"""`fa doctor` on an H100 with a wheel that carries the arch-specific sm_90a forward (issue 39): the GPU
line says which path fp16 and bf16 take and why (sm_90a once its first-use check passed, else sm 9.0),
`--json` carries the same, and a GPU of any other arch is never told sm_90a. Run as a user runs it (the
CLI in-process, COLUMNS=80), on a machine of the test corpus and an index.json written here from
`fa build`'s packager and kernels/tiles.py's table (the sm_90a units before csrc/hopper_fwd.cu lands)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from typer.testing import CliRunner

from buildtool.builder import package
from buildtool.builder.plan import CompileJob
from buildtool.cli import app
from buildtool.core import kernels_src
from buildtool.core.runtime import schema
from tests.select.fixture_index import PLATFORM, REQUIRES_PYTHON, kernel_spec

ENVS = Path(__file__).with_name("envs")
tiles = kernels_src.tiles()
TABLE = SimpleNamespace(**{name: getattr(tiles, name) for name in dir(tiles) if not name.startswith("__")})
TABLE.units = tiles.table_units
runner = CliRunner()


def index_with_sm90a(folder: Path) -> Path:
    """index.json of the cu12 torch 2.7 wheel `fa build` makes once sm_90a's units exist."""
    sass = ("7.5", "8.0", "8.6", "9.0", "9.0a", "10.0", "12.0")
    images = [(a, "sass") for a in sass] + [("12.0", "ptx")]
    jobs = tuple(CompileJob(12, a, image, u.name) for a, image in images for u in tiles.table_units(a))
    spec = dataclasses.replace(kernel_spec(12, "2.7", True), sass=sass, ptx="12.0", compile_jobs=jobs)
    info = package.manifest(spec, TABLE).info
    entry = schema.IndexEntry(
        file=f"fa_attn-{info.version}-py3-none-{PLATFORM}.whl", sha256="0" * 64, size=1, info=info,
        python_tag="py3", abi_tag="none", platform_tag=PLATFORM, requires_python=REQUIRES_PYTHON,
    )  # fmt: skip
    folder.mkdir(exist_ok=True)
    (folder / "index.json").write_text(json.dumps(schema.index_json([entry])))
    return folder


def env_file(tmp_path: Path, case: str, **change: Any) -> Path:
    path = tmp_path / f"{case}.json"
    path.write_text(json.dumps({**json.loads((ENVS / f"{case}.json").read_text())["env"], **change}))
    return path


def doctor(*args: str) -> tuple[int, str]:
    done = runner.invoke(app, ["doctor", *args], env={"COLUMNS": "80"})
    return done.exit_code, done.stdout


def test_doctor_tells_an_h100_it_gets_sm90a_once_checked(tmp_path: Path) -> None:
    wheels = index_with_sm90a(tmp_path / "wheels")
    env = env_file(tmp_path, "h100-driver535-torch27-cu128")
    code, out = doctor("--env", str(env), "--wheels", str(wheels))
    assert code == 0, out
    flat = " ".join(out.split())
    assert "fp16, bf16: SASS for sm 9.0a once checked, else SASS for sm 9.0, head dim 128" in flat
    assert "arch-specific forward (wgmma, TMA) for compute capability 9.0 only" in flat
    assert "not verified on a GPU" in flat
    assert all(len(line) <= 80 for line in out.splitlines() if str(wheels) not in line)

    code, text = doctor("--env", str(env), "--wheels", str(wheels), "--json")
    assert code == 0, text
    report = json.loads(text)
    (gpu,) = report["gpus"]
    for dtype in ("fp16", "bf16"):
        runtime = gpu["dtypes"][dtype]
        assert (runtime["path"], runtime["arch"], runtime["passed_over"]) == ("sass", "9.0a", [])
        assert (runtime["then"]["path"], runtime["then"]["arch"]) == ("sass", "9.0")


def test_doctor_says_why_a_backward_call_takes_sm90(tmp_path: Path) -> None:
    wheels = index_with_sm90a(tmp_path / "wheels")
    env = env_file(tmp_path, "h100-driver535-torch27-cu128")
    code, text = doctor("--env", str(env), "--wheels", str(wheels), "--backward", "--json")
    assert code == 0, text
    runtime = json.loads(text)["gpus"][0]["dtypes"]["bf16"]
    assert (runtime["path"], runtime["arch"], runtime["then"]) == ("sass", "9.0", None)
    assert [r["code"] for r in runtime["passed_over"]] == ["arch-specific-unsupported"]
    code, out = doctor("--env", str(env), "--wheels", str(wheels), "--backward")
    assert "arch-specific-unsupported" in out
    assert "backward-unsupported" in " ".join(out.split())


@pytest.mark.parametrize("case", ["a100-ngc-24.10", "b200-sm100", "gb300-sm103", "mixed-a100-t4"])
def test_no_other_gpu_is_told_sm90a(tmp_path: Path, case: str) -> None:
    wheels = index_with_sm90a(tmp_path / "wheels")
    env = env_file(tmp_path, case)
    code, text = doctor("--env", str(env), "--wheels", str(wheels), "--json")
    report = json.loads(text)
    for gpu in report["gpus"]:
        for runtime in gpu["dtypes"].values():
            assert runtime["arch"] != "9.0a" and runtime["then"] is None, (case, code, runtime)
