"""Attention throughput: fa_attn against torch SDPA's flash and cuDNN backends, in one run.

    python bench/attention.py                 # on a GPU: times everything, writes JSON + PNG, prints a table
    python bench/attention.py --dry-run       # anywhere: prints the plan of shapes, times nothing

Shapes follow FA2's benchmark: batch x seqlen = 16k tokens, hidden 2048 (heads = 2048 / head_dim),
head dims 64/128/256, seqlens 512..16k, causal and not, bf16 and fp16. FLOPs: 4 * sq * sk * d * heads *
batch per forward, halved when causal; backward counts 2.5x the forward. Each timing is the median of
--reps runs timed with CUDA events after --warmup runs. A backend that refuses a shape is skipped and the
refusal noted in the results.

Targets checked on an H100 (printed after the table): forward >= 1.0x SDPA-flash at head dim 128 for
seqlen >= 2k, backward >= 0.9x.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

TOKENS = 16 * 1024
HIDDEN = 2048
MODES = ("fwd", "bwd", "fwd_bwd")
IMPLS = ("fa_attn", "sdpa_flash", "sdpa_cudnn")
# (mode, head_dim, min seqlen, minimum ratio of fa_attn to sdpa_flash) checked on H100.
H100_TARGETS = (("fwd", 128, 2048, 1.0), ("bwd", 128, 2048, 0.9))


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


@dataclass
class Result:
    shape: Shape
    impl: str
    mode: str
    ms: float | None = None
    tflops: float | None = None
    skipped: str | None = None  # why the backend refused, when it did
    ran: str | None = None  # for fa_attn: the image that ran ("sass 9.0", "ptx 12.0")
    timings_ms: list[float] = field(default_factory=list)


def plan(head_dims: list[int], seqlens: list[int], dtypes: list[str], causals: list[bool]) -> list[Shape]:
    shapes = []
    for dtype in dtypes:
        for causal in causals:
            for d in head_dims:
                for s in seqlens:
                    shapes.append(Shape(max(1, TOKENS // s), s, HIDDEN // d, d, causal, dtype))
    return shapes


def time_ms(fn: Callable[[], object], warmup: int, reps: int) -> list[float]:
    import torch

    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    out = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        out.append(start.elapsed_time(end))
    return out


def make_fns(impl: str, shape: Shape) -> dict[str, Callable[[], object]]:
    """fwd / bwd / fwd_bwd closures for one implementation; raising here means the backend refused."""
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    dtype = torch.bfloat16 if shape.dtype == "bf16" else torch.float16
    b, s, h, d = shape.batch, shape.seqlen, shape.heads, shape.head_dim
    if impl == "fa_attn":
        # A silent fallback would time SDPA under our name: strict mode turns it into a noted skip.
        os.environ["FA_STRICT"] = "1"
        from fa_attn import flash_attn_func

        # Our layout (b, s, h, d); SDPA's is (b, h, s, d). Each gets its own so no transpose is timed.
        q, k, v = (torch.randn(b, s, h, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))

        def forward() -> torch.Tensor:
            return flash_attn_func(q, k, v, causal=shape.causal)
    else:
        backend = SDPBackend.FLASH_ATTENTION if impl == "sdpa_flash" else SDPBackend.CUDNN_ATTENTION
        q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=dtype, requires_grad=True) for _ in range(3))

        def forward() -> torch.Tensor:
            with sdpa_kernel([backend]):
                return F.scaled_dot_product_attention(q, k, v, is_causal=shape.causal)

    out = forward()  # a refusal surfaces here, before any timing
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


def run(shapes: list[Shape], impls: list[str], warmup: int, reps: int) -> list[Result]:
    import torch

    results = []
    for shape in shapes:
        for impl in impls:
            try:
                fns = make_fns(impl, shape)
            except Exception as e:  # noqa: BLE001 - any refusal (RuntimeError, FaFallback...) is a skip
                msg = str(e).splitlines()[0][:160] if str(e) else type(e).__name__
                results.extend(Result(shape, impl, m, skipped=msg) for m in MODES)
                print(f"skip {impl} {shape}: {msg}", file=sys.stderr)
                continue
            ran = _dispatched() if impl == "fa_attn" else None
            for mode in MODES:
                ts = time_ms(fns[mode], warmup, reps)
                ms = statistics.median(ts)
                tflops = shape.flops(mode) / (ms * 1e-3) / 1e12
                results.append(Result(shape, impl, mode, ms, tflops, None, ran, ts))
            del fns
            torch.cuda.empty_cache()
    return results


def _dispatched() -> str | None:
    import fa_attn

    last = fa_attn.last_dispatch()
    return f"{last.path} {last.arch}" if last is not None else None


def check_targets(results: list[Result], device_name: str) -> list[str]:
    """One line per H100 target: PASS/FAIL with the ratio, or why it was not checked."""
    if "H100" not in device_name:
        return [f"targets are for H100; this is {device_name}: not checked"]
    by_key = {(r.shape, r.impl, r.mode): r for r in results}
    lines = []
    for mode, d, min_s, want in H100_TARGETS:
        for r in results:
            if r.impl != "fa_attn" or r.mode != mode or r.shape.head_dim != d or r.shape.seqlen < min_s:
                continue
            ref = by_key.get((r.shape, "sdpa_flash", mode))
            if r.tflops is None or ref is None or ref.tflops is None:
                lines.append(
                    f"n/a  {mode} {_label(r.shape)}: missing timing ({r.skipped or (ref and ref.skipped)})"
                )
                continue
            ratio = r.tflops / ref.tflops
            verdict = "PASS" if ratio >= want else "FAIL"
            lines.append(f"{verdict} {mode} {_label(r.shape)}: {ratio:.2f}x sdpa_flash (target >= {want}x)")
    return lines


def _label(s: Shape) -> str:
    return f"{s.dtype} d{s.head_dim} s{s.seqlen} b{s.batch} h{s.heads}{' causal' if s.causal else ''}"


def table(results: list[Result], impls: list[str]) -> str:
    rows: dict[tuple[Shape, str], dict[str, str]] = {}
    for r in results:
        cell = f"{r.tflops:7.1f}" if r.tflops is not None else "   skip"
        rows.setdefault((r.shape, r.mode), {})[r.impl] = cell
    head = f"{'shape':40} {'mode':8} " + " ".join(f"{i:>10}" for i in impls)
    lines = [head, "-" * len(head)]
    for (shape, mode), cells in rows.items():
        lines.append(f"{_label(shape):40} {mode:8} " + " ".join(f"{cells.get(i, ''):>10}" for i in impls))
    return "\n".join(lines) + "\n(TFLOP/s; skip = backend refused the shape, see JSON)"


def plot(results: list[Result], path: Path) -> bool:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return False
    groups = sorted({(r.shape.dtype, r.shape.causal, r.shape.head_dim) for r in results})
    fig, axes = plt.subplots(
        len(groups), len(MODES), figsize=(5 * len(MODES), 3 * len(groups)), squeeze=False
    )
    for gi, (dtype, causal, d) in enumerate(groups):
        for mi, mode in enumerate(MODES):
            ax = axes[gi][mi]
            for impl in IMPLS:
                pts = [
                    (r.shape.seqlen, r.tflops)
                    for r in results
                    if r.impl == impl
                    and r.mode == mode
                    and r.tflops is not None
                    and (r.shape.dtype, r.shape.causal, r.shape.head_dim) == (dtype, causal, d)
                ]
                if pts:
                    ax.plot(*zip(*sorted(pts), strict=True), marker="o", label=impl)
            ax.set_xscale("log", base=2)
            ax.set_title(f"{mode} {dtype} d{d}{' causal' if causal else ''}", fontsize=9)
            ax.set_xlabel("seqlen")
            ax.set_ylabel("TFLOP/s")
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--dry-run", action="store_true", help="print the plan of shapes and exit (no GPU needed)")
    p.add_argument("--head-dims", type=int, nargs="+", default=[64, 128, 256])
    p.add_argument("--seqlens", type=int, nargs="+", default=[512, 1024, 2048, 4096, 8192, 16384])
    p.add_argument("--dtypes", nargs="+", choices=["bf16", "fp16"], default=["bf16", "fp16"])
    p.add_argument("--causal", choices=["both", "yes", "no"], default="both")
    p.add_argument("--impls", nargs="+", choices=IMPLS, default=list(IMPLS))
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--reps", type=int, default=20, help="timed runs per point; the median is reported")
    p.add_argument("--out", type=Path, default=None, help="output dir (default $OUT, else bench/out)")
    args = p.parse_args(argv)

    bad = [d for d in args.head_dims if d <= 0 or d > 256 or d % 8 or HIDDEN % d]
    if bad:
        p.error(
            f"--head-dims {bad}: each must be a multiple of 8 in 8..256 dividing the hidden size {HIDDEN}"
        )
    if any(s <= 0 for s in args.seqlens):
        p.error("--seqlens: every seqlen must be positive")
    causals = {"both": [False, True], "yes": [True], "no": [False]}[args.causal]
    shapes = plan(args.head_dims, args.seqlens, args.dtypes, causals)

    if args.dry_run:
        print(f"{len(shapes)} shapes x {len(args.impls)} impls x {len(MODES)} modes ({', '.join(MODES)})")
        for s in shapes:
            print(f"  {_label(s):40} fwd {s.flops('fwd') / 1e12:7.3f} TFLOP")
        print(
            "targets (H100): "
            + "; ".join(f"{m} d{d} s>={s}: >= {w}x sdpa_flash" for m, d, s, w in H100_TARGETS)
        )
        return 0

    import torch

    if not torch.cuda.is_available():
        print("no CUDA device: run with --dry-run here, or on a GPU machine", file=sys.stderr)
        return 2
    device_name = torch.cuda.get_device_name()
    results = run(shapes, args.impls, args.warmup, args.reps)

    out_dir = args.out or Path(os.environ.get("OUT") or Path(__file__).parent / "out")
    out_dir.mkdir(parents=True, exist_ok=True)
    targets = check_targets(results, device_name)
    payload = {
        "device": device_name,
        "torch": torch.__version__,
        "warmup": args.warmup,
        "reps": args.reps,
        "results": [asdict(r) for r in results],
        "targets": targets,
    }
    (out_dir / "attention.json").write_text(json.dumps(payload, indent=1))
    plotted = plot(results, out_dir / "attention.png")
    print(f"wrote {out_dir / 'attention.json'}" + (f" and {out_dir / 'attention.png'}" if plotted else ""))
    print("\n".join(targets))
    print(f"device: {device_name}, torch {torch.__version__}")
    print(table(results, args.impls))
    return 0


if __name__ == "__main__":
    sys.exit(main())
