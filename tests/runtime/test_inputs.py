"""Bad input gives a ValueError that names the argument (never a crash or garbage)."""

from __future__ import annotations

import fa_attn
import pytest
import torch

pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning")


def t(*shape, dtype=torch.float32):
    return torch.randn(*shape).to(dtype)


Q, K, V = t(2, 5, 4, 16), t(2, 7, 2, 16), t(2, 7, 2, 16)


@pytest.mark.parametrize(
    ("args", "kwargs", "match"),
    [
        ((Q.long(), K, V), {}, r"^q: dtype torch.int64"),
        ((Q, K.half(), V), {}, r"^k: dtype torch.float16 differs"),
        ((Q, K, V.to("meta")), {}, r"^v: on meta"),
        ((Q, K, t(2, 7, 2, 8)), {}, r"^v: shape"),
        ((Q, t(2, 7, 2, 8), t(2, 7, 2, 8)), {}, r"^k: head dim 8 differs"),
        ((Q, t(2, 7, 3, 16), t(2, 7, 3, 16)), {}, r"^k: 3 kv heads must divide"),
        ((Q, t(3, 7, 2, 16), t(3, 7, 2, 16)), {}, r"^k: batch 3 differs"),
        ((Q[0], K, V), {}, r"^q: expected 4 dims"),
        (("q", K, V), {}, r"^q: expected a torch.Tensor"),
        ((t(2, 5, 4, 32)[..., ::2], K, V), {}, r"^q: the last dim must be contiguous"),
        ((Q, K, V), {"dropout_p": 1.0}, r"^dropout_p"),
        ((Q, K, V), {"softcap": -1.0}, r"^softcap"),
        ((Q, K, V), {"window_size": (1,)}, r"^window_size"),
        ((Q, K, V), {"window_size": (-2, 0)}, r"^window_size"),
        ((Q, K, V), {"alibi_slopes": t(3)}, r"^alibi_slopes: expected shape"),
        ((Q, K, V), {"softmax_scale": float("nan")}, r"^softmax_scale"),
        ((t(2, 5, 4, 0), t(2, 7, 2, 0), t(2, 7, 2, 0)), {}, r"^q: head dim is 0"),
    ],
)
def test_padded_bad_input(args, kwargs, match) -> None:
    with pytest.raises(ValueError, match=match):
        fa_attn.flash_attn_func(*args, **kwargs)


def cu(*offsets, dtype=torch.int32):
    return torch.tensor(offsets, dtype=dtype)


QV, KV = t(6, 4, 16), t(7, 2, 16)


@pytest.mark.parametrize(
    ("cu_q", "cu_k", "max_q", "match"),
    [
        (cu(0, 2, 6, dtype=torch.int64), cu(0, 3, 7), 4, r"^cu_seqlens_q: dtype torch.int64"),
        (cu(0, 2, 5), cu(0, 3, 7), 4, r"^cu_seqlens_q: last offset 5 != 6"),
        (cu(0, 2, 6), cu(0, 3, 8), 4, r"^cu_seqlens_k: last offset 8 != 7 .*or be fewer"),
        (cu(1, 2, 6), cu(0, 3, 7), 4, r"^cu_seqlens_q: starts at 1"),
        (cu(0, 4, 2, 6), cu(0, 3, 5, 7), 4, r"^cu_seqlens_q: offsets .* decrease"),
        (cu(0, 2, 6), cu(0, 7), 4, r"^cu_seqlens_k: 1 sequences but cu_seqlens_q has 2"),
        (torch.zeros(2, 3, dtype=torch.int32), cu(0, 3, 7), 4, r"^cu_seqlens_q: expected a 1-D"),
        (
            cu(0, 2, 6),
            cu(0, 3, 7),
            3,
            r"^max_seqlen_q: 3 is smaller than the longest sequence in cu_seqlens_q \(4\); pass max_seqlen_q >= 4",
        ),
    ],
)
def test_varlen_bad_cu_seqlens(cu_q, cu_k, max_q, match) -> None:
    with pytest.raises(ValueError, match=match):
        fa_attn.flash_attn_varlen_func(QV, KV, KV, cu_q, cu_k, max_q, 4)


def test_varlen_needs_packed_layout() -> None:
    with pytest.raises(ValueError, match=r"^q: expected 3 dims \(total_tokens"):
        fa_attn.flash_attn_varlen_func(Q, K, V, cu(0, 5), cu(0, 7), 5, 7)


def test_fp32_is_accepted_and_falls_back_with_dtype_reason() -> None:
    # On CPU the first reason is device-not-cuda; the dtype reason shows for a (described) CUDA call.
    from fa_attn.runtime.decision import Call, Device
    from fa_attn.runtime.dispatch import CallFacts, decide
    from fa_attn.schema import Manifest

    facts = CallFacts(Device("cuda", "9.0"), Call("fp32", 64))
    man = Manifest.from_json({"schema": 1, "version": "0.1.0", "cuda_major": 12, "binding": "x.so"})
    assert decide(facts, man, lambda: None).reasons[0].code == "dtype-unsupported"
    out = fa_attn.flash_attn_func(Q, K, V)
    assert out.dtype == torch.float32
    assert torch.isfinite(out).all()
