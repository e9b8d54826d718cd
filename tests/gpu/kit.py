"""The GPU window's runner: each command of tests/gpu/README.md's plan is one call of the device tool.

    python tests/gpu/kit.py verify    # smoke (H100 wheel; Turing PTX), explain, the sweep, the Turing tests
    python tests/gpu/kit.py tune      # bench/kernels/autotune.py with the cubins carried in .carry/autotune
    python tests/gpu/kit.py bench     # bench/kernels/attention.py, compute-sanitizer, Nsight Compute on d128
    python tests/gpu/kit.py verify --dry-run        # the same flow here (CI runs all three)
    python tests/gpu/kit.py verify --steps sweep    # some steps again (after a failure)

Each step runs under a time limit, its cap or what is left of --total-s if that is less, with its
whole output in its own log; the runner goes on whatever a step did and ends with a table of step, rc,
seconds, limit and a note. rc 124 is a step stopped at its limit, "skip" one whose input is missing,
"dry" a step shown, not run, by --dry-run (it needs a GPU).

What comes back in $OUT, at most 8 files: kit.log (all the runner printed, the table last),
logs.tar.gz (every step's log, rebuilt after each step so a kill keeps what finished) and the
command's results: verify smoke.json, smoke_turing.json, sweep.txt; tune autotune.json, tiles.patch;
bench attention.jsonl, attention.png, ncu.txt. Anything else a step leaves in $OUT goes into the
tarball. Exit status 0 when every step passed, 1 otherwise, 2 when $OUT cannot be written.

--dry-run: smoke and autotune run on the CPU emulator at small subsets, the benchmark with CPU
stand-ins, pytest collects the sweep (with the progress plugin) without running it, and the steps that
only make sense on a GPU (explain, compute-sanitizer, ncu) print the command they would run.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import tarfile
import tempfile
import time
import zipfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CARRY = REPO / ".carry"
MAX_FILES = 8  # what the device tool brings back from $OUT
TOTALS = {"verify": 420, "tune": 420, "bench": 420}  # each command's default --total-s
RESULTS = {
    "verify": ("smoke.json", "smoke_turing.json", "sweep.txt"),
    "tune": ("autotune.json", "tiles.patch"),
    "bench": ("attention.jsonl", "attention.png", "ncu.txt"),
}
# The device's torch and CUDA (tests/gpu/device_matrix.yaml): the wheel the kit unpacks for each.
WHEEL_GLOB = "fa_attn-*+cu13torch2.11-*.whl"
# The units the dry run smokes: small, and built by the emulator tests already (cached).
DRY_SMOKE = "(fwd|splitkv)_fp16_d64"
MACHINE = """
import sys, torch
print(f"python {sys.version.split()[0]}; torch {torch.__version__}, CUDA {torch.version.cuda}")
if torch.cuda.is_available():
    p = torch.cuda.get_device_properties(0)
    print(f"GPU 0: {p.name}, sm {p.major}.{p.minor}, {p.multi_processor_count} SMs, {p.total_memory / 2**30:.0f} GiB")
else:
    print("torch sees no CUDA GPU")
    sys.exit(int(len(sys.argv) > 1 and sys.argv[1] == "--need-gpu"))
