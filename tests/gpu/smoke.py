"""Every kernel unit a wheel ships for this GPU, launched once at a tiny shape against the fp32 reference.

    python tests/gpu/smoke.py --wheel .carry/wheels-h100/fa_attn-*.whl --json $OUT/smoke.json
    python tests/gpu/smoke.py --wheel .carry/wheels-turing/fa_attn-*.whl --images ptx   # the Turing path
    python tests/gpu/smoke.py --dry-run --arch 9.0 --only 'd(64|128)'   # here: the CPU emulator

One case per (unit, image, causal): forward and backward units, each dtype and head-dim bucket, SASS
for this GPU's arch and (--images ptx) the PTX the driver JIT-compiles. A unit runs straight from the
wheel's image file through the CUDA driver API (tests/gpu/cuda_launch.py) with the manifest's launch
numbers, so neither the binding nor dispatch stands between the kernel and its verdict. A backward case
takes the reference's out and lse, so its verdict does not hang on the forward's.

Cases run in a worker process with CUDA_LAUNCH_BLOCKING=1. A CUDA error poisons the worker's context,
so after one the worker exits and a new one carries on from the next case; a worker that dies or stops
answering for --case-timeout seconds is killed and replaced the same way. Every case gets a verdict:
ok, wrong (an output over FA2's error bound), cuda-error, load-error (the driver refused the image),
crash, hang, error (anything else raised). Rows print as they finish; --json gets the whole table.
Exit status 0 when every case is ok, 1 otherwise, 2 for bad arguments or a worker that cannot start.

--dry-run runs the same flow on this machine with the CPU emulator (tests/emu) as the device, --arch
standing for the live GPU's: the cases come from --wheel's manifest (or kernels/tiles.py without one)
and each unit is compiled for the emulator from kernels/ by name (the wheel check ties the two). FA_SMOKE_FAULT="<substring of a case id>=crash|hang|cuda-error"
makes the worker fail that case so (the kit's CI tests check the restarts with it).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import tempfile
import time
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _p in (HERE, REPO / "tests" / "emu", REPO / "kernels", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

# The tiny shape: odd lengths across block edges, seqlen_q != seqlen_k, GQA 2. Every query row sees a
# key (bottom-right causal with seqlen_k > seqlen_q), so out and lse are compared on every row.
BATCH, SEQLEN_Q, SEQLEN_K, HEADS, HEADS_K = 2, 77, 130, 4, 2
VERDICTS = ("ok", "wrong", "cuda-error", "load-error", "crash", "hang", "error", "not-run")


@dataclass(frozen=True)
class SmokeCase:
    """One unit's image at one causal setting. `kernel` is its manifest entry (docs/contracts.md 3)."""

    kernel: dict[str, Any]
    causal: bool

    @property
    def id(self) -> str:
        k = self.kernel
        return f"{k['unit']}-{k['image']}{k['arch']}-{'causal' if self.causal else 'full'}"


@dataclass
class CaseResult:
    id: str
    unit: str
    image: str
    arch: str
    direction: str
    dtype: str
    head_dim: int
    causal: bool
    verdict: str
    worst: str | None = None  # the output with the largest error / bound
    ratio: float | None = None  # that output's error / bound (at most 1 passes)
    max_err: float | None = None
    seconds: float = 0.0
    message: str = ""
    resources: dict[str, dict[str, int]] = field(default_factory=dict)  # entry -> registers, local_bytes

    @classmethod
    def of(cls, case: SmokeCase, verdict: str, **kw: Any) -> CaseResult:
        k = case.kernel
        return cls(
            case.id, k["unit"], k["image"], k["arch"], k["direction"], k["dtype"], k["head_dim"], case.causal,
            verdict, **kw,
        )  # fmt: skip


# ---- which cases ------------------------------------------------------------------------------------------
def _arch(text: str) -> tuple[int, int]:
    from buildtool.core.runtime import versions

    return versions.parse_arch(text)


def runnable_kernels(manifest: dict, arch: str, images: list[str]) -> list[dict]:
    """The manifest's kernels that run on `arch`: per unit, the SASS of the best arch of the device's
    major at or below it (kernel_choice's rule), and with "ptx" every PTX at or below it."""
    device = _arch(arch)
    best: dict[tuple[str, str], dict] = {}
    for k in manifest.get("kernels") or []:
        a = _arch(k["arch"])
        if k["image"] not in images or a > device:
            continue
        if k["image"] == "sass" and a[0] != device[0]:
            continue
        key = (k["image"], k["unit"])
        if key not in best or _arch(best[key]["arch"]) < a:
            best[key] = k
    order = {"fwd": 0, "splitkv": 1, "bwd": 2}
    return sorted(
        best.values(), key=lambda k: (k["image"], order.get(k["direction"], 3), k["dtype"], k["head_dim"])
    )


