// The TMA tensor maps of the sm_90a forward (kernels/csrc/hopper_fwd.cu): the arguments of one
// cuTensorMapEncodeTiled call for each of Q, K and V, from the call's FaParams and its tensors' extents.
// launch.cpp hands them to the driver; the CPU emulator (tests/emu) compiles this same header and hands
// them to its own encoder, so both run the kernel on the same maps. Header-only and dependency-free
// (params.h only): the caller turns a status into its own error.
//
// Each map is rank 4, innermost first: (column, row, head, batch) of a (batch, seqlen, heads, dim)
// tensor, or of a packed (total, heads, dim) one with a batch of 1 (varlen: the kernel adds the
// sequence's first row, attention.cuh's locate()). The box is one swizzle panel of the kernel's tile:
// panel_cols(bucket) columns (64: 128-byte rows and swizzle; 32 for head dim 96: 64-byte) by BLOCK_M (Q)
// or BLOCK_N (K, V) rows, one head, one batch; the kernel issues one copy per panel. Columns past the
// call's head dim and rows past the tensor's end are read as zeros (no OOB fill request), which the
// kernel relies on: a zero column adds nothing to Q K^T, and keys past a sequence's end are masked.
// A paged KV cache (block_table) is mapped as its pages: k/v (pages, page_block_size, heads_k, dim) is
// (column, row in page, head, page), the kernel taking a key block's page from the block table. Its pages
// must hold whole key blocks (page_block_size a multiple of BLOCK_N), so no box crosses a page; other page
// sizes are refused (kSplitPages) and the routing sends them to sm_90's unit, which reads any page size
// its own key block divides.
#ifndef FA_BINDING_TENSOR_MAPS_H_
#define FA_BINDING_TENSOR_MAPS_H_

#include <cstdint>

#include "params.h"

