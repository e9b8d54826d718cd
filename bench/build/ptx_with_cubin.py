"""Is the PTX a cubin compile gives the PTX fa ships? For every PTX program of a matrix that the build
takes from its cubin's compile (buildtool/builder/compile.py pair_ptx_with_cubins), compile it both
ways, for compute_XX alone and for sm_XX keeping the PTX, and compare the bytes.

    python bench/build/ptx_with_cubin.py [--matrix matrix.yaml] [--platform x86_64]

Prints one line per CUDA major (programs compared, identical) and exits 1 if any pair differs, naming
it. It compiles twice per pair (about 0.5 s each): minutes for the release matrix. Not a test.
"""

from __future__ import annotations

import argparse
import collections
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))

from buildtool.builder import toolkits
from buildtool.builder.compile import KernelTree, pair_ptx_with_cubins, resolve
from buildtool.builder.matrix import load_matrix
from buildtool.builder.nvrtc import open_nvrtc
from buildtool.builder.plan import make_plan
from buildtool.builder.pypi import fetch_torch_catalog


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--matrix", type=Path, default=REPO / "matrix.yaml")
    ap.add_argument("--platform", default="x86_64")
    args = ap.parse_args()
    plan = make_plan(load_matrix(args.matrix), fetch_torch_catalog(), platform=args.platform)
    tree = KernelTree()
    tasks = {job: resolve(job, tree) for job in plan.compile_jobs}
    compared: collections.Counter[int] = collections.Counter()
    differing: list[str] = []
    for ptx_job, cubin_job in sorted(pair_ptx_with_cubins(tasks).items(), key=lambda p: str(p[0])):
        ptx, cubin = tasks[ptx_job], tasks[cubin_job]
        nvrtc = open_nvrtc(str(toolkits.nvrtc_lib_dir(ptx.cuda_major)))
        alone = nvrtc.compile(ptx.source, ptx.source_name, ptx.target, list(ptx.options), dict(ptx.headers))
        kept = nvrtc.compile(
            cubin.source,
            cubin.source_name,
            cubin.target,
            list(cubin.options),
            dict(cubin.headers),
            with_ptx=True,
        )
        compared[ptx.cuda_major] += 1
        if kept.ptx != alone.image:
            differing.append(f"CUDA {ptx.cuda_major} {ptx.unit} {ptx.target}")
    for major, n in sorted(compared.items()):
        same = n - sum(d.startswith(f"CUDA {major} ") for d in differing)
        print(f"CUDA {major}: {n} PTX programs compared, {same} identical")
    for d in differing:
        print(f"differs: {d}")
    return 1 if differing else 0


if __name__ == "__main__":
    raise SystemExit(main())
