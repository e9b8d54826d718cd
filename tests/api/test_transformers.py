"""Hugging Face transformers on fa_attn: tiny models built from a config (no download), logits and greedy
generation compared with attn_implementation="eager".

Two ways in: `fa_attn.hf.register()` (an AttentionInterface entry, any device), and transformers' own
flash_attention_2 code path with the flash_attn stand-in. transformers refuses flash_attention_2
without a CUDA device, so that test answers transformers' one device question (is_torch_cuda_available)
with yes; everything else (its availability checks, its unpad/varlen/packed routing) is transformers'.
"""

from __future__ import annotations

from contextlib import nullcontext

import fa_attn
import pytest
import torch
from fa_attn.standin import compat as flash_attn_compat
from reference import assert_close

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning", "ignore::UserWarning")

CONFIGS = {
    "llama": lambda: transformers.LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64,
    ),
    "qwen2": lambda: transformers.Qwen2Config(
        vocab_size=101, hidden_size=48, intermediate_size=96, num_hidden_layers=2, num_attention_heads=6,
        num_key_value_heads=1, max_position_embeddings=64,
    ),
}  # fmt: skip


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """These models are tiny: one intra-op thread is faster than two fighting over a busy CI machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def flash_attention_2(monkeypatch):
    """transformers' flash_attention_2 on the fa_attn stand-in, with a CUDA device claimed."""
    from transformers.utils import import_utils

    fa_attn.install_as_flash_attn()
    monkeypatch.setattr(import_utils, "is_torch_cuda_available", lambda: True)
    import_utils.is_flash_attn_2_available.cache_clear()
    assert import_utils.is_flash_attn_2_available()
    yield "flash_attention_2"
    monkeypatch.undo()
    flash_attn_compat.uninstall_as_flash_attn()  # also clears transformers' cached answers


def models(family: str, implementation: str):
    torch.manual_seed(0)
    eager = transformers.AutoModelForCausalLM.from_config(
        CONFIGS[family](), attn_implementation="eager"
    ).eval()
    ours = transformers.AutoModelForCausalLM.from_config(
        CONFIGS[family](), attn_implementation=implementation
    )
    ours.load_state_dict(eager.state_dict())
    assert ours.config._attn_implementation == implementation
    assert eager.config._attn_implementation == "eager"
    return eager, ours.eval()


