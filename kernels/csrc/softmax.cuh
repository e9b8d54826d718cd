// The softmax stages of the forward kernels, over fp32 score fragments in registers: shared by the
// FA2-class forward (fwd.cu, mma.sync) and the sm_90a forward (hopper_fwd.cu, wgmma), whose
// accumulators have the same per-warp layout.
//
// A warp's scores are S[MT][ST][4]: MT 16-row m-tiles x ST 8-key n-tiles, element (mt, j, 2 hh + e)
// at row 16 mt + g + 8 hh and key 8 j + 2 t + e (g = lane / 4, t = lane % 4). That is mma.m16n8k16's C
// layout (fwd.cu) and, with MT = 1, each warp's 16 rows of a wgmma m64nNk16 fp32 accumulator
// (PTX ISA "Register Fragments of wgmma .m64nNk16": warp w of the warpgroup holds rows 16 w .. 16 w + 15
// in that same pattern). The output accumulator O[MT][OT][4] is laid out alike over head-dim columns.
#ifndef FA_SOFTMAX_CUH_
#define FA_SOFTMAX_CUH_

#include "attention.cuh"  // Band

namespace fa {

// The running softmax of a warp's rows g and g + 8 of each m-tile: the raw-logit max so far and this
// thread's partial sum of exp (reduced over the quad only at the end: reduce_sums).
template <int MT>
struct SoftmaxRows {
  float max[MT][2];
  float sum[MT][2];

  FA_DEVICE void start() {
#pragma unroll
    for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
        max[mt][hh] = -pos_inf();
        sum[mt][hh] = 0.f;
      }
    }
  }
};

// logit = softcap * tanh(S * scale / softcap); the outer softcap is folded into the exponent's scale.
template <int MT, int ST>
FA_DEVICE void apply_softcap(float (&s)[MT][ST][4], float tanh_scale) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < ST; ++j) {
#pragma unroll
      for (int e = 0; e < 4; ++e) s[mt][j][e] = tanh_approx(s[mt][j][e] * tanh_scale);
    }
  }
}

// S = -inf where the band hides the key. `row` is this warp's first row in the sequence. Element
// (mt, j, 2 hh + e) of this thread is key key0 + 2t + 8j + e of row row + g + 16 mt + 8 hh, visible
// iff the key is < seqlen_k and -left <= key - row - diag <= right: two thread constants and
// compile-time offsets, so the mask costs few registers. Selects, not branches: a branch per element
// would split the unrolled body into hundreds of basic blocks.
template <int MT, int ST>
FA_DEVICE void apply_mask(float (&s)[MT][ST][4], const Band& band, int row, int key0, int seqlen_k, int lane) {
  const int g = lane >> 2, t = lane & 3;
  constexpr int kFar = 1 << 30;  // an unbounded side (Band::of keeps |key - row - diag| below it)
  const int keys_left = seqlen_k - key0 - 2 * t;  // visible iff 8j + e < keys_left
  const int offset = key0 + 2 * t - (row + g) - band.diag;
  const int lo = band.left < 0 ? -kFar : -band.left;
  const int hi = band.right < 0 ? kFar : band.right;
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int j = 0; j < ST; ++j) {
#pragma unroll
      for (int hh = 0; hh < 2; ++hh) {
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int rel = offset + 8 * j + e - 16 * mt - 8 * hh;
          float& x = s[mt][j][2 * hh + e];
          x = (8 * j + e < keys_left) & (rel >= lo) & (rel <= hi) ? x : -pos_inf();
        }
      }
    }
  }
}

// The online softmax's row step, O aside: the new row max, S replaced by P = exp2(logit2 - max2) with
// logit2 = S * logit_scale, the running sum rescaled and extended; corr[mt][hh] = exp2(old - new) is
// the factor O's rows take (rescale_output), separately so that a kernel whose O is still being written
// by an asynchronous MMA (hopper_fwd.cu) computes P first and rescales O after the MMA's wait.
template <int MT, int ST>
FA_DEVICE void softmax_rows(float (&s)[MT][ST][4], SoftmaxRows<MT>& st, float logit_scale, float (&corr)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) {
      float mx = st.max[mt][hh];
#pragma unroll
      for (int j = 0; j < ST; ++j) mx = fmax2(mx, fmax2(s[mt][j][2 * hh], s[mt][j][2 * hh + 1]));
      mx = quad_max(mx);
      // A row with nothing visible so far keeps max -inf; subtracting 0 instead keeps exp2 at 0 rather
      // than NaN (-inf - -inf).
      const float max2 = mx == -pos_inf() ? 0.f : mx * logit_scale;
      const float correction = exp2_approx(st.max[mt][hh] * logit_scale - max2);
      st.max[mt][hh] = mx;
      corr[mt][hh] = correction;
      float sum = st.sum[mt][hh] * correction;
#pragma unroll
      for (int j = 0; j < ST; ++j) {
#pragma unroll
        for (int e = 2 * hh; e < 2 * hh + 2; ++e) {
          const float p = exp2_approx(s[mt][j][e] * logit_scale - max2);
          s[mt][j][e] = p;
          sum += p;
        }
      }
      st.sum[mt][hh] = sum;
    }
  }
}

// O's rows times their softmax_rows correction.
template <int MT, int OT>
FA_DEVICE void rescale_output(float (&o)[MT][OT][4], const float (&corr)[MT][2]) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int n = 0; n < OT; ++n) {
#pragma unroll
      for (int e = 0; e < 4; ++e) o[mt][n][e] *= corr[mt][e >> 1];
    }
  }
}

// The online softmax step: softmax_rows, then O rescaled at once.
template <int MT, int ST, int OT>
FA_DEVICE void online_softmax(float (&s)[MT][ST][4], float (&o)[MT][OT][4], SoftmaxRows<MT>& st, float logit_scale) {
  float corr[MT][2];
  softmax_rows(s, st, logit_scale, corr);
  rescale_output(o, corr);
}

// Row sums reduced over the quad; afterwards st.sum holds this thread's rows' sums (g and g + 8 of
// each m-tile).
template <int MT>
FA_DEVICE void reduce_sums(SoftmaxRows<MT>& st) {
#pragma unroll
  for (int mt = 0; mt < MT; ++mt) {
#pragma unroll
    for (int hh = 0; hh < 2; ++hh) st.sum[mt][hh] = quad_sum(st.sum[mt][hh]);
  }
}

// The row's log-sum-exp (natural log) from its final max and reduced sum; `empty` for a row that saw
// no key (+inf for the output's lse, -inf for a split-KV partial's).
FA_DEVICE float row_lse(float max, float sum, float logit_scale, float empty) {
  return sum > 0.f ? (max * logit_scale + log2_approx(sum)) * kLn2 : empty;
}

}  // namespace fa

#endif  // FA_SOFTMAX_CUH_
