// y = x W^T (+ b) for float32 inputs of a few rows: the shapes of tree verification on a CPU.
//
// W is streamed once, in blocks of 12 rows. A block runs against the rows of x 4 at a time as
// four 3x4 tiles, and against the 1-3 rows left over as one 12x1, two 6x2 or three 4x3 tiles:
// every tile keeps 12 independent AVX2 accumulators, enough to hide FMA latency on both pipes
// whatever the number of rows (with 3-row weight tiles a 5-7-token tree ran its last rows on
// 3-9 accumulators and cost as much as 8 tokens). oneDNN and MKL spend tens of microseconds per
// call on shapes this small; measured in racer/cpu/linear.py's docstring.
//
// Every output y[m, n] is summed by the same operations in the same order whatever the tile
// shape, the number of rows and where row m falls, so a token's result does not depend on how
// many tokens share the forward (batch invariance).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

// External linkage in namespace racer: bindings.cpp exposes the entry points.
namespace racer {

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  s = _mm_add_ss(s, _mm_movehl_ps(sh, s));
  return _mm_cvtss_f32(s);
}

// y[r, j] = x[r] . w[j] for NX rows of x and NW rows of w. When pf is set, the tile also
// prefetches rows pf[0..NW) of W (the same rows of the next block) at the same k, one cache
// line per step pair.
template <int NW, int NX>
inline void tile(const float* __restrict x, const float* __restrict w, int64_t K, float* __restrict y,
                 int64_t ldy, const float* pf = nullptr) {
  __m256 acc[NX][NW];
#pragma GCC unroll 12
  for (int r = 0; r < NX; ++r)
#pragma GCC unroll 12
    for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    // 16 registers hold the 12 accumulators plus the operands of the narrower side, loaded
    // once per k step; the wider side streams through one more.
    if (pf && (k & 15) == 0) {
#pragma GCC unroll 12
      for (int j = 0; j < NW; ++j) _mm_prefetch(reinterpret_cast<const char*>(pf + j * K + k), _MM_HINT_T1);
    }
    if constexpr (NW <= NX) {
      __m256 wv[NW];
#pragma GCC unroll 12
      for (int j = 0; j < NW; ++j) wv[j] = _mm256_loadu_ps(w + j * K + k);
#pragma GCC unroll 12
      for (int r = 0; r < NX; ++r) {
        const __m256 xv = _mm256_loadu_ps(x + r * K + k);
#pragma GCC unroll 12
        for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_fmadd_ps(xv, wv[j], acc[r][j]);
      }
    } else {
      __m256 xv[NX];
#pragma GCC unroll 12
      for (int r = 0; r < NX; ++r) xv[r] = _mm256_loadu_ps(x + r * K + k);
#pragma GCC unroll 12
      for (int j = 0; j < NW; ++j) {
        const __m256 wv = _mm256_loadu_ps(w + j * K + k);
#pragma GCC unroll 12
        for (int r = 0; r < NX; ++r) acc[r][j] = _mm256_fmadd_ps(xv[r], wv, acc[r][j]);
      }
    }
  }
  for (int r = 0; r < NX; ++r)
    for (int j = 0; j < NW; ++j) {
      float s = hsum(acc[r][j]);
      for (int64_t k = K8; k < K; ++k) s += x[r * K + k] * w[j * K + k];
      y[r * ldy + j] = s;
    }
}

// All rows of x against NW consecutive rows of W in tiles of NW x 4, then NW x (1..3).
template <int NW>
inline void all_rows(const float* x, int64_t M, const float* w, int64_t K, float* y, int64_t N) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile<NW, 4>(x + m * K, w, K, y + m * N, N);
  switch (M - m) {
    case 3: tile<NW, 3>(x + m * K, w, K, y + m * N, N); break;
    case 2: tile<NW, 2>(x + m * K, w, K, y + m * N, N); break;
    case 1: tile<NW, 1>(x + m * K, w, K, y + m * N, N); break;
    default: break;
  }
}

