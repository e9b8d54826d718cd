"""transformers 4.57 (in a nested venv: the test extra pins 5.x) with the flash_attn stand-in: ModernBERT
imports (its module imports flash_attn.ops.triton.rotary.apply_rotary when flash-attn 2 looks available,
which broke every sentence-transformers model built on it), and its sdpa and flash_attention_2 paths
(unpadded varlen with in-place rotary through the stand-in) match eager (modernbert_4_57.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.nested_venv import make_venv, uv_binary

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
TRANSFORMERS = "transformers==4.57.6"


def test_modernbert_imports_and_runs_on_the_stand_in(tmp_path: Path) -> None:
    python = make_venv(tmp_path / "venv", pip=False, tool="uv")
    install = subprocess.run(
        [uv_binary(), "pip", "install", "-q", "--python", str(python), TRANSFORMERS],
        capture_output=True, text=True, check=False, timeout=600,
    )  # fmt: skip
    if install.returncode != 0:
        pytest.skip(f"{TRANSFORMERS} could not be installed here: {install.stderr[-500:]}")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join([str(REPO / "kernels"), os.environ.get("PYTHONPATH", "")]),
    }
    result = subprocess.run(
        [str(python), "-W", "ignore", str(HERE / "modernbert_4_57.py")],
        capture_output=True, text=True, env=env, check=False, timeout=300,
    )  # fmt: skip
    cases = dict(line.split()[1:3] for line in result.stdout.splitlines() if line.startswith("CASE "))
    assert cases.get("version") == "4.57.6", result.stderr[-3000:]
    assert cases["flash_attn_2_available"] == "True"
    assert cases["apply_rotary_is_fas"] == "True"
    assert float(cases["sdpa_max_error"]) < 1e-5
    # fp32; the flash path's own order (unpadded rows, rotary applied in place) differs from eager's
    assert float(cases["flash_attention_2_max_error"]) < 1e-4
