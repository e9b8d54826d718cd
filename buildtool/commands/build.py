"""`fa build`: matrix -> plan -> compile -> package -> index.

A thin shell: parse options, make the plan (build/plan.py), run it (build/pipeline.py), print. The
build pipeline is imported after the command's first line (commands.say): loading it takes a second.
Exit codes: 0 done, 1 the build failed (compiler, download, packaging), 2 bad input (matrix, options).
"""

from __future__ import annotations

import functools
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.commands import _options, say
from buildtool.errors import FaError, UsageError

if TYPE_CHECKING:
    from buildtool.builder.matrix import Matrix
    from buildtool.builder.plan import Plan

RESUME_NOTE = "(finished work is cached: re-run the same command to resume)"
LOCAL_OUT = Path("wheels") / "local"  # --local's own folder: never the release's wheels/
DEFAULT_LOCAL_CUDA = 12  # a CPU-only torch says nothing about CUDA; the newest widely driven major


def _plan(
    matrix_path: Path, local: bool, cuda: list[int], shard: str | None, platform: str | None, refresh: bool
) -> Plan:
    from buildtool.builder.matrix import load_matrix
    from buildtool.builder.plan import local_plan, parse_shard
    from buildtool.builder.plan_cache import cached_plan
    from buildtool.builder.pypi import fetch_torch_catalog
    from buildtool.builder.torch_headers import HeaderError, local_torch
    from buildtool.core import installed, kernels_src

    if local:
        matrix: Matrix | None = load_matrix(matrix_path) if matrix_path.is_file() else None
        version, _ = local_torch()
        torch_dir = installed.find_torch()
        info = installed.probe_torch(torch_dir) if torch_dir else None
        if info is None or info.cxx11abi is None:
            raise HeaderError("cannot read the installed torch's version and C++ ABI from its files")
        majors = tuple(cuda) or (info.cuda_major or DEFAULT_LOCAL_CUDA,)
        return local_plan(version, info.cxx11abi, installed.python_version(), majors, matrix)
    matrix = load_matrix(matrix_path)
    return cached_plan(
        matrix,
        fetch_torch_catalog(refresh),
        parse_shard(shard) if shard is not None else None,
        platform=platform,
        kernels_root=kernels_src.kernels_dir(),
    )


