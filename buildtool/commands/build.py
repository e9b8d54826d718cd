"""`fa build` (matrix -> plan -> wheels + index) and `fa index` (re-index a wheel directory).

A thin shell: parse options, make the plan (buildtool.plan), run it (buildtool.build), print.
Exit codes: 0 done, 1 the build failed (compiler, download, packaging), 2 bad input (matrix, options).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.text import Text

from buildtool import index, plan_view, probe
from buildtool.binding import BindingError
from buildtool.build import execute, summary_table
from buildtool.compile import CompileError, KernelTree, is_cached
from buildtool.fetch import FetchError
from buildtool.matrix import Matrix, MatrixError, load_matrix
from buildtool.package import PackageError
from buildtool.plan import Plan, local_plan, make_plan, parse_shard
from buildtool.platform_tag import PlatformTagError
from buildtool.pypi import CatalogError, fetch_torch_catalog
from buildtool.toolkits import ToolkitError
from buildtool.torch_headers import HeaderError, local_torch

# OSError last: a full disk or an unwritable --out is a failed build with the OS's own words.
BUILD_FAILURES = (
    CompileError,
    BindingError,
    ToolkitError,
    HeaderError,
    FetchError,
    PackageError,
    PlatformTagError,
    CatalogError,
    OSError,
)
DEFAULT_LOCAL_CUDA = 12  # a CPU-only torch says nothing about CUDA; the newest widely driven major


def _fail(code: int, message: str) -> typer.Exit:
    # Text, not markup: compiler logs are full of [brackets].
    Console(stderr=True).print(Text("fa build: ", style="bold red") + Text(message), highlight=False)
    return typer.Exit(code)


def _plan(matrix_path: Path, local: bool, cuda: list[int], shard: str | None, refresh: bool) -> Plan:
    if local:
        matrix: Matrix | None = load_matrix(matrix_path) if matrix_path.is_file() else None
        version, _ = local_torch()
        torch_dir = probe.find_torch()
        info = probe.probe_torch(torch_dir) if torch_dir else None
        if info is None or info.cxx11abi is None:
            raise HeaderError("cannot read the installed torch's version and C++ ABI from its files")
        majors = tuple(cuda) or (info.cuda_major or DEFAULT_LOCAL_CUDA,)
        return local_plan(version, info.cxx11abi, probe.python_version(), majors, matrix)
    matrix = load_matrix(matrix_path)
    return make_plan(matrix, fetch_torch_catalog(refresh), parse_shard(shard) if shard else None)


def register(app: typer.Typer) -> None:
    @app.command("build")
    def build(
        matrix: Annotated[Path, typer.Option("--matrix", "-m", help="the build matrix")] = Path(
            "matrix.yaml"
        ),
        out: Annotated[Path, typer.Option("--out", "-o", help="where wheels and the index go")] = Path(
            "wheels"
        ),
        jobs: Annotated[int, typer.Option("--jobs", "-j", help="parallel compiles")] = os.cpu_count() or 1,
        shard: Annotated[str | None, typer.Option(help="build shard K of N, e.g. 2/4")] = None,
        dry_run: Annotated[bool, typer.Option("--dry-run", help="show the plan; build nothing")] = False,
        as_json: Annotated[bool, typer.Option("--json", help="machine-readable summary on stdout")] = False,
        local: Annotated[bool, typer.Option("--local", help="only the torch installed here")] = False,
        cuda: Annotated[list[int], typer.Option(help="with --local: CUDA major(s) to build for")] = [],  # noqa: B006
        refresh: Annotated[bool, typer.Option(help="re-read PyPI's torch releases now")] = False,
        progress: Annotated[bool, typer.Option(help="progress bars on stderr")] = True,
    ) -> None:
        """Build the wheels of a matrix (or of the installed torch with --local) and index them."""
        if jobs < 1:
            raise _fail(2, f"--jobs: {jobs} is not a positive number\n  fix: pass --jobs 1 or more")
        if cuda and not local:
            raise _fail(2, "--cuda: only used with --local\n  fix: list CUDA majors in matrix.yaml `cuda:`")
        try:
            plan = _plan(matrix, local, cuda, shard, refresh)
        except MatrixError as e:
            raise _fail(2, str(e)) from None
        except (CatalogError, HeaderError) as e:
            raise _fail(1, str(e)) from None
        if dry_run:
            if as_json:
                print(json.dumps(plan_view.plan_json(plan, is_cached), indent=2))
            else:
                plan_view.print_plan(plan, is_cached)
            return
        try:
            summary = execute(plan, out, jobs, KernelTree(), show_progress=progress and not as_json)
        except BUILD_FAILURES as e:
            raise _fail(1, f"{e}\n(finished work is cached: re-run the same command to resume)") from None
        if as_json:
            print(json.dumps(summary.to_json(), indent=2))
        else:
            console = Console()
            console.print(summary_table(summary))
            console.print(
                f"install: pip install --find-links {out} fa-attn   (index: {out / 'index.json'})",
                highlight=False,
                markup=False,
            )

    @app.command("index")
    def index_cmd(
        directory: Annotated[Path, typer.Argument(help="a directory of fa-attn wheels (e.g. merged shards)")],
    ) -> None:
        """Rewrite DIRECTORY/index.json and DIRECTORY/simple/ from the wheels in it."""
        if not directory.is_dir():
            raise _fail(2, f"{directory}: not a directory\n  fix: pass the folder holding the .whl files")
        try:
            data = index.write_index(directory)
        except index.WheelDirError as e:
            raise _fail(1, str(e)) from None
        Console().print(f"indexed {len(data['wheels'])} wheels in {directory}")
