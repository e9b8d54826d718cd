"""The binding's shared launch logic (kernels/binding/launch.cpp) compiled with g++ beside a small
driver (launch_probe.cpp) and run here, without torch or a GPU: the backward refuses an LSE that is
not on q's device, and the grid's (batch, head) fold agrees with the one the emulator and GPU tests
launch with (tests/gpu/kernel_launch.py), whose kernels tests/emu runs on a folded grid."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parents[1] / "kernels"
sys.path.insert(0, str(HERE.parent / "gpu"))

import kernel_launch

pytestmark = pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")


@pytest.fixture(scope="module")
def probe(tmp_path_factory: pytest.TempPathFactory):
    """ask(*commands) -> one answer per command, from one run of the probe; the driver it loads is
    tests/runtime/fake_libcuda.c built as libcuda.so.1."""
    out = tmp_path_factory.mktemp("probe")
    exe = out / "launch_probe"
    fake = ["gcc", "-shared", "-fPIC", "-Wl,-soname,libcuda.so.1", str(HERE / "fake_libcuda.c")]
    subprocess.run([*fake, "-o", str(out / "libcuda.so.1")], check=True, capture_output=True, text=True)
    binding = KERNELS / "binding"
    sources = [HERE / "launch_probe.cpp", binding / "launch.cpp", binding / "cuda_driver.cpp"]
    cmd = ["g++", "-std=c++17", "-O1", "-rdynamic", f"-I{binding}", f"-I{KERNELS / 'csrc'}"]
    cmd += [*map(str, sources), "-ldl", "-o", str(exe)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    env = {**os.environ, "LD_LIBRARY_PATH": str(out)}

    def ask(*lines: str) -> list[str]:
        stdin = "\n".join(lines) + "\n"
        done = subprocess.run([str(exe)], input=stdin, capture_output=True, text=True, check=True, env=env)
        return done.stdout.splitlines()

    return ask


def test_lse_on_another_device_is_refused(probe) -> None:
    on_cpu, on_gpu1, on_q_device = probe("lse 0 0 0", "lse 1 1 0", "lse 1 0 0")
    assert on_cpu == (
        "error fa_attn: softmax_lse is on cpu, q on cuda:0; pass the LSE the forward returned for these tensors"
    )
    assert on_gpu1.startswith("error fa_attn: softmax_lse is on cuda:1, q on cuda:0")
    assert on_q_device == "ok"


CASES = [
    (3, 4, 65535),
    (65535, 65535, 65535),
    (70000, 2, 65535),
    (1, 200000, 65535),
    (2, 4, 3),
    (5, 3, 4),
    (4, 1, 2),
]


def test_batch_heads_fold_as_the_emulated_launches_do(probe) -> None:
    answers = probe(*(f"fold {b} {h} {limit}" for b, h, limit in CASES))
    for (batch, heads, limit), line in zip(CASES, answers, strict=True):
        y, z = kernel_launch.fold_batch_heads(batch, heads, limit)
        assert line == f"ok {y} {z}", (batch, heads, limit)
        assert y <= limit
        assert z <= limit
        if batch <= limit and heads <= limit:
            assert (y, z) == (batch, heads)  # unfolded: blockIdx.y is the batch, z the head
        else:
            assert 0 <= y * z - batch * heads < z  # every pair has a block; fewer than a row idle


def test_more_pairs_than_a_grid_holds_is_a_clear_error(probe) -> None:
    (line,) = probe("fold 65536 65536 65535")
    assert line.startswith("error fa_attn: batch 65536 x heads 65536 = 4294967296 (batch, head) pairs exceed")
    with pytest.raises(kernel_launch.LaunchError, match="pairs exceed"):
        kernel_launch.fold_batch_heads(65536, 65536, 65535)


def test_graph_capture_never_loads_kernels(probe, tmp_path: Path) -> None:
    """launch_all on a capturing stream: refused before any load while the module is not loaded; an
    eager call with no (batch, head) pair (what fa_attn/runtime/preload.py issues) loads module and functions
    and launches nothing; the captured call then launches without loading anything."""
    module = tmp_path / "unit.cubin"
    module.write_bytes(b"a cubin")  # the fake driver does not read it
    answers = probe(*(f"launch {c} {b} {module}" for c, b in ((1, 1), (0, 0), (1, 3))))
    first_in_capture, preload, captured = answers
    assert first_in_capture.startswith(
        f"error fa_attn: the first launch of {module} in this process is inside"
    )
    assert first_in_capture.endswith("| loads 0 functions 0 launches 0")
    assert preload == "ok | loads 1 functions 1 launches 0"
    assert captured == "ok | loads 1 functions 1 launches 1"


def test_a_kernel_whose_shared_memory_does_not_fit_is_refused_with_both_numbers(
    probe, tmp_path: Path
) -> None:
    """The loaded function's own static shared memory (cuFuncGetAttribute: what the driver's JIT gave a
    PTX kernel) plus the launch's dynamic part, against the GPU's opt-in limit per block
    (cuDeviceGetAttribute): a 99 KiB tile with ptxas's 1 KiB on a 99 KiB part is refused before launch,
    naming both, where it used to reach cuLaunchKernel. One process per case: functions are cached."""
    module = tmp_path / "unit.ptx"
    module.write_bytes(b"a ptx")
    (fits,) = probe(f"smem 1024 101376 100352 {module}")
    assert fits == "ok | loads 1 functions 1 launches 1"
    (refused,) = probe(f"smem 1024 101376 101376 {module}")
    assert refused.startswith(
        "error fa_attn: fa_fwd needs 102400 bytes of shared memory per block (1024 static + 101376 dynamic); "
        "this GPU offers 101376."
    )
    assert refused.endswith("| loads 1 functions 1 launches 0")
