"""The GPU window's three commands (tests/gpu/kit.py), each as its dry run: the same steps, logs,
limits, bundling and summary as on the GPU, with the CPU emulator and CPU stand-ins for the device.
What comes back must fit the device tool (at most 8 files) and hold each command's results."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import tiles

REPO = Path(__file__).resolve().parents[2]
KIT = REPO / "tests" / "gpu" / "kit.py"
needs_cxx = pytest.mark.skipif(shutil.which("g++") is None, reason="the kernel emulator needs g++")


def _kit(command: str, out: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], dict[str, str]]:
    done = subprocess.run(
        [sys.executable, str(KIT), command, "--dry-run", "--out", str(out), *extra],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    table = done.stdout[done.stdout.index("\nstep ") :].splitlines()[2:]
    rcs = {ln.split()[0]: ln.split()[1] for ln in table if ln and not ln.startswith("total ")}
    return done, rcs


def _files(out: Path) -> set[str]:
    names = {p.name for p in out.iterdir()}
    assert len(names) <= 8, names
    return names


def _logs(out: Path) -> set[str]:
    with tarfile.open(out / "logs.tar.gz") as tar:
        return {m.name for m in tar.getmembers()}


@needs_cxx
def test_verify(tmp_path: Path) -> None:
    done, rcs = _kit("verify", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert rcs["wheel-h100"] in ("0", "dry")
    assert rcs["wheel-turing"] in ("0", "dry")
    assert rcs["explain"] == ("0" if rcs["wheel-h100"] == "0" else "dry")
    assert rcs == {
        "nvidia-smi": rcs["nvidia-smi"],  # "dry" here, 0 where a driver is installed
        "wheel-h100": rcs["wheel-h100"],  # "dry" without .carry/, 0 with wheels built from this checkout
        "wheel-turing": rcs["wheel-turing"],
        "torch": "0",
        "smoke": "0",
        "smoke-turing": "0",
        "explain": rcs["explain"],  # "dry" without a carried wheel, 0: its runtime up to explain()
        "sweep": "0",
        "turing": "0",
    }
    assert _files(tmp_path) == {"kit.log", "logs.tar.gz", "smoke.json", "smoke_turing.json", "sweep.txt"}
    smoke = json.loads((tmp_path / "smoke.json").read_text())
    assert smoke["counts"] == {"ok": 4}
    assert smoke["arch"] == "9.0"
    turing = json.loads((tmp_path / "smoke_turing.json").read_text())
    assert {(c["image"], c["arch"]) for c in turing["cases"]} <= {
        ("ptx", "7.5"),
        ("sass", "7.5"),
    }  # the 7.5 code
    assert "tests collected" in (tmp_path / "sweep.txt").read_text()
    assert {"logs/smoke.log", "logs/sweep.log", "logs/explain.log"} <= _logs(tmp_path)
    assert (tmp_path / "kit.log").read_text().endswith(done.stdout[done.stdout.index("\nstep ") + 1 :])


@needs_cxx
def test_tune(tmp_path: Path) -> None:
    done, rcs = _kit("tune", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert rcs["autotune"] == "0"
    assert (
        {"kit.log", "logs.tar.gz", "autotune.json"}
        <= _files(tmp_path)
        <= {
            "kit.log",
            "logs.tar.gz",
            "autotune.json",
            "tiles.patch",
        }
    )
    result = json.loads((tmp_path / "autotune.json").read_text())
    assert result["dry_run"]
    # The default gates and times; the other candidate's verdict depends on the emulator's speed (a
    # candidate 1.5x slower than the default at the first shape is "slow"), which a busy machine sways.
    default, other = result["candidates"]
    assert default["verdict"] == "ok"
    assert other["verdict"] in {"ok", "slow"}
    (winner,) = result["winners"]
    assert winner["key"] == "fwd_bf16_d64"
    assert winner["default"] == tiles.default_tile("9.0", "fwd", 64).label


def test_bench(tmp_path: Path) -> None:
    done, rcs = _kit("bench", tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert rcs["attention"] == "0"
    assert rcs["sanitize"] == "dry"
    assert rcs["ncu-fwd_bf16_d128"] == "dry"
    assert rcs["ncu-bwd_bf16_d128"] == "dry"
    if any(name.startswith("launch-") for name in rcs):  # the emulator's launches need g++
        assert rcs["launch-fwd_fp16_d64"] == "0"
        assert rcs["launch-bwd_fp16_d64"] == "0"
    names = _files(tmp_path)
    assert {"kit.log", "logs.tar.gz", "attention.jsonl"} <= names
    assert len((tmp_path / "attention.jsonl").read_text().splitlines()) == 1 + 2 * 2 * 3  # header, rows
    assert "--launch-skip 3 --launch-count 3" in (tmp_path / "kit.log").read_text()


def test_steps_and_a_stray_file(tmp_path: Path) -> None:
    (tmp_path / "left-over.bin").write_bytes(b"x")  # a file a step left in $OUT: into the tarball
    done, rcs = _kit("bench", tmp_path, "--steps", "sanitize")
    assert done.returncode == 0
    assert rcs["sanitize"] == "dry"
    assert set(rcs) <= {
        "wheel-h100",
        "sanitize",
    }  # the wheel step runs (or is shown) for the steps needing it
    assert _files(tmp_path) == {"kit.log", "logs.tar.gz"}
    assert "logs/out-left-over.bin" in _logs(tmp_path)


def test_out_that_cannot_be_written(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("")
    done = subprocess.run(
        [sys.executable, str(KIT), "bench", "--dry-run", "--out", str(blocker / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "cannot write OUT" in done.stderr


pytestmark = pytest.mark.timeout(900)
