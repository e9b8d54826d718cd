"""Tile autotuning on the GPU machine: every candidate tile kernels/tiles.py offers for the live GPU,
compiled, pruned, checked and timed; the winner per (arch, dtype, head-dim bucket, direction) as JSON
and as a patch to kernels/tiles.py that a person reviews and applies.

    python bench/kernels/autotune.py --out $OUT --images .carry/autotune --budget-s 400   # on the GPU
    python bench/kernels/autotune.py --dry-run --out /tmp/t --head-dims 64 --dtypes fp16 --max-candidates 3
    python bench/kernels/autotune.py --patch-from autotune.json --out DIR    # winners and patch from saved results

1. Candidates: tiles.candidates(arch, direction, head_dim) for every bucket, dtype and direction, head
   dims 128, 64, 256 first (the benchmark's), bf16 before fp16; shared memory is pruned there.
2. Compile and prune: NVRTC with -Xptxas=-v (bench/kernels/tile_compile.py); a candidate that spills registers
   is dropped. --images takes cubins compiled beforehand (tile_compile.py, into .carry/) when their
   arch and source hash match this checkout; the rest compile here with --nvrtc-lib or the NVRTC that
   torch's CUDA build installed.
3. Correctness gate: two small problems (odd lengths, GQA, causal and not) against the fp32 reference
   (tests/gpu/unit_check.py, FA2's rule), in restartable workers (tests/gpu/workers.py): a candidate
   that faults costs its own verdict, not the run.
4. Timing: the survivors at the benchmark shapes (16k tokens, hidden 2048, seqlen 1k..8k for head dims
   64/128/256 and 2k/8k for the others, causal and not), launched straight through the driver API,
   median of CUDA-event timings. A candidate 1.5x slower than the default at the first shape is not
   timed further ("slow").
5. Winners: the lowest geometric mean of time relative to the default over the shapes; one must beat
   the default by 3% to replace it. tiles.py has one table per arch family and direction (not per
   dtype), so the patch takes, per bucket, the tile with the best mean over both dtypes.

--budget-s stops starting candidates after that many seconds (compiles included), records the rest as
"skipped" and says how to go on (--resume). --dry-run runs the same flow here: the CPU emulator for the
gate, the emulator's wall clock at a tiny shape as a stand-in timer (numbers mean nothing), NVRTC for
the spill pruning when one is unpacked here (else every candidate goes on).

Outputs in --out: autotune.json (every candidate's fate, the winners, what was skipped) and, when a
winner differs from today's table, tiles.patch (`git apply tiles.patch`), checked by loading the
patched tiles.py.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
for _p in (HERE, REPO / "bench", REPO / "tests" / "gpu", REPO / "tests" / "emu", REPO / "kernels", REPO):
    if str(_p) not in sys.path:
        sys.path.insert(0, str(_p))

import figures
import tile_compile
import tiles  # kernels/ is on sys.path above
from tile_compile import Candidate

PRIORITY_DIMS = (128, 64, 256)  # the benchmark's head dims: tuned first, at every seqlen
TOKENS, HIDDEN = 16 * 1024, 2048  # bench/kernels/attention.py's shapes
MIN_GAIN = 0.03  # a winner must be this much faster than the default to replace it
SLOW = 1.5  # slower than the default by this at the first shape: not timed further
RESULTS, PATCH = "autotune.json", "tiles.patch"


DECODE_BATCH = 8  # the split-KV forward is timed at decode: one query row per sequence
SM_COUNT_DRY = 132  # an H100's multiprocessors, for the dry run's split counts


@dataclasses.dataclass(frozen=True)
class TimedShape:
    batch: int
    seqlen_q: int
    seqlen_k: int
    heads: int
    causal: bool


def timing_shapes(direction: str, head_dim: int, dry_run: bool) -> list[TimedShape]:
    """Where a candidate is timed, the largest first (the early-out compares there): the benchmark's
    shapes (16k tokens, hidden 2048), or decode shapes for the split-KV forward."""
    heads = max(1, HIDDEN // head_dim)
    if direction == "splitkv":
        if dry_run:
            return [TimedShape(1, 1, 300, 2, False)]
        lengths = (16384, 4096) if head_dim in PRIORITY_DIMS else (8192,)
        return [TimedShape(DECODE_BATCH, 1, s, heads, False) for s in lengths]
    if dry_run:
        return [TimedShape(1, 96, 96, 2, False)]
    seqlens = (8192, 4096, 2048, 1024) if head_dim in PRIORITY_DIMS else (8192, 2048)
    return [TimedShape(max(1, TOKENS // s), s, s, heads, causal) for causal in (False, True) for s in seqlens]


def gate_cases(c: Candidate) -> list[Any]:
    """The two small problems every candidate must pass: odd lengths across block edges, GQA."""
    import torch
    from attn_reference import Case

    dtype = torch.bfloat16 if c.dtype == "bf16" else torch.float16
    return [
        Case(2, 77, 130, 4, 2, c.head_dim, True, dtype, seed=11),
        Case(1, 257, 200, 2, 1, c.head_dim, False, dtype, seed=12),
    ]


# ---- the worker: gate and time one candidate ----------------------------------------------------------------
class CandidateRunner:
    def __init__(self, images: Path | None, dry_run: bool) -> None:
        self.images = images
        self.dry_run = dry_run
        self.first_ms: dict[str, float] = {}  # key -> the default's time at the first shape
        self.inputs: dict[tuple, dict[str, Any]] = {}
        self.sm_count: int | None = None

    def runner(self, c: Candidate) -> Any:
        import unit_check
        from kernel_launch import UnitLaunch

        if self.dry_run:
            return unit_check.EmulatedUnit(c.unit(), c.arch)
        assert self.images is not None
        return unit_check.GpuUnit(self.images / c.file, UnitLaunch.of(c.unit()), c.id)

    def run(self, c: Candidate) -> dict:
        import unit_check

        t0 = time.perf_counter()
        out: dict[str, Any] = {"id": c.id}
        try:
            runner = self.runner(c)
            gates = [
                unit_check.summary(unit_check.measure(runner, c.direction, case)) for case in gate_cases(c)
            ]
            out["gate"] = gates
            bad = [g for g in gates if g["verdict"] != "ok"]
            if bad:
                out.update(verdict="wrong", message=bad[0]["message"])
                return out
            out["resources"] = runner.resources()
            out["timings"] = []
            for shape in timing_shapes(c.direction, c.head_dim, self.dry_run):
                ms = self.time(runner, c, shape)
                out["timings"].append({**dataclasses.asdict(shape), "ms": round(ms, 5)})
                if len(out["timings"]) == 1:
                    if c.default:
                        self.first_ms[c.key] = ms
                    elif c.key in self.first_ms and ms > SLOW * self.first_ms[c.key]:
                        out.update(
                            verdict="slow", message=f"{ms / self.first_ms[c.key]:.2f}x the default's time"
                        )
                        return out
            out["verdict"] = "ok"
        except Exception as e:  # noqa: BLE001 - every failure becomes this candidate's verdict
            out.update(verdict=unit_check.verdict_of(e), message=unit_check.describe(e))
        finally:
            out["seconds"] = round(time.perf_counter() - t0, 2)
        return out

    def time(self, runner: Any, c: Candidate, shape: TimedShape) -> float:
        """Median milliseconds of one launch of every entry of the unit (the binding's launch_all)."""
        import statistics

        import attention
        import kernel_launch as kl

        tensors = self._inputs(c, shape, runner.device)
        call = kl.Call(tensors["q"], tensors["k"], tensors["v"], causal=shape.causal)
        if self.dry_run:
            lib = runner.lib
            with lib.arena():
                prep = self._prepare(lib, lib.launches, c, call, tensors)
                ts = attention.time_ms(
                    lambda: kl.launch_all(lib, lib.launches, prep.params), 0, 2, cuda=False
                )
        else:
            prep = self._prepare(runner.dev, runner.launch, c, call, tensors)
            ts = attention.time_ms(
                lambda: kl.launch_all(runner.dev, runner.launch, prep.params), 2, 7, cuda=True
            )
            runner.dev.module.drv.synchronize()
        return statistics.median(ts)

    def _prepare(self, dev: Any, launch: Any, c: Candidate, call: Any, t: dict[str, Any]) -> Any:
        import kernel_launch as kl

        if c.direction == "fwd":
            return kl.prepare_forward(dev, call)
        if c.direction == "splitkv":
            return kl.prepare_forward_splitkv(dev, launch, call, self.splits(c, call))
        return kl.prepare_backward(dev, launch, call, t["out"], t["lse"], t["dout"])

    def splits(self, c: Candidate, call: Any) -> int:
        """The runtime's split count for this call and tile (fa_attn/runtime/decision.py num_splits)."""
        from buildtool.core.runtime import decision

        if self.sm_count is None:
            import torch

            self.sm_count = (
                SM_COUNT_DRY if self.dry_run else torch.cuda.get_device_properties(0).multi_processor_count
            )
        b, sq, h, _ = call.q.shape
        tile = c.tile()
        return decision.num_splits(b, h, sq, call.k.shape[1], tile.block_m, tile.block_n, self.sm_count)

    def _inputs(self, c: Candidate, shape: TimedShape, device: str) -> dict[str, Any]:
        """Random inputs for a shape (kept for the next candidate of the key), and for the backward
        the reference's out and lse, computed in fp32 head by head."""
        import torch

        key = (c.dtype, c.head_dim, shape, c.direction)
        if key not in self.inputs:
            self.inputs = {k: v for k, v in self.inputs.items() if k[:2] == key[:2]}  # free other keys'
            dtype = torch.bfloat16 if c.dtype == "bf16" else torch.float16
            gen = torch.Generator(device=device).manual_seed(shape.seqlen_k + shape.causal)

            def rand(rows: int) -> Any:
                size = (shape.batch, rows, shape.heads, c.head_dim)
                return torch.randn(size, generator=gen, device=device).to(dtype)

            q, k, v, dout = (
                rand(shape.seqlen_q),
                rand(shape.seqlen_k),
                rand(shape.seqlen_k),
                rand(shape.seqlen_q),
            )
            t = {"q": q, "k": k, "v": v, "dout": dout}
            if c.direction == "bwd":
                from attn_reference import out_lse_by_heads

                t["out"], t["lse"] = out_lse_by_heads(q, k, v, shape.causal)
            self.inputs[key] = t
        return self.inputs[key]


def worker_main(args: argparse.Namespace) -> int:
    import workers

    cands = [Candidate(**c) for c in json.loads(Path(args.cands).read_text())]
    runner = CandidateRunner(Path(args.images) if args.images else None, args.dry_run)
    return workers.serve(len(cands), args.start, lambda i: runner.run(cands[i]))


# ---- winners -------------------------------------------------------------------------------------------------
def _geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs))


