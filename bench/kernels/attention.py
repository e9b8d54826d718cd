"""Attention throughput: fa_attn against torch SDPA's flash and cuDNN backends, streamed row by row.

    python bench/kernels/attention.py --out $OUT                    # on a GPU: every default shape
    python bench/kernels/attention.py --head-dims 128 --seqlens 2048 4096 --dtypes bf16 --budget-s 240
    python bench/kernels/attention.py --plot attention.png --jsonl attention.jsonl   # the PNG and targets, again
    python bench/kernels/attention.py --list                        # the plan of shapes, nothing run
    python bench/kernels/attention.py --dry-run --out /tmp/b        # the whole flow on the CPU, stand-in timings

Shapes follow FA2's benchmark: batch x seqlen = 16k tokens, hidden 2048 (heads = 2048 / head_dim),
head dims 64/128/256, seqlens 512..16k, causal and not, bf16 and fp16. FLOPs: 4 * sq * sk * d * heads *
batch per forward, halved when causal; backward counts 2.5x the forward. Each timing is the median of
--reps runs timed with CUDA events after --warmup runs.

Streaming: one row per (shape, mode), measured ours first, then SDPA's FLASH_ATTENTION and
CUDNN_ATTENTION, is appended to attention.jsonl (one JSON object per line, flushed) and printed as a
table line with the ratios, the moment it is measured. A run that is killed keeps every row it
finished; SIGTERM (what `timeout` sends) ends it after writing the plot and the target lines.
--budget-s stops before a shape that would start past the budget and lists what it skipped; --resume
FILE copies the rows of an earlier run's attention.jsonl and measures only the rest. A backend that
refuses a shape is noted in its cell (see the JSON), not fatal.

H100 targets, printed after the table: forward >= 1.0x SDPA-flash, backward >= 0.9x and
forward+backward >= 1.0x, at head dim 128 and seqlen >= 2k.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # bench/: figures (stdlib only)
import figures

TOKENS = 16 * 1024
HIDDEN = 2048
MODES = ("fwd", "bwd", "fwd_bwd")
IMPLS = ("fa_attn", "sdpa_flash", "sdpa_cudnn")
REFERENCE = "sdpa_flash"  # the targets' denominator
# (mode, head_dim, min seqlen, minimum ratio of fa_attn to sdpa_flash), checked on an H100.
H100_TARGETS = (("fwd", 128, 2048, 1.0), ("bwd", 128, 2048, 0.9), ("fwd_bwd", 128, 2048, 1.0))
JSONL = "attention.jsonl"
PNG = "attention.png"
DRY_RUN_SHRINK = 64  # the dry run's stand-ins run seqlen / 64 (at least 16) on one head


@dataclass(frozen=True)
class Shape:
    batch: int
    seqlen: int
    heads: int
    head_dim: int
    causal: bool
    dtype: str  # "bf16" | "fp16"

    def flops(self, mode: str) -> float:
        fwd = 4.0 * self.seqlen * self.seqlen * self.head_dim * self.heads * self.batch
        if self.causal:
            fwd /= 2
        return {"fwd": fwd, "bwd": 2.5 * fwd, "fwd_bwd": 3.5 * fwd}[mode]

    @property
    def label(self) -> str:
        return f"{self.dtype} d{self.head_dim} s{self.seqlen} b{self.batch} h{self.heads}" + (
            " causal" if self.causal else ""
        )


def plan(head_dims: list[int], seqlens: list[int], dtypes: list[str], causals: list[bool]) -> list[Shape]:
    """Shapes in the order they are measured: head dim 128 first (the targets), then the others."""
    dims = sorted(head_dims, key=lambda d: (d != 128, d))
    return [
        Shape(max(1, TOKENS // s), s, HIDDEN // d, d, causal, dtype)
        for dtype in dtypes
        for d in dims
        for causal in causals
        for s in seqlens
    ]


# ---- measuring ---------------------------------------------------------------------------------------------
Fns = dict[str, Callable[[], object]]  # mode -> one call


def time_ms(fn: Callable[[], object], warmup: int, reps: int, cuda: bool) -> list[float]:
    """Per-run milliseconds: CUDA events on a GPU, the wall clock on the CPU."""
    import torch

    for _ in range(warmup):
        fn()
    if cuda:
        torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            out.append(start.elapsed_time(end))
        else:
            t0 = time.perf_counter()
            fn()
            out.append((time.perf_counter() - t0) * 1e3)
    return out


def _mode_fns(forward: Callable[[], Any], q: Any, k: Any, v: Any) -> Fns:
    """fwd / bwd / fwd_bwd closures around one implementation's forward (run once here: a refusal
    surfaces before any timing)."""
    import torch

    out = forward()
    dout = torch.randn_like(out)
    out.backward(dout, retain_graph=True)

    def fwd() -> object:
        with torch.no_grad():
            return forward()

    def bwd() -> object:
        return torch.autograd.grad(out, (q, k, v), dout, retain_graph=True)

    def fwd_bwd() -> object:
        return torch.autograd.grad(forward(), (q, k, v), dout)

    return {"fwd": fwd, "bwd": bwd, "fwd_bwd": fwd_bwd}


def gpu_fns(impl: str, shape: Shape) -> Fns:
    """The closures for one implementation on the GPU; raising here means the backend refused."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16 if shape.dtype == "bf16" else torch.float16
    b, s, h, d = shape.batch, shape.seqlen, shape.heads, shape.head_dim
    if impl == "fa_attn":
        # A silent fallback would time SDPA under our name: strict mode turns it into a noted refusal.
        os.environ["FA_STRICT"] = "1"
        from fa_attn import flash_attn_func

        # Our layout (b, s, h, d); SDPA's is (b, h, s, d). Each gets its own so no transpose is timed.
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))

        def forward() -> Any:
            return flash_attn_func(q, k, v, causal=shape.causal)
    else:
        backend = SDPBackend.FLASH_ATTENTION if impl == "sdpa_flash" else SDPBackend.CUDNN_ATTENTION
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))

        def forward() -> Any:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal)

    return _mode_fns(forward, q, k, v)


