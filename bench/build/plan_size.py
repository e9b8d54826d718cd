"""What the release matrix asks for: cells, wheels, kernel programs and bindings, for README's first
command (x86_64) and for the release (both CPUs); beside the kernel programs, what the same matrix
would compile with `sass_per_major: [12, 13]` (CUDA 12's and 13's own SASS and PTX for every arch, as
before one SASS per arch: docs/build.md). Planning only: nothing is compiled.

    python bench/build/plan_size.py [--record]

Reads matrix.yaml and PyPI's torch catalog (cached for a day) as `fa build --dry-run` does. `--record`
writes the table into docs/figures.md (section `plan`); tests/ci/test_figures.py plans again (offline,
with its fixture catalog) and checks that the kernel programs, which depend only on the tree, are in
step with it.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(REPO), str(REPO / "bench")]

from figures import report  # bench/figures.py

from buildtool.builder.matrix import load_matrix
from buildtool.builder.plan import Plan, make_plan
from buildtool.builder.plan_view import plan_json
from buildtool.builder.pypi import TorchCatalog, fetch_torch_catalog
from buildtool.core.cuda_facts import SASS_FROM

# (row label, fa build's --platform): README's first command builds x86_64 only.
SCOPES = (("x86_64 (README's first command)", "x86_64"), ("x86_64 and aarch64 (the release)", None))


def plans(
    catalog: TorchCatalog, matrix: Path = REPO / "matrix.yaml", *, per_major: bool = False
) -> dict[str, Plan]:
    """The plan of each scope; `per_major`: with sass_per_major listing every major that may take it."""
    m = load_matrix(matrix)
    if per_major:
        m = dataclasses.replace(m, sass_per_major=tuple(c for c in m.cuda if c in SASS_FROM))
    return {label: make_plan(m, catalog, platform=cpu) for label, cpu in SCOPES}


def table(by_scope: dict[str, Plan], per_major: dict[str, Plan] | None = None) -> str:
    rows = [
        "| CPUs | cells | covered | wheels | kernel programs | per-major SASS | bindings |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for label, plan in by_scope.items():
        t = plan_json(plan, lambda _: False)["totals"]  # fa build --dry-run --json's own counts
        other = len(per_major[label].compile_jobs) if per_major else 0
        rows.append(
            f"| {label} | {t['cells']} | {t['covered']} | {t['wheels']} | {t['compile_jobs']} | "
            f"{other} | {t['binding_jobs']} |"
        )
    return "\n".join(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--record", action="store_true", help="write the table into docs/figures.md")
    args = ap.parse_args()
    catalog = fetch_torch_catalog()
    body = table(plans(catalog), plans(catalog, per_major=True))
    body += (
        "\n\nper-major SASS: the kernel programs with `sass_per_major: [12, 13]`, CUDA 12 and 13 compiling "
        'their own cubins and PTX for every arch (docs/build.md, "One SASS per arch").'
    )
    report("plan", body, args.record)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
