"""The options flash-attn 2.8.3's private forwards and backwards share (their positional names), for
test_private_forward.py and test_private_backward.py: the defaults each case starts from, and per option
a value other than the default whose effect the reference (reference.py) computes."""

from __future__ import annotations

from typing import Any

import torch

B, SQ, SK, H, HK, D = 2, 5, 7, 4, 2, 8
F64 = torch.float64
SLOPES = torch.tensor([0.5, 0.25, 0.125, 0.0625], dtype=torch.float32)
SHARED_DEFAULTS: dict[str, Any] = {
    "dropout_p": 0.0,
    "softmax_scale": 0.3,
    "causal": False,
    "window_size_left": -1,
    "window_size_right": -1,
    "softcap": 0.0,
    "alibi_slopes": None,
}
CHANGED: dict[str, dict[str, Any]] = {
    "softmax_scale": {"softmax_scale": 0.17},
    "causal": {"causal": True},
    "window_size_left": {"window_size_left": 1},
    "window_size_right": {"window_size_right": 0},
    "softcap": {"softcap": 0.9},
    "alibi_slopes": {"alibi_slopes": SLOPES},
}
