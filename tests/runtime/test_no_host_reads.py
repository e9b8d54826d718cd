"""No public function reads device data on the host when the caller passes max_seqlen (issue 26): every
one compiles with torch.compile(fullgraph=True), runs on meta tensors (which have no data to read), and
on the kernel path runs under FakeTensorMode with CUDA tensors, where any read of a value (.item(),
.tolist(), bool()) raises. That is what a CUDA graph capture needs too. The one read fa keeps is
flash-attn's own: a paged KV cache's bound check (kvcache._paged_bound), outside tracing and capture."""

from __future__ import annotations

from collections.abc import Callable

import fa_attn
import pytest
import torch
from fa_attn.runtime import interface
from fa_attn.runtime.dispatch import Dispatch
from fa_attn.runtime.ops import KernelLaunch
from torch._subclasses.fake_tensor import FakeTensorMode

pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")

Args = Callable[[str], tuple[Callable[..., object], tuple[object, ...], dict[str, object]]]


def _t(device: str, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, device=device, dtype=torch.float16 if device == "cuda" else torch.float32)


def _i(device: str, values: list[int] | list[list[int]]) -> torch.Tensor:
    return torch.tensor(values, dtype=torch.int32, device=device)


# Each public function with arguments on a device; cu_seqlens, block tables and cache lengths are
# device tensors, max_seqlen ints (as flash-attn requires).
CALLS: dict[str, Args] = {
    "flash_attn_func": lambda d: (
        fa_attn.flash_attn_func,
        (_t(d, 2, 5, 4, 16), _t(d, 2, 7, 2, 16), _t(d, 2, 7, 2, 16)),
        {"causal": True},
    ),
    "flash_attn_qkvpacked_func": lambda d: (fa_attn.flash_attn_qkvpacked_func, (_t(d, 2, 5, 3, 4, 16),), {}),
    "flash_attn_kvpacked_func": lambda d: (
        fa_attn.flash_attn_kvpacked_func,
        (_t(d, 2, 5, 4, 16), _t(d, 2, 7, 2, 2, 16)),
        {"window_size": (2, 0)},
    ),
    "flash_attn_varlen_func": lambda d: (
        fa_attn.flash_attn_varlen_func,
        (_t(d, 7, 4, 16), _t(d, 9, 2, 16), _t(d, 9, 2, 16), _i(d, [0, 3, 7]), _i(d, [0, 4, 9]), 4, 5),
        {"causal": True},
    ),
    "flash_attn_varlen_func[paged]": lambda d: (
        fa_attn.flash_attn_varlen_func,
        (
            _t(d, 7, 4, 16),
            _t(d, 4, 16, 2, 16),
            _t(d, 4, 16, 2, 16),
            _i(d, [0, 3, 7]),
            _i(d, [0, 20, 29]),
            4,
            20,
        ),
        {"block_table": _i(d, [[2, 0], [1, 3]])},
    ),
    "flash_attn_varlen_qkvpacked_func": lambda d: (
        fa_attn.flash_attn_varlen_qkvpacked_func,
        (_t(d, 7, 3, 4, 16), _i(d, [0, 3, 7]), 4),
        {"causal": True},
    ),
    "flash_attn_varlen_kvpacked_func": lambda d: (
        fa_attn.flash_attn_varlen_kvpacked_func,
        (_t(d, 7, 4, 16), _t(d, 9, 2, 2, 16), _i(d, [0, 3, 7]), _i(d, [0, 4, 9]), 4, 5),
        {},
    ),
    "flash_attn_with_kvcache": lambda d: (
        fa_attn.flash_attn_with_kvcache,
        (
            _t(d, 2, 1, 4, 16),
            _t(d, 3, 16, 2, 16),
            _t(d, 3, 16, 2, 16),
            _t(d, 2, 1, 2, 16),
            _t(d, 2, 1, 2, 16),
        ),
        {
            "cache_seqlens": _i(d, [3, 9]),
            "cache_batch_idx": _i(d, [2, 0]),
            "cache_leftpad": _i(d, [1, 0]),
            "causal": True,
            "return_softmax_lse": True,
        },
    ),
    "flash_attn_with_kvcache[paged]": lambda d: (
        fa_attn.flash_attn_with_kvcache,
        (
            _t(d, 2, 1, 4, 16),
            _t(d, 4, 16, 2, 16),
            _t(d, 4, 16, 2, 16),
            _t(d, 2, 1, 2, 16),
            _t(d, 2, 1, 2, 16),
        ),
        {"cache_seqlens": _i(d, [3, 20]), "block_table": _i(d, [[2, 0], [1, 3]]), "causal": True},
    ),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_compiles_with_fullgraph_and_matches_eager(name: str) -> None:
    torch.manual_seed(0)
    torch._dynamo.reset()  # each case compiles fa_attn's functions afresh (no recompile limit across cases)
    fn, args, options = CALLS[name]("cpu")
    # The KV cache is written in place: each run gets its own copy.
    eager = fn(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args], **options)
    compiled = torch.compile(lambda *a: fn(*a, **options), fullgraph=True, backend="aot_eager")
    got = compiled(*[a.clone() if isinstance(a, torch.Tensor) else a for a in args])
    torch.testing.assert_close(got, eager)