// All rows of x against a block of 12 rows of W, every tile with 12 accumulators.
//
// Streaming W from memory and multiplying it did not overlap on their own: a 4-token forward's
// linear layers took about the single-token time plus the in-cache compute time. So the first
// pass over the block prefetches the next block (the following 12 rows, contiguous in W) into
// L2, and memory time hides behind compute: measured in racer/cpu/linear.py's docstring.
inline void block12(const float* x, int64_t M, const float* w, int64_t K, float* y, int64_t N,
                    bool prefetch_next) {
  const float* next = prefetch_next ? w + 12 * K : nullptr;
  int64_t m = 0;
  for (; m + 4 <= M; m += 4)
    for (int j = 0; j < 12; j += 3)
      tile<3, 4>(x + m * K, w + j * K, K, y + m * N + j, N, m == 0 && next ? next + j * K : nullptr);
  const float* xr = x + m * K;
  float* yr = y + m * N;
  const float* pf = m == 0 ? next : nullptr;
  switch (M - m) {
    case 3:
      for (int j = 0; j < 12; j += 4) tile<4, 3>(xr, w + j * K, K, yr + j, N, pf ? pf + j * K : nullptr);
      break;
    case 2:
      for (int j = 0; j < 12; j += 6) tile<6, 2>(xr, w + j * K, K, yr + j, N, pf ? pf + j * K : nullptr);
      break;
    case 1: tile<12, 1>(xr, w, K, yr, N, pf); break;
    default: break;
  }
}

torch::Tensor tiled_linear(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(x.scalar_type() == torch::kFloat32 && weight.scalar_type() == torch::kFloat32,
              "tiled_linear takes float32 tensors");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "tiled_linear runs on the CPU");
  TORCH_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
              "tiled_linear: x's last dimension must equal the weight's second");
  const auto xs = x.contiguous();
  const auto w = weight.contiguous();
  const int64_t K = w.size(1), N = w.size(0);
  const int64_t M = K ? xs.numel() / K : 0;
  auto out_shape = xs.sizes().vec();
  out_shape.back() = N;
  auto y = torch::empty({M, N}, xs.options());
  if (M > 0 && N > 0) {
    const float* xp = xs.data_ptr<float>();
    const float* wp = w.data_ptr<float>();
    float* yp = y.data_ptr<float>();
    constexpr int B = 12;
    at::parallel_for(0, (N + B - 1) / B, 2, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n = b * B;
        const int64_t rows = std::min<int64_t>(B, N - n);
        if (rows == B) {
          // Only a block whose successor is a whole block prefetches it, so reads stay in W.
          block12(xp, M, wp + n * K, K, yp + n, N, b + 1 < b1 && n + 2 * B <= N);
          continue;
        }
        // The last, partial block (N not a multiple of 12): 3-row tiles, then 2 or 1.
        int64_t j = 0;
        for (; j + 3 <= rows; j += 3) all_rows<3>(xp, M, wp + (n + j) * K, K, yp + n + j, N);
        if (rows - j == 2) all_rows<2>(xp, M, wp + (n + j) * K, K, yp + n + j, N);
        if (rows - j == 1) all_rows<1>(xp, M, wp + (n + j) * K, K, yp + n + j, N);
      }
    });
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "tiled_linear: bias must have one entry per output");
    y.add_(bias->to(torch::kFloat32).reshape({1, N}));
  }
  return y.view(out_shape);
}


// ---- bfloat16, for CPUs with AVX512-BF16 ------------------------------------------------------
//
// The same blocking as above on bf16 operands: one vdpbf16ps multiplies 32 bf16 pairs and adds
// them, pairwise, into 16 float32 lanes. AVX-512's 32 registers take tiles of 3 weight rows by up
// to 8 rows of x, so trees of 5-8 tokens stream each weight block once (whole forward 1.06-1.13x
// faster at T = 5-12 than 4-row passes, context 300, interleaved A/B, throwaway script). oneDNN's bf16 inner product spends about three times
// the weight-streaming time at one row (SmolLM2-135M, 2-core EPYC); this runs near it. Compiled
// for AVX512-BF16 whatever the build machine's flags; tiled_linear_bf16 refuses to run on a CPU
// without it (racer/cpu/linear.py checks before routing a layer here). Sums are float32, the
// output is rounded once to bf16 (nearest even), and every y[m, n] is summed in the same order
// whatever the number of rows: batch-invariant like the float32 kernel.
#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512bf16")

using bf16_t = uint16_t;

inline __m512bh bf_load(const bf16_t* p) { return (__m512bh)_mm512_loadu_si512(p); }
inline __m512bh bf_load_tail(const bf16_t* p, __mmask32 m) { return (__m512bh)_mm512_maskz_loadu_epi16(m, p); }

