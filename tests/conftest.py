"""Shared test setup: GPU tests skip cleanly on machines without an NVIDIA GPU (CI, laptops)."""

from __future__ import annotations

import pytest


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
