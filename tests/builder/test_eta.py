"""The kernel compiles' time left (builder/eta.py) on README's first build: the release matrix's x86_64
plan in the order the build compiles it, two workers, each NVRTC run lasting its CUDA major's
recorded seconds per run (docs/figures.md, nvrtc-phases) scaled per major (another machine) and per
program (units differ). After the first tenth of the work the estimate stays within 30% of the time
that was really left (or within 5 s, at the very end); counting programs (what the bar's eta did)
does not. The durations are drawn around the recorded means, not recorded one by one."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from pathlib import Path
from types import MappingProxyType

import pytest

from buildtool.builder.compile import KernelTree, shared_targets
from buildtool.builder.eta import (
    BINDING_SECONDS,
    OBJECTS_SECONDS,
    PTXAS_SHARE,
    SECONDS_PER_RUN,
    WorkEta,
    binding_weights,
    job_weights,
)
from buildtool.builder.matrix import load_matrix
from buildtool.builder.plan import Plan, make_plan
from buildtool.builder.pypi import catalog_from_simple_json
from buildtool.builder.wheel_specs import BindingJob, CompileJob
from tests.ci import offline_catalog  # PyPI's torch answer, recorded

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def first_build() -> Plan:
    catalog = catalog_from_simple_json(offline_catalog.simple_json())
    return make_plan(load_matrix(REPO / "matrix.yaml"), catalog, platform="x86_64")


@pytest.fixture(scope="module")
def first_build_jobs(first_build: Plan) -> list[CompileJob]:
    return list(first_build.compile_jobs)


@pytest.fixture(scope="module")
def first_build_bindings(first_build: Plan) -> dict[BindingJob, float]:
    """README's bindings as the build weighs them (ATen forms of 2.4-2.6 with two ABIs each, 2.7, 2.8,
    2.9, the stable one)."""
    weights = binding_weights(first_build.binding_jobs)
    assert len(weights) == 10
    return weights


def _runs(jobs: list[CompileJob]) -> list[list[CompileJob]]:
    """The NVRTC runs in the build's order: a PTX beside its cubin comes out of that cubin's run."""
    cubins = {(j.cuda_major, j.arch, j.unit): j for j in jobs if j.image == "sass"}
    rides = {
        cubins[j.cuda_major, j.arch, j.unit]: j
        for j in jobs
        if j.image == "ptx" and (j.cuda_major, j.arch, j.unit) in cubins
    }
    return [[j, rides[j]] if j in rides else [j] for j in jobs if j not in rides.values()]


def test_the_first_binding_of_each_abi_compiles_the_objects(
    first_build_bindings: dict[BindingJob, float],
) -> None:
    """binding.shared_objects: the torch-free objects are built once per (CPU, C++ ABI), by the first
    binding of that pair, and weigh on it alone."""
    heavier = [
        job for job, weight in first_build_bindings.items() if weight == BINDING_SECONDS + OBJECTS_SECONDS
    ]
    assert sorted(job.cxx11abi for job in heavier) == [False, True]
    assert all(
        weight == BINDING_SECONDS for job, weight in first_build_bindings.items() if job not in heavier
    )


def _shares(pulls: list[float], cpus: int) -> list[float]:
    """The CPU each running process gets: in proportion to its pull, at most one CPU each."""
    shares = [0.0] * len(pulls)
    free, open_ = float(cpus), list(range(len(pulls)))
    while open_:
        total = sum(pulls[i] for i in open_)
        capped = [i for i in open_ if free * pulls[i] / total >= 1.0]
        if not capped:
            for i in open_:
                shares[i] = free * pulls[i] / total
            return shares
        for i in capped:
            shares[i] = 1.0
            open_.remove(i)
        free -= len(capped)
    return shares


def _timeline(
    jobs: list[CompileJob],
    seed: int,
    shared: frozenset[CompileJob] = frozenset(),
    bindings: Mapping[BindingJob, float] = MappingProxyType({}),
    cpus: int = 2,
    pull: float = 1.0,
) -> list[tuple[float, str, str, list[object]]]:
    """The build as the CPUs run it: two kernel workers take the runs in order and, with `bindings`,
    two threads take the bindings' g++ runs beside them; each running process gets CPU in proportion to
    its pull (an NVRTC worker 1, a g++ `pull`: a cold README build here gave the two g++ runs about 1.24
    of 2 CPUs, a pull of about 1.6), at most one CPU. Returns (time, what, pool, items) per start of a
    binding and per completion (what: "started" or "done"). A `shared` cubin is a ptxas run: a quarter
    to half of its major's NVRTC run (docs/figures.md ptx-share: about a third)."""
    rng = random.Random(seed)
    per_major = {m: s * rng.uniform(0.8, 1.2) for m, s in SECONDS_PER_RUN.items()}
    runs = _runs(jobs)
    queues: dict[str, list[tuple[float, list[object]]]] = {
        "kernels": [
            (
                per_major[r[0].cuda_major]
                * rng.uniform(0.6, 1.4)
                * (rng.uniform(0.25, 0.5) if r[0] in shared else 1.0),
                list(r),
            )
            for r in runs
        ],
        "bindings": [
            (weight * rng.uniform(0.8, 1.2) * rng.uniform(0.6, 1.4), [item])
            for item, weight in bindings.items()
        ],
    }
    running: list[list] = []  # [work left, pool, items]
    now, events = 0.0, []
    while True:
        for pool, queue in queues.items():
            while queue and sum(r[1] == pool for r in running) < 2:
                work, items = queue.pop(0)
                running.append([work, pool, items])
                if pool == "bindings":
                    events.append((now, "started", pool, items))
        if not running:
            return events
        speeds = _shares([pull if r[1] == "bindings" else 1.0 for r in running], cpus)
        step, first = min((r[0] / v, r) for r, v in zip(running, speeds, strict=True))
        now += step
        for r, v in zip(running, speeds, strict=True):
            r[0] -= step * v
        running.remove(first)
        events.append((now, "done", first[1], first[2]))


