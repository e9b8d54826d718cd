"""`fa check` and `python -m fa_attn.check` as a user runs them: no GPU here, so verdict no-gpu and exit
1 without a traceback; `fa check --emulate` passes on the shipped kernels and fails, naming the unit
and the error, on a deliberately broken copy of their source (a causal mask off by one)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "kernels"), "FA_CHECK_RECORDS": "/nonexistent-fa-check"}
UNITS = ["--unit", "fwd_fp16_d32", "--unit", "bwd_fp16_d32"]  # one arch, two units, tiny shapes


def run(*argv: str, cwd: Path = REPO) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *argv], capture_output=True, text=True, env=ENV, cwd=cwd, check=False
    )


@pytest.mark.parametrize(
    "argv", [["-m", "buildtool.cli", "check"], ["-m", "fa_attn.check"]], ids=["fa", "wheel"]
)
def test_without_a_gpu_the_verdict_is_no_gpu(argv: list[str]) -> None:
    done = run(*argv)
    assert done.returncode == 1, done.stderr
    assert "verdict no-gpu" in done.stdout
    assert "fix: " in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
    assert max(len(line) for line in done.stdout.splitlines()) <= 80
    as_json = run(*argv, "--json")
    assert as_json.returncode == 1, as_json.stderr
    report = json.loads(as_json.stdout)
    assert report["verdict"] == "no-gpu"
    assert report["fix"]


def test_bad_input_exits_2() -> None:
    done = run("-m", "buildtool.cli", "check", "--arch", "8.0", "--unit", "x")
    assert done.returncode == 2
    assert "--emulate" in done.stderr


def test_an_unknown_problem_exits_2_naming_the_problems() -> None:
    done = run("-m", "buildtool.cli", "check", "--emulate", "--unit", "fwd_fp16_d32", "--problem", "nosuch")
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--problem nosuch" in done.stderr
    assert "window-left" in done.stderr  # the problems there are
    assert "Traceback" not in done.stderr


def emulator_or_skip() -> None:
    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("the kernel emulator needs a host C++ compiler (g++)")


def test_emulate_passes_on_the_shipped_kernels() -> None:
    emulator_or_skip()
    done = run("-m", "buildtool.cli", "check", "--emulate", "--arch", "8.0", *UNITS, "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    assert report["verdict"] == "pass"
    assert [(u["unit"], u["verdict"]) for u in report["units"]] == [
        ("sm_80/fwd_fp16_d32", "pass"),
        ("sm_80/bwd_fp16_d32", "pass"),
    ]
    assert all(0 < u["max_err"] <= u["bound"] for u in report["units"])


# Each a one-line fault in the device code that only one of the check's layouts exposes: the causal
# mask (every layout), the varlen key offset (packed sequences after the first read another's keys)
# and the KV cache's used rows (the shorter sequence attends to rows it does not use).
MUTATIONS = {
    "causal-mask": (
        "softmax.cuh",
        "x = (8 * j + e < keys_left) & (rel >= lo) & (rel <= hi) ? x : -pos_inf();",
        "x = (8 * j + e < keys_left) & (rel >= lo) & (rel < hi) ? x : -pos_inf();",
        "padded",
        "blocks-causal",
    ),
    "varlen-offset": (
        "attention.cuh",
        "s.k_row0 = p.cu_seqlens_k[b];",
        "s.k_row0 = p.cu_seqlens_k[b] / 2;",
        "varlen",
        "varlen",
    ),
    "kvcache-used-rows": (
        "attention.cuh",
        "if (p.seqused_k != nullptr) end = p.seqused_k[b];",
        "if (p.seqused_k != nullptr) end = p.seqused_k[0];",
        "kvcache",
        "kvcache",
    ),
}


@pytest.mark.parametrize("mutation", sorted(MUTATIONS))
def test_emulate_fails_naming_the_unit_on_a_broken_kernel(tmp_path: Path, mutation: str) -> None:
    emulator_or_skip()
    file, line, broken, layout, problem = MUTATIONS[mutation]
    csrc = tmp_path / "csrc"
    shutil.copytree(REPO / "kernels" / "csrc", csrc)
    source = (csrc / file).read_text()
    assert source.count(line) == 1, "the mutation's target line changed"
    (csrc / file).write_text(source.replace(line, broken))
    unit = ["--unit", "fwd_fp16_d32", "--problem", problem]
    done = run("-m", "buildtool.cli", "check", "--emulate", *unit, "--source", str(csrc))
    assert done.returncode == 1, done.stdout + done.stderr
    assert "sm_80/fwd_fp16_d32" in done.stdout
    assert "out: error" in done.stdout
    assert f"[{problem}]" in done.stdout  # the failing problem is named, with its layout
    assert f" {layout} " in done.stdout
    assert "verdict fail" in done.stdout
    assert "Traceback" not in done.stdout + done.stderr
