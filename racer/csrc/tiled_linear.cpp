// y = x W^T (+ b) for float32 inputs of a few rows: the shapes of tree verification on a CPU.
//
// W is streamed once: each tile holds NW rows of W in registers' reach and runs them against
// up to 4 rows of x at a time, with NW * 4 independent AVX2 accumulators, enough to keep both
// FMA pipes busy. oneDNN and MKL spend tens of microseconds per call on shapes this small and
// lose efficiency from 2 rows on; measured in racer/fastlinear.py's docstring.
//
// Every output y[m, n] is summed by the same operations in the same order whatever the number
// of rows and wherever row m falls in its tile, so a token's result does not depend on how many
// tokens share the forward (batch invariance).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

namespace {

inline float hsum(__m256 v) {
  __m128 lo = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  __m128 sh = _mm_movehdup_ps(lo);
  __m128 s = _mm_add_ps(lo, sh);
  s = _mm_add_ss(s, _mm_movehl_ps(sh, s));
  return _mm_cvtss_f32(s);
}

template <int NW, int NX>
inline void tile(const float* __restrict x, const float* __restrict w, int64_t K, float* __restrict y,
                 int64_t ldy) {
  __m256 acc[NX][NW];
#pragma GCC unroll 8
  for (int r = 0; r < NX; ++r)
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_setzero_ps();
  const int64_t K8 = K & ~int64_t(7);
  for (int64_t k = 0; k < K8; k += 8) {
    __m256 wv[NW];
#pragma GCC unroll 8
    for (int j = 0; j < NW; ++j) wv[j] = _mm256_loadu_ps(w + j * K + k);
#pragma GCC unroll 8
    for (int r = 0; r < NX; ++r) {
      const __m256 xv = _mm256_loadu_ps(x + r * K + k);
#pragma GCC unroll 8
      for (int j = 0; j < NW; ++j) acc[r][j] = _mm256_fmadd_ps(xv, wv[j], acc[r][j]);
    }
  }
  for (int r = 0; r < NX; ++r)
    for (int j = 0; j < NW; ++j) {
      float s = hsum(acc[r][j]);
      for (int64_t k = K8; k < K; ++k) s += x[r * K + k] * w[j * K + k];
      y[r * ldy + j] = s;
    }
}

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
    constexpr int NW = 3;
    at::parallel_for(0, (N + NW - 1) / NW, 8, [&](int64_t b0, int64_t b1) {
      for (int64_t b = b0; b < b1; ++b) {
        const int64_t n = b * NW;
        switch (std::min<int64_t>(NW, N - n)) {
          case 3: all_rows<3>(xp, M, wp + n * K, K, yp + n, N); break;
          case 2: all_rows<2>(xp, M, wp + n * K, K, yp + n, N); break;
          default: all_rows<1>(xp, M, wp + n * K, K, yp + n, N); break;
        }
      }
    });
  }
  if (bias.has_value() && bias->defined()) {
    TORCH_CHECK(bias->numel() == N, "tiled_linear: bias must have one entry per output");
    y.add_(bias->to(torch::kFloat32).reshape({1, N}));
  }
  return y.view(out_shape);
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tiled_linear", &tiled_linear, "y = x W^T + b for a few float32 rows (AVX2/FMA)");
}
