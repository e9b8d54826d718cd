"""`python -m fa_attn.check` (and `fa check`): verify the installed kernels on this machine's GPUs.

Per visible GPU, every unit (kernel file) of the installed wheel that the runtime would use there (the
path decision, decision.decide, per dtype, head dim and direction the manifest covers), run through
fa_attn's own ops on a set of problems (`problems`: a tiny and a medium shape, causal and not, GQA,
fewer queries than keys, varlen, a KV cache) against the fp32 reference under FA2's rule
(verify/unitcheck.py). Each unit runs in its own worker process (`--worker`) with a time limit: an
illegal address, a hang or a crash marks that unit failed and the check goes on. The verdicts become a verification record
(verify/record.py) that every later process reads (fa_attn.selfcheck).

Not verified on a GPU: this project has none; `fa check --emulate` runs the same unit checks on the CPU
emulator. Exit codes: 0 every unit passed, 1 a unit failed, no GPU (verdict no-gpu) or no unit the
runtime would use (verdict no-units: a check of nothing is not a pass), 2 bad input.
"""

from __future__ import annotations

import argparse
import datetime
import json
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch

from ..reasons import Reason
from ..runtime import decision, dispatch, loader
from . import record as records
from .unitcheck import Outcome, Problem, check_backward, check_forward, key_block, query_block

UNIT_TIMEOUT_S = 300.0  # one unit's worker: its problems, and a hang's limit
BENCH_SEQLENS = (512, 2048, 8192)
JSON_SCHEMA = 1


@dataclass(frozen=True)
class Job:
    """One unit to check on one GPU."""

    unit: str  # "sm_80/fwd_bf16_d128"
    direction: str  # "fwd" | "splitkv" | "bwd"
    dtype: str  # "fp16" | "bf16"
    module: str
    entries: str
    launch: tuple[int, ...]
    device: int  # CUDA device index
    # The smallest head dim the unit serves (its manifest coverage; tiles.head_dims in a checkout): its
    # problems check it and the next, the head dims just above the next smaller bucket
    lowest_head_dim: int
    # False: the unit reads no paged KV (an arch-specific unit whose manifest features lack paged_kv; those
    # calls run on the plain arch's unit), so the paged problems are not its (problems(paged=False))
    paged: bool = True


@dataclass
class UnitReport:
    unit: str
    gpu: int
    direction: str
    dtype: str
    head_dim: int
    verdict: str  # "pass" | "fail"
    error: str = ""
    max_err: float = 0.0
    bound: float = 0.0
    problems: int = 0
    speed: dict[str, dict[str, float]] = field(default_factory=dict)


