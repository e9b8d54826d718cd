"""flash-attn 2.8.3's signatures, recorded from its source at tag v2.8.3 (flash_attn/flash_attn_interface.py,
flash_attn/layers/rotary.py, flash_attn/bert_padding.py, flash_attn/modules/mha.py, and
csrc/flash_attn/flash_api.cpp for the compiled extension's functions, which take their arguments by
position). Facts, not code: each function
is its parameters in order, a parameter (name, default) with REQUIRED where it has none."""

from __future__ import annotations

REQUIRED = object()
R = REQUIRED

_PADDED_OPTIONS = [
    ("dropout_p", 0.0), ("softmax_scale", None), ("causal", False), ("window_size", (-1, -1)),
    ("softcap", 0.0), ("alibi_slopes", None), ("deterministic", False), ("return_attn_probs", False),
]  # fmt: skip
_VARLEN_Q_K = [("cu_seqlens_q", R), ("cu_seqlens_k", R), ("max_seqlen_q", R), ("max_seqlen_k", R)]
# The two private backwards (padded and varlen) take the same tensors first and the same options last.
_BWD_TENSORS = [
    ("dout", R), ("q", R), ("k", R), ("v", R), ("out", R), ("softmax_lse", R), ("dq", R), ("dk", R), ("dv", R),
]  # fmt: skip
_BWD_OPTIONS = [
    ("dropout_p", R), ("softmax_scale", R), ("causal", R), ("window_size_left", R), ("window_size_right", R),
    ("softcap", R), ("alibi_slopes", R), ("deterministic", R), ("rng_state", None),
]  # fmt: skip

# layer_norm_fn's; rms_norm_fn takes the same but is_rms_norm (it passes True).
_LAYER_NORM_FN = [
    ("x", R),
    ("weight", R),
    ("bias", R),
    ("residual", None),
    ("x1", None),
    ("weight1", None),
    ("bias1", None),
    ("eps", 1e-6),
    ("dropout_p", 0.0),
    ("rowscale", None),
    ("prenorm", False),
    ("residual_in_fp32", False),
    ("zero_centered_weight", False),
    ("is_rms_norm", False),
    ("return_dropout_mask", False),
    ("out_dtype", None),
    ("out", None),
    ("residual_out", None),
]

# layer_norm_ref's and rms_norm_ref's (flash-attn's unfused references).
_NORM_REF = [
    *_LAYER_NORM_FN[:11], ("zero_centered_weight", False), ("dropout_mask", None), ("dropout_mask1", None),
    ("upcast", False),
]  # fmt: skip

