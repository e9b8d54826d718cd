"""What `fa install`'s checks and transaction cost: `fa install` replacing fa-attn 0.1.0 by 0.2.0 in a
venv, with pip and with uv side by side, and the member check (core/wheel_members.py) alone on a
wheel shaped like a release's kernel wheel (about 210 members, 3.3 MiB packed).

    python bench/install/install_time.py            # 5 installs per installer, 20 member checks; medians
    python bench/install/install_time.py --runs 9

CPU seconds are the kernel's accounting of `fa install` and every process it waited for (pip, the
imports, the guard), from wait4, so other load on the machine does not count; wall seconds do count it.
Tiny test wheels (tests/select/tiny_wheels.py) are installed, so the install figures are fa's and the
installer's overhead, not unpacking. Not a test: numbers depend on the machine.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from buildtool.compat.probe import probe
from buildtool.compat.wheel_index import entry_from_wheel
from buildtool.core import wheel_members
from tests.nested_venv import make_venv
from tests.select.fixture_index import kernel_entry
from tests.select.tiny_wheels import build_wheel, build_wheelhouse


def _env(without_uv: bool) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    uv = shutil.which("uv")
    if without_uv and uv:
        env["PATH"] = os.pathsep.join(
            p for p in env["PATH"].split(os.pathsep) if p and Path(p).resolve() != Path(uv).parent.resolve()
        )
    return env


def _timed(cmd: list[str], env: dict[str, str], cwd: Path) -> tuple[float, float]:
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return usage.ru_utime + usage.ru_stime, time.perf_counter() - t0


def installs(root: Path, runs: int) -> dict[str, list[tuple[float, float]]]:
    torch = probe().torch
    assert torch is not None, "needs torch installed"
    old = build_wheelhouse(root / "old", torch.minor, bool(torch.cxx11abi), version="0.1.0")
    new = build_wheelhouse(root / "new", torch.minor, bool(torch.cxx11abi), version="0.2.0")
    template = root / "template"
    make_venv(template, pip=False)  # sees this environment's packages, torch among them
    fa = [str(template / "bin" / "python"), "-m", "buildtool.cli", "install", "--wheels"]
    _timed([*fa, str(old)], _env(True), root)
    results: dict[str, list[tuple[float, float]]] = {"pip": [], "uv": []}
    names = [n for n in results if n == "pip" or shutil.which("uv")]
    for i in range(runs):
        for name in names:  # side by side: each run of one next to a run of the other
            venv = root / f"{name}-{i}"
            shutil.copytree(template, venv, symlinks=True)
            cmd = [str(venv / "bin" / "python"), *fa[1:], str(new)]
            results[name].append(_timed(cmd, _env(name == "pip"), root))
            shutil.rmtree(venv)
    return {k: v for k, v in results.items() if v}


def member_checks(root: Path, runs: int) -> list[float]:
    torch = probe().torch
    assert torch is not None
    entry = kernel_entry(13, torch.minor, bool(torch.cxx11abi))
    root.mkdir(parents=True)
    wheel = build_wheel(root, entry)
    rng = random.Random(0)
    # Kernel images: about 200 members of 10 to 90 KiB of bytes that deflate about 3 to 1.
    with zipfile.ZipFile(wheel) as zf:
        members = {n: zf.read(n) for n in zf.namelist() if not n.endswith("/RECORD")}
    for i in range(200):
        size = rng.randrange(10 << 10, 90 << 10)
        members[f"fa_attn/kernels/unit_{i:03d}.cubin"] = rng.randbytes(size // 3) + bytes(size - size // 3)
    from tests.select.test_install_hostile_wheels import _record  # RECORD as pip checks it

    dist_info = f"fa_attn-{entry['version']}.dist-info"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"{dist_info}/RECORD", _record(members, dist_info))
    index_entry = entry_from_wheel(wheel)
    print(f"member check on {wheel.stat().st_size / (1 << 20):.1f} MiB, {len(members) + 1} members")
    times = []
    for _ in range(runs):
        t0 = time.perf_counter()
        wheel_members.check(wheel, index_entry)
        times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="fa-bench-install-") as tmp:
        root = Path(tmp)
        checks = member_checks(root / "check", 20)
        print(
            f"  wheel_members.check: median {statistics.median(checks) * 1000:.1f} ms (min {min(checks) * 1000:.1f} ms)"
        )
        for name, runs in installs(root, args.runs).items():
            cpu = statistics.median(c for c, _ in runs)
            wall = statistics.median(w for _, w in runs)
            print(
                f"  fa install 0.1.0 -> 0.2.0 with {name}: median {cpu:.2f} s CPU, {wall:.2f} s wall ({len(runs)} runs)"
            )


if __name__ == "__main__":
    main()
