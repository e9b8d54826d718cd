"""`fa check`: verify (and with --bench, time) the installed kernels on this machine's GPUs, or with
--emulate on the CPU emulator; the work is fa_attn.check's (the same as `python -m fa_attn.check`) and,
emulated, buildtool/emucheck."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated, Any

import typer

from buildtool.commands import say
from buildtool.commands._shared import JsonOpt, print_json
from buildtool.errors import FaError, UsageError


def _check_module() -> Any:
    """fa_attn.check from the installed fa-attn, else from this source checkout's kernels/ (its old path,
    which wheels built before fa_attn/verify/check.py existed also have)."""
    try:
        return importlib.import_module("fa_attn.check")
    except ImportError:
        kernels = Path(__file__).resolve().parents[2] / "kernels"
        if not (kernels / "fa_attn" / "verify" / "check.py").is_file():
            raise FaError("fa-attn is not installed here: nothing to check (fix: `fa install`)") from None
        sys.path.insert(0, str(kernels))
        return importlib.import_module("fa_attn.check")


def _plot(report: Any, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise UsageError(f"--plot {path}: needs matplotlib (pip install matplotlib)") from None
    bars = [
        (f"{u.unit} {d} {n}", r) for u in report.units for d, by in u.speed.items() for n, r in by.items()
    ]
    if not bars:
        raise UsageError(f"--plot {path}: no speed was measured; add --bench")
    fig, ax = plt.subplots(figsize=(8, max(2.0, 0.25 * len(bars))))
    ax.barh([b[0] for b in bars], [b[1] for b in bars])
    ax.axvline(1.0, color="k", lw=0.8)
    ax.set_xlabel("fa time / SDPA time (below 1: fa faster)")
    fig.tight_layout()
    fig.savefig(path)


def check_cmd(
    emulate: Annotated[
        bool, typer.Option("--emulate", help="Run the kernels on the CPU emulator (a checkout)")
    ] = False,
    arch: Annotated[str, typer.Option("--arch", help="With --emulate: the arch to build for")] = "8.0",
    unit: Annotated[
        list[str] | None, typer.Option("--unit", help="With --emulate: only units whose name has this")
    ] = None,
    problem: Annotated[
        list[str] | None,
        typer.Option("--problem", help="With --emulate: only the problems of this name (docs/checking.md)"),
    ] = None,
    source: Annotated[
        Path | None, typer.Option("--source", help="With --emulate: kernel sources (a csrc copy)")
    ] = None,
    bench: Annotated[bool, typer.Option("--bench", help="Also time fa against SDPA (GPU only)")] = False,
    plot: Annotated[Path | None, typer.Option("--plot", help="Write the speed ratios as a PNG")] = None,
    no_record: Annotated[
        bool, typer.Option("--no-record", help="Do not write a verification record")
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Verify the installed kernels on this machine's GPUs against an fp32 reference.

    Exit codes: 0 every unit passed, 1 a unit failed or no GPU, 2 bad input."""
    if not emulate and (unit or source or problem or arch != "8.0"):
        raise UsageError(
            "--arch, --unit, --problem and --source go with --emulate; drop them or add --emulate"
        )
    if emulate and bench:
        raise UsageError("--bench times a GPU; the emulator's speed means nothing: drop --bench")
    if plot is not None and not bench:
        raise UsageError(f"--plot {plot}: the plot shows speed ratios; add --bench")
    where = f"on the CPU emulator for sm {arch}" if emulate else "on this machine's GPUs"
    say("check", f"loading torch and fa_attn, then checking the kernels {where}")
    check = _check_module()
    if emulate:
        from buildtool.emucheck.run import check_emulated

        with _progress_bar() as on_unit:
            report = check_emulated(arch, tuple(unit or ()), source, on_unit, tuple(problem or ()))
    else:
        with _progress_bar() as on_unit:
            report = check.check_gpus(bench=bench, write=not no_record, on_unit=on_unit)
    if plot is not None and report.verdict not in ("no-gpu", "no-units"):
        _plot(report, plot)
    if as_json:
        print_json(report.to_json())
    else:
        _print_table(check, report)
    return int(report.exit_code)


@contextmanager
def _progress_bar() -> Iterator[Callable[[int, int, str], None]]:
    """A bar on stderr with the unit being checked, elapsed time and the time left (hidden when stderr
    is not a terminal: scripts read --json, logs need no bar)."""
    from rich.progress import MofNCompleteColumn, Progress

    from buildtool.core.console import plain_console, progress_columns

    console = plain_console(stderr=True)
    columns = progress_columns(MofNCompleteColumn())
    with Progress(*columns, console=console, disable=not console.is_terminal, transient=True) as bar:
        task = bar.add_task("units", total=None)

        def on_unit(done: int, total: int, name: str) -> None:
            bar.update(task, completed=done, total=total, description=name[:30] or "units")

        yield on_unit


def _print_table(check: Any, report: Any) -> None:
    """fa_attn.check's cells (unit_row, footer) in a rich table at 80 columns; each failure's message in
    full under the table."""
    from rich.table import Table
    from rich.text import Text

    from buildtool.core.console import plain_console

    console = plain_console()
    if report.verdict in ("no-gpu", "no-units"):
        check.render(report, console.print)
        return
    gpus = ", ".join(f"{g['index']}: {g.get('gpu', '?')}" for g in report.gpus)
    table = Table(title=Text(f"fa check: {gpus}"), title_justify="left", box=None, pad_edge=False)
    table.add_column("unit", no_wrap=True)
    table.add_column("dir", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("error/bound", justify="right", no_wrap=True)
    table.add_column("speed", justify="right", no_wrap=True)
    table.add_column("gpu", justify="right", no_wrap=True)
    for u in report.units:
        unit, direction, verdict, ratio, speed, gpu = check.unit_row(u)
        style = "green" if verdict == "pass" else "bold red"
        table.add_row(Text(unit), direction, Text(verdict, style=style), ratio, speed, gpu)
    width = min(console.width, 80)
    console.print(table, width=width)
    for u in report.units:  # each failure in full: what exceeded its bound, on which problem
        if u.error:
            console.print(Text(f"{u.unit}: {u.error}", style="red"), width=width)
    for line in check.footer(report):
        console.print(Text(line), width=width)


def register(app: typer.Typer) -> None:
    app.command("check")(check_cmd)
