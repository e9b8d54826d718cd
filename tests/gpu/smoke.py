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

--dry-run runs the same flow on this machine with the CPU emulator (tests/emu) as the device, the units
taken from kernels/tiles.py for --arch. FA_SMOKE_FAULT="<substring of a case id>=crash|hang|cuda-error"
makes the worker fail that case so (the kit's CI tests check the restarts with it).
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import subprocess
import sys
import tempfile
import threading
import time
import zipfile
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import IO, Any

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
    from buildtool.core import kernels_src

    return kernels_src.kernel_choice().parse_arch(text)


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
    order = {"fwd": 0, "bwd": 1}
    return sorted(
        best.values(), key=lambda k: (k["image"], order.get(k["direction"], 2), k["dtype"], k["head_dim"])
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


# ---- one case, on any device ------------------------------------------------------------------------------
class Backend:
    """Runs a case's unit: the GPU through the driver API, or the CPU emulator."""

    device: str  # where the case's tensors live ("cuda", "cpu")

    def forward(self, case: SmokeCase, call: Any) -> tuple[Any, Any]:
        raise NotImplementedError

    def backward(self, case: SmokeCase, call: Any, out: Any, lse: Any, dout: Any) -> tuple[Any, Any, Any]:
        raise NotImplementedError

    def resources(self, case: SmokeCase) -> dict[str, dict[str, int]]:
        return {}


class GpuBackend(Backend):
    device = "cuda"

    def __init__(self, package_dir: Path) -> None:
        import cuda_launch

        self.cuda = cuda_launch
        self.package_dir = package_dir
        self.modules: dict[str, Any] = {}

    def _dev(self, case: SmokeCase) -> Any:
        file = case.kernel["file"]
        if file not in self.modules:
            self.modules[file] = self.cuda.load(self.package_dir / file)
        return self.cuda.CudaDevice(self.modules[file])

    def forward(self, case: SmokeCase, call: Any) -> tuple[Any, Any]:
        from kernel_launch import UnitLaunch

        return self.cuda.run_forward(self._dev(case), UnitLaunch.of(case.kernel), call)

    def backward(self, case: SmokeCase, call: Any, out: Any, lse: Any, dout: Any) -> tuple[Any, Any, Any]:
        from kernel_launch import UnitLaunch

        return self.cuda.run_backward(self._dev(case), UnitLaunch.of(case.kernel), call, out, lse, dout)

    def resources(self, case: SmokeCase) -> dict[str, dict[str, int]]:
        module = self._dev(case).module
        return {entry: module.attributes(entry) for entry in case.kernel["entries"]}


class EmulatorBackend(Backend):
    device = "cpu"

    def __init__(self) -> None:
        import emu_harness

        self.emu = emu_harness
        self.libs: dict[tuple[str, str], Any] = {}

    def _lib(self, case: SmokeCase) -> Any:
        import tiles

        arch, name = case.kernel["arch"], case.kernel["unit"]
        if (arch, name) not in self.libs:
            unit = next((u for u in tiles.units(arch) if u.name == name), None)
            if unit is None:
                raise LookupError(f"kernels/tiles.py has no unit {name} for sm {arch}")
            self.libs[arch, name] = self.emu.Emulated(unit, arch)
        return self.libs[arch, name]

    def forward(self, case: SmokeCase, call: Any) -> tuple[Any, Any]:
        return self.emu.forward(self._lib(case), call)

    def backward(self, case: SmokeCase, call: Any, out: Any, lse: Any, dout: Any) -> tuple[Any, Any, Any]:
        return self.emu.backward(self._lib(case), call, out, lse, dout)


def check_case(backend: Backend, case: SmokeCase) -> CaseResult:
    """Run one case and measure every output against the fp32 reference (FA2's rule)."""
    import torch
    from attn_reference import attention_ref, fa2_error, lse_error, visible_rows
    from kernel_launch import Call

    k = case.kernel
    t0 = time.perf_counter()
    dtype = torch.bfloat16 if k["dtype"] == "bf16" else torch.float16
    gen = torch.Generator(device=backend.device).manual_seed(k["head_dim"] * 2 + case.causal)

    def rand(*shape: int) -> torch.Tensor:
        return torch.randn(shape, generator=gen, device=backend.device, dtype=torch.float32).to(dtype)

    d = k["head_dim"]
    q, kk, v = (
        rand(BATCH, SEQLEN_Q, HEADS, d),
        rand(BATCH, SEQLEN_K, HEADS_K, d),
        rand(BATCH, SEQLEN_K, HEADS_K, d),
    )
    call = Call(q, kk, v, causal=case.causal)
    qr, kr, vr = (t.clone().requires_grad_() for t in (q, kk, v))
    out_ref, lse_ref = attention_ref(qr, kr, vr, case.causal)
    out_low, _ = attention_ref(qr, kr, vr, case.causal, upcast=False)
    if k["direction"] == "fwd":
        out, lse = backend.forward(case, call)
        rows = visible_rows(SEQLEN_Q, SEQLEN_K, case.causal, q.device)
        errors = [fa2_error("out", out, out_ref, out_low), lse_error(lse, lse_ref, rows)]
    else:
        dout = rand(BATCH, SEQLEN_Q, HEADS, d)
        # The kernels' convention for a row that sees no key is lse = +inf (the reference gives -inf).
        lse_in = torch.where(torch.isneginf(lse_ref), torch.inf, lse_ref).detach().contiguous()
        grads = backend.backward(case, call, out_ref.detach().contiguous(), lse_in, dout)
        refs = torch.autograd.grad(out_ref, (qr, kr, vr), dout, retain_graph=True)
        lows = torch.autograd.grad(out_low, (qr, kr, vr), dout)
        errors = [fa2_error(n, g, r, lo) for n, g, r, lo in zip(("dq", "dk", "dv"), grads, refs, lows)]
    worst = max(errors, key=lambda e: e.ratio)
    bad = [e for e in errors if not e.ok]
    return CaseResult.of(
        case,
        "ok" if not bad else "wrong",
        worst=worst.name,
        ratio=worst.ratio,
        max_err=worst.err,
        seconds=round(time.perf_counter() - t0, 3),
        message="; ".join(f"{e.name}: error {e.err:.3g} > bound {e.bound:.3g}" for e in bad),
        resources=backend.resources(case),
    )


def _injected_fault(case: SmokeCase) -> str | None:
    spec = os.environ.get("FA_SMOKE_FAULT", "")
    if "=" in spec:
        where, kind = spec.rsplit("=", 1)
        if where and where in case.id:
            return kind
    return None


def run_in_worker(backend: Backend, case: SmokeCase) -> CaseResult:
    """check_case, with every failure turned into a verdict."""
    from kernel_launch import LaunchError

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
                "launching fa_fwd (injected)", 700, "an illegal memory access was encountered"
            )
        return check_case(backend, case)
    except Exception as e:  # noqa: BLE001 - every failure becomes this case's verdict
        verdict = _verdict_of(e)
        msg = f"{type(e).__name__}: {e}".strip().replace("\n", " ")[:500]
        if isinstance(e, LaunchError):
            verdict = "error"
        return CaseResult.of(case, verdict, seconds=round(time.perf_counter() - t0, 3), message=msg)


def _verdict_of(e: Exception) -> str:
    try:
        import cuda_launch
    except ImportError:  # no torch CUDA bits needed to classify
        cuda_launch = None  # type: ignore[assignment]
    if cuda_launch is not None and isinstance(e, cuda_launch.CudaError):
        return "load-error" if str(e).startswith("loading ") else "cuda-error"
    text = str(e)
    if re.search(
        r"CUDA error|cudaError|illegal memory access|misaligned address|unspecified launch failure", text
    ):
        return "cuda-error"
    return "error"


# ---- the worker process -------------------------------------------------------------------------------------
def worker_main(args: argparse.Namespace) -> int:
    # The protocol goes to the original stdout; anything else printed (warnings, C libraries) to stderr.
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)
    cases = [SmokeCase(c["kernel"], c["causal"]) for c in json.loads(Path(args.cases).read_text())]
    backend: Backend = EmulatorBackend() if args.dry_run else GpuBackend(Path(args.package))

    def send(**event: Any) -> None:
        proto.write(json.dumps(event) + "\n")

    send(event="ready")
    for i in range(args.start, len(cases)):
        send(event="start", index=i)
        result = run_in_worker(backend, cases[i])
        send(event="done", index=i, result=asdict(result))
        if result.verdict == "cuda-error":
            return 3  # the context is lost: the parent starts a new worker at the next case
    send(event="end")
    return 0