"""


@dataclass
class Record:
    name: str
    rc: str  # exit status, "skip" or "dry"
    seconds: float
    limit: float
    note: str = ""


@dataclass
class Kit:
    command: str
    out: Path
    scratch: Path
    deadline: float
    dry_run: bool
    py: str
    printer: IO[str] | io.TextIOBase
    logs: Path
    records: list[Record] = field(default_factory=list)
    sites: dict[str, Path] = field(default_factory=dict)  # "h100" / "turing" -> unpacked wheel
    wheels: dict[str, Path] = field(default_factory=dict)

    def say(self, text: str) -> None:
        self.printer.write(text + "\n")
        self.printer.flush()

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def record(self, name: str, rc: int | str, seconds: float, limit: float, note: str = "") -> None:
        self.records.append(Record(name, str(rc), round(seconds, 1), round(limit), note))
        self.bundle()

    def bundle(self) -> None:
        """logs.tar.gz from every step log so far (a kill later keeps this one)."""
        tmp = self.out / ".logs.tar.gz.tmp"
        with tarfile.open(tmp, "w:gz") as tar:
            for path in sorted(self.logs.iterdir()):
                tar.add(path, arcname=f"logs/{path.name}")
        os.replace(tmp, self.out / "logs.tar.gz")

    def run(
        self,
        name: str,
        cap: float,
        cmd: list[str],
        env: dict[str, str] | None = None,
        note: Callable[[str, int], str] | None = None,
        shown: str | None = None,
    ) -> int | None:
        """Run one step's command under its limit, output to logs/<name>.log; None when skipped.
        `note` makes the table's note from the log and rc; `shown` stands for the command in kit.log."""
        limit = min(cap, self.left())
        if limit < 5:
            self.record(name, "skip", 0, 0, "no time left")
            return None
        log = self.logs / f"{name}.log"
        self.say(f"== {name} (at most {limit:.0f}s) -> logs/{log.name}: {shown or shlex.join(cmd)}")
        t0 = time.monotonic()
        with log.open("w") as f:
            f.write(f"$ {shown or shlex.join(cmd)}\n")
            f.flush()
            proc = subprocess.Popen(
                cmd, stdout=f, stderr=subprocess.STDOUT, cwd=REPO, env={**os.environ, **(env or {})},
                start_new_session=True,
            )  # fmt: skip
            try:
                rc = proc.wait(timeout=limit)
            except subprocess.TimeoutExpired:
                _stop(proc)
                rc = 124
        text = log.read_text(errors="replace")
        tail = [ln for ln in text.splitlines() if ln.strip()][-8:]
        self.say("".join(f"   | {ln[:220]}\n" for ln in tail).rstrip())
        self.record(name, rc, time.monotonic() - t0, limit, note(text, rc) if note else "")
        return rc

    def show(self, name: str, cmd: list[str], why: str) -> None:
        """--dry-run: a step that needs a GPU, shown."""
        log = self.logs / f"{name}.log"
        log.write_text(f"dry run, not run ({why}):\n$ {shlex.join(cmd)}\n")
        self.say(f"== {name}: dry run, would run: {shlex.join(cmd)}")
        self.record(name, "dry", 0, 0, why)

    def skip(self, name: str, why: str) -> None:
        self.say(f"== {name}: skipped, {why}")
        self.record(name, "skip", 0, 0, why)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM to the step's process group (bench keeps what it measured), SIGKILL 10 s later."""
    for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, None)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


# ---- steps shared by the commands --------------------------------------------------------------------------
def step_machine(kit: Kit) -> None:
    if shutil.which("nvidia-smi"):
        kit.run("nvidia-smi", 20, ["nvidia-smi"])
    elif kit.dry_run:
        kit.show("nvidia-smi", ["nvidia-smi"], "not on PATH here (no NVIDIA driver)")
    else:
        kit.skip("nvidia-smi", "not on PATH (no NVIDIA driver?)")
    need = [] if kit.dry_run else ["--need-gpu"]
    kit.run(
        "torch",
        60,
        [kit.py, "-c", MACHINE, *need],
        note=lambda text, _rc: _last(text),
        shown="python -c MACHINE",
    )


def step_wheels(kit: Kit, which: tuple[str, ...]) -> None:
    """Check each carried wheel against the checkout (wheel_check.py) and unzip it into a site dir."""
    for name in which:
        folder = CARRY / f"wheels-{name}"
        found = sorted(folder.glob(WHEEL_GLOB))
        if len(found) != 1 and kit.dry_run:
            kit.show(
                f"wheel-{name}",
                ["wheel_check.py", f"{folder.relative_to(REPO)}/{WHEEL_GLOB}"],
                "no wheel here",
            )
            continue
        if len(found) != 1:
            kit.skip(
                f"wheel-{name}",
                f"want one {folder.relative_to(REPO)}/{WHEEL_GLOB}, found {len(found)} "
                "(build: python tests/gpu/carry.py build)",
            )
            continue
        rc = kit.run(
            f"wheel-{name}",
            60,
            [kit.py, str(HERE / "wheel_check.py"), str(found[0].relative_to(REPO))],
            note=lambda t, _rc: _last(t),
        )
        if rc == 0:
            site = kit.scratch / f"site-{name}"
            with zipfile.ZipFile(found[0]) as zf:
                zf.extractall(site)
            kit.sites[name] = site
            kit.wheels[name] = found[0]