inline bf16_t to_bf16(float f) { return at::BFloat16(f).x; }

// y[r, j] = x[r] . w[j] (+ b[j]) for NX rows of x and NW rows of w, rounded to bf16. K steps of
// 32; pf as in tile(): one cache line (32 bf16) of each next-block row per step.
template <int NW, int NX>
inline void tile_bf16(const bf16_t* __restrict x, const bf16_t* __restrict w, int64_t K, bf16_t* __restrict y,
                      int64_t ldy, const float* b, const bf16_t* pf = nullptr) {
  __m512 acc[NX][NW];
#pragma GCC unroll 24
  for (int r = 0; r < NX; ++r)
#pragma GCC unroll 24
    for (int j = 0; j < NW; ++j) acc[r][j] = _mm512_setzero_ps();
  const int64_t K32 = K & ~int64_t(31);
  for (int64_t k = 0; k < K32; k += 32) {
    if (pf) {
#pragma GCC unroll 12
      for (int j = 0; j < NW; ++j) _mm_prefetch(reinterpret_cast<const char*>(pf + j * K + k), _MM_HINT_T1);
    }
    __m512bh wv[NW];
#pragma GCC unroll 12
    for (int j = 0; j < NW; ++j) wv[j] = bf_load(w + j * K + k);
#pragma GCC unroll 12
    for (int r = 0; r < NX; ++r) {
      const __m512bh xv = bf_load(x + r * K + k);
#pragma GCC unroll 12
      for (int j = 0; j < NW; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv, wv[j]);
    }
  }
  if (K32 < K) {
    const __mmask32 m = (__mmask32)((1ull << (K - K32)) - 1);
    for (int r = 0; r < NX; ++r) {
      const __m512bh xv = bf_load_tail(x + r * K + K32, m);
      for (int j = 0; j < NW; ++j) acc[r][j] = _mm512_dpbf16_ps(acc[r][j], xv, bf_load_tail(w + j * K + K32, m));
    }
  }
  for (int r = 0; r < NX; ++r)
    for (int j = 0; j < NW; ++j) {
      const float s = _mm512_reduce_add_ps(acc[r][j]);
      y[r * ldy + j] = to_bf16(b ? s + b[j] : s);
    }
}

template <int NW>
inline void all_rows_bf16(const bf16_t* x, int64_t M, const bf16_t* w, int64_t K, bf16_t* y, int64_t N,
                          const float* b) {
  int64_t m = 0;
  for (; m + 4 <= M; m += 4) tile_bf16<NW, 4>(x + m * K, w, K, y + m * N, N, b);
  switch (M - m) {
    case 3: tile_bf16<NW, 3>(x + m * K, w, K, y + m * N, N, b); break;
    case 2: tile_bf16<NW, 2>(x + m * K, w, K, y + m * N, N, b); break;
    case 1: tile_bf16<NW, 1>(x + m * K, w, K, y + m * N, N, b); break;
    default: break;
  }
}

// One pass of the 12-row weight block w against NX rows of x, as 12 / NW tiles; pf (the next
// block, or null) is prefetched along the way.
template <int NW, int NX>
inline void pass12_bf16(const bf16_t* x, const bf16_t* w, int64_t K, bf16_t* y, int64_t N, const float* b,
                        const bf16_t* pf) {
  for (int j = 0; j < 12; j += NW)
    tile_bf16<NW, NX>(x, w + j * K, K, y + j, N, b ? b + j : nullptr, pf ? pf + j * K : nullptr);
}

