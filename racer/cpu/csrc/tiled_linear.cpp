// y = x W^T (+ b) for float32 inputs of a few rows: the shapes of tree verification on a CPU.
//
// W is streamed once, in blocks of 12 rows. A block runs against the rows of x 4 at a time as
// four 3x4 tiles, and against the 1-3 rows left over as one 12x1, two 6x2 or three 4x3 tiles:
// every tile keeps 12 independent AVX2 accumulators, enough to hide FMA latency on both pipes
// whatever the number of rows (with 3-row weight tiles a 5-7-token tree ran its last rows on
// 3-9 accumulators and cost as much as 8 tokens). From 5 rows at K <= TILE_MAJOR_MAX_K the block
// runs tile by tile instead, the 1-3 rows left on 3-9 accumulators after all, which the tile
// staying in L1 more than pays for (block12). oneDNN and MKL spend tens of microseconds per call
// on shapes this small; measured in racer/cpu/linear.py's docstring.
//
// Every output y[m, n] is summed by the same operations in the same order whatever the tile
// shape, the number of rows and where row m falls, so a token's result does not depend on how
// many tokens share the forward (batch invariance).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

// External linkage in namespace racer: bindings.cpp exposes the entry points.
namespace racer {

// Up to this K, a 3-row tile of W, the next tile and 4 rows of x (10 rows of K floats, 24 KiB at
// K = 614) fit in a 32 KiB L1 beside the rest, so a product of 5 rows or more can keep each tile in
// L1 for all its passes (block12). The default model's down projection (K = 1536) cannot.
constexpr int64_t TILE_MAJOR_MAX_K = 640;

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  s = _mm_add_ss(s, _mm_movehl_ps(sh, s));
  return _mm_cvtss_f32(s);
}

// How a tile prefetches rows w[0..NW) of the next block while it multiplies: `at(k, K)` runs at
// each k step of 8 floats. With one pass over the block, every line of those rows, one per pair of
// k steps, addressed by the tile's own k. Non-temporal (into L1 only on AMD): one pass reads each
// weight once, and a hint into L2 sent the whole 538 MB of a float32 forward through L2 and L3,
// evicting the KV cache and everything Python and PyTorch touch between the products. With NTA a
// verify forward of 1-4 tokens ran 1.07-1.17x faster on an AVX2 Zen 1 (racer/cpu/linear.py).
struct EveryLine {
  const float* w = nullptr;
  template <int NW>
  inline void at(int64_t k, int64_t K) {
    if (w && (k & 15) == 0) {
#pragma GCC unroll 12
      for (int j = 0; j < NW; ++j) _mm_prefetch(reinterpret_cast<const char*>(w + j * K + k), _MM_HINT_NTA);
    }
  }
};

// With several passes, pass p fetches its share of each row's lines, [line, end), one line every
// `every` k steps, so the fetching spreads over all the passes; HINT says into which cache.
template <_mm_hint HINT = _MM_HINT_T1>
struct ShareOfLines {
  const float* w = nullptr;
  int64_t every = 2, line = 0, end = 0, due = 0;
  template <int NW>
  inline void at(int64_t, int64_t K) {
    if (w && due-- == 0) {
      due = every - 1;
      if (line < end) {
#pragma GCC unroll 12
        for (int j = 0; j < NW; ++j) _mm_prefetch(reinterpret_cast<const char*>(w + j * K + line * 16), HINT);
        ++line;
      }
    }
  }
};