# ---- the parent: workers, restarts, the table ------------------------------------------------------------------
@dataclass
class WorkerSpec:
    argv: list[str]  # the worker's command line, without --start
    env: dict[str, str]
    case_timeout: float  # seconds a case may take
    start_timeout: float  # seconds a worker may take to get ready (imports, CUDA init, emulator builds)


def _reader(stream: IO[str], q: queue.Queue[str | None]) -> None:
    for line in stream:
        q.put(line)
    q.put(None)


def run_cases(
    cases: list[SmokeCase], spec: WorkerSpec, report: Callable[[CaseResult], None]
) -> list[CaseResult]:
    """Every case gets exactly one result, in order, whatever the workers do."""
    results: dict[int, CaseResult] = {}
    start = 0
    while start < len(cases):
        with tempfile.TemporaryFile("w+") as err:
            nxt, fatal = _one_worker(cases, spec, start, err, results, report)
            err.seek(0)
            tail = err.read()
        if tail.strip():
            sys.stderr.write(_indent(f"worker (from case {start}) stderr:", tail[-4000:]))
        if fatal is not None:
            for i in range(nxt, len(cases)):
                results[i] = CaseResult.of(cases[i], "not-run", message=fatal)
                report(results[i])
            break
        if nxt in results or nxt >= len(cases):
            start = max(results, default=-1) + 1
        else:
            start = nxt
    return [results[i] for i in range(len(cases))]


