"""`fa doctor`: probe -> fit -> choose, reported wheel by wheel (compat/doctor.py). The probe and the
doctor's rules are imported after the command's first line (commands.say)."""

from __future__ import annotations

import sys
import sysconfig
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from buildtool.commands import _options, say
from buildtool.commands._shared import IndexOpt, JsonOpt, WheelsOpt, load_wheel_index, print_json
from buildtool.errors import EXIT_OK, UsageError

if TYPE_CHECKING:
    from buildtool.compat import doctor
    from buildtool.compat.env import Env

_MATRIX_MAX_BYTES = 1 << 20  # a matrix.yaml is a few KB


def _load_env(path: Path | None) -> Env:
    from buildtool.compat.env import env_from_file
    from buildtool.compat.probe import probe

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
    dtype: Annotated[
        str | None, typer.Option(help="fp16 | bf16 | fp32 (default: answer for fp16 and for bf16)")
    ] = None,
    head_dim: Annotated[int, typer.Option("--head-dim", help="Head dimension of the call")] = 128,
    backward: Annotated[bool, typer.Option("--backward", help="The call also needs backward")] = False,
    show_all: Annotated[
        bool, typer.Option("--all", help="Also list the wheels built for other CPUs than this machine's")
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Which wheel fits, why the others don't, and what the runtime will do on this GPU.

    Exit codes: 0 ok/ok-jit, or any answer for a machine without an NVIDIA GPU; 1 fallback or no wheel
    on a machine with one; 2 usage."""
    if head_dim <= 0:
        raise UsageError(f"--head-dim {head_dim}: use a positive head dimension like 128")
    if env_file is not None:
        _options.path(env_file, "--env")
    machine = "this machine (driver, GPUs, torch)" if env_file is None else f"the machine in {env_file}"
    where = index if index is not None else wheels or Path("wheels")
    say("doctor", f"probing {machine} and reading the wheels in {where}")
    from buildtool.compat import doctor, install_txn
    from buildtool.compat.choose import DTYPES, Request
    from buildtool.core.console import plain_console

    if dtype is not None:
        _options.one_of(dtype, DTYPES, "--dtype")
    env = _load_env(env_file)
    if env_file is None:  # this machine: say if its fa-attn is being changed, or was left half-changed
        state = install_txn.unfinished(Path(sysconfig.get_path("platlib")))
        if state:
            sys.stderr.write(f"note: {state}\n")
    # Without --dtype: fa install's choice (made for bf16, Request's default) answered for fp16 and bf16.
    request = Request(head_dim=head_dim, backward=backward)
    if dtype is not None:
        request = Request(dtype, head_dim, backward)
    report = doctor.build_report(
        env,
        load_wheel_index(wheels, index),
        request,
        doctor.BOTH_DTYPES if dtype is None else (dtype,),
        matrix_platforms(wheels, index),
    )
    if as_json:
        print_json(doctor.report_json(report))
    else:
        doctor.render(report, plain_console(), show_all)
    return exit_code(report)


def exit_code(report: doctor.DoctorReport) -> int:
    """The verdict's exit code (doctor.EXIT_CODES), but 0 for a machine without an NVIDIA GPU: its answer
    (every call falls back, `no-gpu`) is what was asked, not a failure, and there is nothing in the
    wheels to fix, so README's `fa build ... && fa doctor` ends in success where the build did. A GPU
    machine where nothing runs still gets 1; the verdict itself (text and --json) is unchanged."""
    from buildtool.compat import doctor

    if any(reason.code == "no-gpu" for reason in report.selection.stack):
        return EXIT_OK
    return doctor.EXIT_CODES[report.answer.verdict]


def matrix_platforms(wheels: Path | None, index: str | None) -> list[str] | None:
    """The platforms of the matrix.yaml a local wheel folder was built from, when one is found (the
    folder's parent's, else the current folder's, as README's `fa build --matrix matrix.yaml` leaves
    them); None for an --index URL or when there is none. Only read, for a fix to name the build's
    --platform; a matrix that does not parse counts as none (fa build reports its errors)."""
    import yaml

    if index is not None:
        return None
    folder = (wheels or Path("wheels")).resolve()
    for candidate in (folder.parent / "matrix.yaml", Path.cwd() / "matrix.yaml"):
        try:
            if not candidate.is_file() or candidate.stat().st_size > _MATRIX_MAX_BYTES:
                continue
            data = yaml.safe_load(candidate.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, yaml.YAMLError):
            continue
        found = data.get("platforms") if isinstance(data, dict) else None
        if isinstance(found, list) and all(isinstance(p, str) for p in found):
            return found
    return None


def register(app: typer.Typer) -> None:
    app.command("doctor")(doctor_cmd)