def _ms(r: dict) -> dict[tuple, float]:
    return {
        (t["batch"], t["seqlen_q"], t["seqlen_k"], t["heads"], t["causal"]): t["ms"]
        for t in r.get("timings", [])
    }


def relative_scores(results: list[dict]) -> dict[str, dict[str, float]]:
    """key -> label -> geometric mean over the shapes of time / the default's time (1.0: the default).
    Only candidates timed at every shape the default was, and keys whose default was timed."""
    out: dict[str, dict[str, float]] = {}
    for key in dict.fromkeys(r["key"] for r in results):
        rows = [r for r in results if r["key"] == key and r.get("verdict") == "ok"]
        default = next((r for r in rows if r["default"]), None)
        if default is None:
            continue
        base = _ms(default)
        scores = {}
        for r in rows:
            ms = _ms(r)
            if base and set(base) <= set(ms):
                scores[r["label"]] = _geomean([ms[s] / base[s] for s in base])
        out[key] = scores
    return out


def winners(results: list[dict]) -> list[dict]:
    """Per key: the default, the best candidate and its speedup, and the choice (the best when it
    beats the default by MIN_GAIN)."""
    scores = relative_scores(results)
    out = []
    for key in dict.fromkeys(r["key"] for r in results):
        rows = [r for r in results if r["key"] == key]
        first = rows[0]
        default = next(r for r in rows if r["default"])
        counts: dict[str, int] = {}
        for r in rows:
            counts[r.get("verdict", "?")] = counts.get(r.get("verdict", "?"), 0) + 1
        entry = {
            "key": key,
            "arch": first["arch"],
            "dtype": first["dtype"],
            "head_dim": first["head_dim"],
            "direction": first["direction"],
            "default": default["label"],
            "verdicts": counts,
            "complete": not counts.get("skipped") and not counts.get("not-run"),
        }
        s = scores.get(key)
        if not s:
            entry.update(best=None, choice=default["label"], speedup=None, note="the default was not timed")
        else:
            best = min(s, key=lambda label: s[label])
            chosen = best if s[best] <= 1 - MIN_GAIN else default["label"]
            entry.update(best=best, speedup=round(1 / s[best], 3), choice=chosen)
            entry["fields"] = next(r["fields"] for r in rows if r["label"] == chosen)
        out.append(entry)
    return out


