"""The build's time left, by what each piece of work costs rather than by how many are left.

A program's NVRTC run costs what its CUDA major's NVRTC takes (docs/figures.md, "Where a kernel
compile's time goes"), and a plan compiles the majors one after the other (the wheels' order), so
counting programs, or rich's speed over the last seconds, says minutes more than are left during one
major's runs and then jumps. Here each program has a weight (its major's seconds per run; a PTX that
comes out of its cubin's run weighs nothing, a PTX alone about half a run, a cubin ptxas assembles
from another target's PTX about a third), and the time left is the weight left at the rate the weight
done took. Machine speed cancels out of that rate; only the ratios of the weights matter. Cached
programs weigh nothing.

The bindings (g++ against each torch's headers, a few seconds of CPU each) are built beside the kernel
compiles, in threads of their own, on the same CPUs: while they run, the kernels get a share of the
CPUs, and once they are done, all of it. A rate taken over the kernels alone carries that slow start
forward (a cold README build on 2 CPUs: 2.3 to 3 times the real time left at a tenth of the work,
`bench/build/eta_truth.py`). So the work is pools sharing the CPUs, each with its own measured rate,
and a pool's time left counts on the CPUs the others free when they are done (WorkEta).

Pure: `now` comes in (time.monotonic() in the build, recorded times in tests/builder/test_eta.py).
"""

from __future__ import annotations

from collections.abc import Collection, Hashable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from buildtool.builder.wheel_specs import BindingJob, CompileJob

# Seconds per NVRTC run by CUDA major: docs/figures.md's nvrtc-phases section (2026-11-29: 0.62 and
# 0.59 s). Only the ratios matter. README's x86_64 plan has no CUDA 13 run, so 13's is its ratio to 12
# when both were measured in one run (2026-11-26: 0.98 against 1.85 s). A major not listed weighs like
# the mean of these.
SECONDS_PER_RUN: Mapping[int, float] = {11: 0.62, 12: 0.59, 13: 0.31}
PTX_ALONE = 0.5  # a PTX without its cubin's run: the front end and NVVM, no PTX-to-SASS (about half)
# a cubin ptxas assembles from another target's PTX (compile.py): docs/figures.md ptx-share, where
# ptxas takes about a third of the CPU of the target's own NVRTC run
PTXAS_SHARE = 0.35
# One binding: g++ of a binding form against one torch's headers, and the link (docs/figures.md,
# binding-time: 4.2-4.4 s of CPU, the same day and machine as nvrtc-phases); the first of
# each (CPU, C++ ABI) also compiles the torch-free objects every binding of that pair links (about
# 2.9 s: binding.shared_objects).
BINDING_SECONDS = 4.3
OBJECTS_SECONDS = 2.9


def binding_weights(jobs: Iterable[BindingJob]) -> dict[BindingJob, float]:
    """Each binding's expected cost in the units of SECONDS_PER_RUN, in the order they are built."""
    out, seen = {}, set()
    for job in jobs:
        first = (job.platform, job.cxx11abi) not in seen
        seen.add((job.platform, job.cxx11abi))
        out[job] = BINDING_SECONDS + (OBJECTS_SECONDS if first else 0.0)
    return out


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


@dataclass
class _Pool:
    weights: dict[Hashable, float]  # what is left, by item
    workers: int  # the processes (or threads running one) it keeps busy while it has items
    left: float
    done: float = 0.0  # work finished since the clock started
    # Items said to have started (WorkEta.started), with their start; None for a pool that says nothing
    # of starts: it is taken to keep `workers` running while it has items.
    flying: dict[Hashable, float] | None = None
    took: list[float] = field(default_factory=list)  # wall seconds of its items seen start and end

    def running(self) -> int:
        if self.flying is not None:
            return len(self.flying)
        return min(self.workers, len(self.weights))

    def in_flight(self, now: float) -> float:
        """The work its running items have done, from how long they have run against how long its
        finished ones took (at most nine tenths each: an item is not done until it says so)."""
        if not self.flying or not self.took:
            return 0.0
        typical = sum(self.took) / len(self.took)
        return sum(
            self.weights.get(item, 0.0) * min(0.9, (now - began) / typical)
            for item, began in self.flying.items()
        )


