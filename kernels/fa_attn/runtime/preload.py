"""Loading a route's kernels before a CUDA graph capture can need them.

The binding loads a kernel module (and its functions) at the module's first launch in a process, and
refuses to do so on a capturing stream: a capture must not load kernels (kernels/binding/launch.cpp).
So at a route's first eager call on a device the runtime loads every module the route may use: the
forward, the backward its autograd formula will launch, and the split-KV forward. It does so with an
op call that has no (batch, head) pair: the binding loads the module and its entries' functions and
launches nothing. A capture after one eager call then never loads. A first call that is itself inside
capture loads nothing here, and the binding refuses it with a message saying to run one eager step
first (torch's documented warm-up before capture does). Nothing here is verified on a GPU.
"""

from __future__ import annotations

import threading

import torch

from .decision import Dispatch, KernelLaunch

_lock = threading.Lock()
_loaded: set[tuple[str, int]] = set()  # (module path, CUDA device index) loaded in this process
# Routes whose every module is loaded, by (id(route), device index) -> route, checked by identity (an
# entry keeps its route alive, so its id is not reused): a decode step's call is one lookup, without
# asking CUDA whether it captures or taking the lock once per module.
_ready: dict[tuple[int, int], Dispatch] = {}


def on_gpu(t: torch.Tensor) -> bool:
    return t.is_cuda


def capturing() -> bool:
    return torch.cuda.is_available() and torch.cuda.is_current_stream_capturing()


def before_call(route: Dispatch, q: torch.Tensor) -> None:
    """Load the route's modules on q's device if this process has not yet, unless this is a trace
    (torch.compile: the compiled graph calls the ops itself) or a capture (nothing may load there)."""
    if not on_gpu(q) or torch.compiler.is_compiling():
        return
    index = q.device.index
    device = index if index is not None else torch.cuda.current_device()
    if _ready.get((id(route), device)) is route or capturing():
        return
    for launch in (route.fwd, route.bwd, route.splitkv):
        if launch is None or not launch.module:
            continue
        key = (launch.module, device)
        with _lock:
            if key in _loaded:
                continue
        _load(launch, q)
        with _lock:
            _loaded.add(key)
    with _lock:
        if len(_ready) >= 1024:
            _ready.clear()
        _ready[(id(route), device)] = route


def _load(launch: KernelLaunch, like: torch.Tensor) -> None:
    """An op call with batch 0 carrying `launch`: the binding loads its module and functions and skips
    every (empty) grid. The forward op serves every direction: it only passes the launch data on."""
    empty = torch.empty((0, 1, 1, launch.launch[0]), dtype=like.dtype, device=like.device)
    args = (empty, empty, empty, None, None, None, None, None, None, 1, 1, 1.0, False, -1, -1, 0.0)
    torch.ops.fa_attn.fwd(*args, launch.module, launch.entries, list(launch.launch), "", "", [])