def tiles_manifest(arch: str) -> dict:
    """What a wheel's manifest would list for `arch`, from kernels/tiles.py (the dry run has no wheel)."""
    import tiles

    return {
        "kernels": [
            {
                "arch": arch,
                "image": "sass",
                "file": None,
                "unit": u.name,
                "direction": u.direction,
                "dtype": u.dtype,
                "head_dim": u.head_dim,
                "entries": {e: asdict(lc) for e, lc in u.entries.items()},
            }
            for u in tiles.units(arch)
        ]
    }


def make_cases(kernels: list[dict], only: str | None) -> list[SmokeCase]:
    cases = [SmokeCase(k, causal) for k in kernels for causal in (False, True)]
    return [c for c in cases if only is None or re.search(only, c.id)]


# ---- one case, in a worker ------------------------------------------------------------------------------
def case_problem(case: SmokeCase) -> Any:
    import torch
    from attn_reference import Case

    k = case.kernel
    dtype = torch.bfloat16 if k["dtype"] == "bf16" else torch.float16
    seed = 2 * k["head_dim"] + case.causal
    return Case(BATCH, SEQLEN_Q, SEQLEN_K, HEADS, HEADS_K, k["head_dim"], case.causal, dtype, seed=seed)


def _injected_fault(case: SmokeCase) -> str | None:
    spec = os.environ.get("FA_SMOKE_FAULT", "")
    if "=" in spec:
        where, kind = spec.rsplit("=", 1)
        if where and where in case.id:
            return kind
    return None


class CaseRunner:
    """The worker's side: one runner per unit image (GPU) or tiles unit (emulator), kept across cases."""

    def __init__(self, package: Path | None, dry_run: bool) -> None:
        self.package = package
        self.dry_run = dry_run
        self.runners: dict[tuple[str, str], Any] = {}

    def runner(self, case: SmokeCase) -> Any:
        import unit_check
        from kernel_launch import UnitLaunch

        k = case.kernel
        key = (k["arch"], k["file"] or k["unit"])
        if key not in self.runners:
            if self.dry_run:
                import tiles

                unit = next((u for u in tiles.units(k["arch"]) if u.name == k["unit"]), None)
                if unit is None:
                    raise LookupError(f"kernels/tiles.py has no unit {k['unit']} for sm {k['arch']}")
                self.runners[key] = unit_check.EmulatedUnit(unit, k["arch"])
            else:
                assert self.package is not None
                self.runners[key] = unit_check.GpuUnit(self.package / k["file"], UnitLaunch.of(k))
        return self.runners[key]

    def run(self, case: SmokeCase) -> CaseResult:
        """One case, every failure turned into its verdict."""
        import unit_check

        t0 = time.perf_counter()
        fault = _injected_fault(case)
        try:
            if fault == "crash":
                os._exit(9)
            if fault == "hang":
                time.sleep(3600)
            if fault == "cuda-error":
                import cuda_launch

                raise cuda_launch.CudaError(
                    "launching (injected)", 700, "an illegal memory access was encountered"
                )
            runner = self.runner(case)
            errors = unit_check.measure(runner, case.kernel["direction"], case_problem(case))
            return CaseResult.of(
                case,
                seconds=round(time.perf_counter() - t0, 3),
                resources=runner.resources(),
                **unit_check.summary(errors),
            )
        except Exception as e:  # noqa: BLE001 - every failure becomes this case's verdict
            return CaseResult.of(
                case,
                unit_check.verdict_of(e),
                seconds=round(time.perf_counter() - t0, 3),
                message=unit_check.describe(e),
            )


def worker_main(args: argparse.Namespace) -> int:
    import workers

    cases = [SmokeCase(c["kernel"], c["causal"]) for c in json.loads(Path(args.cases).read_text())]
    runner = CaseRunner(Path(args.package) if args.package else None, args.dry_run)
    return workers.serve(len(cases), args.start, lambda i: asdict(runner.run(cases[i])))


# ---- the table ----------------------------------------------------------------------------------------------
HEADER = (
    f"{'case':34} {'verdict':10} {'worst':5} {'err/bound':>9} {'max err':>9} {'regs':>9} {'local':>5} "
    f"{'s':>5}  message"
)


def row(r: CaseResult) -> str:
    regs = "/".join(str(v["registers"]) for v in r.resources.values()) or "-"
    local = max((v["local_bytes"] for v in r.resources.values()), default=None)
    ratio = f"{r.ratio:9.3f}" if r.ratio is not None else f"{'-':>9}"
    err = f"{r.max_err:9.2e}" if r.max_err is not None else f"{'-':>9}"
    return (
        f"{r.id:34} {r.verdict:10} {r.worst or '-':5} {ratio} {err} {regs:>9} "
        f"{local if local is not None else '-':>5} {r.seconds:5.1f}  {r.message[:160]}"
    )


