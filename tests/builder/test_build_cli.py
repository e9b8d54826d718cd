"""`fa build` end to end, as a user runs it (subprocesses): a --local build of the real kernels whose
wheel installs into a fresh venv and works on CPU, a second build that compiles nothing (counters),
a build killed half-way that resumes, and exit codes 2 (bad input) and 1 (failed build)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
import zipfile
from pathlib import Path

import pytest

from tests.builder.conftest import fa_command
from tests.child import run_child
from tests.nested_venv import make_venv

pytestmark = [pytest.mark.slow, pytest.mark.network]

REPO = Path(__file__).resolve().parents[2]

TINY = """\
version: "0.1.0"
torch: ["2.8"]
cuda: [12]
python: ["3.11"]
archs:
  12: {archs}
kernels:
  dtypes: {dtypes}
  head_dims: [64]
  directions: [fwd]
"""


def _fa(args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    return run_child(fa_command(*args), cwd=cwd, env={**os.environ, **env})


def _summary(proc: subprocess.CompletedProcess) -> dict:
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


@pytest.mark.usefixtures("fresh_cache")
def test_local_build_real_kernels_installs_and_rebuilds_from_cache(tmp_path):
    (tmp_path / "matrix.yaml").write_text(TINY.format(archs='["8.0"]', dtypes="[fp16]"))
    out = tmp_path / "wheels"
    real = tmp_path / "kernels"  # a snapshot of the repo's kernels/, so both builds see the same sources
    shutil.copytree(REPO / "kernels", real, ignore=shutil.ignore_patterns("__pycache__"))
    first = _summary(
        _fa(["build", "--local", "--out", str(out), "--json", "-j", "2"], tmp_path, FA_KERNELS_DIR=str(real))
    )
    assert first["nvrtc_compiles"] + first["nvrtc_ptx_with_cubin"] >= 2
    assert first["nvrtc_ptx_with_cubin"] >= 1  # the 8.0 PTX comes with the 8.0 cubin's compile
    assert first["cxx_compiles"] == 1
    (wheel,) = first["wheels"]
    assert wheel["platform_tag"].startswith(("manylinux_", "linux_"))
    assert wheel["cells"] == 1

    second = _summary(
        _fa(["build", "--local", "--out", str(out), "--json", "-j", "2"], tmp_path, FA_KERNELS_DIR=str(real))
    )
    assert second["nvrtc_compiles"] == 0
    assert second["cxx_compiles"] == 0
    assert second["nvrtc_cached"] == first["nvrtc_compiles"] + first["nvrtc_ptx_with_cubin"]
    assert second["cxx_cached"] == 1
    assert second["wheels"][0]["cache_hits"] == first["nvrtc_compiles"] + first["nvrtc_ptx_with_cubin"] + 1
    assert (out / "index.json").is_file()
    assert not list(out.glob("*.fa-tmp-*"))

    venv = tmp_path / "venv"
    py = make_venv(venv)
    pip = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-index", "--find-links", str(out), "fa-attn"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert pip.returncode == 0, pip.stderr
    check = """
import os, warnings, torch, fa_attn
q = torch.randn(1, 8, 2, 64)
with warnings.catch_warnings():
    warnings.simplefilter("ignore")
    o = fa_attn.flash_attn_func(q, q, q, causal=True)
ref = torch.nn.functional.scaled_dot_product_attention(
    q.transpose(1, 2), q.transpose(1, 2), q.transpose(1, 2), is_causal=True).transpose(1, 2)
