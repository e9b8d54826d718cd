"""Bench scripts write under the user's cache or where --out/--json says, never into the checkout
(issue 37: `bench/kernels/attention.py --dry-run` left an untracked bench/out/)."""

from __future__ import annotations

import ast
import json
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


def _bench_env(cache: Path) -> dict[str, str]:
    """The running environment with FA_CACHE at `cache` (holding the user cache's NVRTC, so nothing is
    fetched again), no $OUT, and this checkout importable."""
    from buildtool.core.cache import cache_dir

    cache.mkdir(parents=True, exist_ok=True)
    (cache / "toolkits").symlink_to(cache_dir() / "toolkits")
    env = {k: v for k, v in os.environ.items() if k != "OUT"}
    env["FA_CACHE"] = str(cache)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(REPO / "kernels")])
    return env


def _run_bench(script: str, args: list[str], tmp_path: Path) -> Path:
    """Run bench/SCRIPT without --out/--json from a folder of its own; the checkout's bench/ must be
    unchanged after; returns the cache the script was given."""
    before = _files(REPO / "bench")
    cache = tmp_path / "cache"
    done = run_child(
        [sys.executable, str(REPO / "bench" / script), *args], cwd=tmp_path, env=_bench_env(cache)
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert _files(REPO / "bench") - before == set(), "written into the checkout"
    return cache


def test_autotune_without_out_writes_under_the_cache(tmp_path: Path) -> None:
    """autotune.py wrote bench/out/ in the checkout (its default was HERE.parent / "out")."""
    payload = tmp_path / "earlier.json"
    payload.write_text(json.dumps({"candidates": []}))
    cache = _run_bench("kernels/autotune.py", ["--patch-from", str(payload)], tmp_path)
    assert json.loads((cache / "bench" / "autotune" / "autotune.json").read_text())["winners"] == []


def test_kernel_resources_without_json_writes_under_the_cache(tmp_path: Path) -> None:
    """kernel_resources.py wrote bench/results/kernel_resources_cu12.json in the checkout."""
    one = ["--cuda", "12", "--arch", "8.0", "--direction", "fwd", "--dtype", "fp16", "--head-dim", "64"]
    cache = _run_bench("kernels/kernel_resources.py", [*one, "--workers", "1"], tmp_path)
    rows = json.loads((cache / "bench" / "kernel_resources_cu12.json").read_text())["rows"]
    assert {(r["arch"], r["unit"].startswith("fwd_fp16_d64")) for r in rows} == {("8.0", True)}


def test_kernel_model_without_json_writes_under_the_cache(tmp_path: Path) -> None:
    """kernel_model.py wrote bench/results/kernel_model.json in the checkout."""
    cache = _run_bench("kernels/kernel_model.py", ["--arch", "8.0", "--head-dim", "64"], tmp_path)
    rows = json.loads((cache / "bench" / "kernel_model.json").read_text())
    assert {r["arch"] for r in rows} == {"8.0"}


def _output_defaults(script: Path) -> list[str]:
    """The default=... of each --out/--json option of a bench script, as source text."""
    tree = ast.parse(script.read_text())
    found = []
    for call in ast.walk(tree):
        if not (isinstance(call, ast.Call) and getattr(call.func, "attr", "") == "add_argument"):
            continue
        names = [a.value for a in call.args if isinstance(a, ast.Constant)]
        if not {"--out", "--json"} & set(names):
            continue
        found += [ast.unparse(k.value) for k in call.keywords if k.arg == "default"]
    return found


def test_no_bench_script_defaults_its_output_to_the_checkout_or_the_working_folder() -> None:
    """build.py and install_build.py wrote bench-build.json / bench-install-build.json into the folder
    they were run from (the checkout, as docs/figures.md's commands run them); the cheap scripts are run
    for real above, these two are whole builds, so their defaults are read."""
    scripts = sorted((REPO / "bench").rglob("*.py"))
    assert len(scripts) > 20
    bad = {
        f"{script.relative_to(REPO)}: default={default}"
        for script in scripts
        for default in _output_defaults(script)
        if default != "None" and not any(ok in default for ok in ("cache", "gettempdir"))
    }
    assert bad == set(), "write under figures.cache_out(...) (the user's cache) or a temp folder instead"