def _one_worker(
    cases: list[SmokeCase],
    spec: WorkerSpec,
    start: int,
    err: IO[str],
    results: dict[int, CaseResult],
    report: Callable[[CaseResult], None],
) -> tuple[int, str | None]:
    """Run a worker from case `start` until it ends, fails or hangs. Returns (the next case to run,
    a fatal message when no worker can run at all)."""
    proc = subprocess.Popen(
        [*spec.argv, "--start", str(start)],
        stdout=subprocess.PIPE,
        stderr=err,
        env=spec.env,
        text=True,
        start_new_session=True,  # its own process group: a hung worker is killed with its children
    )
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    current: int | None = None
    ready = False
    case_t0 = time.monotonic()
    while True:
        timeout = spec.case_timeout if ready else spec.start_timeout
        try:
            line = lines.get(timeout=max(0.1, timeout - (time.monotonic() - case_t0)))
        except queue.Empty:
            _kill(proc)
            if not ready:
                return start, f"the worker did not get ready in {spec.start_timeout:.0f}s"
            i = current if current is not None else start
            results[i] = CaseResult.of(
                cases[i],
                "hang",
                seconds=spec.case_timeout,
                message=f"no answer in {spec.case_timeout:.0f}s: killed",
            )
            report(results[i])
            return i + 1, None
        if line is None:  # the worker exited
            rc = proc.wait()
            if current is not None:
                err.seek(0)
                last = [ln for ln in err.read().splitlines() if ln.strip()][-3:]
                results[current] = CaseResult.of(
                    cases[current], "crash", message=f"worker exited with {rc}: " + " | ".join(last)
                )
                report(results[current])
                return current + 1, None
            if not ready:
                err.seek(0)
                return start, f"the worker exited with {rc} before its first case: {err.read()[-2000:]}"
            return max(results, default=start - 1) + 1, None
        event = json.loads(line)
        case_t0 = time.monotonic()
        if event["event"] == "ready":
            ready = True
        elif event["event"] == "start":
            current = event["index"]
        elif event["event"] == "done":
            results[event["index"]] = CaseResult(**event["result"])
            report(results[event["index"]])
            current = None
        elif event["event"] == "end":
            proc.wait()
            return len(cases), None


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()


def _indent(title: str, text: str) -> str:
    return title + "\n" + "".join(f"  | {ln}\n" for ln in text.rstrip().splitlines())


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

    with tempfile.TemporaryDirectory(prefix="fa-smoke-") as tmp:
        scratch = Path(tmp)
        package: Path | None = None
        if args.dry_run:
            arch, device = args.arch, f"CPU emulator (tests/emu) as sm {args.arch}"
            manifest = tiles_manifest(arch)
            source = "kernels/tiles.py (dry run)"
        else:
            if args.wheel is None:
                ap.error("--wheel is required (or --dry-run)")
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
            live = live_device()
            if live is None:
                print(
                    "smoke: torch sees no CUDA GPU (run with --dry-run on a machine without one)",
                    file=sys.stderr,
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
        worker = [sys.executable, str(Path(__file__).resolve()), "--worker", "--cases", str(cases_file)]
        worker += ["--dry-run"] if args.dry_run else ["--package", str(package)]
        spec = WorkerSpec(
            argv=worker,
            env=dict(os.environ, CUDA_LAUNCH_BLOCKING="1", PYTHONUNBUFFERED="1"),
            case_timeout=args.case_timeout or (300.0 if args.dry_run else 60.0),
            start_timeout=args.start_timeout,
        )
        t0 = time.monotonic()
        print(HEADER, flush=True)
        results = run_cases(cases, spec, lambda r: print(row(r), flush=True))
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