// As block12: 12 weight rows against all rows of x, the first pass prefetching the next block.
// Up to 8 rows a pass (3 x 8 accumulators of the 32 registers), so a tree of up to 8 tokens
// streams each weight block once.
inline void block12_bf16(const bf16_t* x, int64_t M, const bf16_t* w, int64_t K, bf16_t* y, int64_t N,
                         const float* b, bool prefetch_next) {
  const bf16_t* next = prefetch_next ? w + 12 * K : nullptr;
  int64_t m = 0;
  for (; m + 8 <= M; m += 8) pass12_bf16<3, 8>(x + m * K, w, K, y + m * N, N, b, m == 0 ? next : nullptr);
  const bf16_t* xr = x + m * K;
  bf16_t* yr = y + m * N;
  const bf16_t* pf = m == 0 ? next : nullptr;
  switch (M - m) {
    case 7: pass12_bf16<3, 7>(xr, w, K, yr, N, b, pf); break;
    case 6: pass12_bf16<3, 6>(xr, w, K, yr, N, b, pf); break;
    case 5: pass12_bf16<3, 5>(xr, w, K, yr, N, b, pf); break;
    case 4: pass12_bf16<3, 4>(xr, w, K, yr, N, b, pf); break;
    case 3: pass12_bf16<4, 3>(xr, w, K, yr, N, b, pf); break;
    case 2: pass12_bf16<6, 2>(xr, w, K, yr, N, b, pf); break;
    // One row is memory-bound: four 3-row passes streamed faster than one 12-row pass
    // (vocabulary projection 1.05-1.2x), the same sums in the same order.
    case 1: pass12_bf16<3, 1>(xr, w, K, yr, N, b, pf); break;
    default: break;
  }
}

void bf16_blocks(const bf16_t* xp, int64_t M, const bf16_t* wp, int64_t K, bf16_t* yp, int64_t N, const float* bp,
                 int64_t b0, int64_t b1) {
  constexpr int B = 12;
  for (int64_t blk = b0; blk < b1; ++blk) {
    const int64_t n = blk * B;
    const int64_t rows = std::min<int64_t>(B, N - n);
    const float* bb = bp ? bp + n : nullptr;
    if (rows == B) {
      block12_bf16(xp, M, wp + n * K, K, yp + n, N, bb, blk + 1 < b1 && n + 2 * B <= N);
      continue;
    }
    int64_t j = 0;
    for (; j + 3 <= rows; j += 3) all_rows_bf16<3>(xp, M, wp + (n + j) * K, K, yp + n + j, N, bb ? bb + j : nullptr);
    if (rows - j == 2) all_rows_bf16<2>(xp, M, wp + (n + j) * K, K, yp + n + j, N, bb ? bb + j : nullptr);
    if (rows - j == 1) all_rows_bf16<1>(xp, M, wp + (n + j) * K, K, yp + n + j, N, bb ? bb + j : nullptr);
  }
}

#pragma GCC pop_options

bool cpu_has_bf16() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw");
}

torch::Tensor tiled_linear_bf16(const torch::Tensor& x, const torch::Tensor& weight,
                                const c10::optional<torch::Tensor>& bias) {
  TORCH_CHECK(cpu_has_bf16(), "tiled_linear_bf16 needs a CPU with AVX512-BF16");
  TORCH_CHECK(x.scalar_type() == torch::kBFloat16 && weight.scalar_type() == torch::kBFloat16,
              "tiled_linear_bf16 takes bfloat16 tensors");
  TORCH_CHECK(x.device().is_cpu() && weight.device().is_cpu(), "tiled_linear_bf16 runs on the CPU");
  TORCH_CHECK(weight.dim() == 2 && x.dim() >= 1 && x.size(-1) == weight.size(1),
              "tiled_linear_bf16: x's last dimension must equal the weight's second");
  const auto xs = x.contiguous();
  const auto w = weight.contiguous();
  const int64_t K = w.size(1), N = w.size(0);
  const int64_t M = K ? xs.numel() / K : 0;
  auto out_shape = xs.sizes().vec();
  out_shape.back() = N;
  auto y = torch::empty({M, N}, xs.options());
  torch::Tensor bf;
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "tiled_linear_bf16: bias must have one entry per output");
    bf = bias->to(torch::kFloat32).contiguous();
  }
  if (M > 0 && N > 0) {
    const auto* xp = reinterpret_cast<const bf16_t*>(xs.data_ptr<at::BFloat16>());
    const auto* wp = reinterpret_cast<const bf16_t*>(w.data_ptr<at::BFloat16>());
    auto* yp = reinterpret_cast<bf16_t*>(y.data_ptr<at::BFloat16>());
    const float* bp = bf.defined() ? bf.data_ptr<float>() : nullptr;
    at::parallel_for(0, (N + 11) / 12, 2, [&](int64_t b0, int64_t b1) { bf16_blocks(xp, M, wp, K, yp, N, bp, b0, b1); });
  }
  return y.view(out_shape);
}

}  // namespace racer