def _last(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip() and not ln.startswith("$ ")]
    return lines[-1][:160] if lines else ""


def _pythonpath(*dirs: Path) -> dict[str, str]:
    """PYTHONPATH with `dirs` first (an unpacked wheel's site dir goes before anything else)."""
    return {"PYTHONPATH": os.pathsep.join([*map(str, dirs), *filter(None, [os.environ.get("PYTHONPATH")])])}


def _smoke_note(path: Path) -> Callable[[str, int], str]:
    def note(text: str, _rc: int) -> str:
        if not path.is_file():
            return _last(text)
        counts = json.loads(path.read_text())["counts"]
        return "cases: " + ", ".join(f"{n} {v}" for v, n in counts.items())

    return note


# ---- verify ---------------------------------------------------------------------------------------------------
def cmd_verify(kit: Kit, steps: set[str] | None, resume: Path | None) -> None:
    want = lambda s: steps is None or s in steps
    if want("machine"):
        step_machine(kit)
    if steps is None or steps & {"wheels", "smoke", "smoke-turing", "explain", "sweep", "turing"}:
        step_wheels(kit, ("h100", "turing"))  # the dry run checks and unpacks them too, when they exist
    smoke = [kit.py, str(HERE / "smoke.py")]
    if want("smoke"):
        json_out = kit.out / "smoke.json"
        wheel = ["--wheel", str(kit.wheels["h100"])] if "h100" in kit.wheels else []
        if kit.dry_run:  # the carried wheel's cases when there is one, on the emulator
            cmd = [*smoke, "--dry-run", *wheel, "--only", DRY_SMOKE, "--json", str(json_out)]
            kit.run("smoke", 300, cmd, note=_smoke_note(json_out))
        elif wheel:
            kit.run("smoke", 90, [*smoke, *wheel, "--json", str(json_out)], note=_smoke_note(json_out))
        else:
            kit.skip("smoke", "needs wheel-h100")
    if want("smoke-turing"):
        json_out = kit.out / "smoke_turing.json"
        # The 7.5-only wheel on a newer GPU: the driver JIT-compiles its compute_75 PTX, the Turing path.
        wheel = ["--wheel", str(kit.wheels["turing"]), "--images", "ptx"] if "turing" in kit.wheels else []
        if kit.dry_run:
            arch = ["--arch", "9.0"] if wheel else ["--arch", "7.5"]
            cmd = [*smoke, "--dry-run", *wheel, *arch, "--only", "fwd_fp16_d64", "--json", str(json_out)]
            kit.run("smoke-turing", 300, cmd, note=_smoke_note(json_out))
        elif wheel:
            kit.run(
                "smoke-turing", 120, [*smoke, *wheel, "--json", str(json_out)], note=_smoke_note(json_out)
            )
        else:
            kit.skip("smoke-turing", "needs wheel-turing")
    if want("explain"):
        cmd = [kit.py, str(HERE / "explain_check.py")]
        if "h100" not in kit.sites and kit.dry_run:
            kit.show("explain", cmd, "no wheel here")
        elif "h100" not in kit.sites:
            kit.skip("explain", "needs wheel-h100")
        elif kit.dry_run:  # the wheel's runtime as far as it goes without a GPU
            kit.run(
                "explain",
                60,
                [*cmd, "--dry-run"],
                env=_pythonpath(kit.sites["h100"]),
                note=lambda t, _rc: _last(t),
            )
        else:
            kit.run("explain", 60, cmd, env=_pythonpath(kit.sites["h100"]), note=lambda t, _rc: _last(t))
    summary: list[str] = []
    if want("sweep"):
        summary += step_pytest(kit, "sweep", 200, ["tests/gpu"], "h100", {}, resume)
    if want("turing"):
        summary += step_pytest(
            kit, "turing", 120, ["tests/gpu/test_turing.py"], "turing", {"FA_GPU_TURING": "1"}, resume
        )
    if summary:
        (kit.out / "sweep.txt").write_text("\n".join(summary) + "\n")


