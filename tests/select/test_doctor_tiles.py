"""`fa doctor` shows the tile each direction runs with, chosen by the GPU's opt-in shared memory per
block (the environment's `smem_per_block`, else the kernel table's figure for its arch), and says why
split-KV does not run. Run as a user runs it: the CLI in-process on an --env file and an index folder."""

from __future__ import annotations

import json
from pathlib import Path

from typer.testing import CliRunner

from buildtool.cli import app
from buildtool.core import kernels_src
from tests.select.conftest import machine
from tests.select.fixture_index import _index, kernel_entry

runner = CliRunner()
TORCH = {"version": "2.8.0+cu128", "cuda": "12.8", "hip": None, "cxx11abi": True}


def doctor_json(tmp_path: Path, gpu: dict, code: int = 0, **request: str) -> dict:
    """fa doctor --json for one GPU and a wheel with sm 8.0's SASS only (as FlashAttention-2 ships);
    `code`: its exit status (1 when calls fall back)."""
    index = tmp_path / "index"
    index.mkdir(exist_ok=True)
    entry = kernel_entry(12, "2.8", True, sass=("8.0",), ptx=None)
    (index / "index.json").write_text(json.dumps(_index([entry])))
    env = tmp_path / "env.json"
    env.write_text(json.dumps(machine(torch=TORCH, driver={"version": "580.65.06"}, gpus=[gpu])))
    args = ["doctor", "--env", str(env), "--wheels", str(index), "--json"]
    for key, value in request.items():
        args += [f"--{key.replace('_', '-')}", value]
    done = runner.invoke(app, args)
    assert done.exit_code == code, done.stdout
    return json.loads(done.stdout)


def test_doctor_names_the_tile_the_gpu_runs(tmp_path: Path) -> None:
    tiles = kernels_src.tiles()
    rtx3090 = {"name": "NVIDIA GeForce RTX 3090", "sm": "8.6", "memory_mib": 24576}
    report = doctor_json(tmp_path, rtx3090, head_dim="256", dtype="bf16")
    runtime = report["gpus"][0]["runtime"]
    assert (runtime["path"], runtime["arch"]) == ("sass", "8.0")
    assert runtime["tiles"]["fwd"] == tiles.default_tile("8.6", "fwd", 256).label
    a100 = {"name": "NVIDIA A100", "sm": "8.0", "memory_mib": 81920}
    assert doctor_json(tmp_path, a100, head_dim="256", dtype="bf16")["gpus"][0]["runtime"]["tiles"][
        "fwd"
    ] == (tiles.default_tile("8.0", "fwd", 256).label)


def test_the_gpu_s_own_limit_decides(tmp_path: Path) -> None:
    """A part that reports less shared memory than its arch's figure (the description's smem_per_block)
    gets the smaller tile, or a fallback naming both numbers when no tile fits."""
    a100 = {"name": "a smaller part", "sm": "8.0", "memory_mib": None, "smem_per_block": 101376}
    runtime = doctor_json(tmp_path, a100, head_dim="256", dtype="bf16")["gpus"][0]["runtime"]
    assert runtime["tiles"]["fwd"] == kernels_src.tiles().default_tile("8.6", "fwd", 256).label
    tiny = {**a100, "smem_per_block": 65536}
    runtime = doctor_json(tmp_path, tiny, 1, head_dim="256", dtype="bf16")["gpus"][0]["runtime"]
    assert runtime["path"] == "fallback"
    (reason,) = runtime["reasons"]
    assert reason["code"] == "arch-unsupported"
    assert "98304" in reason["message"]
    assert "offers 65536" in reason["message"]


def test_doctor_text_shows_the_tile(tmp_path: Path) -> None:
    index = tmp_path / "index"
    index.mkdir()
    (index / "index.json").write_text(
        json.dumps(_index([kernel_entry(12, "2.8", True, sass=("8.0",), ptx=None)]))
    )
    env = tmp_path / "env.json"
    gpu = {"name": "NVIDIA GeForce RTX 3090", "sm": "8.6", "memory_mib": 24576}
    env.write_text(json.dumps(machine(torch=TORCH, driver={"version": "580.65.06"}, gpus=[gpu])))
    done = runner.invoke(
        app,
        ["doctor", "--env", str(env), "--wheels", str(index), "--head-dim", "256"],
        env={"COLUMNS": "200"},
    )
    assert done.exit_code == 0, done.stdout
    label = kernels_src.tiles().default_tile("8.6", "fwd", 256).label
    assert f"SASS for sm 8.0, head dim 256, fwd tile {label}" in done.stdout
