"""How true the build's time left is: README's first command, cold, read off its own progress bars.

    python bench/build/eta_truth.py --baseline main [--jobs 2] [--record]

Each side (the baseline commit, checked out in a temporary worktree, and this checkout) runs `fa build
--matrix matrix.yaml --platform x86_64` with an empty compile cache (the network's parts fetched before,
shared) on a pseudo-terminal, as a person sees it, in turns. Every redraw of the bars is read with the
time it arrived. For the kernels bar (and the bindings bar), each "eta" it showed after the first tenth
of its items is compared with the time that was really left until its last item: the worst relative
error is the figure (issue 37 asks for at most 30%); in the last 5 seconds the grain is a compile or
two and the error is not counted.

Prints a table and writes JSON outside the tree (default: under the user's cache); `--record` writes
the table into docs/figures.md (section eta-truth). Not a test: it needs minutes and the figures
depend on the machine.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import select
import subprocess
import sys
import time
from pathlib import Path

# bench/build/first_command.py: the two sides, an empty cache sharing the network's parts
from first_command import _cold_cache, _prefetch, sides

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from figures import cache_out, record

_ANSI = re.compile(rb"\x1b\[[0-9;?]*[A-Za-z]")
# A bar as rich draws it: "kernels  ━━━  12/317 0:00:09 eta 02:31"
_BAR = re.compile(rb"(kernels|bindings)\s+\S*?\s*(\d+)/(\d+)\s+[\d:]+\s+eta\s+(?:(\d+):)?(\d+):(\d+)")
GRAIN_S = 5.0


def _watch(checkout: Path, cache: Path, out: Path, platform: str, jobs: int) -> dict:
    """One cold build on a pseudo-terminal: (seconds since start, bar, done, total, eta seconds) for
    every redraw, and the build's wall time."""
    master, slave = os.openpty()
    env = {
        **os.environ,
        "FA_CACHE": str(cache),
        "PYTHONPATH": str(checkout),
        "COLUMNS": "120",
        "TERM": "xterm-256color",
    }
    env.pop("CI", None)  # rich draws no live bars for CI
    cmd = [sys.executable, "-m", "buildtool.cli", "build", "--matrix", str(checkout / "matrix.yaml")]
    cmd += ["--platform", platform, "--out", str(out), "--jobs", str(jobs)]
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=checkout, env=env, stdin=subprocess.DEVNULL, stdout=slave, stderr=slave)
    os.close(slave)
    points: list[tuple[float, str, int, int, int]] = []
    pending = b""
    while True:
        ready, _, _ = select.select([master], [], [], 1.0)
        if ready:
            try:
                chunk = os.read(master, 65536)
            except OSError:  # the terminal closed: the build is over
                break
            if not chunk:
                break
            now = time.monotonic() - t0
            pending += _ANSI.sub(b"", chunk)
            *lines, pending = re.split(rb"[\r\n]", pending)
            for line in lines:
                m = _BAR.search(line)
                if m:
                    bar, done, total, hours, minutes, seconds = m.groups()
                    eta = int(hours or 0) * 3600 + int(minutes) * 60 + int(seconds)
                    points.append((now, bar.decode(), int(done), int(total), eta))
        elif proc.poll() is not None:
            break
    os.close(master)
    code = proc.wait()
    if code != 0:
        raise SystemExit(f"fa build in {checkout} exited {code}")
    return {"wall_s": round(time.monotonic() - t0, 1), "points": points}


