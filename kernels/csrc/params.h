// The one struct that crosses from the host binding to the device kernels.
//
// Plain C: the binding (host C++, compiled against torch headers) and the kernels (device-only CUDA C++,
// compiled by NVRTC) both include this file, so it must not include anything and must lay out the same
// on both sides (only fixed-width fields, 8-byte fields first). Every kernel takes a single
// `const FaParams` by value (`__grid_constant__` where the arch supports it).
//
// Layouts are flash-attn's: q (batch, seqlen_q, heads, dim), k/v (batch, seqlen_k, heads_k, dim);
// varlen packs (total, heads, dim) with int32 cu_seqlens of length batch + 1. Strides are in elements.
#ifndef FA_PARAMS_H_
#define FA_PARAMS_H_

#ifdef __CUDACC_RTC__
typedef long long fa_i64;
typedef int fa_i32;
#else
#include <stdint.h>
typedef int64_t fa_i64;
typedef int32_t fa_i32;
#endif

typedef struct FaParams {
  // Forward inputs/outputs (fp16 or bf16 as compiled; lse is fp32 (batch, heads, seqlen_q), or
  // (heads, total_q) for varlen).
  const void* q;
  const void* k;
  const void* v;
  void* o;
  float* lse;

  // Backward only (null in forward). dq_accum is fp32 (batch, seqlen_q_rounded, heads, dim_rounded)
  // or (total_q + 128 * batch, heads, dim_rounded) for varlen, dim_rounded = the compiled head-dim
  // bucket (FA_HEAD_DIM), laid out by bwd.cu (dq_index) in 16-row groups. dsoftmax_sum is fp32
  // rowsum(dO * O): (batch, heads, seqlen_q_rounded), or for varlen (heads, total_q) indexed like lse
  // (an allocation of (heads, total_q + 128 * batch) is fine: the tail is unused). dk/dv are per
  // *query* head when heads != heads_k (the binding sums the groups). bwd.cu's header has the details.
  const void* dout;
  void* dq;
  void* dk;
  void* dv;
  float* dq_accum;
  float* dsoftmax_sum;

  // Varlen: null for padded batches.
  const fa_i32* cu_seqlens_q;
  const fa_i32* cu_seqlens_k;

  // Split-KV forward only (fa_fwd_splitkv / fa_fwd_combine; null otherwise): fp32 partials of each
  // of num_splits shares of the keys. Split s keeps query row r's output, normalised by the split's
  // own sum, at o_accum[(s * lse_rows + i) * FA_HEAD_DIM ...] and its log-sum-exp (-inf: no key) at
  // lse_accum[s * lse_rows + i], where i is r's index in lse and lse_rows = batch * heads * seqlen_q
  // (varlen: heads * total_q): (num_splits, <lse's shape>, FA_HEAD_DIM) and (num_splits, <lse's
  // shape>), contiguous.
  float* o_accum;
  float* lse_accum;

  // The KV-cache layouts of the forward and split-KV forward (null: absent; the backward takes none).
  // All int32 on q's device, indexed by the batch index b:
  //   seqused_k     keys of sequence b counted from its row 0 (its cache length): seqlen_k, or
  //                 cu_seqlens_k's difference for varlen, is replaced by seqused_k[b]
  //   leftpad_k     the first key of sequence b: keys [leftpad_k[b], end) are attended, end from
  //                 seqused_k or seqlen_k; k/v row leftpad_k[b] is key 0 (not with block_table)
  //   kv_batch_idx  the k/v batch row of sequence b (padded k/v only; k/v may have more rows)
  //   block_table   (batch, >= ceil(keys / page_block_size)) page indices, row stride
  //                 block_table_batch_stride: k/v are (num_pages, page_block_size, heads_k, dim)
  //                 and key t of sequence b is row t % page_block_size of page
  //                 block_table[b][t / page_block_size]; the k/v batch strides step over pages.
  //                 page_block_size is a multiple of the key block, so a key block is in one page.
  const fa_i32* seqused_k;
  const fa_i32* leftpad_k;
  const fa_i32* kv_batch_idx;
  const fa_i32* block_table;

  fa_i64 q_batch_stride, q_row_stride, q_head_stride;
  fa_i64 k_batch_stride, k_row_stride, k_head_stride;
  fa_i64 v_batch_stride, v_row_stride, v_head_stride;
  fa_i64 o_batch_stride, o_row_stride, o_head_stride;
  fa_i64 do_batch_stride, do_row_stride, do_head_stride;
  fa_i64 dq_batch_stride, dq_row_stride, dq_head_stride;
  fa_i64 dk_batch_stride, dk_row_stride, dk_head_stride;
  fa_i64 dv_batch_stride, dv_row_stride, dv_head_stride;
  fa_i64 block_table_batch_stride;  // elements between rows of block_table

  fa_i32 batch;
  fa_i32 heads;      // query heads
  fa_i32 heads_k;    // key/value heads; heads % heads_k == 0
  fa_i32 head_dim;   // actual head dim (multiple of 8, <= the compiled FA_HEAD_DIM)
  fa_i32 seqlen_q;   // max over the batch for varlen
  fa_i32 seqlen_k;   // k/v's dim 1; max over the batch for varlen; keys per sequence with block_table
  fa_i32 seqlen_q_rounded;  // multiple of 128, for lse / dsoftmax_sum / dq_accum
  fa_i32 seqlen_k_rounded;  // multiple of 128
  fa_i32 is_causal;         // bottom-right aligned when seqlen_q != seqlen_k
  fa_i32 window_left;       // -1: unbounded (sliding window; -1/-1 when off)
  fa_i32 window_right;
  fa_i32 num_splits;        // split-KV forward: shares of the key blocks (>= 1); unused elsewhere
  fa_i32 page_block_size;   // keys per page with block_table; 0 otherwise

  float scale_softmax;       // usually 1/sqrt(head_dim)
  float scale_softmax_log2;  // scale_softmax * log2(e)
  float softcap;             // 0: off
} FaParams;

#endif  // FA_PARAMS_H_
