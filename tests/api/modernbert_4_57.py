"""ModernBERT on transformers 4.57 (run in a nested venv by test_modernbert_4_57.py) with the flash_attn
stand-in, on a machine that answers transformers' GPU questions as a GPU machine does
(torch.cuda.is_available() and torch.version.cuda: the only two patched facts; every other check is
transformers'). transformers 4.48-4.57 import `flash_attn.ops.triton.rotary.apply_rotary` in
modeling_modernbert at import once flash-attn 2 looks available, even for attn_implementation="sdpa".

    python modernbert_4_57.py  ->  "CASE <name> <value>" lines
"""

from __future__ import annotations

import fa_attn
import torch

fa_attn.install_as_flash_attn()
torch.cuda.is_available = lambda: True  # type: ignore[assignment]  # a GPU machine's answers
torch.version.cuda = "12.8"  # type: ignore[misc]

import transformers
import transformers.models.modernbert.modeling_modernbert as modernbert
from fa_attn.standin import rotary
from transformers.utils import import_utils

print("CASE version", transformers.__version__)
print("CASE flash_attn_2_available", import_utils.is_flash_attn_2_available())
print("CASE apply_rotary_is_fas", modernbert.apply_rotary is rotary.apply_rotary)
CONFIG = {
    "vocab_size": 50, "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
    "num_attention_heads": 4, "max_position_embeddings": 64, "global_attn_every_n_layers": 2,
    "local_attention": 8, "pad_token_id": 0,
}  # fmt: skip
torch.manual_seed(0)
eager = modernbert.ModernBertModel(modernbert.ModernBertConfig(**CONFIG, attn_implementation="eager")).eval()
ids = torch.randint(1, 50, (2, 12))
mask = torch.ones_like(ids)
mask[1, 9:] = 0
keep = mask.bool()
with torch.no_grad():
    want = eager(input_ids=ids, attention_mask=mask).last_hidden_state[keep]
for implementation in ("sdpa", "flash_attention_2"):
    config = modernbert.ModernBertConfig(**CONFIG, attn_implementation=implementation)
    model = modernbert.ModernBertModel(config).eval()
    model.load_state_dict(eager.state_dict())
    with torch.no_grad():
        got = model(input_ids=ids, attention_mask=mask).last_hidden_state[keep]
    print(f"CASE {implementation}_max_error {(got - want).abs().max().item():.3e}")