def table_changes(results: list[dict], family_of: Any) -> tuple[dict, list[dict]]:
    """tiles.py's tables are per (family, direction, bucket), not per dtype: per bucket, the tile with
    the lowest mean score over the dtypes timed (each must have timed it). Returns (changes for
    tile_patch, one row per bucket saying what was chosen and why)."""
    scores = relative_scores(results)
    groups: dict[tuple[str, str, int], list[str]] = {}
    for r in results:
        groups.setdefault((r["arch"], r["direction"], r["head_dim"]), [])
        if r["key"] not in groups[(r["arch"], r["direction"], r["head_dim"])]:
            groups[(r["arch"], r["direction"], r["head_dim"])].append(r["key"])
    changes: dict[tuple[str, str], dict[int, Any]] = {}
    rows = []
    for (arch, direction, d), keys in groups.items():
        timed = [k for k in keys if scores.get(k)]
        if not timed:
            continue
        common = set.intersection(*(set(scores[k]) for k in timed))
        mean = {label: _geomean([scores[k][label] for k in timed]) for label in common}
        best = min(mean, key=lambda label: mean[label])
        default = next(r["label"] for r in results if r["key"] == timed[0] and r["default"])
        chosen = best if mean[best] <= 1 - MIN_GAIN else default
        row = {
            "arch": arch,
            "family": family_of(arch),
            "direction": direction,
            "head_dim": d,
            "keys": timed,
            "default": default,
            "choice": chosen,
            "speedup": round(1 / mean[chosen], 3),
        }
        per_dtype = {k: min(scores[k], key=scores[k].__getitem__) for k in timed}
        if len(set(per_dtype.values())) > 1:
            row["note"] = "dtypes disagree: " + ", ".join(f"{k} best {v}" for k, v in per_dtype.items())
        rows.append(row)
        if chosen != default:
            cand = next(r for r in results if r["key"] == timed[0] and r["label"] == chosen)
            tile = _candidate(cand).tile()
            changes.setdefault((family_of(arch), direction), {})[d] = tile
    return changes, rows