def dry_run_shape(shape: Shape) -> Shape:
    """What a dry-run stand-in computes for `shape` (its TFLOP/s are counted on this)."""
    return Shape(1, max(16, shape.seqlen // DRY_RUN_SHRINK), 1, shape.head_dim, shape.causal, shape.dtype)


def dry_run_fns(impl: str, shape: Shape) -> Fns:
    """CPU stand-ins for the dry run: SDPA's math at seqlen / DRY_RUN_SHRINK on one head, so the flow
    (streaming, ratios, targets, plot) runs anywhere. The cuDNN stand-in refuses head dims above 128 so
    that a refusal runs through the flow too. The numbers mean nothing."""
    import torch
    import torch.nn.functional as F

    if impl == "sdpa_cudnn" and shape.head_dim > 128:
        raise RuntimeError("dry-run stand-in: refuses head dims above 128")
    small = dry_run_shape(shape)
    q, k, v = (torch.randn(1, 1, small.seqlen, small.head_dim, requires_grad=True) for _ in range(3))

    def forward() -> Any:
        return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal)

    return _mode_fns(forward, q, k, v)


def _dispatched() -> str | None:
    import fa_attn

    last = fa_attn.last_dispatch()
    return f"{last.path} {last.arch}" if last is not None else None


def measure_shape(
    shape: Shape, impls: list[str], make: Callable[[str, Shape], Fns], warmup: int, reps: int, cuda: bool
) -> Iterator[dict]:
    """One row per mode: every implementation's timing of that mode (ours first), with the ratios."""
    counted = shape if cuda else dry_run_shape(shape)
    fns: dict[str, Fns | str] = {}
    for impl in impls:
        try:
            fns[impl] = make(impl, shape)
        except Exception as e:  # noqa: BLE001 - any refusal (RuntimeError, FaFallbackError...) is noted
            fns[impl] = (str(e).splitlines()[0][:200] if str(e) else type(e).__name__) or "refused"
    ran = _dispatched() if cuda and isinstance(fns.get("fa_attn"), dict) else None
    for mode in MODES:
        cells: dict[str, dict] = {}
        for impl in impls:
            f = fns[impl]
            if isinstance(f, str):
                cells[impl] = {"skipped": f}
                continue
            ts = time_ms(f[mode], warmup, reps, cuda)
            ms = statistics.median(ts)
            cells[impl] = {
                "ms": round(ms, 4),
                "tflops": float(f"{counted.flops(mode) / (ms * 1e-3) / 1e12:.4g}"),
            }
            cells[impl]["timings_ms"] = [round(t, 4) for t in ts]
            if impl == "fa_attn" and ran:
                cells[impl]["ran"] = ran
        yield {"shape": asdict(shape), "mode": mode, "results": cells, "ratio": ratios(cells)}
    del fns
    if cuda:
        import torch

        torch.cuda.empty_cache()


def ratios(cells: dict[str, dict]) -> dict[str, float | None]:
    """fa_attn's throughput over each SDPA backend's, None where either did not run."""
    ours = cells.get("fa_attn", {}).get("tflops")
    out: dict[str, float | None] = {}
    for impl, cell in cells.items():
        if impl != "fa_attn":
            theirs = cell.get("tflops")
            out[impl] = round(ours / theirs, 3) if ours and theirs else None
    return out


# ---- presenting -------------------------------------------------------------------------------------------
def table_header(impls: list[str]) -> str:
    others = [i for i in impls if i != "fa_attn"]
    head = f"{'shape':38} {'mode':8} " + " ".join(f"{i:>10}" for i in impls)
    if "fa_attn" in impls:
        head += " " + " ".join(f"{'/' + i.removeprefix('sdpa_'):>7}" for i in others)
    return head


def table_line(row: dict, impls: list[str]) -> str:
    shape = Shape(**row["shape"])
    cells = [row["results"].get(i, {}) for i in impls]
    text = f"{shape.label:38} {row['mode']:8} " + " ".join(
        (f"{c['tflops']:10.1f}" if c["tflops"] >= 10 else f"{c['tflops']:10.4f}")
        if "tflops" in c
        else f"{'refused':>10}"
        for c in cells
    )
    if "fa_attn" in impls:
        text += " " + " ".join(
            f"{r:7.2f}" if (r := row["ratio"].get(i)) is not None else f"{'-':>7}"
            for i in impls
            if i != "fa_attn"
        )
    return text


def check_targets(rows: list[dict], device_name: str) -> list[str]:
    """One line per H100 target point: PASS/FAIL with the ratio, or why it was not checked."""
    if "H100" not in device_name:
        return [f"targets are for H100; this is {device_name}: not checked"]
    lines = []
    for mode, d, min_s, want in H100_TARGETS:
        for row in rows:
            shape = Shape(**row["shape"])
            if row["mode"] != mode or shape.head_dim != d or shape.seqlen < min_s:
                continue
            ratio = row["ratio"].get(REFERENCE)
            if ratio is None:
                why = row["results"].get("fa_attn", {}).get("skipped") or row["results"].get(
                    REFERENCE, {}
                ).get("skipped")
                lines.append(f"n/a  {mode} {shape.label}: no ratio ({why or 'not measured'})")
                continue
            verdict = "PASS" if ratio >= want else "FAIL"
            lines.append(f"{verdict} {mode} {shape.label}: {ratio:.2f}x {REFERENCE} (target >= {want}x)")
    return lines or [f"no row at the target points (head dim 128, seqlen >= 2048) on {device_name}"]


def read_rows(path: Path) -> tuple[dict, list[dict]]:
    """(the run's header, its rows) from an attention.jsonl; a torn last line (a killed run) is dropped."""
    header: dict = {}
    rows: list[dict] = []
    for line in path.read_text().splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if "run" in obj:
            header = header or obj["run"]
        elif "shape" in obj:
            rows.append(obj)
    return header, rows


def plot(rows: list[dict], path: Path, title: str) -> bool:
    """TFLOP/s against seqlen, one panel per (dtype, causal, head dim) and mode. False without matplotlib."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = sorted({(r["shape"]["dtype"], r["shape"]["causal"], r["shape"]["head_dim"]) for r in rows})
    if not groups:
        return False
    fig, axes = plt.subplots(
        len(groups), len(MODES), figsize=(5 * len(MODES), 3 * len(groups)), squeeze=False
    )
    for gi, (dtype, causal, d) in enumerate(groups):
        for mi, mode in enumerate(MODES):
            ax = axes[gi][mi]
            for impl in IMPLS:
                pts = sorted(
                    (r["shape"]["seqlen"], r["results"][impl]["tflops"])
                    for r in rows
                    if r["mode"] == mode
                    and (r["shape"]["dtype"], r["shape"]["causal"], r["shape"]["head_dim"])
                    == (dtype, causal, d)
                    and "tflops" in r["results"].get(impl, {})
                )
                if pts:
                    ax.plot(*zip(*pts, strict=False), marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{mode} {dtype} d{d}{' causal' if causal else ''}", fontsize=9)
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            ax.legend(fontsize=7)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def finish(rows: list[dict], device: str, out_png: Path, title: str) -> None:
    """After a run (whole, budget-stopped or interrupted) or from saved lines: the plot and the targets."""
    if rows and plot(rows, out_png, title):
        print(f"wrote {out_png}")
    print("\n".join(check_targets(rows, device)))


# ---- the run --------------------------------------------------------------------------------------------------
class Interrupted(Exception):
    """SIGTERM: stop measuring, keep what was measured."""


def _on_sigterm(_signum: int, _frame: object) -> None:
    raise Interrupted


def _key(row: dict) -> tuple:
    return (tuple(sorted(row["shape"].items())), row["mode"])


def run(args: argparse.Namespace, shapes: list[Shape]) -> int:
    import torch

    cuda = not args.dry_run
    if cuda and not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run here, or on a GPU machine", file=sys.stderr)
        return 2
    device = (
        "dry run: CPU stand-ins, the numbers mean nothing" if args.dry_run else torch.cuda.get_device_name()
    )
    # Never into the checkout: $OUT, else the user's cache under bench/attention.
    out_dir: Path = args.out or Path(os.environ.get("OUT") or figures.cache_out("attention"))
    out_dir.mkdir(parents=True, exist_ok=True)
    jsonl = out_dir / JSONL
    done: dict[tuple, dict] = {}
    if args.resume:
        _, earlier = read_rows(args.resume)
        done = {_key(r): r for r in earlier}
    header = {
        "device": device,
        "torch": torch.__version__,
        "warmup": args.warmup,
        "reps": args.reps,
        "started": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    make = dry_run_fns if args.dry_run else gpu_fns
    rows: list[dict] = []
    finished: set[Shape] = set()
    t0 = time.monotonic()
    signal.signal(signal.SIGTERM, _on_sigterm)
    print(f"device: {device}, torch {torch.__version__}; {len(shapes)} shapes -> {jsonl}")
    print(table_header(args.impls), flush=True)
    with jsonl.open("w") as sink:
        _write(sink, {"run": header})
        try:
            for shape in shapes:
                have = [done.get(_key({"shape": asdict(shape), "mode": m})) for m in MODES]
                resumed = all(have)
                if not resumed and args.budget_s is not None and time.monotonic() - t0 > args.budget_s:
                    print(f"budget of {args.budget_s:.0f}s spent", flush=True)
                    break
                measured = (
                    have if resumed else measure_shape(shape, args.impls, make, args.warmup, args.reps, cuda)
                )
                for row in measured:
                    assert row is not None
                    row.setdefault("device", device)
                    rows.append(row)
                    _write(sink, row)
                    print(table_line(row, args.impls) + ("  (resumed)" if resumed else ""), flush=True)
                finished.add(shape)
        except (Interrupted, KeyboardInterrupt):
            print("interrupted: keeping the rows measured so far", flush=True)
        finally:
            signal.signal(signal.SIGTERM, signal.SIG_DFL)
        skipped = [s.label for s in shapes if s not in finished]
        if skipped:
            _write(sink, {"skipped": skipped})
    print(f"{len(rows)} rows in {time.monotonic() - t0:.0f}s -> {jsonl}")
    if skipped:
        more = f"; ... ({len(skipped) - 6} more, listed in {JSONL})" if len(skipped) > 6 else ""
        print(f"skipped {len(skipped)} shapes (budget or interrupt): {'; '.join(skipped[:6])}{more}")
        print(f"to measure them: add --resume {JSONL} (copied from this run) to the same command")
    finish(rows, device, out_dir / PNG, f"{device}, torch {torch.__version__}")
    return 1 if skipped else 0


def _write(sink: IO[str], obj: dict) -> None:
    sink.write(json.dumps(obj) + "\n")
    sink.flush()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--dtypes", nargs="+", choices=["bf16", "fp16"], default=["bf16", "fp16"])
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20, help="timed runs per point; the median is reported")
    p.add_argument(
        "--out", type=Path, default=None, help="output dir (default $OUT, else <cache>/bench/attention)"
    )
    p.add_argument("--budget-s", type=float, help="start no new shape after this many seconds")
    p.add_argument("--resume", type=Path, help="an earlier attention.jsonl: keep its rows, measure the rest")
    p.add_argument("--list", action="store_true", help="print the plan of shapes and exit")
    p.add_argument("--dry-run", action="store_true", help="the whole flow on the CPU with stand-in timings")
    p.add_argument("--plot", type=Path, metavar="PNG", help="draw PNG from --jsonl (and print the targets)")
    p.add_argument("--jsonl", type=Path, help="with --plot: the attention.jsonl to draw")
    args = p.parse_args(argv)

    if args.plot:
        if args.jsonl is None or not args.jsonl.is_file():
            p.error(f"--plot needs --jsonl FILE, an attention.jsonl a run wrote (got {args.jsonl})")
        header, rows = read_rows(args.jsonl)
        device = header.get("device", "unknown device")
        print(f"{len(rows)} rows from {args.jsonl} ({device})")
        impls = [i for i in IMPLS if any(i in r["results"] for r in rows)]
        print(table_header(impls))
        for row in rows:
            print(table_line(row, impls))
        finish(rows, device, args.plot, f"{device}, torch {header.get('torch', '?')}")
        return 0 if rows else 1

    bad = [d for d in args.head_dims if d <= 0 or d > 256 or d % 8 or HIDDEN % d]
    if bad:
        p.error(
            f"--head-dims {bad}: each must be a multiple of 8 in 8..256 dividing the hidden size {HIDDEN}"
        )
    if any(s <= 0 for s in args.seqlens):
        p.error("--seqlens: every seqlen must be positive")
    if args.resume is not None and not args.resume.is_file():
        p.error(f"--resume {args.resume}: no such file (an attention.jsonl from an earlier run)")
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    shapes = plan(args.head_dims, args.seqlens, args.dtypes, causals)

    if args.list:
        print(f"{len(shapes)} shapes x {len(args.impls)} impls x {len(MODES)} modes ({', '.join(MODES)})")
        for s in shapes:
            print(f"  {s.label:38} fwd {s.flops('fwd') / 1e12:7.3f} TFLOP")
        print(
            "targets (H100): "
            + "; ".join(f"{m} d{d} s>={s}: >= {w}x {REFERENCE}" for m, d, s, w in H100_TARGETS)
        )
        return 0
    return run(args, shapes)


if __name__ == "__main__":
    sys.exit(main())
