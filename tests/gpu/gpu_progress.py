"""A pytest plugin for the kit's runner (tests/gpu/kit.py loads it with `-p gpu_progress`): the progress
of a GPU test session, so the runner can restart pytest after a test that breaks the CUDA context
instead of letting every later test fail with it.

With FA_GPU_PROGRESS=FILE, each test appends "start <nodeid>" when it begins and "<outcome> <nodeid>"
when it ends (passed, failed, skipped, error). A test that leaves the context unusable (a sticky error:
illegal address, launch failure, ...) also appends "poisoned <nodeid>" and stops the session. With
FA_GPU_RESUME=1, the tests FILE already names are deselected, so the next pytest goes on after them.
Without FA_GPU_PROGRESS the plugin does nothing.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

_CUDA_TEXT = re.compile(
    r"CUDA error|cudaError|illegal memory access|misaligned address|unspecified launch failure"
)


def _progress() -> Path | None:
    path = os.environ.get("FA_GPU_PROGRESS")
    return Path(path) if path else None


def _append(line: str) -> None:
    path = _progress()
    if path is not None:
        with path.open("a") as f:
            f.write(line + "\n")


def seen(path: Path) -> set[str]:
    """Every test the file names as started or finished (a started one that never finished died with
    its process: it is not run again)."""
    if not path.is_file():
        return set()
    return {line.split(" ", 1)[1] for line in path.read_text().splitlines() if " " in line}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    path = _progress()
    if path is None or os.environ.get("FA_GPU_RESUME") != "1":
        return
    done = seen(path)
    keep = [item for item in items if item.nodeid not in done]
    if len(keep) != len(items):
        config.hook.pytest_deselected(items=[item for item in items if item.nodeid in done])
        items[:] = keep


def pytest_runtest_logstart(nodeid: str) -> None:
    _append(f"start {nodeid}")


_outcomes: dict[str, str] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if report.failed:
        _outcomes[report.nodeid] = "failed" if report.when == "call" else "error"
    elif report.skipped:
        _outcomes.setdefault(report.nodeid, "skipped")
    elif report.when == "call":
        _outcomes.setdefault(report.nodeid, "passed")


def pytest_runtest_logfinish(nodeid: str) -> None:
    _append(f"{_outcomes.pop(nodeid, 'passed')} {nodeid}")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    yield
    if _progress() is None or call.excinfo is None or not _CUDA_TEXT.search(str(call.excinfo.value)):
        return
    if not _context_lost():
        return
    _append(f"poisoned {item.nodeid}")
    item.session.shouldstop = (
        f"{item.nodeid} left the CUDA context unusable; the runner goes on in a new process"
    )


def _context_lost() -> bool:
    try:
        import torch

        torch.cuda.synchronize()
        (torch.ones(1, device="cuda") + 1).item()
    except Exception:  # noqa: BLE001 - any failure here means the context cannot be used
        return True
    return False