_CANDIDATE_FIELDS = [f.name for f in dataclasses.fields(Candidate)]


def _candidate(record: dict) -> Candidate:
    """A Candidate back from a JSON record (index.json, autotune.json) that holds its fields."""
    return Candidate(**{f: record[f] for f in _CANDIDATE_FIELDS})


def write_outputs(payload: dict, out_dir: Path) -> None:
    """autotune.json, the winners table on stdout, and tiles.patch when a table entry changes."""
    import tile_patch

    results = payload["candidates"]
    payload["winners"] = winners(results)
    changes, table = table_changes(results, lambda arch: tiles.arch_family(arch).name)
    payload["table"] = table
    patch = ""
    try:
        patch = tile_patch.make_patch(changes)
        payload["patch"] = PATCH if patch else None
    except tile_patch.PatchError as e:
        payload["patch"] = None
        payload["patch_error"] = str(e)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / RESULTS).write_text(json.dumps(payload, indent=1) + "\n")
    if patch:
        (out_dir / PATCH).write_text(patch)
    print(f"\n{'key':16} {'default':12} {'best':12} {'speedup':>7}  verdicts")
    for w in payload["winners"]:
        speed = f"{w['speedup']:6.2f}x" if w["speedup"] else f"{'-':>7}"
        verdicts = ", ".join(f"{n} {v}" for v, n in sorted(w["verdicts"].items()))
        print(f"{w['key']:16} {w['default']:12} {w['best'] or '-':12} {speed}  {verdicts}")
    print(f"\n{'table (tiles.py)':28} {'default':12} {'choice':12} {'speedup':>7}")
    for row in table:
        name = f"{row['family']} {row['direction']} d{row['head_dim']}"
        print(
            f"{name:28} {row['default']:12} {row['choice']:12} {row['speedup']:6.2f}x  {row.get('note', '')}"
        )
    print(f"wrote {out_dir / RESULTS}" + (f" and {out_dir / PATCH} (git apply {PATCH})" if patch else ""))
    if payload.get("patch_error"):
        print(f"no patch: {payload['patch_error']}; apply the table above by hand")
    if payload.get("skipped"):
        print(
            f"skipped {len(payload['skipped'])} candidates for lack of time ({', '.join(sorted(set(payload['skipped_keys'])))}); "
            f"to go on: the same command with --resume {RESULTS} (copied from this run's output)"
        )


# ---- the run -------------------------------------------------------------------------------------------------
def live_arch() -> tuple[str, str] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    major, minor = torch.cuda.get_device_capability(0)
    return f"{major}.{minor}", torch.cuda.get_device_name(0)