def step_pytest(
    kit: Kit, name: str, cap: float, paths: list[str], wheel: str, env: dict[str, str], resume: Path | None
) -> list[str]:
    """pytest over `paths` with the wheel first on PYTHONPATH, run again after a test that broke the
    CUDA context (the gpu_progress plugin records progress and stops there) until every test ran or the
    time is up; `resume`/<name>.progress (an earlier call's) skips the tests it lists. Returns the
    lines of sweep.txt for this step."""
    progress = kit.logs / f"{name}.progress"
    earlier = resume / f"{name}.progress" if resume else None
    progress.write_text(earlier.read_text() if earlier and earlier.is_file() else "")
    timeout = ["--timeout", "150", "--timeout-method", "thread"] if _has("pytest_timeout") else []
    opts = [
        "-q",
        "-o",
        "pythonpath=",
        "-p",
        "no:cacheprovider",
        "-p",
        "gpu_progress",
        "-rf",
    ]  # gpu_progress: HERE
    base = [kit.py, "-m", "pytest", *paths, *opts, *timeout]
    env = {**env, "FA_STRICT": "1", "FA_GPU_PROGRESS": str(progress)}
    if kit.dry_run:
        kit.run(
            name,
            cap,
            [*base, "--collect-only"],
            # No wheel in a dry run: collecting imports fa_attn (the tests' reference is the runtime's,
            # fa_attn/verify), so the checkout's runtime stands in for it here, and only here.
            env={**env, **_pythonpath(HERE, REPO / "kernels")},
            note=lambda t, _rc: _last(t),
        )
        return [f"{name}: collected only (dry run): {_last((kit.logs / f'{name}.log').read_text())}"]
    if wheel not in kit.sites:
        kit.skip(name, f"needs wheel-{wheel}")
        return [f"{name}: skipped, needs wheel-{wheel}"]
    env.update(_pythonpath(kit.sites[wheel], HERE))  # the wheel first, never kernels/
    end = time.monotonic() + min(cap, kit.left())
    for attempt in range(1, 20):
        before = len(progress.read_text().splitlines())
        rc = kit.run(
            name if attempt == 1 else f"{name}-{attempt}",
            max(0.0, end - time.monotonic()),
            base,
            env={**env, "FA_GPU_RESUME": str(int(attempt > 1 or before > 0))},
            note=_progress_note(progress),
        )
        lines = progress.read_text().splitlines()[before:]
        broke = {ln.split(" ", 1)[1] for ln in lines if ln.startswith("poisoned ")}
        started = {ln.split(" ", 1)[1] for ln in lines if ln.startswith("start ")}
        ended = {
            ln.split(" ", 1)[1] for ln in lines if " " in ln and not ln.startswith(("start ", "poisoned "))
        }
        died = started - ended  # a test whose process died (a crash, pytest-timeout's exit) never ended
        if rc is None or rc == 124 or not (broke or died) or end - time.monotonic() < 20:
            break
        kit.say(f"   {name}: going on after {', '.join(sorted(broke | died))}")
    return _progress_summary(name, progress)


def _progress_note(progress: Path) -> Callable[[str, int], str]:
    def note(text: str, _rc: int) -> str:
        counts: dict[str, int] = {}
        for ln in progress.read_text().splitlines():
            kind = ln.split(" ", 1)[0]
            if kind != "start":
                counts[kind] = counts.get(kind, 0) + 1
        return ", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or _last(text)

    return note


def _progress_summary(name: str, progress: Path) -> list[str]:
    """sweep.txt's lines for one step: the counts, then every test that failed, broke the CUDA context
    or died with its pytest (those get no outcome line)."""
    records = [ln.split(" ", 1) for ln in progress.read_text().splitlines() if " " in ln]
    started = list(dict.fromkeys(test for kind, test in records if kind == "start"))
    outcome = {test: kind for kind, test in records if kind not in ("start", "poisoned")}
    broke = {test for kind, test in records if kind == "poisoned"}
    counts: dict[str, int] = {}
    for test in started:
        counts[outcome.get(test, "died")] = counts.get(outcome.get(test, "died"), 0) + 1
    out = [f"{name}: " + (", ".join(f"{n} {k}" for k, n in sorted(counts.items())) or "no test ran")]
    for test in started:
        kind = outcome.get(test, "died")
        if kind in ("failed", "error", "died"):
            out.append(
                f"  {kind} {test}"
                + (" (broke the CUDA context: the rest ran in a new pytest)" if test in broke else "")
            )
    return out