namespace fa_tensor_maps {

// cuda.h's enum values (CUtensorMapDataType, ...Interleave, ...Swizzle, ...L2promotion,
// ...FloatOOBfill), stable since CUDA 12.0.
constexpr int kDataTypeFloat16 = 6;
constexpr int kDataTypeBFloat16 = 9;
constexpr int kInterleaveNone = 0;
constexpr int kSwizzle64B = 2;
constexpr int kSwizzle128B = 3;
constexpr int kL2Promotion128B = 2;
constexpr int kOobFillNone = 0;  // out-of-bounds elements read as zeros

constexpr unsigned kRank = 4;
constexpr int kElemBytes = 2;
constexpr uint32_t kMaxBoxDim = 256;         // TMA's limit per box dimension
constexpr uint64_t kMaxStride = 1ull << 40;  // global strides are below 2^40 bytes, multiples of 16

// The arguments of one cuTensorMapEncodeTiled call (its parameter order).
struct Encode {
  int data_type;
  unsigned rank;
  const void* global_address;
  uint64_t global_dim[kRank];          // column, row, head, batch
  uint64_t global_strides[kRank - 1];  // bytes, of dims 1 .. 3 (dim 0 is contiguous)
  uint32_t box_dim[kRank];
  uint32_t element_strides[kRank];
  int interleave, swizzle, l2_promotion, oob_fill;
};

struct Maps {
  Encode q, k, v;
};

// What FaParams does not say: the element type and the tensors' extents (rows: seqlen of a padded
// tensor, total of a packed one; batches: dim 0 of a padded tensor, 1 for a packed one; k/v may hold
// more batch rows than the call's batch with kv_batch_idx; a paged k/v's rows are page_block_size and
// its batches the pages).
struct Source {
  bool bf16;
  int64_t q_rows, q_batches;
  int64_t k_rows, k_batches;
};

enum class Status {
  kOk,
  kSplitPages,  // block_table with pages that do not hold whole key blocks (use the sm_90 unit)
  kBadTile,     // bucket / block sizes the kernel does not build
  kUnaligned,   // a base address not a multiple of 16 bytes
  kBadStride,   // a stride not a multiple of 16 bytes, or >= 2^40
  kBadExtent,   // an extent < 1 or > 2^32
};

// Columns per swizzle panel for a head-dim bucket (hopper_fwd.cu kPanelCols).
constexpr int panel_cols(int bucket) { return bucket % 64 == 0 ? 64 : 32; }

// A packed tensor's batch dimension has extent 1: any valid stride will do; one past the whole tensor.
inline int64_t batch_stride_or_span(int64_t stride, int64_t batches, int64_t rows, int64_t row_stride) {
  return batches == 1 && (stride <= 0 || stride % 8 != 0) ? ((rows * row_stride + 7) / 8) * 8 : stride;
}

inline Status encode_one(const void* base, int64_t rows, int64_t batches, int64_t row_stride, int64_t head_stride,
                         int64_t batch_stride, int heads, const FaParams& p, bool bf16, int bucket,
                         int box_rows, Encode* out) {
  if (reinterpret_cast<uintptr_t>(base) % 16 != 0) return Status::kUnaligned;
  const int64_t dims[kRank] = {p.head_dim, rows, heads, batches};
  for (int64_t d : dims) {
    if (d < 1 || d > (int64_t{1} << 32)) return Status::kBadExtent;
  }
  const int64_t strides[kRank - 1] = {row_stride, head_stride,
                                       batch_stride_or_span(batch_stride, batches, rows, row_stride)};
  Encode e{};
  e.data_type = bf16 ? kDataTypeBFloat16 : kDataTypeFloat16;
  e.rank = kRank;
  e.global_address = base;
  for (unsigned i = 0; i < kRank; ++i) e.global_dim[i] = static_cast<uint64_t>(dims[i]);
  for (unsigned i = 0; i < kRank - 1; ++i) {
    const int64_t bytes = strides[i] * kElemBytes;
    // A dimension of extent 1 is never stepped over, but the driver checks its stride all the same.
    if (bytes <= 0 || bytes % 16 != 0 || static_cast<uint64_t>(bytes) >= kMaxStride) return Status::kBadStride;
    e.global_strides[i] = static_cast<uint64_t>(bytes);
  }
  const int cols = panel_cols(bucket);
  e.box_dim[0] = static_cast<uint32_t>(cols);
  e.box_dim[1] = static_cast<uint32_t>(box_rows);
  e.box_dim[2] = 1;
  e.box_dim[3] = 1;
  for (unsigned i = 0; i < kRank; ++i) e.element_strides[i] = 1;
  e.interleave = kInterleaveNone;
  e.swizzle = cols * kElemBytes == 128 ? kSwizzle128B : kSwizzle64B;
  e.l2_promotion = kL2Promotion128B;
  e.oob_fill = kOobFillNone;
  *out = e;
  return Status::kOk;
}

// Q's, K's and V's maps for hopper_fwd.cu built with (bucket, block_m, block_n).
inline Status hopper_maps(const FaParams& p, const Source& src, int bucket, int block_m, int block_n, Maps* out) {
  const bool bucket_ok = bucket == 64 || bucket == 96 || bucket == 128 || bucket == 192 || bucket == 256;
  if (!bucket_ok || block_m < 64 || block_m > static_cast<int>(kMaxBoxDim) || block_n < 16 ||
      block_n > static_cast<int>(kMaxBoxDim) || p.head_dim > bucket) {
    return Status::kBadTile;
  }
  if (p.block_table != nullptr && (p.page_block_size < 1 || p.page_block_size % block_n != 0)) {
    return Status::kSplitPages;
  }
  Maps m{};
  Status s = encode_one(p.q, src.q_rows, src.q_batches, p.q_row_stride, p.q_head_stride, p.q_batch_stride, p.heads,
                        p, src.bf16, bucket, block_m, &m.q);
  if (s != Status::kOk) return s;
  s = encode_one(p.k, src.k_rows, src.k_batches, p.k_row_stride, p.k_head_stride, p.k_batch_stride, p.heads_k, p,
                 src.bf16, bucket, block_n, &m.k);
  if (s != Status::kOk) return s;
  s = encode_one(p.v, src.k_rows, src.k_batches, p.v_row_stride, p.v_head_stride, p.v_batch_stride, p.heads_k, p,
                 src.bf16, bucket, block_n, &m.v);
  if (s != Status::kOk) return s;
  *out = m;
  return Status::kOk;
}

// The user-facing reason of a status (the binding adds the call's context).
inline const char* status_text(Status s) {
  switch (s) {
    case Status::kOk:
      return "ok";
    case Status::kSplitPages:
      return "the paged KV cache's pages do not hold whole key blocks of this unit; the sm_90 unit serves them";
    case Status::kBadTile:
      return "the unit's head-dim bucket or block sizes are not the sm_90a kernel's (reinstall fa-attn)";
    case Status::kUnaligned:
      return "q, k or v does not start on a 16-byte boundary";
    case Status::kBadStride:
      return "a stride of q, k or v is not a multiple of 8 elements (16 bytes) or is 2^40 bytes or more";
    case Status::kBadExtent:
      return "a dimension of q, k or v is empty or above 2^32";
  }
  return "unknown";
}

}  // namespace fa_tensor_maps

#endif  // FA_BINDING_TENSOR_MAPS_H_
