"""`fa probe`, `fa doctor`, `fa install`: thin shells over probe -> rules -> select -> install."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console

from buildtool import doctor, install
from buildtool.probe import Env, EnvError, env_from_json, env_to_json, probe
from buildtool.select import DTYPES, Request, select
from buildtool.wheel_index import WheelIndex, WheelIndexError, load_index

WheelsOpt = Annotated[
    Path | None,
    typer.Option(
        "--wheels", help="Directory of wheels (index.json or the wheels themselves). Default: ./wheels"
    ),
]
IndexOpt = Annotated[
    str | None,
    typer.Option("--index", help="http(s) or file URL of a directory holding index.json and the wheels"),
]
JsonOpt = Annotated[bool, typer.Option("--json", help="Machine-readable output on stdout")]


def _usage(message: str) -> NoReturn:
    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {message}", highlight=False)
    raise typer.Exit(doctor.EXIT_USAGE)


def _print_json(data: Any) -> None:
    sys.stdout.write(json.dumps(data, indent=2) + "\n")


def _load_env(path: Path | None) -> Env:
    if path is None:
        return probe()
    try:
        data = json.loads(path.read_text())
    except OSError as exc:
        _usage(f"--env {path}: cannot read it ({exc.strerror})")
    except json.JSONDecodeError as exc:
        _usage(
            f"--env {path}: not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg}); "
            "write it like `fa probe --json` does"
        )
    if isinstance(data, dict) and "os" not in data and isinstance(data.get("env"), dict):
        data = data["env"]  # a case of the test corpus (tests/select/envs): the env plus its expectations
    try:
        return env_from_json(data)
    except EnvError as exc:
        _usage(f"--env {path}: {exc}")


def _load_index(wheels: Path | None, index: str | None) -> WheelIndex:
    if wheels is not None and index is not None:
        _usage("--wheels and --index both given; pass one")
    try:
        return load_index(index if index is not None else str(wheels or Path("wheels")))
    except WheelIndexError as exc:
        _usage(str(exc))


def probe_cmd(as_json: JsonOpt = False) -> None:
    """Describe this machine (OS, Python, torch, driver, GPUs) without importing torch."""
    env = probe()
    if as_json:
        _print_json(env_to_json(env))
        return
    console = Console()
    data = env_to_json(env)
    for key in ("os", "arch", "glibc", "python"):
        console.print(f"{key:8} {data[key]}")
    console.print(f"{'torch':8} {json.dumps(data['torch'])}")
    console.print(f"{'driver':8} {env.driver or 'none'}")
    for i, gpu in enumerate(env.gpus):
        console.print(f"{'gpu ' + str(i):8} {gpu.name}, sm {gpu.sm}, {gpu.memory_mib} MiB")
    if not env.gpus:
        console.print(f"{'gpus':8} none")


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
    as_json: JsonOpt = False,
) -> None:
    """Which wheel fits, why the others don't, and what the runtime will do on this GPU.

    Exit codes: 0 ok/ok-jit, 1 fallback or no wheel, 2 usage."""
    if dtype not in DTYPES:
        _usage(f"--dtype {dtype}: use one of {', '.join(DTYPES)}")
    if head_dim <= 0:
        _usage(f"--head-dim {head_dim}: use a positive head dimension like 128")
    env = _load_env(env_file)
    report = doctor.build_report(env, _load_index(wheels, index), Request(dtype, head_dim, backward))
    if as_json:
        _print_json(doctor.report_json(report))
    else:
        doctor.render(report, Console())
    raise typer.Exit(doctor.EXIT_CODES[report.selection.verdict])


def install_cmd(
    wheels: WheelsOpt = None,
    index: IndexOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the choice and the command; change nothing")
    ] = False,
    as_json: JsonOpt = False,
) -> None:
    """Install the wheel fa doctor picks for this machine, checked against the index's sha256.

    Exit codes: 0 installed (or, with --dry-run, a wheel would be), 1 nothing fits or the install was
    refused or failed (the environment is left as it was, or the message says what changed), 2 usage."""
    idx = _load_index(wheels, index)
    env = probe()
    selection = select(idx.entries, env, Request())
    try:
        plan = install.plan_install(idx, selection, install.default_installer(sys.executable))
    except install.InstallError as exc:
        _usage(str(exc))
    out: dict[str, Any] = {
        "verdict": selection.verdict,
        "selected": plan.entry.file if plan.entry else None,
        "variant": plan.entry.variant if plan.entry else None,
        "codes": list(selection.codes),
        "source": plan.source,
        "command": plan.command(),
        "dry_run": dry_run,
        "ok": False,
        "installed": None,
        "previous": None,
        "message": "",
    }
    console = Console(stderr=as_json)
    if plan.entry is None:
        out["message"] = "no wheel fits this machine; run fa doctor to see why"
    elif dry_run:
        out["ok"] = True
        out["message"] = (
            f"dry run: nothing installed (a real run installs a copy of {plan.source} "
            "after checking its sha256 against the index)"
        )
    else:
        try:
            result = install.run_install(
                plan, idx, log=lambda line: console.print(line, style="dim", highlight=False)
            )
            out.update(
                ok=True,
                installed=result.installed,
                previous=result.previous,
                message=f"installed fa-attn {result.installed} ({result.location})",
            )
        except install.InstallError as exc:
            out["message"] = str(exc)
    if as_json:
        _print_json(out)
    else:
        _render_install(out, console)
    raise typer.Exit(0 if out["ok"] else 1)


def _render_install(out: dict[str, Any], console: Console) -> None:
    console.print(
        f"verdict: {out['verdict']}" + (f" ({', '.join(out['codes'])})" if out["codes"] else ""),
        highlight=False,
    )
    console.print(f"wheel:   {out['selected'] or 'none'}", highlight=False)
    if out["command"]:
        console.print("command: " + " ".join(out["command"]), highlight=False)
    style = "green" if out["ok"] else "bold red"
    console.print(out["message"], style=style, highlight=False)


def register(app: typer.Typer) -> None:
    app.command("probe")(probe_cmd)
    app.command("doctor")(doctor_cmd)
    app.command("install")(install_cmd)