def _has(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def _bench_script(kit: Kit, script: str, resume: Path | None, result: str, *options: str) -> list[str]:
    """`python bench/kernels/<script> --out <out> <options>`, resuming from `resume`/<result> where an earlier
    call of the kit left one."""
    cmd = [kit.py, str(REPO / "bench" / "kernels" / script), "--out", str(kit.out), *options]
    if resume and (resume / result).is_file():
        cmd += ["--resume", str(resume / result)]
    return cmd


# ---- tune -----------------------------------------------------------------------------------------------------
def cmd_tune(kit: Kit, steps: set[str] | None, resume: Path | None) -> None:
    if steps is None or "machine" in steps:
        step_machine(kit)
    if steps is not None and "autotune" not in steps:
        return
    cmd = _bench_script(kit, "autotune.py", resume, "autotune.json")
    if kit.dry_run:
        cmd += [
            "--dry-run",
            "--head-dims",
            "64",
            "--directions",
            "fwd",
            "--max-candidates",
            "2",
        ]  # bf16, as on the GPU
    if (CARRY / "autotune" / "index.json").is_file():  # the dry run reads its spill verdicts too
        cmd += ["--images", str(CARRY / "autotune")]
    # autotune stops starting candidates at its budget; the step's limit leaves it a minute to write.
    limit = min(kit.left(), 600)
    cmd += ["--budget-s", str(int(max(30, limit - 60)))]
    kit.run("autotune", limit, cmd, note=lambda t, _rc: _autotune_note(kit.out / "autotune.json", t))


def _autotune_note(path: Path, text: str) -> str:
    if not path.is_file():
        return _last(text)
    data = json.loads(path.read_text())
    changed = [r for r in data.get("table", []) if r["choice"] != r["default"]]
    return (
        f"{len(data['candidates'])} candidates, {len(data.get('skipped', []))} skipped; "
        f"{len(changed)} table entries change" + (" (tiles.patch)" if data.get("patch") else "")
    )


# ---- bench ----------------------------------------------------------------------------------------------------
NCU_SECTIONS = (
    "SpeedOfLight",
    "ComputeWorkloadAnalysis",
    "MemoryWorkloadAnalysis_Tables",
    "Occupancy",
    "LaunchStats",
)
# Tensor-pipe use, shared-memory bank conflicts, L2 atomics and reductions (dq_accum): asked for only
# when this ncu lists them (ncu --query-metrics), so a renamed metric costs its column, not the pass.
NCU_METRICS = (
    "sm__pipe_tensor_op_hmma_cycles_active.avg.pct_of_peak_sustained_active",
    "sm__inst_executed_pipe_tensor_op_hmma.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_ld.sum",
    "l1tex__data_bank_conflicts_pipe_lsu_mem_shared_op_st.sum",
    "l1tex__data_pipe_lsu_wavefronts_mem_shared_op_ld.sum",
    "lts__t_sectors_op_red.sum",
    "lts__t_sectors_op_atom.sum",
)


def cmd_bench(kit: Kit, steps: set[str] | None, resume: Path | None) -> None:
    want = lambda s: steps is None or s in steps
    if want("machine"):
        step_machine(kit)
    if steps is None or steps & {"attention", "sanitize", "ncu"}:
        step_wheels(kit, ("h100",))
    if want("attention"):
        cmd = _bench_script(kit, "attention.py", resume, "attention.jsonl", "--dtypes", "bf16")
        if kit.dry_run:
            cmd += [
                "--dry-run",
                "--head-dims",
                "128",
                "--seqlens",
                "512",
                "2048",
                "--reps",
                "2",
                "--warmup",
                "1",
            ]
            kit.run("attention", 120, cmd, note=_bench_note)
        elif "h100" in kit.sites:
            cmd += [
                "--head-dims",
                "128",
                "64",
                "256",
                "--seqlens",
                "1024",
                "2048",
                "4096",
                "8192",
                "--budget-s",
                "190",
            ]
            kit.run("attention", 230, cmd, env=_pythonpath(kit.sites["h100"]), note=_bench_note)
        else:
            kit.skip("attention", "needs wheel-h100")
    if want("sanitize"):
        cmd = ["bash", str(HERE / "sanitize.sh")]
        if kit.dry_run:
            kit.show("sanitize", cmd, "needs a GPU, compute-sanitizer and the H100 wheel")
        elif "h100" in kit.sites:
            kit.run(
                "sanitize",
                120,
                cmd,
                env={
                    **_pythonpath(kit.sites["h100"]),
                    **_sanitizer_env(),
                    "PYTHON": kit.py,
                },  # sanitize.sh runs $PYTHON
                note=_sanitize_note,
            )
        else:
            kit.skip("sanitize", "needs wheel-h100")
    if want("ncu"):
        step_ncu(kit)


def _bench_note(text: str, _rc: int) -> str:
    passed, failed = text.count("\nPASS "), text.count("\nFAIL ")
    rows = next((ln for ln in text.splitlines() if " rows in " in ln), "")
    return f"{rows.split(' ->')[0]}; H100 targets: {passed} PASS, {failed} FAIL"


def _sanitizer_env() -> dict[str, str]:
    """sanitize.sh looks in $COMPUTE_SANITIZER, PATH and $CUDA_HOME/bin: add the toolkit's usual homes."""
    if os.environ.get("COMPUTE_SANITIZER") or shutil.which("compute-sanitizer"):
        return {}
    for cand in sorted(Path("/usr/local").glob("cuda*/bin/compute-sanitizer")) + sorted(
        Path("/usr/local").glob("cuda*/compute-sanitizer/compute-sanitizer")
    ):
        if os.access(cand, os.X_OK):
            return {"COMPUTE_SANITIZER": str(cand)}
    return {}


def _sanitize_note(text: str, _rc: int) -> str:
    import re

    found = re.findall(r"ERROR SUMMARY: (\d+) errors?", text)
    return "memcheck, racecheck, initcheck: " + (
        ", ".join(found) + " errors" if found else "no ERROR SUMMARY line"
    )


def _ncu() -> str | None:
    found = shutil.which("ncu")
    if found:
        return found
    cands = sorted(Path("/usr/local").glob("cuda*/bin/ncu")) + sorted(
        Path("/opt/nvidia").glob("nsight-compute/*/ncu")
    )
    return str(cands[-1]) if cands else None


def step_ncu(kit: Kit) -> None:
    """One Nsight Compute pass each on the forward and backward bf16 d128 units, one launch each."""
    ncu = _ncu() or "ncu"
    text_out = kit.out / "ncu.txt"
    for unit, entries in (("fwd_bf16_d128", 1), ("bwd_bf16_d128", 3)):
        target = [kit.py, str(HERE / "profile_units.py"), "--unit", unit]
        if kit.dry_run:
            fake = [
                *_ncu_cmd(ncu, entries, NCU_METRICS, kit.logs / f"ncu-{unit}"),
                *target,
                "--package",
                "SITE/fa_attn",
            ]
            kit.show(f"ncu-{unit}", fake, "needs a GPU and Nsight Compute")
            small = unit.replace("bf16_d128", "fp16_d64")  # the emulator launches the same direction
            kit.run(
                f"launch-{small}", 120, [kit.py, str(HERE / "profile_units.py"), "--unit", small, "--dry-run"]
            )
            continue
        if "h100" not in kit.sites:
            kit.skip(f"ncu-{unit}", "needs wheel-h100")
            continue
        metrics = _available_metrics(ncu, NCU_METRICS)
        cmd = [
            *_ncu_cmd(ncu, entries, metrics, kit.logs / f"ncu-{unit}"),
            *target,
            "--package",
            str(kit.sites["h100"] / "fa_attn"),
        ]
        kit.run(f"ncu-{unit}", 60, cmd, note=lambda t, _rc: _last(t))
        log = kit.logs / f"ncu-{unit}.log"
        if log.is_file():
            with text_out.open("a") as f:
                f.write(f"===== {unit}: {shlex.join(cmd)}\n{log.read_text(errors='replace')}\n")


def _ncu_cmd(ncu: str, entries: int, metrics: tuple[str, ...] | list[str], export: Path) -> list[str]:
    cmd = [ncu, "--target-processes", "all", "--kernel-name", "regex:^fa_", "--launch-skip", str(entries)]
    cmd += [
        "--launch-count",
        str(entries),
        "--clock-control",
        "none",
        "--export",
        str(export),
        "--force-overwrite",
    ]
    for section in NCU_SECTIONS:
        cmd += ["--section", section]
    if metrics:
        cmd += ["--metrics", ",".join(metrics)]
    return cmd


def _available_metrics(ncu: str, wanted: tuple[str, ...]) -> list[str]:
    """The wanted metrics whose base name this ncu lists for the device (all of them if it cannot say)."""
    try:
        listed = subprocess.run(
            [ncu, "--query-metrics"], capture_output=True, text=True, timeout=60, check=False
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return list(wanted)
    names = {ln.split()[0] for ln in listed.splitlines() if ln.strip()}
    if len(names) < 50:  # no usable listing
        return list(wanted)
    return [m for m in wanted if m.split(".", 1)[0] in names]


# ---- the run ------------------------------------------------------------------------------------------------------
def finish(kit: Kit, t0: float) -> int:
    """The table, and $OUT cut down to its files: kit.log, logs.tar.gz, the command's results."""
    keep = {"kit.log", "logs.tar.gz", *RESULTS[kit.command]}
    for path in sorted(kit.out.iterdir()):
        if path.name not in keep:  # a step's stray output goes into the tarball, not back as a file
            shutil.move(str(path), kit.logs / f"out-{path.name}")
    kit.bundle()
    kit.say(f"\n{'step':22} {'rc':>5} {'seconds':>8} {'limit':>6}  note")
    failed = False
    for r in kit.records:
        kit.say(f"{r.name:22} {r.rc:>5} {r.seconds:8.1f} {r.limit:6.0f}  {r.note}")
        failed |= r.rc not in ("0", "dry")
    files = sorted(p.name for p in kit.out.iterdir())
    kit.say(f"total {time.monotonic() - t0:.0f}s; {len(files)} files in $OUT ({kit.out}): {', '.join(files)}")
    if len(files) > MAX_FILES:
        kit.say(f"warning: more than {MAX_FILES} files in $OUT: the device tool brings back only {MAX_FILES}")
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=sorted(TOTALS))
    ap.add_argument("--dry-run", action="store_true", help="the same flow without a GPU")
    ap.add_argument("--steps", nargs="+", help="only these steps (names as in the table)")
    ap.add_argument("--total-s", type=float, help="the command's deadline in seconds (default per command)")
    ap.add_argument(
        "--resume",
        type=Path,
        metavar="DIR",
        help="an earlier call's results to go on from: sweep.progress, turing.progress (verify), "
        "autotune.json (tune), attention.jsonl (bench)",
    )
    ap.add_argument("--out", type=Path, help="default $OUT, else /tmp/fa-kit-out")
    args = ap.parse_args(argv)

    out = args.out or Path(os.environ.get("OUT") or Path(tempfile.gettempdir()) / "fa-kit-out")
    try:
        out.mkdir(parents=True, exist_ok=True)
        log_file = (out / "kit.log").open("w")
    except OSError as e:
        print(f"kit: cannot write OUT={out}: {e}", file=sys.stderr)
        return 2
    t0 = time.monotonic()
    printer = _Tee(sys.stdout, log_file)
    with tempfile.TemporaryDirectory(prefix="fa-kit-") as tmp:
        scratch = Path(tmp)
        logs = scratch / "logs"
        logs.mkdir()
        kit = Kit(
            command=args.command,
            out=out,
            scratch=scratch,
            deadline=t0 + (args.total_s or TOTALS[args.command]),
            dry_run=args.dry_run,
            py=sys.executable,
            printer=printer,
            logs=logs,
        )
        kit.say(
            f"kit {args.command}{' --dry-run' if args.dry_run else ''}: {time.strftime('%Y-%m-%d %H:%M:%S')}, "
            f"repo {REPO}, OUT {out}, deadline {args.total_s or TOTALS[args.command]:.0f}s"
        )
        steps = set(args.steps) if args.steps else None
        if args.command == "verify":
            cmd_verify(kit, steps, args.resume)
        elif args.command == "tune":
            cmd_tune(kit, steps, args.resume)
        else:
            cmd_bench(kit, steps, args.resume)
        status = finish(kit, t0)
    log_file.close()
    return status


class _Tee(io.TextIOBase):
    def __init__(self, *streams: IO[str]) -> None:
        self.streams = streams

    def write(self, text: str) -> int:
        for s in self.streams:
            s.write(text)
        return len(text)

    def flush(self) -> None:
        for s in self.streams:
            s.flush()


if __name__ == "__main__":
    sys.exit(main())
