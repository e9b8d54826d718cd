"""`fa probe`: describe this machine (compat/probe.py), for people or as JSON."""

from __future__ import annotations

import json

from buildtool.commands._shared import JsonOpt, print_json
from buildtool.compat.env import env_to_json
from buildtool.compat.probe import probe
from buildtool.core.console import plain_console


def probe_cmd(as_json: JsonOpt = False) -> None:
    """Describe this machine (OS, Python, torch, driver, GPUs) without importing torch."""
    env = probe()
    if as_json:
        print_json(env_to_json(env))
        return
    console = plain_console()
    data = env_to_json(env)
    for key in ("os", "arch", "glibc", "python"):
        console.print(f"{key:8} {data[key]}")
    console.print(f"{'torch':8} {json.dumps(data['torch'])}")
    console.print(f"{'driver':8} {env.driver or 'none'}")
    for i, gpu in enumerate(env.gpus):
        console.print(f"{'gpu ' + str(i):8} {gpu.name}, sm {gpu.sm}, {gpu.memory_mib} MiB")
    if not env.gpus:
        console.print(f"{'gpus':8} none")