def _worst_error_after_a_tenth(
    events: list[tuple[float, str, str, list[object]]],
    estimate: Callable[[str, str, list[object], float], float | None],
) -> float:
    """At each kernel completion after a tenth of the kernels' time, the estimate of the kernels' time
    left against the real one. Returns the worst relative error. There may be no estimate while no
    binding has ended yet (how much CPU a g++ takes is not known before), if that is over within the
    first fifth of the time."""
    end = max(at for at, _, pool, _ in events if pool == "kernels")
    first_binding = min(
        (at for at, what, pool, _ in events if pool == "bindings" and what == "done"), default=0
    )
    assert first_binding < end / 5
    worst = 0.0
    for at, what, pool, items in events:
        left = estimate(what, pool, items, at)
        if what == "done" and pool == "kernels" and max(end / 10, first_binding) <= at < end:
            assert left is not None
            error = abs(left - (end - at))
            # The last seconds are a run or two in flight: there, 5 s (several NVRTC runs) is the grain.
            worst = max(worst, error / (end - at) if error > 5 * SECONDS_PER_RUN[11] else 0.0)
    return worst


def _weighted(
    jobs: list[CompileJob],
    shared: frozenset[CompileJob] = frozenset(),
    bindings: Mapping[BindingJob, float] = MappingProxyType({}),
    cpus: int = 2,
) -> Callable[[str, str, list[object], float], float | None]:
    """WorkEta as the build keeps it: the kernels' programs and the bindings beside them."""
    eta = WorkEta(
        0.0,
        cpus,
        kernels=(job_weights(jobs, shared), 2),
        bindings=(bindings, 2),
        say_starts=("bindings",),
    )

    def seconds_left(what: str, pool: str, items: list[object], at: float) -> float | None:
        for item in items:
            if what == "started":
                eta.started(pool, item, at)
            else:
                eta.done(pool, item, at)
        return eta.seconds_left("kernels", at)

    return seconds_left


def _kernels_only(
    jobs: list[CompileJob], weights: dict[CompileJob, float] | None = None
) -> Callable[..., float | None]:
    """The kernels' programs alone, at the rate they were done (`weights`: each program's; by default
    one each, a count): the estimates the bar showed before."""
    eta = WorkEta(0.0, 2, kernels=(weights if weights is not None else dict.fromkeys(jobs, 1.0), 2))

    def seconds_left(what: str, pool: str, items: list[object], at: float) -> float | None:
        if what == "done" and pool == "kernels":
            for item in items:
                eta.done(pool, item, at)
        return eta.seconds_left("kernels", at)

    return seconds_left


