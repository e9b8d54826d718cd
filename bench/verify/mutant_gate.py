"""The mutant gate's figures: how many of the project's one-line faults (tests/mutants/mutants.py) a
checkout's `fa check --emulate` catches, each run as a user runs it (a subprocess on an altered copy of
kernels/csrc), with the CPU seconds it took.

    python bench/verify/mutant_gate.py                       # this checkout, each fault's own selection
    python bench/verify/mutant_gate.py --checkout /old/clone --whole-unit   # another checkout's check, every
                                                      # problem of each fault's unit (for a before/after)

--whole-unit runs every problem of the unit (a checkout without --problem). Figures are CPU seconds of
the child processes. Exits 1 when a fault escapes."""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from tests.mutants.mutants import MUTANTS, Mutant


def run(m: Mutant, checkout: Path, whole_unit: bool, root: Path) -> tuple[bool, float]:
    """(caught, CPU seconds) of one fault."""
    csrc = root / m.name
    shutil.copytree(REPO / "kernels" / "csrc", csrc)
    text = (csrc / m.file).read_text()
    assert text.count(m.old) == 1, m.name
    (csrc / m.file).write_text(text.replace(m.old, m.new))
    argv = [sys.executable, "-m", "buildtool.cli", "check", "--emulate", "--arch", m.arch, "--unit", m.unit]
    argv += [] if whole_unit else ["--problem", m.problem]
    env = {**os.environ, "PYTHONPATH": f"{checkout}{os.pathsep}{checkout / 'kernels'}"}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [*argv, "--source", str(csrc)], check=False, capture_output=True, text=True, env=env, cwd=checkout
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if done.returncode not in (0, 1):
        raise SystemExit(f"{m.name}: fa check exited {done.returncode}: {done.stderr[-500:]}")
    return done.returncode == 1, cpu


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--checkout", type=Path, default=REPO, help="the fa checkout whose check runs")
    ap.add_argument("--whole-unit", action="store_true", help="every problem of the unit, not the selection")
    args = ap.parse_args()
    caught = 0
    total = 0.0
    with tempfile.TemporaryDirectory() as tmp:
        for m in MUTANTS:
            hit, cpu = run(m, args.checkout.resolve(), args.whole_unit, Path(tmp))
            total += cpu
            caught += hit
            print(f"{m.name:32} {'caught' if hit else 'ESCAPED':8} {cpu:6.1f} s", flush=True)
    print(f"caught {caught} of {len(MUTANTS)}; {total:.0f} CPU seconds in all")
    return 0 if caught == len(MUTANTS) else 1


if __name__ == "__main__":
    raise SystemExit(main())