def prepare_images(
    cands: list[Candidate], args: argparse.Namespace, scratch: Path
) -> tuple[Path | None, dict[str, dict], str]:
    """(the cubin dir, id -> compile outcome, how) for the candidates. Cubins from --images where its
    index matches this arch and checkout; the rest compiled here."""
    from buildtool.core.kernels_src import IMAGE_SOURCES, source_hash

    compiled: dict[str, dict] = {}
    image_dir: Path | None = None
    how = []
    if args.images and (args.images / tile_compile.INDEX).is_file():
        index = tile_compile.read_index(args.images)
        ours = source_hash(REPO / "kernels", IMAGE_SOURCES)
        if index.get("image_source_sha256") != ours or index.get("arch") != cands[0].arch:
            how.append(
                f"--images {args.images} ignored: built for sm {index.get('arch')} from sources "
                f"{str(index.get('image_source_sha256'))[:12]}, this is sm {cands[0].arch} at {ours[:12]}"
            )
        else:
            image_dir = tile_compile.cubin_dir(args.images, scratch.parent / "carried")
            compiled = {_candidate(c).id: c["compiled"] for c in index["candidates"]}
            how.append(f"{len(compiled)} candidates from --images {args.images} (NVRTC {index.get('nvrtc')})")
    todo = [c for c in cands if c.id not in compiled]
    if todo:
        lib = args.nvrtc_lib or tile_compile.find_nvrtc()
        if lib is None and args.dry_run:
            try:
                from buildtool.builder import toolkits

                lib = toolkits.nvrtc_lib_dir(13) if toolkits.is_unpacked(13) else None
            except ImportError:
                lib = None
        if lib is None:
            if not args.dry_run:
                raise SystemExit(
                    "autotune: no NVRTC to compile with (pass --nvrtc-lib, or --images from tile_compile.py)"
                )
            how.append(f"{len(todo)} candidates not compiled (dry run, no NVRTC here): no spill pruning")
            compiled.update({c.id: {"verdict": "kept", "registers": {}, "spill_bytes": 0} for c in todo})
        else:
            if image_dir is not None and image_dir != scratch:  # keep --images read-only: link its cubins
                for c in cands:
                    if c.id in compiled and (image_dir / c.file).is_file():
                        (scratch / c.file).parent.mkdir(parents=True, exist_ok=True)
                        (scratch / c.file).symlink_to((image_dir / c.file).resolve())
            image_dir = scratch
            done = tile_compile.compile_all(todo, Path(lib), scratch, args.workers)
            compiled.update({k: dataclasses.asdict(v) for k, v in done.items()})
            how.append(f"{len(todo)} candidates compiled here with {lib}")
    return image_dir, compiled, "; ".join(how)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--out",
        type=Path,
        help="where autotune.json and tiles.patch go (default $OUT, else the user's cache: bench/autotune)",
    )
    ap.add_argument(
        "--images", type=Path, help="cubins from bench/kernels/tile_compile.py (e.g. .carry/autotune)"
    )
    ap.add_argument("--nvrtc-lib", type=Path, help="an NVRTC lib dir for the compiles made here")
    ap.add_argument(
        "--dtypes",
        nargs="+",
        default=["bf16"],
        choices=("bf16", "fp16"),
        help="tiles.py's tables are per family, not per dtype: bf16 alone decides (default)",
    )
    ap.add_argument(
        "--head-dims", type=int, nargs="+", help="buckets, in order (default 128 64 256, then the rest)"
    )
    ap.add_argument("--directions", nargs="+", default=list(tiles.DIRECTIONS), choices=tiles.DIRECTIONS)
    ap.add_argument(
        "--max-candidates", type=int, help="at most this many candidates per key (the default first)"
    )
    ap.add_argument("--budget-s", type=float, default=400, help="start no candidate after this (default 400)")
    ap.add_argument("--item-timeout", type=float, help="seconds one candidate may take (60; dry run 600)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1, help="parallel compiles")
    ap.add_argument("--resume", type=Path, help="an earlier autotune.json: keep its results, run the rest")
    ap.add_argument(
        "--patch-from", type=Path, help="only recompute winners and the patch from this autotune.json"
    )
    ap.add_argument("--dry-run", action="store_true", help="the CPU emulator stands in for the GPU")
    ap.add_argument("--arch", default="9.0", help="the arch the dry run emulates")
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--cands", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.worker:
        return worker_main(args)
    out_dir = args.out or Path(os.environ.get("OUT") or figures.cache_out("autotune"))  # never the checkout
    if args.patch_from:
        payload = json.loads(args.patch_from.read_text())
        write_outputs(payload, out_dir)
        return 0
    t0 = time.monotonic()
    deadline = t0 + args.budget_s
    if args.dry_run:
        arch, device = args.arch, f"CPU emulator (tests/emu) as sm {args.arch}"
    else:
        live = live_arch()
        if live is None:
            print("autotune: torch sees no CUDA GPU (use --dry-run here)", file=sys.stderr)
            return 2
        arch, device = live
    dims = args.head_dims or [*PRIORITY_DIMS, *(d for d in tiles.HEAD_DIM_BUCKETS if d not in PRIORITY_DIMS)]
    cands = tile_compile.candidates(arch, args.dtypes, dims, args.directions)
    if args.max_candidates:
        per_key: dict[str, int] = {}
        kept = []
        for c in cands:
            per_key[c.key] = per_key.get(c.key, 0) + 1
            if per_key[c.key] <= args.max_candidates:
                kept.append(c)
        cands = kept
    earlier: dict[str, dict] = {}
    if args.resume:
        earlier = {
            r["id"]: r
            for r in json.loads(args.resume.read_text())["candidates"]
            if r.get("verdict") != "skipped"
        }
    print(
        f"autotune: {device}, sm {arch}; {len(cands)} candidates ({len(earlier)} from --resume); budget {args.budget_s:.0f}s"
    )
    if not cands:
        print("autotune: no candidate (tiles.candidates() offered none for these arguments)")
        return 1

    import workers

    with tempfile.TemporaryDirectory(prefix="fa-autotune-") as tmp:
        scratch = Path(tmp)
        todo = [c for c in cands if c.id not in earlier]
        image_dir, compiled, how = prepare_images(todo, args, scratch / "images") if todo else (None, {}, "")
        print(f"autotune: {how}" if how else "autotune: nothing to compile", flush=True)
        runnable = [c for c in todo if compiled.get(c.id, {}).get("verdict") == "kept"]
        cand_file = scratch / "candidates.json"
        cand_file.write_text(json.dumps([dataclasses.asdict(c) for c in runnable]))
        mode = ["--dry-run"] if args.dry_run else ["--images", str(image_dir)]
        spec = workers.python_worker(
            [str(Path(__file__).resolve()), "--worker", "--cands", str(cand_file), *mode],
            item_timeout=args.item_timeout or (600.0 if args.dry_run else 60.0),
            start_timeout=300.0,
        )
        print(
            f"{'candidate':32} {'verdict':10} {'gate err/bound':>14} {'first ms':>9} {'s':>5}  message",
            flush=True,
        )

        def report(i: int, r: dict) -> None:
            gate = max((g["ratio"] for g in r.get("gate", [])), default=None)
            first = r["timings"][0]["ms"] if r.get("timings") else None
            print(
                f"{runnable[i].id:32} {r['verdict']:10} {gate if gate is not None else '-':>14.4} "
                f"{first if first is not None else '-':>9.4} {r.get('seconds', 0):5.1f}  {r.get('message', '')[:120]}",
                flush=True,
            )

        raw = workers.run_items(
            len(runnable),
            spec,
            lambda i, verdict, msg: {"id": runnable[i].id, "verdict": verdict, "message": msg},
            report,
            deadline=deadline,
        )
    results_by_id = {r["id"]: r for r in raw}
    candidates_out = []
    skipped = []
    for c in cands:
        if c.id in earlier:
            candidates_out.append(earlier[c.id])
            continue
        row = {**dataclasses.asdict(c), "id": c.id, "key": c.key, "compiled": compiled.get(c.id)}
        comp = compiled.get(c.id, {}).get("verdict")
        if comp != "kept":
            row["verdict"] = comp or "not-compiled"
        else:
            row.update({k: v for k, v in results_by_id[c.id].items() if k != "id"})
        if row["verdict"] == "skipped":
            skipped.append(c.id)
        candidates_out.append(row)
    payload = {
        "device": device,
        "arch": arch,
        "dry_run": args.dry_run,
        "how": how,
        "budget_s": args.budget_s,
        "wall_s": round(time.monotonic() - t0, 1),
        "min_gain": MIN_GAIN,
        "candidates": candidates_out,
        "skipped": skipped,
        "skipped_keys": sorted({r["key"] for r in candidates_out if r["id"] in skipped}),
    }
    write_outputs(payload, out_dir)
    return 0


if __name__ == "__main__":
    sys.exit(main())