assert torch.allclose(o, ref, atol=1e-5), (o - ref).abs().max()
lib = os.path.join(os.path.dirname(fa_attn.__file__), "libfa_attn_ops.so")
torch.ops.load_library(lib)
print(torch._C._dispatch_has_kernel_for_dispatch_key("fa_attn::fwd", "CUDA"))
"""
    run = subprocess.run([str(py), "-c", check], cwd=tmp_path, capture_output=True, text=True, check=False)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "True"  # the binding registered its CUDA kernel under the CPU torch


def test_killed_build_resumes_and_leaves_no_partial_wheel(tmp_path, fixture_tree, fresh_cache):
    archs = '["7.5", "8.0", "8.6", "8.9", "9.0", "10.0", "12.0"]'
    (tmp_path / "matrix.yaml").write_text(TINY.format(archs=archs, dtypes="[fp16, bf16]"))
    out = tmp_path / "wheels"
    env = {**os.environ, "FA_KERNELS_DIR": str(fixture_tree)}
    cmd = fa_command("build", "--local", "--out", str(out), "--json", "-j", "1")
    proc = subprocess.Popen(cmd, cwd=tmp_path, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    images = fresh_cache / "kernels"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(images.rglob("*.cubin"))) < 3:
        assert proc.poll() is None, "the build finished before it could be killed"
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    done_before = len(list(images.rglob("*.cubin")))
    assert done_before >= 3
    assert not list(out.glob("*.whl"))  # killed during compiles: no wheel, partial or whole
    # What a later build may and may not sweep: a dead build's half-written wheel goes; the user's own
    # look-alike names and anything below --out stay.
    stale = out / f"fa_attn-0.0.9-py3-none-any.whl.fa-tmp-{proc.pid}-abcdefgh"
    users = [out / "draft.tmp-v2", out / "docs" / f"x.whl.fa-tmp-{proc.pid}-abcdefgh"]
    for p in [stale, *users]:
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text("x")

    resumed = _summary(
        _fa(
            ["build", "--local", "--out", str(out), "--json", "-j", "2"],
            tmp_path,
            FA_KERNELS_DIR=str(fixture_tree),
        )
    )
    assert resumed["nvrtc_cached"] >= done_before
    images = resumed["nvrtc_cached"] + resumed["nvrtc_compiles"] + resumed["nvrtc_ptx_with_cubin"]
    # SASS programs x dtypes + PTX x dtypes: 8.6 and 8.9 run sm 8.0's cubin, the fixture's program being
    # the same for every arch (plan.reuse_lower_minor), so 5 of the 7 archs compile
    assert images == 5 * 2 + 2
    assert not stale.exists()
    assert all(p.read_text() == "x" for p in users)
    assert not list(out.glob("*.fa-tmp-*"))
    for whl in out.glob("*.whl"):
        with zipfile.ZipFile(whl) as zf:
            assert zf.testzip() is None


def test_out_inside_the_sources_is_refused_before_any_work(tmp_path, fixture_tree):
    """Wheels written into the package they pack would be packed into the next ones (a wheel grew
    132 KB -> 420 KB -> 1.1 MB over three runs): refused with exit 2, nothing written."""
    link = tmp_path / "link"
    link.symlink_to(fixture_tree / "fa_attn", target_is_directory=True)
    for out in (fixture_tree / "fa_attn", fixture_tree / "fa_attn" / "wheels", fixture_tree, link):
        proc = _fa(["build", "--local", "--out", str(out)], tmp_path, FA_KERNELS_DIR=str(fixture_tree))
        assert proc.returncode == 2, proc.stderr
        said = " ".join(proc.stderr.split())
        assert "inside the kernels source tree" in said
        assert "fix:" in said
    proc = _fa(["build", "--local", "--out", "kernels/fa_attn"], REPO)
    assert proc.returncode == 2
    assert "kernels/fa_attn" in proc.stderr
    assert not (fixture_tree / "fa_attn" / "wheels").exists()
    assert not list(fixture_tree.rglob("*.whl"))


@pytest.mark.usefixtures("fresh_cache")
def test_out_that_is_a_file_names_the_path_and_the_fix(tmp_path, fixture_tree):
    (tmp_path / "matrix.yaml").write_text(TINY.format(archs='["8.0"]', dtypes="[fp16]"))
    blocker = tmp_path / "wheels"
    blocker.write_text("a file where the output folder goes")
    proc = _fa(["build", "--local", "--out", str(blocker)], tmp_path, FA_KERNELS_DIR=str(fixture_tree))
    said = " ".join(proc.stderr.split())
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert f"cannot create the folder {blocker}: File exists" in said
    assert "fix: a file is in the way" in said


def test_bad_matrix_exits_2_with_the_field(tmp_path):
    (tmp_path / "matrix.yaml").write_text('torch: ["2.8"]\ncuda: [12]\npython: ["3.11"]\nbogus: 1\n')
    proc = _fa(["build", "--dry-run"], tmp_path)
    assert proc.returncode == 2
    assert "bogus" in proc.stderr
    assert "fix:" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = _fa(["build", "--jobs", "0"], tmp_path)
    assert proc.returncode == 2
    assert "--jobs" in proc.stderr


@pytest.mark.usefixtures("fresh_cache")
def test_failed_compile_exits_1_naming_unit_and_arch(tmp_path, broken_tree):
    (tmp_path / "matrix.yaml").write_text(TINY.format(archs='["8.0"]', dtypes="[fp16]"))
    proc = _fa(
        ["build", "--local", "--out", str(tmp_path / "w"), "--no-progress"],
        tmp_path,
        FA_KERNELS_DIR=str(broken_tree),
    )
    assert proc.returncode == 1, proc.stderr
    assert "fwd_fp16_d64" in proc.stderr
    assert "sm_80" in proc.stderr
    assert "no_such_function" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert "re-run" in proc.stderr


@pytest.mark.usefixtures("fresh_cache")
def test_dry_run_json_reports_cache_status(tmp_path, fixture_tree):
    (tmp_path / "matrix.yaml").write_text(TINY.format(archs='["8.0"]', dtypes="[fp16]"))
    proc = _fa(["build", "--local", "--dry-run", "--json"], tmp_path, FA_KERNELS_DIR=str(fixture_tree))
    plan = _summary(proc)
    assert plan["totals"]["to_compile"] == len(plan["compile_jobs"]) == 2
    assert not (tmp_path / "wheels").exists()  # a dry run builds nothing


def test_two_builds_sharing_a_cache(tmp_path, fixture_tree, fresh_cache):
    """Two builds at once on one FA_CACHE (different output folders) both finish with whole wheels, and
    share the work: each kernel and the binding is compiled once, by whichever build gets to it first;
    the other waits for it and reuses it."""
    (tmp_path / "matrix.yaml").write_text(TINY.format(archs='["8.0", "9.0"]', dtypes="[fp16]"))
    env = {**os.environ, "FA_KERNELS_DIR": str(fixture_tree)}
    procs = [
        subprocess.Popen(
            fa_command("build", "--local", "--out", str(tmp_path / f"w{i}"), "--json", "-j", "1"),
            cwd=tmp_path,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    outs = [p.communicate(timeout=600) for p in procs]
    assert all(p.returncode == 0 for p in procs), [err[-2000:] for _, err in outs]
    wheels = [next((tmp_path / f"w{i}").glob("*.whl")) for i in range(2)]
    assert wheels[0].name == wheels[1].name
    assert wheels[0].read_bytes() == wheels[1].read_bytes()  # same inputs, same bytes (reproducible)
    assert not list(fresh_cache.rglob("*.fa-tmp-*"))
    summaries = [json.loads(out) for out, _ in outs]
    # sm_80 and sm_90 SASS, once each; the sm_90 PTX comes with the sm_90 cubin's compile, once
    assert sum(s["nvrtc_compiles"] for s in summaries) == 2
    assert sum(s["nvrtc_ptx_with_cubin"] for s in summaries) == 1
    assert all(s["nvrtc_compiles"] + s["nvrtc_ptx_with_cubin"] + s["nvrtc_cached"] == 3 for s in summaries)
    assert sum(s["cxx_compiles"] for s in summaries) == 1


@pytest.mark.usefixtures("fresh_cache")
def test_matrix_build_in_shards_merges_with_fa_index(tmp_path, fixture_tree):
    """The release flow: shards built apart (torch headers from PyPI by Range), copied together, and
    re-indexed; the merged index lists every wheel of the plan."""
    (tmp_path / "matrix.yaml").write_text(TINY.format(archs='["8.0"]', dtypes="[fp16]"))
    merged = tmp_path / "all"
    merged.mkdir()
    names: list[str] = []
    for k in (1, 2):
        out = tmp_path / f"shard{k}"
        summary = _summary(
            _fa(
                ["build", "--shard", f"{k}/2", "--out", str(out), "--json", "-j", "2"],
                tmp_path,
                FA_KERNELS_DIR=str(fixture_tree),
            )
        )
        names += [w["file"] for w in summary["wheels"]]
        assert (out / "logs" / f"build-{k}of2.json").is_file()
        for whl in out.glob("*.whl"):
            shutil.copy(whl, merged)
    assert sorted(names) == sorted(p.name for p in merged.glob("*.whl"))
    assert any(n.endswith("-py3-none-any.whl") for n in names)
    assert any("+cu12torch2.8-" in n for n in names)
    proc = _fa(["index", str(merged)], tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = json.loads((merged / "index.json").read_text())
    assert sorted(w["file"] for w in data["wheels"]) == sorted(names)
