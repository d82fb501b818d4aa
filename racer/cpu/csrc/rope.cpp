// Rotary position embedding of a few rows of query or key heads, one call for what transformers'
// apply_rotary_pos_emb does in about ten PyTorch ops per tensor: out = x * cos + rotate_half(x) * sin,
// rotate_half(x) = (-x[D/2:], x[:D/2]).
//
// Why: a decoder layer rotates q and k at every step; in PyTorch that was about 20 us a layer on
// the default model (2-core EPYC), 0.6 ms of a 15 ms one-token forward. The rounding steps are
// PyTorch's, so the result is bit-identical to the module path: in bfloat16 each product is
// rounded to bf16 (nearest even), then their float32 sum is rounded again; in float32 the products
// and the sum are separate float32 operations (no fused multiply-add: contraction is off for this
// file's functions).
//
// Eight lanes at a time (AVX2) where half a head is a whole number of 8-lane blocks (every model
// racer runs: head sizes 64, 128, ...), one element at a time otherwise. The scalar loop had
// rounded each bf16 product through at::BFloat16 one by one, 5-6 ns an element: at 8 tree tokens
// 27 us for the default model's 9 query heads, a millisecond of a 19 ms verify forward over its 30
// layers. The vector path rounds as at::BFloat16 does (nearest even; a NaN becomes 0x7FC0).
#include <torch/extension.h>
#include <immintrin.h>

#include <type_traits>

namespace racer {
namespace {

#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")

inline float bf16_round(float f) { return static_cast<float>(at::BFloat16(f)); }

inline float rot_sum(float a, float c, float b, float s, bool bf16) {
  if (bf16) return bf16_round(a * c) + bf16_round(b * s);
  const float p = a * c;
  const float q = b * s;
  return p + q;
}

// at::BFloat16(float)'s rounding, 8 lanes: round to nearest even, a NaN to 0x7FC0; the result's
// 16 bits in the high half of each lane (a float that is exactly the bf16 value).
inline __m256i bf16_round8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  const __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  const __m256i hi = _mm256_and_si256(r, _mm256_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(hi, _mm256_set1_epi32(0x7FC00000), nan);
}

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
inline __m256 load8(const at::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

// y[0:8] = x * c + xo * s with rounding as rot_sum (xo already carries rotate_half's sign).
inline void rot8(const float* x, const float* xo, bool neg, const float* c, const float* s, float* y) {
  __m256 o = _mm256_loadu_ps(xo);
  if (neg) o = _mm256_xor_ps(o, _mm256_set1_ps(-0.0f));
  const __m256 p = _mm256_mul_ps(_mm256_loadu_ps(x), _mm256_loadu_ps(c));
  const __m256 q = _mm256_mul_ps(o, _mm256_loadu_ps(s));
  _mm256_storeu_ps(y, _mm256_add_ps(p, q));
}
inline void rot8(const at::BFloat16* x, const at::BFloat16* xo, bool neg, const at::BFloat16* c,
                 const at::BFloat16* s, at::BFloat16* y) {
  __m256 o = load8(xo);
  if (neg) o = _mm256_xor_ps(o, _mm256_set1_ps(-0.0f));
  const __m256 p = _mm256_castsi256_ps(bf16_round8(_mm256_mul_ps(load8(x), load8(c))));
  const __m256 q = _mm256_castsi256_ps(bf16_round8(_mm256_mul_ps(o, load8(s))));
  const __m256i w = _mm256_srli_epi32(bf16_round8(_mm256_add_ps(p, q)), 16);
  const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(w, w), 0x08);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(y), _mm256_castsi256_si128(packed));
}

template <typename T>
void rope_row(const T* x, const T* cos, const T* sin, T* y, int64_t heads, int64_t D) {
  constexpr bool bf16 = std::is_same<T, at::BFloat16>::value;
  const int64_t h2 = D / 2;
  if (h2 % 8 == 0) {
    for (int64_t h = 0; h < heads; ++h) {
      const T* xh = x + h * D;
      T* yh = y + h * D;
      for (int64_t i = 0; i < h2; i += 8) {
        rot8(xh + i, xh + i + h2, true, cos + i, sin + i, yh + i);
        rot8(xh + h2 + i, xh + i, false, cos + h2 + i, sin + h2 + i, yh + h2 + i);
      }
    }
    return;
  }
  for (int64_t h = 0; h < heads; ++h) {
    const T* xh = x + h * D;
    T* yh = y + h * D;
    for (int64_t i = 0; i < h2; ++i)
      yh[i] = static_cast<T>(rot_sum((float)xh[i], (float)cos[i], -(float)xh[i + h2], (float)sin[i], bf16));
    for (int64_t i = h2; i < D; ++i)
      yh[i] = static_cast<T>(rot_sum((float)xh[i], (float)cos[i], (float)xh[i - h2], (float)sin[i], bf16));
  }
}

#pragma GCC pop_options

}  // namespace

torch::Tensor rope_rows(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin) {
  TORCH_CHECK(x.device().is_cpu() && cos.device().is_cpu() && sin.device().is_cpu(), "rope_rows runs on the CPU");
  TORCH_CHECK((x.scalar_type() == torch::kFloat32 || x.scalar_type() == torch::kBFloat16) &&
                  cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type(),
              "rope_rows takes float32 or bfloat16 x, cos and sin of one dtype");
  TORCH_CHECK(x.dim() == 3 && cos.dim() == 3 && sin.sizes() == cos.sizes(),
              "rope_rows: x is (batch, tokens, heads * head_dim), cos and sin (batch or 1, tokens, head_dim)");
  const int64_t B = x.size(0), T = x.size(1), D = cos.size(2);
  TORCH_CHECK(D > 0 && D % 2 == 0 && x.size(2) % D == 0, "rope_rows: x's last dimension must be whole heads of even size");
  TORCH_CHECK(cos.size(1) == T && (cos.size(0) == B || cos.size(0) == 1),
              "rope_rows: cos and sin need one row per token of x");
  const auto xs = x.stride(2) == 1 ? x : x.contiguous();  // rows may be strided (a slice of q|k|v)
  const auto c = cos.contiguous(), s = sin.contiguous();
  const int64_t heads = x.size(2) / D;
  auto y = torch::empty({B, T, x.size(2)}, x.options());
  const int64_t sb = xs.stride(0), st = xs.stride(1), cb = c.size(0) == 1 ? 0 : T * D;
  AT_DISPATCH_SWITCH(x.scalar_type(), "rope_rows",
    AT_DISPATCH_CASE(torch::kFloat32, [&] {
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          rope_row(xs.data_ptr<float>() + b * sb + t * st, c.data_ptr<float>() + b * cb + t * D,
                   s.data_ptr<float>() + b * cb + t * D, y.data_ptr<float>() + (b * T + t) * x.size(2), heads, D);
    })
    AT_DISPATCH_CASE(torch::kBFloat16, [&] {
      for (int64_t b = 0; b < B; ++b)
        for (int64_t t = 0; t < T; ++t)
          rope_row(xs.data_ptr<at::BFloat16>() + b * sb + t * st, c.data_ptr<at::BFloat16>() + b * cb + t * D,
                   s.data_ptr<at::BFloat16>() + b * cb + t * D,
                   y.data_ptr<at::BFloat16>() + (b * T + t) * x.size(2), heads, D);
    }));
  return y;
}

}  // namespace racer
