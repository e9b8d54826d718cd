"""`fa check --emulate --arch 9.0a`: it selects the sm_90a units (issue 39) and runs them on the emulator
(wgmma, mbarrier, TMA) with the Q, K, V tensor maps the binding makes, on the problems their features
cover (paged KV too: the key block's page by TMA); a checkout that cannot run them exits 1 saying what is missing,
the kernel source or the emulator's support, never a pass."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import tiles

from buildtool.emucheck import run as emurun
from buildtool.emucheck.harness import emulator
from buildtool.errors import FaError

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "PYTHONPATH": str(REPO / "kernels"), "FA_CHECK_RECORDS": "/nonexistent-fa-check"}

pytestmark = pytest.mark.skipif(
    shutil.which(os.environ.get("CXX", "g++")) is None, reason="--emulate needs a host C++ compiler (g++)"
)


def test_fa_check_emulate_9_0a_without_the_kernel_exits_1_naming_it() -> None:
    if not tiles.missing_sources("9.0a"):
        pytest.skip("csrc/hopper_fwd.cu is in this tree")
    done = subprocess.run(
        [sys.executable, "-m", "buildtool.cli", "check", "--emulate", "--arch", "9.0a"],
        capture_output=True, text=True, env=ENV, cwd=REPO, check=False,
    )  # fmt: skip
    assert done.returncode == 1, done.stdout + done.stderr
    assert "--arch 9.0a: not supported by this checkout yet: kernels/csrc/hopper_fwd.cu" in done.stderr
    assert "nothing was checked" in done.stderr
    assert "pass" not in done.stdout
    assert "Traceback" not in done.stderr


@pytest.fixture
def with_hopper_source(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """kernels/ as it will be once hopper_fwd.cu lands (a copy of kernels/csrc and the file's name; the
    file is not a kernel: nothing here builds or runs it)."""
    if not tiles.missing_sources("9.0a"):
        return REPO / "kernels"
    shutil.copytree(REPO / "kernels" / "csrc", tmp_path / "csrc")
    (tmp_path / tiles.HOPPER_SOURCE).write_text("// stands for issue 39's forward: never compiled here\n")
    monkeypatch.setattr(tiles, "_KERNELS_DIR", tmp_path)
    return tmp_path


@pytest.mark.usefixtures("with_hopper_source")
def test_the_sm90a_units_are_selected() -> None:
    jobs = emurun.emulated_jobs("9.0a", ())
    assert {job.unit for job, _ in jobs} == {
        f"sm_90a/fwd_{t}_d{d}" for t in ("fp16", "bf16") for d in (64, 96, 128, 192, 256)
    }
    for job, unit in jobs:
        assert unit.arch_specific
        assert job.direction == "fwd"
        assert job.module == f"/emulated/sm_90a/{unit.name}.cubin"
        assert job.entries == tiles.HOPPER_ENTRY
    (only,) = emurun.emulated_jobs("9.0a", ("bf16_d128",))
    assert only[0].unit == "sm_90a/fwd_bf16_d128"


@pytest.mark.usefixtures("with_hopper_source")
def test_an_emulator_without_sm90a_refuses_instead_of_passing(monkeypatch: pytest.MonkeyPatch) -> None:
    """An emulator whose harness does not list 9.0a (before issue 39's, or a stale copy) checks nothing."""
    monkeypatch.setattr(emulator(), "ARCH_SPECIFIC", ())
    with pytest.raises(FaError, match="not supported by this emulator yet") as caught:
        emurun.check_emulated("9.0a", ("fwd_bf16_d128",))
    assert caught.value.exit_code == 1


def fa_check(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "buildtool.cli", "check", "--emulate", "--arch", "9.0a", *args],
        capture_output=True, text=True, env=ENV, cwd=REPO, check=False,
    )  # fmt: skip


@pytest.mark.slow
def test_fa_check_emulate_9_0a_passes_a_shipped_unit() -> None:
    """The real path: the CLI builds fa_fwd_sm90a for the emulator, launches it with its tensor maps and
    compares with the fp32 reference; a few problems of one unit (the full run is the CLI's)."""
    if tiles.missing_sources("9.0a"):
        pytest.skip("csrc/hopper_fwd.cu is not in this tree")
    problems = ("blocks-causal", "gqa2", "varlen", "leftpad", "paged128", "paged256")
    done = fa_check("--unit", "fwd_fp16_d64", *(a for p in problems for a in ("--problem", p)), "--json")
    assert done.returncode == 0, done.stdout + done.stderr
    report = json.loads(done.stdout)
    (unit,) = report["units"]
    assert (unit["unit"], unit["verdict"], unit["problems"]) == ("sm_90a/fwd_fp16_d64", "pass", len(problems))
    assert report["verdict"] == "pass"


def test_the_sm90a_units_run_the_paged_problems() -> None:
    """The sm_90a forward reads paged KV (its key blocks TMA-loaded from their pages): its problem list has
    the paged problems of its own key block, as sm 9.0's has of its own, and the CLI passes them."""
    if tiles.missing_sources("9.0a"):
        pytest.skip("csrc/hopper_fwd.cu is not in this tree")
    ((job, unit),) = emurun.emulated_jobs("9.0a", ("fwd_fp16_d64",))
    block_n = unit.defines["FA_BLOCK_N"]
    assert job.paged
    paged = [n for n in emurun.problem_names(job) if n.startswith("paged")]
    assert paged == [f"paged{block_n}", f"paged{2 * block_n}"]
    ((plain, _),) = emurun.emulated_jobs("9.0", ("fwd_fp16_d64",))
    assert plain.paged


def test_a_unit_without_paged_kv_refuses_a_paged_problem_naming_why(monkeypatch: pytest.MonkeyPatch) -> None:
    """An arch whose features lack paged_kv: its problem list leaves the paged problems out, and asking
    for one is bad input naming the reason, not a skip."""
    if tiles.missing_sources("9.0a"):
        pytest.skip("csrc/hopper_fwd.cu is not in this tree")
    features = tiles.features
    monkeypatch.setattr(tiles, "features", lambda arch: features(arch) - {"paged_kv"})
    ((job, _),) = emurun.emulated_jobs("9.0a", ("fwd_fp16_d64",))
    assert not job.paged
    assert not [n for n in emurun.problem_names(job) if n.startswith("paged")]
    with pytest.raises(
        FaError, match="--problem paged128: not a problem of sm_90a/fwd_fp16_d64, which reads no "
    ) as e:
        emurun.check_emulated("9.0a", ("fwd_fp16_d64",), problems=("paged128",))
    assert e.value.exit_code == 2
