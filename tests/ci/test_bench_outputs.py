"""Bench scripts write under the user's cache or where --out/--json says, never into the checkout
(issue 37: `bench/kernels/attention.py --dry-run` left an untracked bench/out/)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from tests.child import run_child

REPO = Path(__file__).resolve().parents[2]


def _files(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*") if "__pycache__" not in p.parts}


def test_attention_dry_run_without_out_writes_under_the_cache(tmp_path: Path) -> None:
    before = _files(REPO / "bench")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["FA_CACHE"] = str(tmp_path / "cache")
    small = ["--head-dims", "64", "--seqlens", "512", "--dtypes", "fp16", "--causal", "no"]
    small += ["--impls", "fa_attn", "--warmup", "1", "--reps", "1"]
    done = run_child(
        [sys.executable, str(REPO / "bench" / "kernels" / "attention.py"), "--dry-run", *small],
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "cache" / "bench" / "attention" / "attention.jsonl").is_file()
    assert _files(REPO / "bench") == before
