// y = x W^T (+ b) in bfloat16 for CPUs with AVX512-BF16, on a copy of W packed once for it
// (pack_bf16): every forward of decoding (one token, a draft tree) and the prefill.
//
// The packed layout puts 16 outputs in the lanes of a register: packed[nb][kp][l][e] =
// W[16 nb + l][2 kp + e], zero-padded. One vdpbf16ps multiplies a broadcast pair of x
// (x[r][2kp], x[r][2kp+1]) by that pair of weights for 16 outputs and adds both products into
// their float32 sums, so an output is one lane summed down the whole row and no horizontal sum is
// ever needed. The row-major kernel this replaced summed each output in a 16-lane vector and
// reduced it at the end: at K = 576 the reductions and the scalar rounding cost about as much as
// the products, and 8 rows ran at 39 % of the vector units' peak; this one runs at 75-80 % in
// cache (docs/PERFORMANCE.md §3, "bfloat16 linear kernel").
//
// A tile is 3 output blocks (48 outputs) by up to 8 rows of x: 24 accumulators of AVX-512's 32
// registers, the 3 weight vectors and the broadcast. The 8-row groups of x run against the tile's
// weights in turn (the second group reads them from L2), and the first group prefetches the next
// tile's weights into L2: streaming the weights from memory and multiplying them do not overlap
// by themselves.
//
// Every y[m, n] is one lane's sum over kp in order, then + b[n], rounded once to bf16 (nearest
// even), whatever the number of rows, where row m falls and where output n sits in W: a token's
// result does not depend on how many tokens share the forward (batch invariance), and fused
// weights (q/k/v in one) give the same bits as separate ones. Compiled for AVX512-BF16 whatever the
// build machine's flags; the entry points refuse to run on a CPU without it.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cstring>

namespace racer {

bool cpu_has_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

using bf16_t = uint16_t;
constexpr int64_t kLanes = 16;   // outputs per block
constexpr int kBlocks = 3;       // output blocks per tile
constexpr int kRows = 8;         // rows of x per pass

// acc[r][b] += x[r] . W[block b] for NX rows and NB blocks of `p` (kp-major, 32 bf16 per kp);
// then y[r][n0 + 16 b + l] = bf16(acc + bias). With `pf`, the same bytes of the next tile are
// prefetched, one cache line per block per kp.
template <int NB, int NX>
inline void tile(const bf16_t* __restrict x, int64_t ldx, const bf16_t* __restrict p, int64_t KP,
                 bf16_t* __restrict y, int64_t ldy, int64_t n0, int64_t N, const float* bias, const bf16_t* pf) {
  __m512 acc[NX][NB];
#pragma GCC unroll 8
  for (int r = 0; r < NX; ++r)
#pragma GCC unroll 3
    for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_setzero_ps();
  for (int64_t kp = 0; kp < KP; ++kp) {
    if (pf) {
#pragma GCC unroll 3
      for (int b = 0; b < NB; ++b) _mm_prefetch(reinterpret_cast<const char*>(pf + (b * KP + kp) * 32), _MM_HINT_T1);
    }
    __m512bh wv[NB];
#pragma GCC unroll 3
    for (int b = 0; b < NB; ++b) wv[b] = (__m512bh)_mm512_loadu_si512(p + (b * KP + kp) * 32);
#pragma GCC unroll 8
    for (int r = 0; r < NX; ++r) {
      int32_t pair;
      std::memcpy(&pair, x + r * ldx + 2 * kp, sizeof(pair));
      const __m512bh xv = (__m512bh)_mm512_set1_epi32(pair);
#pragma GCC unroll 3
      for (int b = 0; b < NB; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xv, wv[b]);
    }
  }
#pragma GCC unroll 3
  for (int b = 0; b < NB; ++b) {
    const int64_t n = n0 + b * kLanes;
    const __mmask16 m = N - n >= kLanes ? (__mmask16)0xFFFF : (__mmask16)((1u << (N - n)) - 1);
    const __m512 bv = bias ? _mm512_maskz_loadu_ps(m, bias + n) : _mm512_setzero_ps();
#pragma GCC unroll 8
    for (int r = 0; r < NX; ++r) {
      const __m512 s = bias ? _mm512_add_ps(acc[r][b], bv) : acc[r][b];
      _mm256_mask_storeu_epi16(y + r * ldy + n, m, (__m256i)_mm512_cvtneps_pbh(s));
    }
  }
}

// All M rows of x against NB blocks starting at output n0, 8 rows a pass.
template <int NB>
inline void all_rows(const bf16_t* x, int64_t M, int64_t ldx, const bf16_t* p, int64_t KP, bf16_t* y, int64_t N,
                     int64_t n0, const float* bias, const bf16_t* pf) {
  int64_t m = 0;
  for (; m + kRows <= M; m += kRows)
    tile<NB, kRows>(x + m * ldx, ldx, p, KP, y + m * N, N, n0, N, bias, m == 0 ? pf : nullptr);
  if (m > 0) pf = nullptr;
  const bf16_t* xr = x + m * ldx;
  bf16_t* yr = y + m * N;
  switch (M - m) {
    case 7: tile<NB, 7>(xr, ldx, p, KP, yr, N, n0, N, bias, pf); break;
    case 6: tile<NB, 6>(xr, ldx, p, KP, yr, N, n0, N, bias, pf); break;
    case 5: tile<NB, 5>(xr, ldx, p, KP, yr, N, n0, N, bias, pf); break;
    case 4: tile<NB, 4>(xr, ldx, p, KP, yr, N, n0, N, bias, pf); break;
    case 3: tile<NB, 3>(xr, ldx, p, KP, yr, N, n0, N, bias, pf); break;
    case 2: tile<NB, 2>(xr, ldx, p, KP, yr, N, n0, N, bias, pf); break;
    case 1: tile<NB, 1>(xr, ldx, p, KP, yr, N, n0, N, bias, pf); break;
    default: break;
  }
}

#pragma GCC pop_options

torch::Tensor pack_bf16(const torch::Tensor& weight) {
  TORCH_CHECK(cpu_has_bf16(), "pack_bf16 needs a CPU with AVX512-BF16");
  TORCH_CHECK(weight.scalar_type() == torch::kBFloat16 && weight.dim() == 2 && weight.device().is_cpu(),
              "pack_bf16 takes a 2-D bfloat16 CPU weight");
  const auto w = weight.contiguous();
  const int64_t N = w.size(0), K = w.size(1), NB = (N + kLanes - 1) / kLanes, KP = (K + 1) / 2;
  auto packed = torch::zeros({NB, KP, 2 * kLanes}, w.options());
  const auto* src = reinterpret_cast<const bf16_t*>(w.data_ptr<at::BFloat16>());
  auto* dst = reinterpret_cast<bf16_t*>(packed.data_ptr<at::BFloat16>());
  at::parallel_for(0, NB, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t nb = b0; nb < b1; ++nb)
      for (int64_t l = 0; l < kLanes && nb * kLanes + l < N; ++l) {
        const bf16_t* row = src + (nb * kLanes + l) * K;
        bf16_t* out = dst + nb * KP * 2 * kLanes + 2 * l;
        for (int64_t k = 0; k < K; ++k) out[(k / 2) * 2 * kLanes + (k & 1)] = row[k];
      }
  });
  return packed;
}

