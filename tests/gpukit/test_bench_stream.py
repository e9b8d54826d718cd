"""bench/kernels/attention.py streams: rows land in attention.jsonl as they are measured, a SIGTERM keeps them,
--resume measures only the rest, --plot redraws from the lines, and the targets read the rows. Run as
the dry run (CPU stand-ins for the three implementations)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import attention
import pytest

SCRIPT = Path(attention.__file__)
SMALL = ["--dry-run", "--dtypes", "bf16", "--head-dims", "128", "256", "--reps", "2", "--warmup", "1"]


def _rows(path: Path) -> list[dict]:
    return attention.read_rows(path)[1]


def test_a_dry_run_streams_one_row_per_shape_and_mode(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *SMALL,
            "--seqlens",
            "512",
            "2048",
            "--causal",
            "no",
            "--out",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    rows = _rows(tmp_path / "attention.jsonl")
    assert len(rows) == 2 * 2 * 3  # head dims x seqlens x modes
    assert rows[0]["shape"]["head_dim"] == 128  # the targets' head dim first
    assert all(
        r["results"]["sdpa_cudnn"] == {"skipped": "dry-run stand-in: refuses head dims above 128"}
        for r in rows
        if r["shape"]["head_dim"] == 256
    )
    assert all(r["ratio"]["sdpa_flash"] is not None for r in rows)
    table = [ln for ln in done.stdout.splitlines() if ln.startswith("bf16 d")]
    assert len(table) == len(rows)
    assert "refused" in table[-1]


def test_sigterm_keeps_the_rows_and_resume_measures_the_rest(tmp_path: Path) -> None:
    first = tmp_path / "first"
    # Every default shape, each timed 1000 times: minutes of work, so the SIGTERM lands mid-run even when
    # a busy machine delays this test's polling (with 20 repetitions the run could finish first).
    slow = ["--dry-run", "--reps", "1000", "--warmup", "2", "--out", str(first)]
    proc = subprocess.Popen([sys.executable, str(SCRIPT), *slow], stdout=subprocess.PIPE, text=True)
    jsonl = first / "attention.jsonl"
    # The first rows may wait for the emulator's kernels to compile (g++, slow on a busy machine).
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not (jsonl.is_file() and len(_rows(jsonl)) >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 1, out  # incomplete
    assert "interrupted: keeping the rows measured so far" in out
    kept = _rows(jsonl)
    assert 3 <= len(kept) < 72 * 3
    skipped = json.loads(jsonl.read_text().splitlines()[-1])["skipped"]
    assert skipped
    assert "to measure them: add --resume" in out

    second = tmp_path / "second"
    again = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            *SMALL,
            "--seqlens",
            "512",
            "--causal",
            "no",
            "--out",
            str(second),
            "--resume",
            str(jsonl),
        ],
        capture_output=True,
        text=True,
        check=True,
    )
    resumed = [ln for ln in again.stdout.splitlines() if ln.endswith("(resumed)")]
    assert len(resumed) == 3  # the first shape (d128 s512 full) was whole in the first run


def test_plot_redraws_from_the_lines(tmp_path: Path) -> None:
    pytest.importorskip("matplotlib")
    subprocess.run(
        [sys.executable, str(SCRIPT), *SMALL, "--seqlens", "512", "--causal", "no", "--out", str(tmp_path)],
        capture_output=True,
        check=True,
    )
    png = tmp_path / "again.png"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--plot", str(png), "--jsonl", str(tmp_path / "attention.jsonl")],
        capture_output=True,
        text=True,
        check=True,
    )
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "6 rows from" in done.stdout


def test_targets_read_the_ratio_rows() -> None:
    def row(mode: str, seqlen: int, ratio: float | None) -> dict:
        shape = attention.Shape(16384 // seqlen, seqlen, 16, 128, False, "bf16")
        return {
            "shape": shape.__dict__,
            "mode": mode,
            "results": {"fa_attn": {"skipped": "x"}},
            "ratio": {"sdpa_flash": ratio},
        }

    rows = [row("fwd", 1024, 0.5), row("fwd", 2048, 1.1), row("bwd", 4096, 0.85), row("fwd_bwd", 8192, None)]
    lines = attention.check_targets(rows, "NVIDIA H100 80GB HBM3")
    assert lines[0].startswith("PASS fwd bf16 d128 s2048")  # s1024 is below the targets' seqlens
    assert lines[1].startswith("FAIL bwd bf16 d128 s4096")
    assert "0.85x" in lines[1]
    assert lines[2].startswith("n/a  fwd_bwd")
    assert attention.check_targets(rows, "NVIDIA H200")[0].startswith("targets are for H100")


def test_environment_is_not_needed_for_list() -> None:
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, check=True, env=env
    )
    assert "72 shapes x 3 impls x 3 modes" in done.stdout