def batch(pad: str):
    ids = torch.randint(0, 101, (3, 10), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    if pad == "right":
        mask[0, 7:], mask[2, 4:] = 0, 0
    elif pad == "left":
        mask[0, :3], mask[2, :6] = 0, 0
    return ids, mask


def assert_same_greedy_generation(
    label: str, eager, ours, ids: torch.Tensor, new_tokens: int, inputs: dict, **ours_only
) -> None:
    """Greedy generation of `new_tokens` from `ids` (plus `inputs`, e.g. an attention mask) gives eager's
    tokens and, step by step, its logits; `ours_only` are generate options for our model alone."""
    options = {
        "max_new_tokens": new_tokens,
        "do_sample": False,
        "output_logits": True,
        "return_dict_in_generate": True,
        **inputs,
    }
    got = ours.generate(ids, **options, **ours_only)
    want = eager.generate(ids, **options)
    assert torch.equal(got.sequences, want.sequences)
    for step, (a, b) in enumerate(zip(got.logits, want.logits, strict=True)):
        assert_close(f"{label} step {step}", a, b, torch.float32, ulps=64)


def check_scenarios(eager, ours, calls: list[str]) -> None:
    with torch.no_grad():
        for pad in ("none", "right", "left"):
            ids, mask = batch(pad)
            calls.clear()
            got = ours(input_ids=ids, attention_mask=mask).logits
            want = eager(input_ids=ids, attention_mask=mask).logits
            keep = mask.bool()
            assert_close(f"{pad}-padded logits", got[keep], want[keep], torch.float32, ulps=64)
            assert calls, calls
            assert set(calls) == ({"padded"} if pad == "none" else {"varlen"}), calls

        # padding-free: three sequences packed in one row, positions restarting at each
        ids = torch.randint(0, 101, (1, 11), generator=torch.Generator().manual_seed(2))
        positions = torch.tensor([[0, 1, 2, 3, 0, 1, 2, 0, 1, 2, 3]])
        calls.clear()
        got = ours(input_ids=ids, position_ids=positions).logits
        want = torch.cat([eager(input_ids=ids[:, a:b]).logits for a, b in ((0, 4), (4, 7), (7, 11))], dim=1)
        assert_close("packed logits", got, want, torch.float32, ulps=64)
        assert calls
        assert set(calls) == {"varlen"}

        # greedy generation from a left-padded batch: prefill, then one query per step over the cache
        ids, mask = batch("left")
        assert_same_greedy_generation("generate", eager, ours, ids, 5, {"attention_mask": mask})


@pytest.mark.parametrize("family", list(CONFIGS))
def test_registered_attention_matches_eager(family: str, calls: list[str]) -> None:
    eager, ours = models(family, fa_attn.hf.register())
    check_scenarios(eager, ours, calls)


@pytest.mark.parametrize("family", list(CONFIGS))
def test_transformers_flash_attention_2_path_on_fa_attn(
    family: str, calls: list[str], flash_attention_2
) -> None:
    from transformers import modeling_flash_attention_utils as fa_utils

    eager, ours = models(family, flash_attention_2)
    assert fa_utils._flash_varlen_fn is fa_attn.flash_attn_varlen_func  # transformers imported the stand-in
    check_scenarios(eager, ours, calls)


@pytest.mark.usefixtures("calls")
def test_registered_attention_with_a_static_cache() -> None:
    """A static cache's unwritten rows stay out of the attention (transformers drops the all-ones mask)."""
    eager, ours = models("llama", fa_attn.hf.register())
    ids, _ = batch("none")
    with torch.no_grad():
        assert_same_greedy_generation("static cache", eager, ours, ids, 4, {}, cache_implementation="static")


def assert_same_gradients(label: str, eager, ours, calls: list[str]) -> dict[str, torch.Tensor]:
    """A right-padded batch through both models: logits and every parameter's gradient equal (and, when
    `calls` spies, only our model calls fa_attn). -> eager's gradients by parameter name."""
    ids, mask = batch("right")
    keep = mask.bool()
    results = []
    for model in (ours, eager):
        calls.clear()
        model.zero_grad()
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits[keep].square().mean().backward()
        results.append((logits, {n: p.grad for n, p in model.named_parameters() if p.grad is not None}))
        assert not calls or model is ours, calls
    (got, got_grads), (want, want_grads) = results
    assert_close(f"{label} logits", got[keep], want[keep], torch.float32, ulps=64)
    assert got_grads.keys() == want_grads.keys()
    for name, grad in got_grads.items():
        assert_close(f"{label} grad {name}", grad, want_grads[name], torch.float32, ulps=256)
    return want_grads


def test_register_refuses_transformers_own_flash_names() -> None:
    for name in ("flash_attention_2", "kernels-community/flash-attn2"):
        with pytest.raises(
            ValueError, match=r"^name: .* is transformers' own flash-attention or hub-kernel name"
        ):
            fa_attn.hf.register(name)


FLASH_NAMED = {
    # Falcon and GPT-Neo pick their attention class from a map keyed by name: for a "flash" name, their
    # flash-attention class (which calls transformers' flash-attention forward with the name's functions)
    "falcon": lambda: transformers.FalconConfig(
        vocab_size=101, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
        new_decoder_architecture=True, num_kv_heads=2,
    ),
    # GPT-Neo's flash class has no local window (transformers' own, also on flash-attn): a window longer
    # than the batch, as the real models' 256
    "gpt_neo": lambda: transformers.GPTNeoConfig(
        vocab_size=101, hidden_size=64, num_layers=2, num_heads=4, attention_types=[[["global", "local"], 1]],
        window_size=16, max_position_embeddings=64,
    ),
    "llama": CONFIGS["llama"],
}  # fmt: skip


@pytest.mark.parametrize("registered", ["fa_flash", "fa_attn"])
@pytest.mark.parametrize("family", list(FLASH_NAMED))
def test_a_flash_name_runs_name_keyed_models_on_fa_attn(
    family: str, registered: str, calls: list[str]
) -> None:
    """register("fa_flash"): a name containing "flash" (what Falcon/GPT-Neo's class maps and padding-free
    trainers look for) loads fa_attn's functions, not a hub kernel; logits and gradients equal eager's.
    The default register() name works for them too (a KeyError in their class maps before)."""
    name = fa_attn.hf.register(registered)
    torch.manual_seed(0)
    eager = transformers.AutoModelForCausalLM.from_config(FLASH_NAMED[family](), attn_implementation="eager")
    ours = transformers.AutoModelForCausalLM.from_config(FLASH_NAMED[family](), attn_implementation=name)
    ours.load_state_dict(eager.state_dict())
    assert (eager.config._attn_implementation, ours.config._attn_implementation) == ("eager", name)
    assert_same_gradients(family, eager, ours, calls)
    calls.clear()
    with torch.no_grad():
        ours(input_ids=batch("left")[0])
    assert calls  # the model ran on fa_attn


def gpt_oss_models():
    """A tiny gpt-oss (attention sinks, a sliding-window layer and a full one) on eager and on fa_attn."""

    def config():  # one each: from_config sets the implementation on the config it is given
        return transformers.GptOssConfig(
            vocab_size=101, hidden_size=64, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, num_local_experts=4, num_experts_per_tok=2,
            max_position_embeddings=64, sliding_window=4, layer_types=["sliding_attention", "full_attention"],
        )  # fmt: skip

    torch.manual_seed(0)
    eager = transformers.AutoModelForCausalLM.from_config(config(), attn_implementation="eager")
    with torch.no_grad():  # sinks far from 0, so a path that dropped them could not pass
        for layer in eager.model.layers:
            layer.self_attn.sinks.normal_(0.0, 2.0)
    ours = transformers.AutoModelForCausalLM.from_config(config(), attn_implementation=fa_attn.hf.register())
    ours.load_state_dict(eager.state_dict())
    assert (eager.config._attn_implementation, ours.config._attn_implementation) == ("eager", "fa_attn")
    return eager.eval(), ours.eval()


def test_attention_sinks_are_exact_with_a_named_reason() -> None:
    """gpt-oss passes its sinks as s_aux: fa_attn.hf computes them on the fallback (reason
    sinks-unsupported, never the kernels), so logits under padding, packing and greedy generation, and
    the gradients (to the sinks too), equal transformers' eager path."""
    from fa_attn.runtime import dispatch

    eager, ours = gpt_oss_models()
    dispatch._warned.discard("sinks-unsupported")
    with torch.no_grad():
        for pad in ("none", "right", "left"):
            ids, mask = batch(pad)
            with (
                pytest.warns(fa_attn.FaFallbackWarning, match=r"\[sinks-unsupported\]")
                if pad == "none"
                else nullcontext()
            ):
                got = ours(input_ids=ids, attention_mask=mask).logits
            last = fa_attn.last_dispatch()
            assert last is not None
            assert [r.code for r in last.reasons] == ["sinks-unsupported"]
            want = eager(input_ids=ids, attention_mask=mask).logits
            keep = mask.bool()
            assert_close(f"gpt-oss {pad}-padded logits", got[keep], want[keep], torch.float32, ulps=64)

        ids = torch.randint(0, 101, (1, 11), generator=torch.Generator().manual_seed(2))
        positions = torch.tensor([[0, 1, 2, 3, 4, 5, 0, 1, 2, 0, 1]])
        got = ours(input_ids=ids, position_ids=positions).logits
        want = torch.cat([eager(input_ids=ids[:, a:b]).logits for a, b in ((0, 6), (6, 9), (9, 11))], dim=1)
        assert_close("gpt-oss packed logits", got, want, torch.float32, ulps=64)

        ids, mask = batch("left")
        assert_same_greedy_generation("gpt-oss generate", eager, ours, ids, 5, {"attention_mask": mask})

    grads = assert_same_gradients("gpt-oss", eager, ours, [])
    sinks = [name for name in grads if name.endswith("sinks")]
    assert len(sinks) == 2
    assert all(grads[name].abs().max() > 0 for name in sinks)


def test_a_flash_name_meets_the_padding_free_predicate_of_sentence_transformers() -> None:
    """sentence-transformers 6.2.0 flattens text batches (no padding) only when, in
    base/modules/transformer.py, `is_flash_attention_requested(requested_attention_implementation=attn_impl)`
    holds and `(_, flash_varlen_fn, *_), _ = lazy_import_flash_attention(self.config._attn_implementation)`
    gives a varlen function (not None). The package itself is not installed here: this checks those two
    calls, on transformers' real functions, for the registered names."""
    from transformers.modeling_flash_attention_utils import lazy_import_flash_attention
    from transformers.utils.generic import is_flash_attention_requested

    assert not is_flash_attention_requested(requested_attention_implementation=fa_attn.hf.register())
    name = fa_attn.hf.register("fa_flash")
    assert is_flash_attention_requested(requested_attention_implementation=name)
    (flash_fn, flash_varlen_fn, *_), _ = lazy_import_flash_attention(name)
    assert flash_varlen_fn is fa_attn.flash_attn_varlen_func
    assert flash_fn is fa_attn.flash_attn_func
