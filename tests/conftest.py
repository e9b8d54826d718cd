"""Shared test setup: GPU tests skip cleanly on machines without an NVIDIA GPU (CI, laptops), and the
property-based tests (hypothesis) run a bounded, repeatable number of examples unless asked for more.

FA_HYPOTHESIS=thorough runs 20x as many examples, from a fresh random seed each time (what to run
after changing a parser); the default, "ci", keeps them to a few seconds per test and derandomized, so
CI gives the same answer on every run."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

settings.register_profile(
    "ci", max_examples=60, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "thorough", max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("FA_HYPOTHESIS", "ci"))


def _has_cuda_gpu() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return bool(torch.cuda.is_available())


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if _has_cuda_gpu():
        return
    skip = pytest.mark.skip(reason="needs an NVIDIA GPU (not verified on a GPU here)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