def _errors(points: list, bar: str) -> dict:
    """The bar's worst error after its first tenth of items, when it ended, and its eta against the
    truth as a tenth, a fifth and half of its items were done."""
    mine = [p for p in points if p[1] == bar]
    if not mine:
        return {}
    total = mine[0][3]
    end = min((t for t, _, done, _, _ in mine if done == total), default=mine[-1][0])
    counted = [
        (t, done, eta, end - t)
        for t, _, done, _, eta in mine
        if total / 10 <= done < total and end - t > GRAIN_S
    ]
    worst = max(counted, key=lambda c: abs(c[2] - c[3]) / c[3], default=None)
    out: dict = {"total": total, "end_s": round(end, 1), "worst_error": 0.0, "worst_at": None}
    if worst is not None:
        out["worst_error"] = round(abs(worst[2] - worst[3]) / worst[3], 3)
        out["worst_at"] = {"done": worst[1], "eta_s": worst[2], "truth_s": round(worst[3], 1)}
    for share in (10, 20, 50):
        first = next((c for c in counted if c[1] >= total * share / 100), None)
        out[f"{share}%"] = {"eta_s": first[2], "truth_s": round(first[3], 1)} if first else None
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--baseline", required=True, help="the git commit to compare with (e.g. main)")
    ap.add_argument("--platform", default="x86_64")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--json", type=Path, default=None, help="where to write results (default: the cache)")
    ap.add_argument("--record", action="store_true", help="write the table into docs/figures.md")
    args = ap.parse_args()
    result: dict = {"baseline_ref": args.baseline, "platform": args.platform, "jobs": args.jobs}
    with sides(args.baseline, "fa-bench-eta-") as (work, checkouts):
        shared = work / "net"
        _prefetch(shared, args.platform)
        for name, checkout in checkouts.items():
            tag = name.replace(" ", "-")
            run = _watch(
                checkout,
                _cold_cache(work / f"cache-{tag}", shared),
                work / f"out-{tag}",
                args.platform,
                args.jobs,
            )
            result[name] = {
                "points": run["points"],  # (s since start, bar, done, total, eta s) per redraw
                "wall_s": run["wall_s"],
                **{bar: _errors(run["points"], bar) for bar in ("kernels", "bindings")},
            }
            result[name]["load_1min"] = round(os.getloadavg()[0], 1)
            print(
                f"{name}: {run['wall_s']} s, kernels' worst error {result[name]['kernels'].get('worst_error')}",
                file=sys.stderr,
            )
    out = args.json or cache_out("eta-truth.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2))
    text = _markdown(result)
    print(text)
    print(f"(JSON: {out})", file=sys.stderr)
    if args.record:
        record("eta-truth", text)
    return 0


def _cell(sample: dict | None) -> str:
    return f"{sample['eta_s']} / {sample['truth_s']}" if sample else "-"


def _markdown(r: dict) -> str:
    rows = []
    for name in ("baseline", "this checkout"):
        for bar in ("kernels", "bindings"):
            e = r[name][bar]
            if not e:
                continue
            rows.append(
                f"| {name} | {bar} ({e['total']}) | {e['end_s']} | {_cell(e.get('10%'))} | {_cell(e.get('20%'))} | "
                f"{_cell(e.get('50%'))} | {round(100 * e['worst_error'])}% |"
            )
    return "\n".join(
        [
            (
                f"`fa build --matrix matrix.yaml --platform {r['platform']} --jobs {r['jobs']}` with an empty compile cache "
                f"(network parts fetched before) on a pseudo-terminal, baseline `{r['baseline_ref']}` and this checkout in "
                "turns. Each bar's eta against the time really left until its last item, in seconds, when a tenth, a "
                "fifth and half of its items were done; the worst error over every redraw after the first tenth (not "
                f"counting the last {GRAIN_S:.0f} s)."
            ),
            "",
            "| code | bar (items) | done after, s | eta / truth at 10% | at 20% | at 50% | worst error |",
            "| --- | --- | --- | --- | --- | --- | --- |",
            *rows,
            "",
            (
                f"Load average (1 min) after each build: {r['baseline']['load_1min']}, {r['this checkout']['load_1min']} "
                f"on {os.cpu_count()} CPUs."
            ),
        ]
    )


if __name__ == "__main__":
    raise SystemExit(main())
