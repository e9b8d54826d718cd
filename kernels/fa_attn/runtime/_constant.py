"""torch.compiler.assume_constant_result, cheap to import (the path decision and the self-check's
admission are constants torch.compile bakes into a graph)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any, TypeVar

import torch

Fn = TypeVar("Fn", bound=Callable[..., Any])


def assume_constant_result(fn: Fn) -> Fn:
    """torch.compiler.assume_constant_result without its cost: the public decorator imports
    torch._dynamo (~2 s) only to set this attribute (torch 2.4 to 2.15; tests/runtime/test_compile.py
    checks that it still does), which would make `import fa_attn` slow for everyone."""
    if "torch._dynamo" in sys.modules:
        return torch.compiler.assume_constant_result(fn)  # type: ignore[no-any-return]
    fn._dynamo_marked_constant = True  # type: ignore[attr-defined]
    return fn
