"""The smoke test's choice of cases from a wheel's manifest, and its dry run on the emulator with an
injected CUDA error: that case gets its verdict, a new worker runs the next."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import smoke


def _k(arch: str, image: str, unit: str) -> dict:
    direction, dtype, d = unit.split("_")
    return {
        "arch": arch,
        "image": image,
        "unit": unit,
        "direction": direction,
        "dtype": dtype,
        "head_dim": int(d[1:]),
    }


MANIFEST = {
    "kernels": [
        _k("8.0", "sass", "fwd_bf16_d64"),
        _k("8.6", "sass", "fwd_bf16_d64"),
        _k("9.0", "sass", "fwd_bf16_d64"),
        _k("9.0", "sass", "bwd_bf16_d64"),
        _k("9.0", "ptx", "fwd_bf16_d64"),
        _k("12.0", "sass", "fwd_bf16_d64"),
        _k("7.5", "ptx", "fwd_fp16_d64"),
    ]
}


def test_sass_of_the_devices_major_at_or_below_it_and_ptx_on_request() -> None:
    on_89 = smoke.runnable_kernels(MANIFEST, "8.9", ["sass"])
    assert [(k["arch"], k["unit"]) for k in on_89] == [("8.6", "fwd_bf16_d64")]  # the best minor <= 8.9
    on_90 = smoke.runnable_kernels(MANIFEST, "9.0", ["sass", "ptx"])
    assert [(k["image"], k["arch"], k["unit"]) for k in on_90] == [
        ("ptx", "9.0", "fwd_bf16_d64"),  # each unit's newest PTX at or below the device
        ("ptx", "7.5", "fwd_fp16_d64"),
        ("sass", "9.0", "fwd_bf16_d64"),
        ("sass", "9.0", "bwd_bf16_d64"),
    ]
    cases = smoke.make_cases(on_90, only="sass")
    assert [c.id for c in cases][:2] == ["fwd_bf16_d64-sass9.0-full", "fwd_bf16_d64-sass9.0-causal"]


@pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel emulator needs g++")
def test_a_cuda_error_costs_its_case_and_a_new_worker_goes_on(tmp_path: Path) -> None:
    out = tmp_path / "smoke.json"
    env = dict(os.environ, FA_SMOKE_FAULT="fwd_fp16_d64-sass9.0-full=cuda-error")
    done = subprocess.run(
        [sys.executable, smoke.__file__, "--dry-run", "--only", "fwd_fp16_d64", "--json", str(out)],
        capture_output=True,
        text=True,
        env=env,
        check=False,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    cases = json.loads(out.read_text())["cases"]
    assert [(c["id"], c["verdict"]) for c in cases] == [
        ("fwd_fp16_d64-sass9.0-full", "cuda-error"),
        ("fwd_fp16_d64-sass9.0-causal", "ok"),
    ]
    assert "CUDA error 700" in cases[0]["message"]
    assert cases[1]["worst"] in ("out", "lse")
    assert "smoke: 2 cases" in done.stdout
    assert "1 ok, 1 cuda-error" in done.stdout