SIGNATURES: dict[str, dict[str, list[tuple[str, object]]]] = {
    "flash_attn.flash_attn_interface": {
        "flash_attn_func": [("q", R), ("k", R), ("v", R), *_PADDED_OPTIONS],
        "flash_attn_qkvpacked_func": [("qkv", R), *_PADDED_OPTIONS],
        "flash_attn_kvpacked_func": [("q", R), ("kv", R), *_PADDED_OPTIONS],
        "flash_attn_varlen_func": [
            ("q", R),
            ("k", R),
            ("v", R),
            *_VARLEN_Q_K,
            *_PADDED_OPTIONS,
            ("block_table", None),
        ],
        "flash_attn_varlen_qkvpacked_func": [
            ("qkv", R),
            ("cu_seqlens", R),
            ("max_seqlen", R),
            *_PADDED_OPTIONS,
        ],
        "flash_attn_varlen_kvpacked_func": [("q", R), ("kv", R), *_VARLEN_Q_K, *_PADDED_OPTIONS],
        "flash_attn_with_kvcache": [
            ("q", R),
            ("k_cache", R),
            ("v_cache", R),
            ("k", None),
            ("v", None),
            ("rotary_cos", None),
            ("rotary_sin", None),
            ("cache_seqlens", None),
            ("cache_batch_idx", None),
            ("cache_leftpad", None),
            ("block_table", None),
            ("softmax_scale", None),
            ("causal", False),
            ("window_size", (-1, -1)),
            ("softcap", 0.0),
            ("rotary_interleaved", True),
            ("alibi_slopes", None),
            ("num_splits", 0),
            ("return_softmax_lse", False),
        ],
        "_flash_attn_forward": [
            ("q", R),
            ("k", R),
            ("v", R),
            ("dropout_p", R),
            ("softmax_scale", R),
            ("causal", R),
            ("window_size_left", R),
            ("window_size_right", R),
            ("softcap", R),
            ("alibi_slopes", R),
            ("return_softmax", R),
        ],
        "_flash_attn_varlen_forward": [
            ("q", R),
            ("k", R),
            ("v", R),
            *_VARLEN_Q_K,
            ("dropout_p", R),
            ("softmax_scale", R),
            ("causal", R),
            ("window_size_left", -1),
            ("window_size_right", -1),
            ("softcap", 0.0),
            ("alibi_slopes", None),
            ("return_softmax", False),
            ("block_table", None),
            ("leftpad_k", None),
            ("seqused_k", None),
            ("zero_tensors", False),
        ],
        "_flash_attn_backward": [*_BWD_TENSORS, *_BWD_OPTIONS],
        "_flash_attn_varlen_backward": [*_BWD_TENSORS, *_VARLEN_Q_K, *_BWD_OPTIONS, ("zero_tensors", False)],
    },
    "flash_attn.layers.rotary": {
        "apply_rotary_emb_torch": [("x", R), ("cos", R), ("sin", R), ("interleaved", False)],
        "rotate_half": [("x", R), ("interleaved", False)],
        "apply_rotary_emb_qkv_": [
            ("qkv", R),
            ("cos", R),
            ("sin", R),
            ("cos_k", None),
            ("sin_k", None),
            ("interleaved", False),
            ("seqlen_offsets", 0),
            ("num_heads_q", None),
        ],
        "apply_rotary_emb_kv_": [
            ("kv", R),
            ("cos", R),
            ("sin", R),
            ("interleaved", False),
            ("seqlen_offsets", 0),
        ],
        "apply_rotary_emb": [
            ("x", R),
            ("cos", R),
            ("sin", R),
            ("interleaved", False),
            ("inplace", False),
            ("seqlen_offsets", 0),
            ("cu_seqlens", None),
            ("max_seqlen", None),
        ],
    },
    "flash_attn.ops.triton.layer_norm": {
        "layer_norm_fn": _LAYER_NORM_FN,
        "rms_norm_fn": [p for p in _LAYER_NORM_FN if p[0] != "is_rms_norm"],
        "layer_norm_ref": _NORM_REF,
        "rms_norm_ref": _NORM_REF,
        "layer_norm_linear_fn": [
            ("x", R),
            ("norm_weight", R),
            ("norm_bias", R),
            ("linear_weight", R),
            ("linear_bias", R),
            ("residual", None),
            ("eps", 1e-6),
            ("prenorm", False),
            ("residual_in_fp32", False),
            ("is_rms_norm", False),
        ],
    },
    "flash_attn.ops.triton.rotary": {
        "apply_rotary": [
            ("x", R),
            ("cos", R),
            ("sin", R),
            ("seqlen_offsets", 0),
            ("cu_seqlens", None),
            ("max_seqlen", None),
            ("interleaved", False),
            ("inplace", False),
            ("conjugate", False),
        ],
    },
    "flash_attn.bert_padding": {
        "pad_input": [("hidden_states", R), ("indices", R), ("batch", R), ("seqlen", R)],
        "unpad_input": [("hidden_states", R), ("attention_mask", R), ("unused_mask", None)],
        "unpad_input_for_concatenated_sequences": [("hidden_states", R), ("attention_mask_in_length", R)],
    },
}

# The compiled extension (flash_attn_interface.flash_attn_gpu): pybind11 functions called by position,
# so the count and order are the contract. Names as in flash_api.cpp.
EXTENSION: dict[str, list[str]] = {
    "fwd": [
        "q", "k", "v", "out_", "alibi_slopes_", "p_dropout", "softmax_scale", "is_causal", "window_size_left",
        "window_size_right", "softcap", "return_softmax", "gen_",
    ],
    "varlen_fwd": [
        "q", "k", "v", "out_", "cu_seqlens_q", "cu_seqlens_k", "seqused_k", "leftpad_k_", "block_table_",
        "alibi_slopes_", "max_seqlen_q", "max_seqlen_k", "p_dropout", "softmax_scale", "zero_tensors",
        "is_causal", "window_size_left", "window_size_right", "softcap", "return_softmax", "gen_",
    ],
    "bwd": [
        "dout", "q", "k", "v", "out", "softmax_lse", "dq_", "dk_", "dv_", "alibi_slopes_", "p_dropout",
        "softmax_scale", "is_causal", "window_size_left", "window_size_right", "softcap", "deterministic",
        "gen_", "rng_state",
    ],
    "varlen_bwd": [
        "dout", "q", "k", "v", "out", "softmax_lse", "dq_", "dk_", "dv_", "cu_seqlens_q", "cu_seqlens_k",
        "alibi_slopes_", "max_seqlen_q", "max_seqlen_k", "p_dropout", "softmax_scale", "zero_tensors",
        "is_causal", "window_size_left", "window_size_right", "softcap", "deterministic", "gen_", "rng_state",
    ],
    "fwd_kvcache": [
        "q", "kcache", "vcache", "k_", "v_", "seqlens_k_", "rotary_cos_", "rotary_sin_", "cache_batch_idx_",
        "leftpad_k_", "block_table_", "alibi_slopes_", "out_", "softmax_scale", "is_causal",
        "window_size_left", "window_size_right", "softcap", "is_rotary_interleaved", "num_splits",
    ],
}  # fmt: skip

