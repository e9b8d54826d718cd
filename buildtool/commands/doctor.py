"""`fa doctor`: probe -> fit -> choose, reported wheel by wheel (compat/doctor.py)."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import Annotated

import typer

from buildtool.commands import _options
from buildtool.commands._shared import IndexOpt, JsonOpt, WheelsOpt, load_wheel_index, print_json
from buildtool.compat import doctor, install_txn
from buildtool.compat.choose import DTYPES, Request
from buildtool.compat.env import Env, env_from_file
from buildtool.compat.probe import probe
from buildtool.core.console import plain_console
from buildtool.errors import UsageError


def _load_env(path: Path | None) -> Env:
    return probe() if path is None else env_from_file(path)


def doctor_cmd(
    env_file: Annotated[
        Path | None,
        typer.Option(
            "--env",
            help="Answer for the machine described in this "
            "JSON file (shape: fa probe --json) instead of this one",
        ),
    ] = None,
    wheels: WheelsOpt = None,
    index: IndexOpt = None,
    dtype: Annotated[str, typer.Option(help="fp16 | bf16 | fp32")] = "bf16",
    head_dim: Annotated[int, typer.Option("--head-dim", help="Head dimension of the call")] = 128,
    backward: Annotated[bool, typer.Option("--backward", help="The call also needs backward")] = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list the wheels built for other CPUs than this machine's")
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Which wheel fits, why the others don't, and what the runtime will do on this GPU.

    Exit codes: 0 ok/ok-jit, 1 fallback or no wheel, 2 usage."""
    _options.one_of(dtype, DTYPES, "--dtype")
    if head_dim <= 0:
        raise UsageError(f"--head-dim {head_dim}: use a positive head dimension like 128")
    if env_file is not None:
        _options.path(env_file, "--env")
    env = _load_env(env_file)
    if env_file is None:  # this machine: say if its fa-attn is being changed, or was left half-changed
        state = install_txn.unfinished(Path(sysconfig.get_path("platlib")))
        if state:
            sys.stderr.write(f"note: {state}\n")
    report = doctor.build_report(env, load_wheel_index(wheels, index), Request(dtype, head_dim, backward))
    if as_json:
        print_json(doctor.report_json(report))
    else:
        doctor.render(report, plain_console(), show_all)
    return doctor.EXIT_CODES[report.selection.verdict]


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