# ---- the wheel ---------------------------------------------------------------------------------------------------
def open_package(wheel: Path, scratch: Path) -> Path:
    """The fa_attn/ directory of a wheel (unzipped into `scratch`) or of an unpacked one."""
    if wheel.is_dir():
        pkg = wheel / "fa_attn" if (wheel / "fa_attn" / "manifest.json").is_file() else wheel
    else:
        with zipfile.ZipFile(wheel) as zf:
            zf.extractall(scratch)
        pkg = scratch / "fa_attn"
    if not (pkg / "manifest.json").is_file():
        raise FileNotFoundError(
            f"--wheel {wheel}: no fa_attn/manifest.json in it (a kernel wheel from `fa build`)"
        )
    return pkg


def live_device() -> tuple[str, str] | None:
    """(arch like "9.0", the GPU's name), or None when torch sees no CUDA GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}", torch.cuda.get_device_name(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--wheel", type=Path, help="a kernel wheel (.whl) or an unpacked one (its fa_attn/ dir)")
    ap.add_argument("--images", nargs="+", choices=("sass", "ptx"), default=["sass"])
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--only", help="only the cases whose id matches this regular expression")
    ap.add_argument("--case-timeout", type=float, help="seconds one case may take (default 60; 300 dry)")
    ap.add_argument("--start-timeout", type=float, default=300, help="seconds a worker may take to start")
    ap.add_argument("--no-source-check", action="store_true", help="run a wheel built from other sources")
    ap.add_argument("--dry-run", action="store_true", help="the CPU emulator stands in for the GPU")
    ap.add_argument("--arch", default="9.0", help="the arch the dry run emulates (default 9.0)")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cases", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--package", help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)

    import wheel_check
    import workers

    with tempfile.TemporaryDirectory(prefix="fa-smoke-") as tmp:
        scratch = Path(tmp)
        package: Path | None = None
        if args.wheel is not None:
            try:
                package = open_package(args.wheel, scratch)
            except (OSError, zipfile.BadZipFile) as e:
                print(f"smoke: {e}", file=sys.stderr)
                return 2
            manifest = json.loads((package / "manifest.json").read_text())
            source = str(args.wheel)
            mismatch = wheel_check.mismatch(manifest, str(args.wheel))
            if mismatch and not args.no_source_check:
                print(f"smoke: {mismatch}", file=sys.stderr)
                return 2
        elif args.dry_run:
            manifest, source = tiles_manifest(args.arch), "kernels/tiles.py"
        else:
            ap.error("--wheel is required (or --dry-run)")
        if args.dry_run:  # the wheel's units by name, compiled from kernels/ (the same sources, by hash)
            arch, device = args.arch, "CPU emulator (tests/emu)"
        else:
            live = live_device()
            if live is None:
                print(
                    "smoke: torch sees no CUDA GPU (use --dry-run on a machine without one)", file=sys.stderr
                )
                return 2
            arch, device = live
        kernels = runnable_kernels(manifest, arch, args.images)
        cases = make_cases(kernels, args.only)
        print(f"smoke: {device}, sm {arch}; {source}; images {'+'.join(args.images)}; {len(cases)} cases")
        if not cases:
            print(
                f"smoke: no {'/'.join(args.images)} kernel of it runs on sm {arch}"
                + (f" matching {args.only}" if args.only else "")
            )
            return 1
        cases_file = scratch / "cases.json"
        cases_file.write_text(json.dumps([asdict(c) for c in cases]))
        mode = ["--dry-run"] if args.dry_run else ["--package", str(package)]
        spec = workers.python_worker(
            [str(Path(__file__).resolve()), "--worker", "--cases", str(cases_file), *mode],
            item_timeout=args.case_timeout or (300.0 if args.dry_run else 60.0),
            start_timeout=args.start_timeout,
        )
        t0 = time.monotonic()
        print(HEADER, flush=True)
        raw = workers.run_items(
            len(cases),
            spec,
            lambda i, verdict, msg: asdict(CaseResult.of(cases[i], verdict, message=msg)),
            lambda _i, res: print(row(CaseResult(**res)), flush=True),
        )
        results = [CaseResult(**r) for r in raw]
        wall = time.monotonic() - t0

    counts = {v: n for v in VERDICTS if (n := sum(r.verdict == v for r in results))}
    print(f"smoke: {len(results)} cases in {wall:.0f}s: " + ", ".join(f"{n} {v}" for v, n in counts.items()))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        payload = {
            "device": device,
            "arch": arch,
            "source": source,
            "images": args.images,
            "shape": {
                "batch": BATCH,
                "seqlen_q": SEQLEN_Q,
                "seqlen_k": SEQLEN_K,
                "heads": HEADS,
                "heads_k": HEADS_K,
            },
            "wall_s": round(wall, 1),
            "counts": counts,
            "cases": [asdict(r) for r in results],
        }
        args.json.write_text(json.dumps(payload, indent=1) + "\n")
    return 0 if counts.get("ok", 0) == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
