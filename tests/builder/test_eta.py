"""The kernel compiles' time left (builder/eta.py) on README's first build: the release matrix's x86_64
plan in the order the build compiles it, two workers, each NVRTC run lasting its CUDA major's
recorded seconds per run (docs/figures.md, nvrtc-phases) scaled per major (another machine) and per
program (units differ). After the first tenth of the work the estimate stays within 30% of the time
that was really left (or within 5 s, at the very end); counting programs (what the bar's eta did)
does not. The durations are drawn around the recorded means, not recorded one by one."""

from __future__ import annotations

import heapq
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from buildtool.builder.compile import KernelTree, shared_targets
from buildtool.builder.eta import PTXAS_SHARE, SECONDS_PER_RUN, WorkEta, job_weights
from buildtool.builder.matrix import load_matrix
from buildtool.builder.plan import make_plan
from buildtool.builder.pypi import catalog_from_simple_json
from buildtool.builder.wheel_specs import CompileJob
from tests.ci import offline_catalog  # PyPI's torch answer, recorded

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def first_build_jobs() -> list[CompileJob]:
    catalog = catalog_from_simple_json(offline_catalog.simple_json())
    plan = make_plan(load_matrix(REPO / "matrix.yaml"), catalog, platform="x86_64")
    return list(plan.compile_jobs)


def _runs(jobs: list[CompileJob]) -> list[list[CompileJob]]:
    """The NVRTC runs in the build's order: a PTX beside its cubin comes out of that cubin's run."""
    cubins = {(j.cuda_major, j.arch, j.unit): j for j in jobs if j.image == "sass"}
    rides = {
        cubins[j.cuda_major, j.arch, j.unit]: j
        for j in jobs
        if j.image == "ptx" and (j.cuda_major, j.arch, j.unit) in cubins
    }
    return [[j, rides[j]] if j in rides else [j] for j in jobs if j not in rides.values()]


def _worst_error_after_a_tenth(
    jobs: list[CompileJob],
    seed: int,
    estimate: Callable[[list[CompileJob]], Callable[..., float | None]],
    shared: frozenset[CompileJob] = frozenset(),
) -> float:
    """Two workers take the runs in order; at each completion after a tenth of the total time, the
    estimate against the real time left. Returns the worst relative error. A `shared` cubin is a
    ptxas run: a quarter to half of its major's NVRTC run (docs/figures.md ptx-share: about a third)."""
    rng = random.Random(seed)
    per_major = {m: s * rng.uniform(0.8, 1.2) for m, s in SECONDS_PER_RUN.items()}
    runs = _runs(jobs)
    seconds = [
        per_major[r[0].cuda_major]
        * rng.uniform(0.6, 1.4)
        * (rng.uniform(0.25, 0.5) if r[0] in shared else 1.0)
        for r in runs
    ]
    workers = [(0.0, w) for w in range(2)]
    finished: list[tuple[float, list[CompileJob]]] = []
    for run, took in zip(runs, seconds, strict=True):
        free_at, w = heapq.heappop(workers)
        heapq.heappush(workers, (free_at + took, w))
        finished.append((free_at + took, run))
    finished.sort(key=lambda f: f[0])
    end = finished[-1][0]
    seconds_left = estimate(jobs)
    worst = 0.0
    for at, run in finished:
        left = seconds_left(run, at)
        if at >= end / 10 and at < end:
            assert left is not None
            error = abs(left - (end - at))
            # The last seconds are a run or two in flight: there, 5 s (two CUDA 12 runs) is the grain.
            worst = max(worst, error / (end - at) if error > 5 else 0.0)
    return worst


def _weighted(jobs: list[CompileJob]) -> Callable[..., float | None]:
    eta = WorkEta(job_weights(jobs), start=0.0)

    def seconds_left(run: list[CompileJob], at: float) -> float | None:
        for job in run:
            eta.done(job)
        return eta.seconds_left(at)

    return seconds_left


def _counted(jobs: list[CompileJob]) -> Callable[..., float | None]:
    """Programs left at the rate programs were done: the estimate the bar showed before."""
    eta = WorkEta(dict.fromkeys(jobs, 1.0), start=0.0)

    def seconds_left(run: list[CompileJob], at: float) -> float | None:
        for job in run:
            eta.done(job)
        return eta.seconds_left(at)

    return seconds_left


