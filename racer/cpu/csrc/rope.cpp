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
#include <torch/extension.h>

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

template <typename T>
void rope_row(const T* x, const T* cos, const T* sin, T* y, int64_t heads, int64_t D) {
  constexpr bool bf16 = std::is_same<T, at::BFloat16>::value;
  const int64_t h2 = D / 2;
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