def _refuse_shrinking(plan: Plan, out: Path) -> None:
    """An all-wheel already in `out` that holds more bindings or CUDA majors than the plan's one of the
    same name (the release's, where --local would build one for this torch alone) is never replaced."""
    index = out / "index.json"
    if not plan.all_wheels or not index.is_file():
        return
    try:
        listed = json.loads(index.read_text(encoding="utf-8")).get("all_wheels", [])
        have = {(e["platform"], e["version"]): e for e in listed}
    except (OSError, ValueError, AttributeError, KeyError, TypeError):
        return  # an index fa cannot read is rewritten by the build, as before
    for spec in plan.all_wheels:
        old = have.get((spec.platform, spec.version))
        if old is None:
            continue
        more_bindings = len(old.get("bindings", ())) > len(spec.bindings)
        more_majors = len(old.get("kernel_sets", ())) > len(spec.kernel_sets)
        if more_bindings or more_majors:
            raise UsageError(
                f"{out / old['file']} holds {len(old.get('bindings', ()))} bindings and "
                f"{len(old.get('kernel_sets', ()))} CUDA majors; this build would replace it with one "
                f"holding {len(spec.bindings)} and {len(spec.kernel_sets)}: nothing built\n"
                f"  fix: build into another folder (--out {LOCAL_OUT}, --local's default)"
            )


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build(
        matrix: Annotated[Path, typer.Option("--matrix", "-m", help="the build matrix")] = Path(
            "matrix.yaml"
        ),
        out: Annotated[
            Path | None,
            typer.Option(
                "--out", "-o", help="where wheels and the index go (default wheels/; --local: wheels/local/)"
            ),
        ] = None,
        jobs: Annotated[
            int, typer.Option("--jobs", "-j", help="parallel compiles (at most one per CPU)")
        ] = os.cpu_count() or 1,
        shard: Annotated[str | None, typer.Option(help="build shard K of N, e.g. 2/4")] = None,
        platform: Annotated[
            str | None,
            typer.Option(help="only the wheels for this CPU of the matrix's platforms (x86_64, aarch64)"),
        ] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="show the plan; build nothing")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable summary on stdout")] = False,
        local: Annotated[bool, typer.Option("--local", help="only the torch installed here")] = False,
        cuda: Annotated[list[int], typer.Option(help="with --local: CUDA major(s) to build for")] = [],  # noqa: B006
        refresh: Annotated[bool, typer.Option(help="re-read PyPI's torch releases now")] = False,
        progress: Annotated[bool, typer.Option(help="progress bars on stderr")] = True,
    ) -> None:
        """Build the wheels of a matrix (or of the installed torch with --local) and index them."""
        jobs = _options.jobs(jobs)
        cuda = list(_options.cuda_majors(cuda))  # --cuda 12 --cuda 12 is one major
        out = out if out is not None else LOCAL_OUT if local else Path("wheels")
        _options.path(out, "--out")
        _options.path(matrix, "--matrix")
        if cuda and not local:
            raise UsageError("--cuda: only used with --local\n  fix: list CUDA majors in matrix.yaml `cuda:`")
        if platform is not None:
            _options.platform(platform)
        if platform and local:
            raise UsageError("--platform: --local builds for this machine's CPU\n  fix: drop one of them")
        doing = "planning" if dry_run else "planning, then building"
        what, reading = (
            ("the installed torch's wheel", "the installed torch's files")
            if local
            else (f"the wheels of {matrix}", "PyPI's torch releases")
        )
        say("build", f"{doing} {what} (loading the build pipeline, reading {reading})")
        from buildtool.builder.compile import KernelTree, is_cached, usable_workers
        from buildtool.builder.package import check_out_dir
        from buildtool.builder.pipeline import execute, summary_table, up_to_date
        from buildtool.builder.plan import parse_shard
        from buildtool.core.console import plain_console
        from buildtool.core.cpus import cxx_for, cxx_install_hint, has_cxx

        if shard is not None:
            parse_shard(shard)  # "" too: an empty --shard is not "no shard"
        if not dry_run:
            check_out_dir(out, KernelTree().root)
        if usable_workers(jobs) < jobs:  # one NVRTC process (~110 MB) per worker: no more than CPUs
            typer.echo(
                f"note: --jobs {jobs}: {usable_workers(jobs)} CPUs here, so {usable_workers(jobs)} at a time",
                err=True,
            )
            jobs = usable_workers(jobs)
        plan = _plan(matrix, local, cuda, shard, platform, refresh)
        missing = [p for p in dict.fromkeys(w.platform for w in plan.wheels if w.platform) if not has_cxx(p)]
        if missing and not dry_run:
            hints = "\n  ".join(f"fix: {cxx_install_hint(p)}" for p in missing)
            raise UsageError(
                f"no C++ compiler for the {', '.join(missing)} bindings ({', '.join(' '.join(cxx_for(p)) for p in missing)})\n  {hints}",
            )
        tree = KernelTree()
        # A folder as the last build of this plan left it holds that build's all-wheels: nothing to refuse.
        done = None if dry_run else up_to_date(plan, out, tree)
        if not dry_run and done is None:
            _refuse_shrinking(plan, out)
        if dry_run:
            from buildtool.builder import plan_view  # here: only the dry run shows the plan

            cached = functools.partial(is_cached, tree=tree)  # one tree: its units and headers read once
            if as_json:
                print(json.dumps(plan_view.plan_json(plan, cached), indent=2))
            else:
                plan_view.print_plan(plan, cached)
            return
        try:
            summary = done or execute(plan, out, jobs, tree, show_progress=progress and not as_json)
        except FaError as e:
            raise e.with_note(RESUME_NOTE) from None
        except OSError as e:  # a full disk or an unwritable --out: a failed build, in the OS's own words
            raise FaError(str(e)).with_note(RESUME_NOTE) from None
        if as_json:
            print(json.dumps(summary.to_json(), indent=2))
        else:
            console = plain_console()
            console.print(summary_table(summary))
            # Not `pip --find-links`: pip would take the highest local label among all the variants.
            console.print(
                f"install: fa install --wheels {out}   (pip and uv lines: fa doctor --wheels {out})"
            )