@pytest.mark.parametrize("seed", range(5))
def test_the_eta_stays_within_30_percent_after_a_tenth(first_build_jobs: list[CompileJob], seed: int) -> None:
    assert _worst_error_after_a_tenth(first_build_jobs, seed, _weighted) <= 0.30


@pytest.mark.parametrize("seed", range(3))
def test_the_eta_stays_within_30_percent_with_ptxas_runs(
    first_build_jobs: list[CompileJob], seed: int
) -> None:
    shared = frozenset(shared_targets(first_build_jobs, KernelTree()))
    assert shared  # the release plan has programs for several targets (CUDA 11's sm_80 and sm_90)

    def weighted(jobs: list[CompileJob]) -> Callable[..., float | None]:
        eta = WorkEta(job_weights(jobs, shared), start=0.0)

        def seconds_left(run: list[CompileJob], at: float) -> float | None:
            for job in run:
                eta.done(job)
            return eta.seconds_left(at)

        return seconds_left

    assert _worst_error_after_a_tenth(first_build_jobs, seed, weighted, shared) <= 0.30


def test_counting_programs_does_not(first_build_jobs: list[CompileJob]) -> None:
    """The fault: CUDA 11's slow runs come first, so a count says far more time is left than is."""
    assert _worst_error_after_a_tenth(first_build_jobs, 0, _counted) > 0.30


def test_cached_programs_weigh_nothing_and_leave_the_rate_alone() -> None:
    a, b, c = (CompileJob(12, "8.0", "sass", u) for u in ("a", "b", "c"))
    eta = WorkEta(job_weights([a, b, c]), start=10.0)
    assert eta.seconds_left(11.0) is None  # no rate yet
    eta.done(a, cached=True)
    assert eta.seconds_left(11.0) is None
    eta.done(b)
    assert eta.seconds_left(14.0) == pytest.approx(4.0)  # c weighs what b did, which took 4 s


def test_a_ptx_beside_its_cubin_weighs_nothing() -> None:
    cubin, ptx = CompileJob(11, "9.0", "sass", "u"), CompileJob(11, "9.0", "ptx", "u")
    alone = CompileJob(12, "12.0", "ptx", "u")
    weights = job_weights([cubin, ptx, alone])
    assert weights[ptx] == 0.0
    assert weights[cubin] == SECONDS_PER_RUN[11]
    assert 0 < weights[alone] < SECONDS_PER_RUN[12]


def test_a_cubin_from_another_targets_ptx_weighs_a_ptxas_run() -> None:
    lead, follower = CompileJob(11, "8.0", "sass", "u"), CompileJob(11, "9.0", "sass", "u")
    weights = job_weights([lead, follower], shared={follower})
    assert weights[lead] == SECONDS_PER_RUN[11]
    assert weights[follower] == pytest.approx(PTXAS_SHARE * SECONDS_PER_RUN[11])


def test_the_kernels_bar_counts_down_from_the_estimate_and_downloads_collapse() -> None:
    """The build's bars (pipeline._Bars) drawn by rich: the kernels bar shows WorkEta's time left, not
    rich's recent rate; a finished download's bar is gone from the screen, a running one is there."""
    import time

    from rich.console import Console

    from buildtool.builder.pipeline import _Bars

    def drawn(progress: object) -> str:
        console = Console(record=True, width=120, color_system=None)
        console.print(progress.get_renderable())  # type: ignore[attr-defined]
        return console.export_text()

    bars = _Bars(Console(width=120), enabled=True)
    fetch = bars.download("NVRTC for CUDA 12")
    fetch(50, 100)
    assert "NVRTC for CUDA 12" in drawn(bars._bytes)
    fetch(100, 100)
    assert "NVRTC for CUDA 12" not in drawn(bars._bytes)

    kernels = bars.counter("kernels", 10)
    bars.advance(kernels, ends_at=time.monotonic() + 125)
    line = drawn(bars._progress)
    assert "1/10" in line
    assert "eta 02:05" in line or "eta 02:04" in line  # counting down from 125 s