// y[r, j] = x[r] . w[j] for NX rows of x and NW rows of w, prefetching as `pf` says.
template <int NW, int NX, class Prefetch>
inline void tile(const float* __restrict x, const float* __restrict w, int64_t K, float* __restrict y,
                 int64_t ldy, Prefetch pf) {
  __m256 acc[NX][NW];
#pragma GCC unroll 12
  for (int r = 0; r < NX; ++r)
#pragma GCC unroll 12
    for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    // 16 registers hold the 12 accumulators plus the operands of the narrower side, loaded
    // once per k step; the wider side streams through one more.
    pf.template at<NW>(k, K);
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

// The tiles of a single pass, kept out of line as the compiler kept them before the passes shared
// their prefetching: inlined into the larger block loop, a 3-token product ran 7 % slower and a
// 4-token one 33 % (the model's linears streamed, interleaved with the out-of-line build).
template <int NW, int NX>
__attribute__((noinline)) void tile1(const float* x, const float* w, int64_t K, float* y, int64_t ldy,
                                     const float* pf = nullptr) {
  tile<NW, NX>(x, w, K, y, ldy, EveryLine{pf});
}

// All rows of x against NW consecutive rows of W in tiles of NW x 4, then NW x (1..3); pass p (each
// 4 rows, then the rest) prefetches as `plan(p)` says.
template <int NW, class Plan>
inline void all_rows(const float* x, int64_t M, const float* w, int64_t K, float* y, int64_t N, Plan plan) {
  int64_t m = 0, p = 0;
  for (; m + 4 <= M; m += 4, ++p) tile<NW, 4>(x + m * K, w, K, y + m * N, N, plan(p));
  switch (M - m) {
    case 3: tile<NW, 3>(x + m * K, w, K, y + m * N, N, plan(p)); break;
    case 2: tile<NW, 2>(x + m * K, w, K, y + m * N, N, plan(p)); break;
    case 1: tile<NW, 1>(x + m * K, w, K, y + m * N, N, plan(p)); break;
    default: break;
  }
}

// All rows of x against a block of 12 rows of W, every tile with 12 accumulators.
//
// Streaming W from memory and multiplying it did not overlap on their own: a 4-token forward's
// linear layers took about the single-token time plus the in-cache compute time. So the passes
// over the block (one per 4 rows of x, and one for the 1-3 left) prefetch the next block (the
// following 12 rows, contiguous in W), and memory time hides behind compute: one pass (1-4 rows)
// non-temporally, several into L2 unless the tiles fit L1 (below). With more
// than one pass (5 rows or more) each pass fetches its share of the next block's lines: when only
// the first did, the later passes multiplied from cache while memory sat idle. Spread, a 5-16-token
// verify forward ran 1.01-1.05x faster on an AVX2 Zen 1 (racer/cpu/linear.py's docstring).
inline void block12(const float* x, int64_t M, const float* w, int64_t K, float* y, int64_t N,
                    bool prefetch_next) {
  const float* next = prefetch_next ? w + 12 * K : nullptr;
  if (M <= 4) {
    auto at = [&](int j) { return next ? next + j * K : nullptr; };
    switch (M) {
      case 4:
        for (int j = 0; j < 12; j += 3) tile1<3, 4>(x, w + j * K, K, y + j, N, at(j));
        break;
      case 3:
        for (int j = 0; j < 12; j += 4) tile1<4, 3>(x, w + j * K, K, y + j, N, at(j));
        break;
      case 2:
        for (int j = 0; j < 12; j += 6) tile1<6, 2>(x, w + j * K, K, y + j, N, at(j));
        break;
      case 1: tile1<12, 1>(x, w, K, y, N, next); break;
      default: break;
    }
    return;
  }
  const int64_t passes = (M + 3) / 4, lines = (K + 15) / 16, share = (lines + passes - 1) / passes;
  if (K <= TILE_MAJOR_MAX_K) {
    // Tile-major: each 3-row tile of W against every row of x while it sits in L1, its passes
    // fetching the next tile non-temporally (as one pass does the next block), so this W never
    // passes through L2. The same sums in the same order as below, so the same bits. Against the block
    // order below, a 5-12-token verify forward ran 1.03-1.08x faster on an AVX2 Zen 1; with a
    // larger K (the tile falls out of L1 between passes and is fetched again) 1.6-2.3x slower.
    for (int j = 0; j < 12; j += 3) {
      const float* nt = j + 3 < 12 ? w + (j + 3) * K : next;
      auto plan = [&](int64_t p) {
        return nt ? ShareOfLines<_MM_HINT_NTA>{nt, 2 * passes, p * share, std::min(lines, (p + 1) * share), 0}
                  : ShareOfLines<_MM_HINT_NTA>{};
      };
      all_rows<3>(x, M, w + j * K, K, y + j, N, plan);
    }
    return;
  }
  // Pass p fetches lines [p * share, (p + 1) * share) of each row of the next block, spread
  // over its k steps.
  auto plan = [&](int64_t p, int j) {
    return next ? ShareOfLines<>{next + j * K, 2 * passes, p * share, std::min(lines, (p + 1) * share), 0}
                : ShareOfLines<>{};
  };
  int64_t m = 0, p = 0;
  for (; m + 4 <= M; m += 4, ++p)
    for (int j = 0; j < 12; j += 3) tile<3, 4>(x + m * K, w + j * K, K, y + m * N + j, N, plan(p, j));
  const float* xr = x + m * K;
  float* yr = y + m * N;
  switch (M - m) {
    case 3:
      for (int j = 0; j < 12; j += 4) tile<4, 3>(xr, w + j * K, K, yr + j, N, plan(p, j));
      break;
    case 2:
      for (int j = 0; j < 12; j += 6) tile<6, 2>(xr, w + j * K, K, yr + j, N, plan(p, j));
      break;
    case 1: tile<12, 1>(xr, w, K, yr, N, plan(p, 0)); break;
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
        auto none = [](int64_t) { return EveryLine{}; };
        int64_t j = 0;
        for (; j + 3 <= rows; j += 3) all_rows<3>(xp, M, wp + (n + j) * K, K, yp + n + j, N, none);
        if (rows - j == 2) all_rows<2>(xp, M, wp + (n + j) * K, K, yp + n + j, N, none);
        if (rows - j == 1) all_rows<1>(xp, M, wp + (n + j) * K, K, yp + n + j, N, none);
      }
    });
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "tiled_linear: bias must have one entry per output");
    y.add_(bias->to(torch::kFloat32).reshape({1, N}));
  }
  return y.view(out_shape);
}

}  // namespace racer