class WorkEta:
    """Time left of weighted work in named pools ("kernels", "bindings"), each done in any order by its
    own workers, all on the same `cpus`.

    The processes do not share the CPUs alike (a g++ parsing torch's headers takes more than an NVRTC
    worker beside it, bench/build/eta_truth.py), so each pool's rate is its own, measured: the work it
    finished over the time since the clock started. What the CPUs give per unit of work comes from all
    of it: the CPU time the running processes had (min(processes, cpus) CPUs at each moment) over the
    work done. When the other pools run out, a pool goes on alone on min(its processes, cpus) CPUs at
    that cost. A pool whose items are few and long (the bindings) says when each starts (`started`), so
    its work in flight is counted as it goes, not only when an item ends."""

    def __init__(
        self,
        start: float,
        cpus: int,
        *,
        say_starts: Collection[str] = (),
        **pools: tuple[Mapping[Any, float], int],
    ) -> None:
        """`pools`: name=(weight by item, workers); `say_starts`: the pools that call `started`."""
        self._pools = {
            name: _Pool(
                dict(weights),
                max(1, workers),
                sum(weights.values()),
                flying={} if name in say_starts else None,
            )
            for name, (weights, workers) in pools.items()
        }
        self._cpus = max(1, cpus)
        self._start = self._clock = start
        self._cpu_time = 0.0  # CPU seconds the running processes had since the clock started

    def restart(self, start: float) -> None:
        """The clock starts again at `start` (the compiles began after the toolkit downloads): what is
        done so far (cached programs) stays done, and the rates count from now."""
        for pool in self._pools.values():
            pool.done = 0.0
            if pool.flying is not None:
                pool.flying = dict.fromkeys(pool.flying, start)
        self._start = self._clock = start
        self._cpu_time = 0.0

    def _advance(self, now: float) -> None:
        processes = sum(p.running() for p in self._pools.values())
        self._cpu_time += min(processes, self._cpus) * max(0.0, now - self._clock)
        self._clock = max(self._clock, now)

    def started(self, pool: str, item: Hashable, now: float) -> None:
        """`item` of `pool` began running."""
        self._advance(now)
        p = self._pools[pool]
        if p.flying is None:
            raise ValueError(f"pool {pool!r} was not made to say when its items start")
        p.flying[item] = now

    def done(self, pool: str, item: Hashable, now: float, cached: bool = False) -> None:
        """`item` of `pool` finished (`cached`: it took no work, so it says nothing about the rate)."""
        self._advance(now)
        p = self._pools[pool]
        weight = p.weights.pop(item, 0.0)
        p.left -= weight
        began = p.flying.pop(item, None) if p.flying is not None else None
        if not cached:
            p.done += weight
            if began is not None:
                p.took.append(now - began)

    def seconds_left(self, pool: str, now: float) -> float | None:
        """Until `pool`'s work is done; None until it and the whole have a rate."""
        self._advance(now)
        elapsed = max(now - self._start, 1e-9)
        mine = self._pools[pool]
        if mine.running() == 0:
            # Done, or (a pool that says its starts) none running while its next waits on a download:
            # nothing to tell from that, and not "no time left".
            return None if mine.weights else 0.0
        flying = {name: p.in_flight(now) for name, p in self._pools.items()}
        worked = {name: p.done + flying[name] for name, p in self._pools.items()}
        left = {name: max(0.0, p.left - flying[name]) for name, p in self._pools.items()}
        if worked[pool] <= 0 or self._cpu_time <= 0:
            return None
        if any(p.flying and not p.took for p in self._pools.values()):
            # Items running that none like them has ended: how much of the CPUs they take is not known
            # yet (a g++ beside NVRTC takes more than its even share), so no estimate rather than a
            # wrong one: README's build shows none for its first ten seconds or so.
            return None
        cost = self._cpu_time / sum(worked.values())  # CPU seconds per unit of work
        mine_left, mine_rate = left[pool], worked[pool] / elapsed
        alone = min(mine.running(), self._cpus) / cost  # its work per second once the others are done
        others = [name for name, p in self._pools.items() if name != pool and p.running()]
        others_rate = sum(worked[name] for name in others) / elapsed
        if not others or others_rate <= 0:
            return mine_left / (alone if not others else mine_rate)
        shared = sum(left[name] for name in others) / others_rate  # until the others are done, at their rates
        if mine_left <= mine_rate * shared:
            return mine_left / mine_rate
        return shared + (mine_left - mine_rate * shared) / alone
