"""Items run one after another in a worker process that is replaced when it fails: the isolation the
smoke test and the autotuner need on a GPU, where one CUDA error poisons the process's context.

The parent (`run_items`) starts a worker (`serve`, in a new process) at an item; the worker reports
each item's result as one JSON line. After an item whose result says "cuda-error" the worker exits and
the parent starts a new one at the next item; a worker that dies mid-item (crash) or answers nothing
for `item_timeout` seconds (hang, killed with its process group) is replaced the same way. So every
item gets exactly one result, whatever the kernels do. CUDA_LAUNCH_BLOCKING=1 in the worker's
environment makes an error surface at the launch that caused it.
"""

from __future__ import annotations

import json
import os
import queue
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import IO, Any

RESTART = "cuda-error"  # the result verdict after which a worker must not go on
RESTART_EXIT = 3  # the worker's exit status after such an item


@dataclass
class WorkerSpec:
    argv: list[str]  # the worker's command line; "--start N" is appended
    env: dict[str, str]
    item_timeout: float  # seconds one item may take
    start_timeout: float  # seconds a worker may take to get ready (imports, CUDA init, builds)


def python_worker(argv: list[str], item_timeout: float, start_timeout: float) -> WorkerSpec:
    """A worker that runs `python argv...` (a script and its worker options) in this environment plus
    CUDA_LAUNCH_BLOCKING=1, so an error surfaces at the launch that caused it, and unbuffered output."""
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", PYTHONUNBUFFERED="1")
    return WorkerSpec([sys.executable, *argv], env, item_timeout, start_timeout)


# ---- the worker side ------------------------------------------------------------------------------------
def serve(
    n_items: int, start: int, run_item: Callable[[int], dict], ready: Callable[[], None] | None = None
) -> int:
    """Run items start..n_items-1, one JSON line per event on the original stdout (anything else the
    process prints goes to stderr). Returns the worker's exit status."""
    proto = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)

    def send(**event: Any) -> None:
        proto.write(json.dumps(event) + "\n")

    if ready is not None:
        ready()
    send(event="ready")
    for i in range(start, n_items):
        send(event="start", index=i)
        result = run_item(i)
        send(event="done", index=i, result=result)
        if result.get("verdict") == RESTART:
            return RESTART_EXIT  # the context is lost: the parent starts a new worker at the next item
    send(event="end")
    return 0


# ---- the parent side --------------------------------------------------------------------------------------
Failed = Callable[[int, str, str], dict]  # (item, verdict, message) -> that item's result


def run_items(
    n_items: int,
    spec: WorkerSpec,
    failed: Failed,
    report: Callable[[int, dict], None],
    log: IO[str] | None = None,
    deadline: float | None = None,
) -> list[dict]:
    """Every item's result, in order. `failed` builds the result of an item the worker could not
    finish (crash, hang), that never ran (not-run, when no worker can start at all) or that the
    `deadline` (time.monotonic()) left no time for (skipped); `report` sees each result as it arrives;
    the workers' stderr goes to `log` (default: this process's stderr)."""
    results: dict[int, dict] = {}
    log = log or sys.stderr
    start = 0
    while start < n_items:
        stop: tuple[str, str] | None = None
        if deadline is not None and time.monotonic() >= deadline:
            stop = ("skipped", "no time left (budget)")
        else:
            with tempfile.TemporaryFile("w+") as err:
                start, stop = _one_worker(n_items, spec, start, err, results, failed, report, deadline)
                err.seek(0)
                text = err.read()
            if text.strip():
                log.write("a worker's stderr:\n" + "".join(f"  | {ln}\n" for ln in text.splitlines()))
                log.flush()
        if stop is not None:
            for i in range(n_items):
                if i not in results:
                    results[i] = failed(i, *stop)
                    report(i, results[i])
            break
    return [results[i] for i in range(n_items)]


def _one_worker(
    n_items: int,
    spec: WorkerSpec,
    start: int,
    err: IO[str],
    results: dict[int, dict],
    failed: Failed,
    report: Callable[[int, dict], None],
    deadline: float | None,
) -> tuple[int, tuple[str, str] | None]:
    """One worker from item `start` until it ends, fails, hangs or runs out of time: (the next item to
    run, and (verdict, message) for every item left when no worker can go on: not-run, skipped)."""
    proc = subprocess.Popen(
        [*spec.argv, "--start", str(start)],
        stdout=subprocess.PIPE,
        stderr=err,
        env=spec.env,
        text=True,
        start_new_session=True,  # its own process group: a hung worker is killed with its children
    )
    assert proc.stdout is not None
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_read_lines, args=(proc.stdout, lines), daemon=True).start()
    current: int | None = None
    ready = False
    since = time.monotonic()
    while True:
        limit = spec.item_timeout if ready else spec.start_timeout
        wait = limit - (time.monotonic() - since)
        if deadline is not None and deadline - time.monotonic() < wait:
            wait = deadline - time.monotonic()
        try:
            line = lines.get(timeout=max(0.1, wait))
        except queue.Empty:
            _kill(proc)
            if deadline is not None and time.monotonic() >= deadline:
                return start, ("skipped", "no time left (budget): stopped")
            if not ready:
                return start, ("not-run", f"the worker did not get ready in {spec.start_timeout:.0f}s")
            i = current if current is not None else next(j for j in range(start, n_items) if j not in results)
            results[i] = failed(i, "hang", f"no answer in {spec.item_timeout:.0f}s: killed")
            report(i, results[i])
            return i + 1, None
        if line is None:  # the worker exited
            rc = proc.wait()
            err.seek(0)
            tail = " | ".join([ln for ln in err.read().splitlines() if ln.strip()][-3:])
            if not ready:
                return start, ("not-run", f"the worker exited with {rc} before its first item: {tail}")
            nxt = next((j for j in range(start, n_items) if j not in results), n_items)
            if current is None and rc == RESTART_EXIT:
                return nxt, None  # it stopped after a CUDA error, as it should
            victim = current if current is not None else nxt  # dying between items counts for the next
            if victim >= n_items:
                return n_items, None
            results[victim] = failed(victim, "crash", f"worker exited with {rc}: {tail}")
            report(victim, results[victim])
            return victim + 1, None
        event = json.loads(line)
        since = time.monotonic()
        kind = event["event"]
        if kind == "ready":
            ready = True
        elif kind == "start":
            current = event["index"]
        elif kind == "done":
            results[event["index"]] = event["result"]
            report(event["index"], event["result"])
            current = None
        elif kind == "end":
            proc.wait()
            return n_items, None


def _read_lines(stream: IO[str], out: queue.Queue[str | None]) -> None:
    for line in stream:
        out.put(line)
    out.put(None)


def _kill(proc: subprocess.Popen[str]) -> None:
    try:
        os.killpg(proc.pid, 9)
    except ProcessLookupError:
        pass
    proc.wait()
