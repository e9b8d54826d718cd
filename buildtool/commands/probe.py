"""`fa probe`: describe this machine (compat/probe.py), for people or as JSON.

`run` needs no CLI framework: cli.main calls it straight for `fa probe [--json]`, which scripts call
and which must stay fast (bench/install/probe_time.py: under 0.1 s of CPU). `register` adds it to typer's app
for `--help` and the other spellings; only then is typer imported. (No `from __future__ import
annotations` here: the command's annotations are evaluated where typer is imported, in register.)"""

import json
import sys
from typing import TYPE_CHECKING

from buildtool.compat.env import env_to_json
from buildtool.compat.probe import probe

if TYPE_CHECKING:
    import typer  # only for the annotation: `fa probe` runs without loading typer


def run(as_json: bool) -> int:
    env = probe()
    data = env_to_json(env)
    if as_json:
        sys.stdout.write(json.dumps(data, indent=2) + "\n")
        return 0
    lines = [f"{key:8} {data[key]}" for key in ("os", "arch", "glibc", "python")]
    lines.append(f"{'torch':8} {json.dumps(data['torch'])}")
    lines.append(f"{'driver':8} {env.driver or 'none'}")
    lines += [f"{'gpu ' + str(i):8} {g.name}, sm {g.sm}, {g.memory_mib} MiB" for i, g in enumerate(env.gpus)]
    if not env.gpus:
        lines.append(f"{'gpus':8} none")
    sys.stdout.write("\n".join(lines) + "\n")
    return 0


def register(app: "typer.Typer") -> None:
    from buildtool.commands._shared import JsonOpt

    @app.command("probe")
    def probe_cmd(as_json: JsonOpt = False) -> int:
        """Describe this machine (OS, Python, torch, driver, GPUs) without importing torch."""
        return run(as_json)
