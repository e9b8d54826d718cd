"""The kernel compiles' time left, by what each program costs rather than by how many are left.

A program's NVRTC run costs what its CUDA major's NVRTC takes (docs/figures.md, "Where a kernel
compile's time goes": 2.57, 1.85 and 0.98 s per run for CUDA 11, 12 and 13 on the 2-core machine),
and a plan compiles the majors one after the other (the wheels' order), so counting programs, or
rich's speed over the last seconds, says 7 minutes left during CUDA 11's runs and then jumps. Here
each program has a weight (its major's seconds per run; a PTX that comes out of its cubin's run
weighs nothing, a PTX alone about half a run, a cubin ptxas assembles from another target's PTX
about a third), and the time left is the weight left at the rate the
weight done took: elapsed / weight done. Machine speed and worker count cancel out of that rate; only
the ratios of the weights matter. Cached programs weigh nothing.

Pure: `now` comes in (time.monotonic() in the build, recorded times in tests/builder/test_eta.py).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping

from buildtool.builder.wheel_specs import CompileJob

# Seconds per NVRTC run by CUDA major: docs/figures.md's nvrtc-phases section (2026-11-26). Only the
# ratios matter. A major not listed weighs like the mean of these.
SECONDS_PER_RUN: Mapping[int, float] = {11: 2.57, 12: 1.85, 13: 0.98}
PTX_ALONE = 0.5  # a PTX without its cubin's run: the front end and NVVM, no PTX-to-SASS (about half)
# a cubin ptxas assembles from another target's PTX (compile.py): docs/figures.md ptx-share, where
# ptxas takes about a third of the CPU of the target's own NVRTC run
PTXAS_SHARE = 0.35


def job_weights(jobs: Iterable[CompileJob], shared: Collection[CompileJob] = ()) -> dict[CompileJob, float]:
    """Each job's expected cost in seconds per run of this table; `shared`: the cubin jobs ptxas
    assembles from another target's PTX (compile.shared_targets)."""
    jobs = list(jobs)
    cubins = {(j.cuda_major, j.arch, j.unit) for j in jobs if j.image == "sass"}
    mean = sum(SECONDS_PER_RUN.values()) / len(SECONDS_PER_RUN)
    out = {}
    for j in jobs:
        run = SECONDS_PER_RUN.get(j.cuda_major, mean)
        if j.image == "sass":
            out[j] = PTXAS_SHARE * run if j in shared else run
        else:  # compile.pair_ptx_with_cubins: a PTX rides on its cubin's run when both are compiled
            out[j] = 0.0 if (j.cuda_major, j.arch, j.unit) in cubins else PTX_ALONE * run
    return out


class WorkEta:
    """Time left of a list of weighted items, done in any order by any number of workers."""

    def __init__(self, weights: Mapping[Hashable, float], start: float) -> None:
        self._weights = dict(weights)
        self._left = sum(self._weights.values())
        self._done = 0.0
        self._start = start

    def restarted(self, start: float) -> WorkEta:
        """The same work, its clock started at `start` (the compiles began after the toolkit downloads);
        what is done so far (cached programs) stays done."""
        again = WorkEta({}, start)
        again._weights, again._left, again._done = self._weights, self._left, 0.0
        return again

    def done(self, item: Hashable, cached: bool = False) -> None:
        """`item` finished (`cached`: it took no work, so it says nothing about the rate)."""
        weight = self._weights.pop(item, 0.0)
        self._left -= weight
        if not cached:
            self._done += weight

    def seconds_left(self, now: float) -> float | None:
        """None until some weighed work is done (no rate yet)."""
        if self._done <= 0:
            return None
        return max(0.0, self._left) * (now - self._start) / self._done