@pytest.mark.parametrize("compiled", [False, True], ids=["eager", "fullgraph"])
@pytest.mark.parametrize("name", list(CALLS))
def test_runs_on_meta_tensors(name: str, compiled: bool) -> None:
    """Meta tensors have shapes and no values: a host read of one raises, eager or compiled."""
    fn, args, options = CALLS[name]("meta")
    if compiled:
        torch._dynamo.reset()
        out = torch.compile(lambda *a: fn(*a, **options), fullgraph=True, backend="aot_eager")(*args)
    else:
        out = fn(*args, **options)
    first = out[0] if isinstance(out, tuple) else out
    assert first.device.type == "meta"
    assert first.dim() == args[0].dim() - ("qkvpacked" in name)  # out is q's layout; qkv has one more dim


FWD = KernelLaunch("/pkg/kernels/sm_80/fwd_fp16_d16.cubin", "fa_fwd", (16, 128, 128, 64, 49152, 0))


@pytest.fixture
def kernel_route(monkeypatch):
    """Every call takes the kernel path (the ops' fake kernels run under FakeTensorMode)."""
    route = Dispatch("sass", "8.0", (), 16, FWD, None)
    monkeypatch.setattr(interface, "decide", lambda *_call_q_k_v: route)
    monkeypatch.setenv("FA_SELF_CHECK", "off")  # no GPU to check a unit on


@pytest.fixture
def fallback_route(monkeypatch):
    route = Dispatch("fallback", None, (), None, None, None)
    monkeypatch.setattr(interface, "decide", lambda *_call_q_k_v: route)


@pytest.mark.parametrize("route", ["kernel_route", "fallback_route"])
@pytest.mark.parametrize("name", list(CALLS))
def test_no_host_read_of_cuda_data(name: str, route: str, request: pytest.FixtureRequest) -> None:
    """Fake CUDA tensors: reading any value on the host raises DataDependentOutputException."""
    request.getfixturevalue(route)
    with FakeTensorMode():
        fn, args, options = CALLS[name]("cuda")
        out = fn(*args, **options)
    first = out[0] if isinstance(out, tuple) else out
    assert first.device.type == "cuda"


def test_a_host_read_would_be_caught() -> None:
    """The check above has teeth: reading a fake CUDA tensor raises."""
    with FakeTensorMode(), pytest.raises(Exception, match="local_scalar_dense"):
        torch.tensor([1, 2], device="cuda").tolist()


def test_indices_on_the_cpu_are_still_checked() -> None:
    """Host data costs no sync: bad offsets there are still caught before any kernel trusts them."""
    q = torch.randn(7, 4, 16)
    with pytest.raises(ValueError, match="max_seqlen_q"):
        fa_attn.flash_attn_varlen_func(q, q, q, torch.tensor([0, 3, 7], dtype=torch.int32), torch.tensor([0, 3, 7], dtype=torch.int32), 3, 4)  # fmt: skip
