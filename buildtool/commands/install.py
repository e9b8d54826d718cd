"""`fa install`: the wheel fa doctor picks, hash-checked, installed without touching torch
(compat/install.py does the side effects)."""

from __future__ import annotations

import sys
from typing import Annotated, Any

import typer
from rich.console import Console

from buildtool.commands._shared import IndexOpt, JsonOpt, WheelsOpt, load_wheel_index, print_json
from buildtool.compat import install
from buildtool.compat.choose import Request, select
from buildtool.compat.probe import probe
from buildtool.core.console import plain_console
from buildtool.errors import EXIT_FAILED, EXIT_OK


def install_cmd(
    wheels: WheelsOpt = None,
    index: IndexOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Show the choice and the command; change nothing")
    ] = False,
    as_json: JsonOpt = False,
) -> int:
    """Install the wheel fa doctor picks for this machine, checked against the index's sha256.

    Exit codes: 0 installed (or, with --dry-run, a wheel would be), 1 nothing fits or the install was
    refused or failed (the environment is left as it was, or the message says what changed), 2 usage."""
    idx = load_wheel_index(wheels, index)
    env = probe()
    selection = select(idx.entries, env, Request())
    plan = install.plan_install(idx, selection, install.default_installer(sys.executable))
    out: dict[str, Any] = {
        "verdict": selection.verdict,
        "selected": plan.entry.file if plan.entry else None,
        "variant": plan.entry.info.variant if plan.entry else None,
        "codes": list(selection.codes),
        "source": plan.source,
        "command": plan.command(),
        "dry_run": dry_run,
        "ok": False,
        "installed": None,
        "previous": None,
        "message": "",
        "downgrade": plan.downgrade,
    }
    console = plain_console(stderr=as_json)
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
        print_json(out)
    else:
        _render_install(out, console)
    return EXIT_OK if out["ok"] else EXIT_FAILED


def _render_install(out: dict[str, Any], console: Console) -> None:
    console.print(
        f"verdict: {out['verdict']}" + (f" ({', '.join(out['codes'])})" if out["codes"] else ""),
        highlight=False,
    )
    console.print(f"wheel:   {out['selected'] or 'none'}", highlight=False)
    if out["command"]:
        console.print("command: " + " ".join(out["command"]), highlight=False)
    if out["downgrade"]:
        console.print(f"note:    {out['downgrade']}", style="yellow", highlight=False)
    style = "green" if out["ok"] else "bold red"
    console.print(out["message"], style=style, highlight=False)