def problems(
    dtype: torch.dtype,
    head_dim: int,
    direction: str,
    block_n: int = 64,
    medium: bool = True,
    block_m: int = 64,
    paged: bool = True,
    *,
    lowest_head_dim: int,
) -> list[Problem]:
    """The problems a unit (bucket `head_dim`, tile block_m x block_n) is checked on: one per code path
    its kernels branch on (docs/checking.md's coverage table, generated from kernels/csrc by
    buildtool/emucheck/coverage.py), each as small as that path allows at the unit's real tile sizes.

    Several query and key blocks with a partial last tile of each, padded batch 2, causal and not;
    rows that see no key; GQA groups 2, 4 and 8 (MQA); the head dims below the bucket (the unit's lowest,
    `lowest_head_dim`, the first above the next smaller bucket, and the one after it); a softmax_scale not
    1/sqrt(d); left, right and two-sided windows and a causal one; softcap; varlen with empty
    sequences (no queries, no keys). Forward and split-KV add the KV-cache layouts: seqused_k,
    leftpad_k, cache_batch_idx and pages of one and of two key blocks; split-KV runs every problem in
    2 shares and adds a problem with more shares than key blocks (an empty share). Then, where a GPU
    runs them (`medium`), a medium shape of each layout. A unit without paged KV (`paged` False: an
    arch-specific unit without the feature) has no paged problems (NOT_PAGED names them)."""
    m, n = block_m, block_n
    sq, sk = m + 17, 2 * n + 15  # two query blocks and three key blocks, the last of each partial
    short = (17, n + 15)  # one partial query block, two key blocks
    out: list[tuple[str, dict[str, Any]]] = [
        _named("blocks", seqlen_q=sq, seqlen_k=sk, batch=2),
        _named("blocks-causal", seqlen_q=sq, seqlen_k=sk, batch=2, causal=True),
        _named("no-key-rows", seqlen_q=sq, seqlen_k=9, causal=True),  # rows < sq - 9 see no key
        _named("gqa2", seqlen_q=short[0], seqlen_k=short[1], heads=4, heads_k=2),
        _named("gqa4", seqlen_q=short[0], seqlen_k=short[1], heads=8, heads_k=2),
        _named("mqa", seqlen_q=short[0], seqlen_k=short[1], heads=8, heads_k=1),
    ]
    out += [
        _named(f"hdim{d}", seqlen_q=short[0], seqlen_k=short[1], head_dim=d)
        for d in (lowest_head_dim, lowest_head_dim + 8)
        if d < head_dim
    ]
    out += [
        _named("scale", seqlen_q=short[0], seqlen_k=short[1], scale=0.37),
        _named("window-left", seqlen_q=sq, seqlen_k=sk, window=(n // 2 + 3, -1)),
        _named("window-right", seqlen_q=sq, seqlen_k=sk, window=(-1, n // 4 + 1)),
        _named("window-both", seqlen_q=sq, seqlen_k=sk, window=(n // 2 + 5, 9)),
        _named("window-causal", seqlen_q=sq, seqlen_k=sk, window=(n + 7, -1), causal=True),
        _named("softcap", seqlen_q=short[0], seqlen_k=short[1], softcap=2.5),
    ]
    # varlen's sequences: a long one, one without queries, one without keys, a short one
    empty = ((sq, sk), (0, n + 3), (17, 0), (m // 2 + 1, n // 2 + 7))
    out += [
        _named("varlen", seqlen_q=sq, seqlen_k=sk, layout="varlen", lengths=empty),
        _named("varlen-causal", seqlen_q=sq, seqlen_k=sk, layout="varlen", lengths=empty, causal=True),
    ]
    if direction != "bwd":  # the KV-cache layouts: forward and split-KV only (no KV-cache backward)
        cache: dict[str, Any] = {
            "seqlen_q": short[0],
            "seqlen_k": sk + 8,
            "lengths": ((short[0], sk), (short[0], n + 3)),
        }
        out += [
            _named("kvcache", **cache, layout="kvcache"),
            _named("leftpad", **cache, layout="kvcache", leftpad=True, causal=True),
            _named("cache-batch-idx", **cache, layout="kvcache", cache_rows=True),
        ]
        if paged:
            out += [
                _named(f"paged{n}", **cache, layout="paged", page_size=n),
                _named(f"paged{2 * n}", **cache, layout="paged", page_size=2 * n, causal=True),
            ]
    if direction == "splitkv":  # a share with no key block: the combine weighs it 0
        out.append(_named("splits-empty", seqlen_q=sq, seqlen_k=sk, splits=4, causal=True))
    if medium:  # on a GPU: a medium shape of each layout too
        out += [
            _named("medium", seqlen_q=512, seqlen_k=512, heads=4, heads_k=2, causal=True),
            _named("medium-varlen", seqlen_q=300, seqlen_k=700, heads=4, heads_k=2, layout="varlen"),
        ]
        if direction == "splitkv":
            out.append(
                _named("medium-decode", seqlen_q=1, seqlen_k=1000, heads=4, heads_k=1, layout="kvcache")
            )
    base: dict[str, Any] = {"dtype": dtype, "head_dim": head_dim, "causal": False}
    return [Problem(**{**base, **kw, "seed": i, "name": name}) for i, (name, kw) in enumerate(out)]


# Why a unit without paged KV has no paged problems (fa check's answer to `--problem paged...` on it).
NOT_PAGED = "reads no paged KV (not among its features): paged calls run on the plain arch's unit"


def _named(name: str, **fields: Any) -> tuple[str, dict[str, Any]]:
    return name, fields


def run_job(job: Job, device: torch.device, medium: bool = True, only: tuple[str, ...] = ()) -> list[Outcome]:
    """Every problem of one unit (in this process: the worker); `only`: those of these names."""
    launch = decision.KernelLaunch(job.module, job.entries, job.launch)
    dtype = torch.bfloat16 if job.dtype == "bf16" else torch.float16
    out = []
    chosen = problems(
        dtype, job.launch[0], job.direction, key_block(launch), medium, query_block(launch), job.paged,
        lowest_head_dim=job.lowest_head_dim,
    )  # fmt: skip
    for problem in chosen:
        if only and problem.name not in only:
            continue
        if job.direction == "bwd":
            out.append(check_backward(launch, problem, device))
        else:
            out.append(check_forward(launch, problem, device, splitkv=job.direction == "splitkv"))
    return out


def summarize(job: Job, outcomes: list[Outcome]) -> UnitReport:
    failed = [o for o in outcomes if not o.passed]
    worst = max((o.worst for o in outcomes), key=lambda e: e.ratio)
    return UnitReport(
        job.unit, job.device, job.direction, job.dtype, job.launch[0], "fail" if failed else "pass",
        failed[0].message() if failed else "", worst.err, worst.bound, len(outcomes),
    )  # fmt: skip


def jobs_for(device: int, manifest: Any = None) -> tuple[list[Job], list[Reason]]:
    """The units the runtime would use on GPU `device`, one job each, and, when there are none, why
    (the runtime's fallback reasons)."""
    major, minor = torch.cuda.get_device_capability(device)
    props = torch.cuda.get_device_properties(device)
    gpu = decision.Device("cuda", f"{major}.{minor}", getattr(props, "shared_memory_per_block_optin", None))
    return jobs_on(gpu, device, manifest or loader.manifest())


def jobs_on(
    gpu: decision.Device,
    index: int,
    man: Any,
    driver: Callable[[], str | None] = dispatch.driver_version,
    package_dir: Path = loader.PACKAGE_DIR,
) -> tuple[list[Job], list[Reason]]:
    """The units the runtime would use on `gpu` (CUDA device `index`): for every kernel file of the
    manifest, the call it serves decided by the runtime's own code (dispatch.decide: the per-variant
    wheel's decision, or the all-wheel's choice of kernel set by this GPU and driver), one job per unit
    the decision names. With none, the reasons the calls fall back (one per code)."""
    seen: dict[str, Job] = {}
    why: dict[str, Reason] = {}
    lowest = lowest_head_dims(man, package_dir)
    for kernel in man.kernels:
        call = decision.Call(kernel.dtype, kernel.head_dim, backward=kernel.direction == "bwd")
        route = dispatch.decide(dispatch.CallFacts(gpu, call), man, lambda: None, driver, package_dir)
        for reason in route.reasons:
            why.setdefault(reason.code, reason)
        # An arch-specific route (sm_90a) has the plain arch's behind it, which runs its calls until
        # they pass their check (and where they fail it): both are checked.
        routes = (route,) if route.then is None else (route, route.then)
        launches = [(d, getattr(r, d)) for r in routes for d in ("fwd", "bwd", "splitkv")]
        for direction, launch in launches:
            if launch is None or not launch.module or launch.module in seen:
                continue
            unit = records.unit_name(launch.module)
            # an arch-specific unit ("sm_90a/...") reads paged KV only if the manifest lists the feature
            paged = not unit.split("/")[0].endswith("a") or "paged_kv" in man.info.arch_specific_features
            seen[launch.module] = Job(
                unit, direction, kernel.dtype, launch.module, launch.entries, launch.launch, index,
                lowest[launch.module], paged,
            )  # fmt: skip
    if not man.kernels:
        why.setdefault("binding-unavailable", NO_KERNELS)
    jobs = sorted(seen.values(), key=lambda j: j.unit)
    return jobs, ([] if jobs else list(why.values()))


def lowest_head_dims(man: Any, package_dir: Path) -> dict[str, int]:
    """Each kernel file's path (as KernelLaunch.of makes it) -> the smallest head dim it serves, from the
    manifest's coverage rows (the per-variant wheel's, and every kernel set's in the all-wheel): the
    packager wrote them from tiles.head_dims, so the buckets are defined once, in tiles.py."""
    rows = [*man.info.coverage, *(row for kset in man.info.kernel_sets for row in kset.coverage)]
    served: dict[tuple[Any, ...], int] = {}
    for row in rows:
        key = (row.arch, row.image, row.arch_specific, row.dtype, row.direction, row.tile, max(row.head_dims))
        served[key] = min(served.get(key, row.head_dims[0]), *row.head_dims)
    out = {}
    for k in man.kernels:
        key = (k.arch, k.image, k.arch_specific, k.dtype, k.direction, k.tile, k.head_dim)
        if key not in served:
            raise ValueError(
                f"the manifest has no coverage row for its kernel file {k.file}: rebuild the wheel"
            )
        out[str(package_dir / k.file)] = served[key]
    return out


NO_KERNELS = Reason(
    "binding-unavailable",
    "this fa-attn has no kernels (the universal wheel, or a source checkout)",
    "install the fa-attn wheel for your torch and CUDA major (`fa install`)",
)


def run_isolated(job: Job, timeout: float = UNIT_TIMEOUT_S) -> UnitReport:
    """The job in a worker process: a crash, a CUDA error that loses the context, or a hang fails only it."""
    argv = [sys.executable, "-m", "fa_attn.check", "--worker"]
    try:
        done = subprocess.run(
            argv, input=json.dumps(asdict(job)), capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        return _failed(job, f"no result within {timeout:.0f} s (a hang)")
    lines = [ln for ln in done.stdout.splitlines() if ln.startswith("{")]
    if done.returncode != 0 or not lines:
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1][:300]
        return _failed(job, f"worker exited {done.returncode}: {tail}")
    return UnitReport(**json.loads(lines[-1]))


def _failed(job: Job, error: str) -> UnitReport:
    return UnitReport(
        job.unit, job.device, job.direction, job.dtype, job.launch[0], "fail", error, float("inf")
    )


def worker() -> int:
    """`--worker`: one Job on stdin, its UnitReport as a JSON line on stdout."""
    data = json.loads(sys.stdin.read())
    job = Job(**{**data, "launch": tuple(data["launch"])})
    problem = loader.load_binding()
    if problem is not None:
        print(json.dumps(asdict(_failed(job, f"[{problem.code}] {problem.message}"))))
        return 0
    device = torch.device("cuda", job.device)
    try:
        report = summarize(job, run_job(job, device))
        torch.cuda.synchronize(device)
    except Exception as err:  # noqa: BLE001 (a launch error is this unit's verdict)
        report = _failed(job, f"{type(err).__name__}: {err}".replace("\n", " ")[:300])
    print(json.dumps(asdict(report)))
    return 0


# ---- the report ---------------------------------------------------------------------------------------


@dataclass
class CheckReport:
    verdict: str  # "pass" | "fail" | "no-gpu" | "no-units"
    gpus: list[dict[str, Any]]
    units: list[UnitReport]
    records: list[str]
    fix: str = ""

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": JSON_SCHEMA,
            "verdict": self.verdict,
            "fix": self.fix,
            "gpus": self.gpus,
            "units": [asdict(u) for u in self.units],
            "records": self.records,
        }

    @property
    def exit_code(self) -> int:
        return 0 if self.verdict == "pass" else 1


NO_GPU_FIX = "run it where nvidia-smi lists a GPU; without one: fa check --emulate"
# `python -m fa_attn.check` runs where only the wheel is installed: the emulator is fa's source, not the
# wheel's, so the fix names nothing that needs a checkout (one line: the report reads at 80 columns).
WHEEL_COMMAND = "python -m fa_attn.check"
WHEEL_NO_GPU_FIX = "run it where nvidia-smi lists a GPU: the wheel's kernels are checked on one"


def no_gpu_report() -> CheckReport:
    return CheckReport("no-gpu", [], [], [], NO_GPU_FIX)


def nothing_to_check(why: list[Reason]) -> CheckReport:
    """No unit to check on any GPU: verdict no-units (exit 1, never a pass of nothing), with why the
    runtime would use no kernel here and what to do."""
    reason = why[0] if why else NO_KERNELS
    return CheckReport("no-units", [], [], [], f"{reason.message} [{reason.code}]; fix: {reason.fix}")


def verdict_of(units: Iterable[UnitReport]) -> str:
    return "fail" if any(u.verdict != "pass" for u in units) else "pass"


def record_for(key: records.RecordKey, units: list[UnitReport], by: str) -> records.Record:
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    return records.Record(
        key,
        now,
        by,
        {u.unit: records.UnitResult(u.verdict, u.error, u.max_err, u.bound, u.speed) for u in units},
    )


def unit_row(u: UnitReport) -> tuple[str, str, str, str, str, str]:
    """A unit's cells for people: unit, direction, verdict, worst error / bound, best speed, GPU."""
    ratio = f"{u.max_err / u.bound:.2f}" if u.bound > 0 and u.max_err != float("inf") else "-"
    speed = max((r for by_len in u.speed.values() for r in by_len.values()), default=None)
    return (u.unit, u.direction, u.verdict, ratio, f"{speed:.2f}x" if speed is not None else "", str(u.gpu))


def footer(report: CheckReport, command: str = "fa check") -> list[str]:
    """The lines under the table: the count, the records written, how to share a failure (with the
    `command` that ran: a wheel-only machine has `python -m fa_attn.check`, not fa-toolchain's `fa`)."""
    failed = sum(u.verdict != "pass" for u in report.units)
    lines = [f"{len(report.units)} units, {failed} failed; verdict {report.verdict}"]
    lines += [f"record: {path}" for path in report.records]
    if failed:
        lines.append(f"share it: attach `{command} --json > check.json` to an issue (docs/checking.md)")
    return lines


def render(report: CheckReport, out: Callable[[str], None] = print, command: str = "fa check") -> None:
    """The table for people, in 80 columns (plain text: the wheel has no rich; `fa check` draws the same
    cells with rich). A failure's message is wrapped in full under its unit: it names the problem."""
    if report.verdict == "no-gpu":
        out("fa check: no NVIDIA GPU visible (verdict no-gpu)")
        out(f"fix: {report.fix}")
        return
    if report.verdict == "no-units":
        out("fa check: no kernel unit the runtime would use here (verdict no-units)")
        for line in textwrap.wrap(report.fix, 78):
            out(line)
        return
    out(f"{'unit':<34} {'dir':<7} {'verdict':<7} {'error/bound':>11} {'speed':>8}   gpu")
    for u in report.units:
        unit, direction, verdict, ratio, speed, gpu = unit_row(u)
        out(f"{unit[:34]:<34} {direction:<7} {verdict:<7} {ratio:>11} {speed:>8}   {gpu}")
        for line in textwrap.wrap(u.error, 78, initial_indent="  ", subsequent_indent="    "):
            out(line)
    for line in footer(report, command):
        out(line)


Progress = Callable[[int, int, str], None]  # (units done, units in all, the next unit's name)


def progress(done: int, total: int, started: float, name: str) -> None:
    """One line on stderr per unit: count, ETA from the mean so far."""
    elapsed = time.monotonic() - started
    eta = elapsed / done * (total - done) if done else 0.0
    sys.stderr.write(f"[{done}/{total}] {name[:40]:<40} eta {eta:4.0f} s\n")
    sys.stderr.flush()


def line_progress() -> Progress:
    """`progress` with the clock started now: the plain-text progress of `python -m fa_attn.check`."""
    started = time.monotonic()
    return lambda done, total, name: progress(done, total, started, name)


def check_gpus(bench: bool = False, write: bool = True, on_unit: Progress | None = None) -> CheckReport:
    """Every unit on every visible GPU, each in its worker; writes one record per GPU. `on_unit` is told
    before each unit and once at the end (default: a line on stderr per unit)."""
    if not torch.cuda.is_available() or torch.cuda.device_count() == 0:
        return no_gpu_report()
    from . import selfcheck  # the record key the runtime reads

    gpus, units, written = [], [], []
    all_jobs: list[tuple[int, Job]] = []
    why: list[Reason] = []
    for i in range(torch.cuda.device_count()):
        jobs, reasons = jobs_for(i)
        all_jobs += [(i, job) for job in jobs]
        why += reasons
    if not all_jobs:
        return nothing_to_check(why)
    on_unit = on_unit or line_progress()
    for n, (_, job) in enumerate(all_jobs):
        on_unit(n, len(all_jobs), job.unit)
        units.append(run_isolated(job))
    on_unit(len(all_jobs), len(all_jobs), "")
    if bench:
        from .speed import measure_speed

        for u in units:
            if u.verdict == "pass":
                job = next(j for _, j in all_jobs if j.unit == u.unit and j.device == u.gpu)
                u.speed = measure_speed(job, BENCH_SEQLENS)
    for i in range(torch.cuda.device_count()):
        key = selfcheck.record_key(torch.device("cuda", i))
        gpus.append({"index": i, **asdict(key)})
        mine = [u for u in units if u.gpu == i]
        if write and mine:
            written.append(str(records.write(record_for(key, mine, "fa check"))))
    return CheckReport(verdict_of(units), gpus, units, written)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fa_attn.check", description=__doc__.split("\n")[0])
    parser.add_argument("--json", action="store_true", help="the report as JSON (docs/contracts.md)")
    parser.add_argument("--bench", action="store_true", help="also time fa against SDPA (CUDA events)")
    parser.add_argument("--no-record", action="store_true", help="do not write a verification record")
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        return worker()
    report = check_gpus(bench=args.bench, write=not args.no_record)
    if report.verdict == "no-gpu":
        report.fix = WHEEL_NO_GPU_FIX
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        render(report, command=WHEEL_COMMAND)
    return report.exit_code


if __name__ == "__main__":
    sys.exit(main())