@pytest.mark.parametrize("seed", range(5))
def test_the_eta_stays_within_30_percent_after_a_tenth(first_build_jobs: list[CompileJob], seed: int) -> None:
    events = _timeline(first_build_jobs, seed)
    assert _worst_error_after_a_tenth(events, _weighted(first_build_jobs)) <= 0.30


@pytest.mark.parametrize(("cpus", "pull"), [(2, 1.0), (2, 1.6), (2, 2.5), (4, 1.6)])
@pytest.mark.parametrize("seed", range(4))
def test_the_eta_stays_within_30_percent_with_the_bindings_beside(
    first_build_jobs: list[CompileJob],
    first_build_bindings: dict[BindingJob, float],
    seed: int,
    cpus: int,
    pull: float,
) -> None:
    """README's build: ten bindings' g++ runs take their share of the CPUs for the first third (on 2
    CPUs, half or more; on 4, none: each process has one)."""
    shared = frozenset(shared_targets(first_build_jobs, KernelTree()))
    events = _timeline(first_build_jobs, seed, shared, bindings=first_build_bindings, cpus=cpus, pull=pull)
    estimate = _weighted(first_build_jobs, shared, first_build_bindings, cpus)
    assert _worst_error_after_a_tenth(events, estimate) <= 0.30


def test_a_rate_over_the_kernels_alone_does_not(
    first_build_jobs: list[CompileJob], first_build_bindings: dict[BindingJob, float]
) -> None:
    """The fault a cold README build showed (bench/build/eta_truth.py): weights right, but the rate
    taken while the bindings held half the CPUs, carried over the rest."""
    shared = frozenset(shared_targets(first_build_jobs, KernelTree()))
    events = _timeline(first_build_jobs, 0, shared, bindings=first_build_bindings)
    weights = job_weights(first_build_jobs, shared)
    assert _worst_error_after_a_tenth(events, _kernels_only(first_build_jobs, weights)) > 0.30


@pytest.mark.parametrize("seed", range(3))
def test_the_eta_stays_within_30_percent_with_ptxas_runs(
    first_build_jobs: list[CompileJob], seed: int
) -> None:
    shared = frozenset(shared_targets(first_build_jobs, KernelTree()))
    assert shared  # the release plan has programs for several targets (CUDA 11's sm_80 and sm_90)
    events = _timeline(first_build_jobs, seed, shared)
    assert _worst_error_after_a_tenth(events, _weighted(first_build_jobs, shared)) <= 0.30


def test_counting_programs_does_not(first_build_jobs: list[CompileJob]) -> None:
    """The fault: the majors' runs differ in cost and come in blocks, so a count is off by more."""
    events = _timeline(first_build_jobs, 0)
    assert _worst_error_after_a_tenth(events, _kernels_only(first_build_jobs)) > 0.30


def test_cached_programs_weigh_nothing_and_leave_the_rate_alone() -> None:
    a, b, c = (CompileJob(12, "8.0", "sass", u) for u in ("a", "b", "c"))
    eta = WorkEta(10.0, 1, kernels=(job_weights([a, b, c]), 1))
    assert eta.seconds_left("kernels", 11.0) is None  # no rate yet
    eta.done("kernels", a, 11.0, cached=True)
    assert eta.seconds_left("kernels", 11.0) is None
    eta.done("kernels", b, 14.0)
    assert eta.seconds_left("kernels", 14.0) == pytest.approx(4.0)  # c weighs what b did, which took 4 s


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


def test_a_pool_between_its_items_has_no_estimate_rather_than_none_left() -> None:
    """A binding ended and the next waits on its torch headers' download: the bindings bar keeps its
    last estimate (None: pipeline leaves the bar's deadline as it was), it does not say 00:00."""
    one, two = ("binding", 0), ("binding", 1)
    eta = WorkEta(
        0.0, 2, kernels=({"k": 1.0}, 1), bindings=({one: 4.0, two: 4.0}, 1), say_starts=("bindings",)
    )
    eta.started("bindings", one, 0.0)
    eta.done("kernels", "k", 1.0)
    eta.done("bindings", one, 4.0)
    assert eta.seconds_left("bindings", 4.0) is None  # the second has not started: no process of it runs
    eta.started("bindings", two, 6.0)
    left = eta.seconds_left("bindings", 6.0)
    assert left is not None
    assert left > 0
    eta.done("bindings", two, 9.0)
    assert eta.seconds_left("bindings", 9.0) == 0.0  # all done
