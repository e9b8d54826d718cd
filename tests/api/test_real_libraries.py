"""Real libraries (pinned in the test extra) on fa_attn.hf, each against the same library on transformers'
own eager or SDPA attention: peft's LoRA (outputs and the adapters' gradients), trl's padding-free
collator (a packed batch's loss and gradients equal the padded batch's), sentence-transformers'
embeddings (its padding-free path under a "flash" name). Tiny models from a config, no download."""

from __future__ import annotations

import fa_attn
import pytest
import torch

transformers = pytest.importorskip("transformers")
pytestmark = pytest.mark.filterwarnings("ignore::fa_attn.FaFallbackWarning", "ignore::UserWarning")


def llama_config():  # one per model: from_config sets the implementation on the config it is given
    return transformers.LlamaConfig(
        vocab_size=101, hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=64, pad_token_id=0,
    )  # fmt: skip


def pair(implementation: str, reference: str = "eager"):
    torch.manual_seed(0)
    ref = transformers.AutoModelForCausalLM.from_config(llama_config(), attn_implementation=reference)
    ours = transformers.AutoModelForCausalLM.from_config(llama_config(), attn_implementation=implementation)
    ours.load_state_dict(ref.state_dict())
    return ref, ours


def padded_batch() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 101, (3, 9), generator=g)
    mask = torch.ones_like(ids)
    mask[1, 6:] = 0  # right padding
    mask[2, :4] = 0  # left padding
    return ids.masked_fill(mask == 0, 0), mask


def grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {name: p.grad.clone() for name, p in model.named_parameters() if p.grad is not None}


def test_peft_lora_matches_eager(calls: list[str]) -> None:
    peft = pytest.importorskip("peft")
    ref, ours = pair(fa_attn.hf.register())
    lora = peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "k_proj", "v_proj", "o_proj"], lora_dropout=0.0
    )
    torch.manual_seed(2)
    ref = peft.get_peft_model(ref, lora)
    torch.manual_seed(2)
    ours = peft.get_peft_model(ours, lora)
    with torch.no_grad():  # LoRA's B starts at zero: give it values so the adapters change the outputs
        for (name, p), (_, q) in zip(ref.named_parameters(), ours.named_parameters(), strict=True):
            if "lora_B" in name:
                p.normal_(0, 0.5)
                q.copy_(p)
    ids, mask = padded_batch()
    keep = mask.bool()
    outputs = []
    for model in (ref, ours):
        logits = model(input_ids=ids, attention_mask=mask).logits
        logits[keep].square().mean().backward()  # padded positions' outputs are not compared
        outputs.append(logits.detach()[keep])
    torch.testing.assert_close(outputs[1], outputs[0], rtol=1e-4, atol=1e-5)
    assert calls  # the peft model ran on fa_attn
    ref_grads, our_grads = grads(ref), grads(ours)
    assert ref_grads.keys() == our_grads.keys()
    assert all("lora_" in name for name in our_grads)  # only the adapters train
    assert len(our_grads) == 2 * 4 * 2  # A and B of four projections in two layers
    for name, grad in ref_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_trl_padding_free_batch_matches_the_padded_one(calls: list[str]) -> None:
    """trl's DataCollatorForLanguageModeling(padding_free=True) packs a batch in one row with position_ids
    restarting per sequence; on fa_attn (a "flash" name, which trl requires for padding-free) that row's
    loss and gradients equal the padded batch's on eager."""
    trl_collator = pytest.importorskip("trl.trainer.sft_trainer").DataCollatorForLanguageModeling
    ref, ours = pair(fa_attn.hf.register("fa_flash"))
    g = torch.Generator().manual_seed(3)
    examples = [{"input_ids": torch.randint(1, 101, (n,), generator=g).tolist()} for n in (5, 8, 3)]
    packed = trl_collator(pad_token_id=0, padding_free=True)(examples)
    padded = trl_collator(pad_token_id=0)(examples)
    assert packed["input_ids"].shape == (1, 16)
    assert packed["position_ids"].tolist() == [[*range(5), *range(8), *range(3)]]
    loss = ours(
        input_ids=packed["input_ids"], position_ids=packed["position_ids"], labels=packed["labels"]
    ).loss
    loss.backward()
    assert set(calls) == {"varlen"}  # the packed row ran as its sequences, on fa_attn
    ref_loss = ref(
        input_ids=padded["input_ids"], attention_mask=padded["attention_mask"], labels=padded["labels"]
    ).loss
    ref_loss.backward()
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-6)
    ref_grads, our_grads = grads(ref), grads(ours)
    for name, grad in ref_grads.items():
        torch.testing.assert_close(our_grads[name], grad, rtol=1e-4, atol=1e-6, msg=name)


def test_sentence_transformers_embeddings_match_sdpa(tmp_path, calls: list[str]) -> None:
    """A tiny BERT saved with a word-level tokenizer, loaded by sentence-transformers under fa_attn's
    "flash" name (its padding-free path flattens the batch) and under "sdpa": the same embeddings."""
    st = pytest.importorskip("sentence_transformers")
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *(f"w{i}" for i in range(40))]
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n")
    tokenizer = transformers.BertTokenizerFast(vocab_file=str(tmp_path / "vocab.txt"), do_lower_case=False)
    config = transformers.BertConfig(
        vocab_size=len(words), hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64,
        max_position_embeddings=32,
    )  # fmt: skip
    torch.manual_seed(4)
    transformers.BertModel(config).save_pretrained(tmp_path)
    tokenizer.save_pretrained(tmp_path)
    sentences = ["w1 w2 w3", "w4 w5 w6 w7 w8 w9 w10", "w11"]
    embeddings = {}
    for implementation in ("sdpa", fa_attn.hf.register("fa_flash")):
        model = st.SentenceTransformer(
            str(tmp_path), device="cpu", model_kwargs={"attn_implementation": implementation}
        )
        embeddings[implementation] = model.encode(sentences, convert_to_tensor=True, batch_size=3)
    torch.testing.assert_close(embeddings["fa_flash"], embeddings["sdpa"], rtol=1e-4, atol=1e-5)
    assert calls == ["varlen"] * 2  # one flattened batch per layer: sentence-transformers' padding-free path
