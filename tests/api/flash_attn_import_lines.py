"""Import lines for flash_attn from public projects, to run with the stand-in installed
(test_flash_attn_import_lines.py).

Gathered 2026-11-26: the newest stored snapshots of the 31 public repositories named below (training
frameworks, serving engines, diffusion and video models, RL trainers), every `import flash_attn...` and
`from flash_attn... import ...` statement in their .py files, read with Python's ast (so a parenthesised
multi-line import is one statement, in ast.unparse's spelling), deduplicated. Each statement is
recorded with one repository it came from (the first by name; several projects share some lines).
Nothing else of those projects is copied: only the statement and owner/name.

FLASH_ATTN_2_8_3 holds the 141 statements a real flash-attn 2.8.3 satisfies (each module and name checked
against its source at tag v2.8.3: a top-level definition, import or submodule); NOT_IN_FLASH_ATTN_2_8_3
the 8 it does not (flash-attn 1.x names, flash_attn.cute modules and names newer than 2.8.3), which must not
resolve with the stand-in either.
"""

from __future__ import annotations

FLASH_ATTN_2_8_3: tuple[tuple[str, str], ...] = (
    ("from flash_attn import __version__", "xdit-project/xDiT"),
    ("from flash_attn import __version__ as flash_attn_version", "OpenGVLab/InternVL"),
    ("from flash_attn import bert_padding", "huggingface/nanotron"),
    ("from flash_attn import bert_padding, flash_attn_interface", "OpenGVLab/InternVL"),
    ("from flash_attn import flash_attn_func", "InternLM/xtuner"),
    ("from flash_attn import flash_attn_func as _flash_attn_2_func", "hao-ai-lab/FastVideo"),
    ("from flash_attn import flash_attn_func as _flash_attn_func", "OpenGVLab/InternVL"),
    ("from flash_attn import flash_attn_func as _impl", "NVIDIA/Megatron-LM"),
    ("from flash_attn import flash_attn_func as flash_attn_2_func", "hao-ai-lab/FastVideo"),
    ("from flash_attn import flash_attn_func as flash_attn_func_2", "xdit-project/xDiT"),
    ("from flash_attn import flash_attn_func as flash_attn_func_v2", "hpcaitech/Open-Sora"),
    ("from flash_attn import flash_attn_func, flash_attn_varlen_func", "InternLM/xtuner"),
    ("from flash_attn import flash_attn_func, flash_attn_varlen_kvpacked_func", "hpcaitech/ColossalAI"),
    ("from flash_attn import flash_attn_kvpacked_func", "zhuzilin/ring-flash-attention"),
    (
        "from flash_attn import flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache",
        "HazyResearch/based",
    ),
    (
        "from flash_attn import flash_attn_kvpacked_func, flash_attn_qkvpacked_func, flash_attn_varlen_kvpacked_func, flash_attn_varlen_qkvpacked_func, flash_attn_with_kvcache, flash_attn_func",
        "HazyResearch/based",
    ),
    ("from flash_attn import flash_attn_qkvpacked_func", "feifeibear/long-context-attention"),
    ("from flash_attn import flash_attn_qkvpacked_func, flash_attn_func", "jzhang38/EasyContext"),
    (
        "from flash_attn import flash_attn_qkvpacked_func, flash_attn_varlen_qkvpacked_func",
        "hpcaitech/ColossalAI",
    ),
    ("from flash_attn import flash_attn_varlen_func", "Wan-Video/Wan2.1"),
    ("from flash_attn import flash_attn_varlen_func as _flash_attn_2_varlen_func", "hao-ai-lab/FastVideo"),
    ("from flash_attn import flash_attn_varlen_func as _flash_attn_varlen_func", "OpenGVLab/InternVL"),
    ("from flash_attn import flash_attn_varlen_func as flash_attn_varlen_func_2", "xdit-project/xDiT"),
    ("from flash_attn import flash_attn_varlen_func as flash_attn_varlen_func_flash", "hao-ai-lab/FastVideo"),
    ("from flash_attn import flash_attn_varlen_func, flash_attn_with_kvcache", "NVIDIA/Megatron-LM"),
    ("from flash_attn import flash_attn_varlen_kvpacked_func", "zhuzilin/ring-flash-attention"),
    ("from flash_attn import flash_attn_varlen_qkvpacked_func", "feifeibear/long-context-attention"),
    ("from flash_attn import flash_attn_with_kvcache", "InternLM/xtuner"),
    ("from flash_attn.bert_padding import index_first_axis as _index_first_axis", "OpenGVLab/InternVL"),
    ("from flash_attn.bert_padding import index_first_axis, pad_input", "hpcaitech/ColossalAI"),
    (
        "from flash_attn.bert_padding import index_first_axis, pad_input, rearrange, unpad_input",
        "LLaVA-VL/LLaVA-NeXT",
    ),
    ("from flash_attn.bert_padding import index_first_axis, pad_input, unpad_input", "InternLM/xtuner"),
    ("from flash_attn.bert_padding import index_first_axis, rearrange, unpad_input", "volcengine/verl"),
    ("from flash_attn.bert_padding import index_first_axis, unpad_input", "InternLM/xtuner"),
    ("from flash_attn.bert_padding import pad_input", "InternLM/xtuner"),
    ("from flash_attn.bert_padding import pad_input as _pad_input", "OpenGVLab/InternVL"),
    ("from flash_attn.bert_padding import pad_input, unpad_input", "NVIDIA/NeMo"),
    ("from flash_attn.bert_padding import unpad_input", "volcengine/verl"),
    ("from flash_attn.bert_padding import unpad_input as _unpad_input", "OpenGVLab/InternVL"),
    ("from flash_attn.bert_padding import unpad_input, pad_input", "LLaVA-VL/LLaVA-NeXT"),
    (
        "from flash_attn.cute import flash_attn_func as ref_flash_attn_func, flash_attn_varlen_func as ref_flash_attn_varlen_func",
        "hao-ai-lab/FastVideo",
    ),
    ("from flash_attn.cute import flash_attn_func, flash_attn_varlen_func", "axolotl-ai-cloud/axolotl"),
    ("from flash_attn.cute import flash_attn_varlen_func as _fa4_varlen_func", "NVIDIA/Megatron-LM"),
    ("from flash_attn.cute import flash_attn_varlen_func as flash_attn4_varlen_func", "NVIDIA/Megatron-LM"),
    ("from flash_attn.cute import interface as flash_cute", "xdit-project/xDiT"),
    ("from flash_attn.cute import utils", "hao-ai-lab/FastVideo"),
    ("from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd", "hao-ai-lab/FastVideo"),
    (
        "from flash_attn.cute.interface import _flash_attn_bwd, _flash_attn_fwd, flash_attn_func",
        "hao-ai-lab/FastVideo",
    ),
    ("from flash_attn.cute.interface import flash_attn_func as fa4_func", "hao-ai-lab/FastVideo"),
    ("from flash_attn.cute.interface import flash_attn_func as flash_attn_func_4", "xdit-project/xDiT"),
    ("from flash_attn.cute.interface import flash_attn_func as flash_attn_func_4_fp4", "xdit-project/xDiT"),
    (
        "from flash_attn.cute.interface import flash_attn_varlen_func as flash_attn_varlen_func_4",
        "xdit-project/xDiT",
    ),
    ("from flash_attn.flash_attn_interface import _flash_attn_backward", "OpenGVLab/InternVL"),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_backward as _fa2_backward",
        "hao-ai-lab/FastVideo",
    ),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_backward as _flash_attn_bwd",
        "NVIDIA/TransformerEngine",
    ),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_backward, _flash_attn_forward",
        "hpcaitech/Open-Sora",
    ),
    ("from flash_attn.flash_attn_interface import _flash_attn_forward", "Tencent/HunyuanVideo"),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_forward as _flash_attn_fwd",
        "NVIDIA/TransformerEngine",
    ),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_forward, _flash_attn_backward",
        "feifeibear/long-context-attention",
    ),
    ("from flash_attn.flash_attn_interface import _flash_attn_varlen_backward", "jzhang38/EasyContext"),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_varlen_backward as _fa2_varlen_backward",
        "hao-ai-lab/FastVideo",
    ),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_varlen_backward as _flash_attn_backward",
        "hpcaitech/ColossalAI",
    ),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_varlen_backward as _flash_attn_varlen_bwd",
        "NVIDIA/TransformerEngine",
    ),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_varlen_backward, _flash_attn_varlen_forward",
        "fla-org/flash-linear-attention",
    ),
    ("from flash_attn.flash_attn_interface import _flash_attn_varlen_forward", "modelscope/ms-swift"),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_varlen_forward as _flash_attn_forward",
        "hpcaitech/ColossalAI",
    ),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_varlen_forward as _flash_attn_varlen_fwd",
        "NVIDIA/TransformerEngine",
    ),
    (
        "from flash_attn.flash_attn_interface import _flash_attn_varlen_forward, _flash_attn_varlen_backward",
        "feifeibear/long-context-attention",
    ),
    (
        "from flash_attn.flash_attn_interface import _wrapped_flash_attn_backward, _wrapped_flash_attn_forward",
        "huggingface/diffusers",
    ),
    ("from flash_attn.flash_attn_interface import flash_attn_func", "axolotl-ai-cloud/axolotl"),
    (
        "from flash_attn.flash_attn_interface import flash_attn_func, flash_attn_varlen_func",
        "EleutherAI/gpt-neox",
    ),
    (
        "from flash_attn.flash_attn_interface import flash_attn_func, flash_attn_varlen_kvpacked_func",
        "OpenGVLab/InternVL",
    ),
    ("from flash_attn.flash_attn_interface import flash_attn_gpu", "InternLM/xtuner"),
    ("from flash_attn.flash_attn_interface import flash_attn_gpu, round_multiple", "InternLM/xtuner"),
    (
        "from flash_attn.flash_attn_interface import flash_attn_qkvpacked_func as flash_attn_func",
        "jzhang38/EasyContext",
    ),
    ("from flash_attn.flash_attn_interface import flash_attn_varlen_func", "OpenGVLab/InternVL"),
    (
        "from flash_attn.flash_attn_interface import flash_attn_varlen_func as flash_attn_unpadded_func",
        "NVIDIA/NeMo",
    ),
    (
        "from flash_attn.flash_attn_interface import flash_attn_varlen_func, flash_attn_with_kvcache",
        "huggingface/nanotron",
    ),
    ("from flash_attn.flash_attn_interface import flash_attn_varlen_qkvpacked_func", "OpenGVLab/InternVL"),
    (
        "from flash_attn.flash_attn_interface import flash_attn_varlen_qkvpacked_func as flash_attn_unpadded_qkvpacked_func",
        "LLaVA-VL/LLaVA-NeXT",
    ),
    (
        "from flash_attn.flash_attn_interface import flash_attn_varlen_qkvpacked_func, flash_attn_varlen_func, flash_attn_varlen_kvpacked_func",
        "alibaba/Pai-Megatron-Patch",
    ),
    ("from flash_attn.flash_attn_interface import flash_attn_with_kvcache", "huggingface/nanotron"),
    (
        "from flash_attn.flash_attn_interface import maybe_contiguous as maybe_contiguous_v2",
        "InternLM/xtuner",
    ),
    ("from flash_attn.flash_attn_triton import flash_attn_func", "OpenGVLab/InternVL"),
    ("from flash_attn.flash_attn_triton import flash_attn_func as flash_attn_func_triton", "NVIDIA/NeMo"),
    (
        "from flash_attn.flash_attn_triton import flash_attn_func as flash_attn_unpadded_unpacked_func_triton",
        "EleutherAI/gpt-neox",
    ),
    ("from flash_attn.layers.rotary import RotaryEmbedding", "HazyResearch/based"),
    ("from flash_attn.layers.rotary import RotaryEmbedding as DAILRotaryEmbedding", "mosaicml/llm-foundry"),
    ("from flash_attn.layers.rotary import RotaryEmbedding as FlashRotaryEmbedding", "huggingface/nanotron"),
    (
        "from flash_attn.layers.rotary import RotaryEmbedding as OrigFlashRotaryEmbedding",
        "huggingface/nanotron",
    ),
    ("from flash_attn.layers.rotary import apply_rotary_emb", "hao-ai-lab/FastVideo"),
    ("from flash_attn.layers.rotary import apply_rotary_emb as apply_rotary_emb_flash", "NVIDIA/Megatron-LM"),
    (
        "from flash_attn.layers.rotary import apply_rotary_emb as flash_apply_rotary_emb",
        "huggingface/nanotron",
    ),
    ("from flash_attn.losses.cross_entropy import CrossEntropyLoss", "HazyResearch/based"),
    (
        "from flash_attn.losses.cross_entropy import CrossEntropyLoss as FusedCrossEntropyLoss",
        "mosaicml/llm-foundry",
    ),
    ("from flash_attn.models.bigcode import remap_state_dict_hf_bigcode", "HazyResearch/based"),
    ("from flash_attn.models.falcon import remap_state_dict_hf_falcon", "HazyResearch/based"),
    ("from flash_attn.models.gpt_neox import remap_state_dict_hf_gpt_neox", "HazyResearch/based"),
    ("from flash_attn.models.gptj import remap_state_dict_hf_gptj", "HazyResearch/based"),
    ("from flash_attn.models.llama import remap_state_dict_hf_llama", "HazyResearch/based"),
    ("from flash_attn.models.opt import remap_state_dict_hf_opt", "HazyResearch/based"),
    ("from flash_attn.modules.block import Block, ParallelBlock", "HazyResearch/based"),
    ("from flash_attn.modules.embedding import GPT2Embeddings, ParallelGPT2Embeddings", "HazyResearch/based"),
    ("from flash_attn.modules.mha import MHA", "HazyResearch/based"),
    ("from flash_attn.modules.mha import MHA, ParallelMHA", "HazyResearch/based"),
    ("from flash_attn.modules.mha import flash_attn_varlen_kvpacked_func", "huggingface/nanotron"),
    (
        "from flash_attn.modules.mlp import FusedMLP, GatedMlp, Mlp, ParallelFusedMLP, ParallelGatedMlp, ParallelMLP",
        "HazyResearch/based",
    ),
    ("from flash_attn.modules.mlp import FusedMLP, Mlp, ParallelFusedMLP, ParallelMLP", "HazyResearch/based"),
    ("from flash_attn.modules.mlp import Mlp", "HazyResearch/based"),
    (
        "from flash_attn.ops.activations import gelu_bwd, relu_bwd, sqrelu_bwd, sqrelu_fwd",
        "HazyResearch/based",
    ),
    ("from flash_attn.ops.activations import sqrelu_bwd, sqrelu_fwd", "HazyResearch/based"),
    ("from flash_attn.ops.activations import sqrelu_fwd", "HazyResearch/based"),
    ("from flash_attn.ops.activations import swiglu", "EleutherAI/gpt-neox"),
    ("from flash_attn.ops.fused_dense import ColumnParallelLinear", "HazyResearch/based"),
    (
        "from flash_attn.ops.fused_dense import ColumnParallelLinear, FusedDense, RowParallelLinear",
        "HazyResearch/based",
    ),
    ("from flash_attn.ops.fused_dense import ColumnParallelLinear, RowParallelLinear", "HazyResearch/based"),
    ("from flash_attn.ops.fused_dense import FusedMLP, ParallelFusedMLP", "HazyResearch/based"),
    (
        "from flash_attn.ops.layer_norm import DropoutAddLayerNormFn, DropoutAddLayerNormParallelResidualFn, DropoutAddLayerNormSubsetFn",
        "HazyResearch/based",
    ),
    ("from flash_attn.ops.layer_norm import dropout_add_layer_norm", "HazyResearch/based"),
    ("from flash_attn.ops.layer_norm import dropout_add_layer_norm_parallel_residual", "HazyResearch/based"),
    ("from flash_attn.ops.rms_norm import rms_norm as rmsnorm_func", "togethercomputer/stripedhyena"),
    ("from flash_attn.ops.triton.cross_entropy import cross_entropy_loss", "LLaVA-VL/LLaVA-NeXT"),
    (
        "from flash_attn.ops.triton.cross_entropy import cross_entropy_loss as flash_attn_cross_entropy_loss",
        "axolotl-ai-cloud/axolotl",
    ),
    (
        "from flash_attn.ops.triton.cross_entropy import cross_entropy_loss as flash_cross_entropy_loss",
        "allenai/OLMo",
    ),
    (
        "from flash_attn.ops.triton.k_activations import gelu, gelu_approx, gelu_approx_grad, gelu_grad, squared_relu, squared_relu_grad",
        "HazyResearch/based",
    ),
    ("from flash_attn.ops.triton.layer_norm import layer_norm_fn", "huggingface/nanotron"),
    ("from flash_attn.ops.triton.layer_norm import layer_norm_fn, RMSNorm", "HazyResearch/based"),
    ("from flash_attn.ops.triton.layer_norm import rms_norm_fn", "mosaicml/llm-foundry"),
    ("from flash_attn.ops.triton.linear import triton_dgrad_act, triton_linear_act", "HazyResearch/based"),
    ("from flash_attn.ops.triton.mlp import FusedDenseSqreluDense", "HazyResearch/based"),
    ("from flash_attn.utils.distributed import all_gather", "OpenRLHF/OpenRLHF"),
    (
        "from flash_attn.utils.distributed import all_gather, all_gather_raw, get_dim_for_local_rank, sync_shared_params",
        "HazyResearch/based",
    ),
    (
        "from flash_attn.utils.distributed import all_gather_raw, all_reduce, all_reduce_raw, reduce_scatter, reduce_scatter_raw",
        "HazyResearch/based",
    ),
    (
        "from flash_attn.utils.distributed import all_gather_raw, get_dim_for_local_rank, sync_shared_params",
        "HazyResearch/based",
    ),
    ("from flash_attn.utils.distributed import get_dim_for_local_rank", "HazyResearch/based"),
    ("from flash_attn.utils.generation import InferenceParams", "HazyResearch/based"),
    ("from flash_attn.utils.pretrained import state_dict_from_pretrained", "HazyResearch/based"),
    ("import flash_attn", "Tencent/HunyuanVideo"),
    ("import flash_attn as fa", "NVIDIA/Megatron-LM"),
    ("import flash_attn as flash_attn", "mosaicml/llm-foundry"),
    ("import flash_attn.flash_attn_interface as _fai", "modelscope/ms-swift"),
)

NOT_IN_FLASH_ATTN_2_8_3: tuple[tuple[str, str], ...] = (
    ("from flash_attn.cute import flash_attn_with_kvcache", "axolotl-ai-cloud/axolotl"),
    ("from flash_attn.cute.block_sparsity import BlockSparseTensorsTorch", "hao-ai-lab/FastVideo"),
    ("from flash_attn.cute.block_sparsity import fast_sampling", "hao-ai-lab/FastVideo"),
    ("from flash_attn.cute.flash_fwd_sm100_fp4 import FlashAttentionForwardSm100", "xdit-project/xDiT"),
    ("from flash_attn.cute.interface import _validate_head_dims", "axolotl-ai-cloud/axolotl"),
    (
        "from flash_attn.cute.interface import flash_attn_func as _flash_attn_func_v4, flash_attn_varlen_func as _flash_attn_varlen_func_v4, _validate_head_dims as _fa4_validate_head_dims",
        "NVIDIA/TransformerEngine",
    ),
    ("from flash_attn.flash_attn_interface import flash_attn_unpadded_func", "NVIDIA/NeMo"),
    ("from flash_attn.flash_attn_interface import flash_attn_unpadded_qkvpacked_func", "LLaVA-VL/LLaVA-NeXT"),
)