# Classes: their constructors and forward, (name, default) after self.
CLASSES: dict[str, dict[str, list[tuple[str, object]]]] = {
    "flash_attn.layers.rotary.RotaryEmbedding": {
        "__init__": [("dim", R), ("base", 10000.0), ("interleaved", False), ("scale_base", None), ("device", None)],
        "forward": [("qkv", R), ("kv", None), ("seqlen_offset", 0), ("max_seqlen", None), ("num_heads_q", None)],
    },
    "flash_attn.ops.triton.layer_norm.RMSNorm": {
        "__init__": [
            ("hidden_size", R), ("eps", 1e-5), ("dropout_p", 0.0), ("zero_centered_weight", False),
            ("device", None), ("dtype", None),
        ],
        "forward": [("x", R), ("residual", None), ("prenorm", False), ("residual_in_fp32", False)],
    },
    "flash_attn.losses.cross_entropy.CrossEntropyLoss": {
        "__init__": [
            ("ignore_index", -100), ("reduction", "mean"), ("label_smoothing", 0.0), ("logit_scale", 1.0),
            ("lse_square_scale", 0.0), ("inplace_backward", False), ("process_group", None),
            ("return_z_loss", False),
        ],
        "forward": [("input", R), ("target", R), ("precomputed_lse", None)],
    },
    "flash_attn.modules.mha.MHA": {
        "__init__": [
            ("embed_dim", R), ("num_heads", R), ("num_heads_kv", None), ("cross_attn", False),
            ("qkv_proj_bias", True), ("out_proj_bias", True), ("dropout", 0.0), ("softmax_scale", None),
            ("causal", False), ("layer_idx", None), ("dwconv", False), ("rotary_emb_dim", 0),
            ("rotary_emb_base", 10000.0), ("rotary_emb_scale_base", None), ("rotary_emb_interleaved", False),
            ("use_alibi", False), ("window_size", (-1, -1)), ("fused_bias_fc", False), ("use_flash_attn", False),
            ("return_residual", False), ("checkpointing", False), ("device", None), ("dtype", None),
        ],
        # ("kwargs", R) is **kwargs (test_flash_attn_mha checks its kind)
        "forward": [
            ("x", R), ("x_kv", None), ("key_padding_mask", None), ("cu_seqlens", None), ("max_seqlen", None),
            ("mixer_subset", None), ("inference_params", None), ("kwargs", R),
        ],
        "allocate_inference_cache": [("batch_size", R), ("max_seqlen", R), ("dtype", None)],
    },
    "flash_attn.modules.mha.FlashSelfAttention": {
        "__init__": [
            ("causal", False), ("softmax_scale", None), ("attention_dropout", 0.0), ("window_size", (-1, -1)),
            ("alibi_slopes", None), ("deterministic", False),
        ],
        "forward": [("qkv", R), ("causal", None), ("cu_seqlens", None), ("max_seqlen", None)],
    },
    "flash_attn.modules.mha.FlashCrossAttention": {
        "__init__": [
            ("causal", False), ("softmax_scale", None), ("attention_dropout", 0.0), ("alibi_slopes", None),
            ("window_size", (-1, -1)), ("deterministic", False),
        ],
        "forward": [
            ("q", R), ("kv", R), ("causal", None), ("cu_seqlens", None), ("max_seqlen", None),
            ("cu_seqlens_k", None), ("max_seqlen_k", None),
        ],
    },
    "flash_attn.modules.mha.SelfAttention": {
        "__init__": [("causal", False), ("softmax_scale", None), ("attention_dropout", 0.0)],
        "forward": [("qkv", R), ("causal", None), ("key_padding_mask", None)],
    },
    "flash_attn.modules.mha.CrossAttention": {
        "__init__": [("causal", False), ("softmax_scale", None), ("attention_dropout", 0.0)],
        "forward": [("q", R), ("kv", R), ("causal", None), ("key_padding_mask", None)],
    },
}  # fmt: skip