torch::Tensor packed_linear_bf16(const torch::Tensor& x, const torch::Tensor& packed, int64_t n_out,
                                 const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(cpu_has_bf16(), "packed_linear_bf16 needs a CPU with AVX512-BF16");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && packed.scalar_type() == torch::kBFloat16,
              "packed_linear_bf16 takes bfloat16 tensors");
  TORCH_CHECK(x.device().is_cpu() && packed.device().is_cpu(), "packed_linear_bf16 runs on the CPU");
  TORCH_CHECK(packed.dim() == 3 && packed.size(2) == 2 * kLanes && packed.is_contiguous(),
              "packed_linear_bf16: the weight must come from pack_bf16");
  const int64_t N = n_out, NB = packed.size(0), KP = packed.size(1);
  TORCH_CHECK(N > (NB - 1) * kLanes && N <= NB * kLanes, "packed_linear_bf16: n_out does not match the packed weight");
  TORCH_CHECK(x.dim() >= 1 && (x.size(-1) + 1) / 2 == KP, "packed_linear_bf16: x's last dimension must equal the weight's second");
  const int64_t K = x.size(-1);
  // An odd K reads x in pairs: pad it with a zero column (the packed weight has one too).
  auto xs = x.contiguous();
  if (K % 2) xs = torch::constant_pad_nd(xs, {0, 1});
  const int64_t ldx = 2 * KP;
  const int64_t M = K ? x.numel() / K : 0;
  auto out_shape = x.sizes().vec();
  out_shape.back() = N;
  auto y = torch::empty({M, N}, x.options());
  torch::Tensor bf;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "packed_linear_bf16: bias must have one entry per output");
    bf = bias->to(torch::kFloat32).contiguous();
  }
  if (M > 0 && N > 0) {
    const auto* xp = reinterpret_cast<const bf16_t*>(xs.data_ptr<at::BFloat16>());
    const auto* pp = reinterpret_cast<const bf16_t*>(packed.data_ptr<at::BFloat16>());
    auto* yp = reinterpret_cast<bf16_t*>(y.data_ptr<at::BFloat16>());
    const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
    const int64_t tiles = (NB + kBlocks - 1) / kBlocks;
    const int64_t per_tile = kBlocks * KP * 2 * kLanes;
    at::parallel_for(0, tiles, 1, [&](int64_t t0, int64_t t1) {
      for (int64_t t = t0; t < t1; ++t) {
        const int64_t nb = t * kBlocks;
        const bf16_t* p = pp + t * per_tile;
        // Only a tile whose successor is a whole tile of this thread prefetches it.
        const bf16_t* pf = t + 1 < t1 && nb + 2 * kBlocks <= NB ? p + per_tile : nullptr;
        switch (std::min<int64_t>(kBlocks, NB - nb)) {
          case 3: all_rows<3>(xp, M, ldx, p, KP, yp, N, nb * kLanes, bp, pf); break;
          case 2: all_rows<2>(xp, M, ldx, p, KP, yp, N, nb * kLanes, bp, nullptr); break;
          default: all_rows<1>(xp, M, ldx, p, KP, yp, N, nb * kLanes, bp, nullptr); break;
        }
      }
    });
  }
  return y.view(out_shape);
}

}  // namespace racer
