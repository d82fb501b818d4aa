// The Llama-family MLP's middle, silu(gate) * up, in bfloat16 for CPUs with AVX512-BF16: one call
// on the fused gate|up product where PyTorch runs two ops, a strided slice and two temporaries.
//
// Why: in a verify forward of the default model (30 layers, 2-core EPYC) PyTorch's silu and mul took
// about 7 us a layer for one token and 15-20 us for eight (the silu runs one thread, and each op
// converts every element to float32 and back); the tree's share grew with its size.
//
// The rounding steps are PyTorch's, so the result is bit-identical: the gate converted to float32,
// g / (1 + exp(-g)) with exp from the same SLEEF routine PyTorch's AVX-512 silu calls
// (Sleef_expf16_u10, found in libtorch_cpu at run time), rounded to bf16 (nearest even); that times
// the up value in float32 (exact: two 8-bit mantissas), rounded again. PyTorch's vectorised silu
// runs a scalar libm exp on a row's last elements short of 64; callers take this kernel only where
// rows are whole multiples of 64 (racer.cpu.layers), and racer.cpu.layers checks it against
// PyTorch's own ops on every bf16 gate value before it is used.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <dlfcn.h>
#include <immintrin.h>

namespace racer {
bool cpu_has_bf16();

namespace {

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq")

using bf16_t = uint16_t;
using ExpFn = __m512 (*)(__m512);

ExpFn sleef_exp() {
  static const ExpFn fn = [] {
    void* lib = dlopen("libtorch_cpu.so", RTLD_LAZY | RTLD_NOLOAD);
    return lib ? reinterpret_cast<ExpFn>(dlsym(lib, "Sleef_expf16_u10")) : nullptr;
  }();
  return fn;
}

inline __m512 load16(const bf16_t* p) {
  return _mm512_castsi512_ps(_mm512_slli_epi32(
      _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))), 16));
}

// at::BFloat16(float)'s rounding, 16 lanes: nearest even, a NaN to 0x7FC0; the bf16 bits in the
// low half of each lane. (vcvtneps2bf16 would flush subnormals, which PyTorch keeps.)
inline __m512i bf16_round16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  const __m512i r = _mm512_srli_epi32(_mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF))), 16);
  return _mm512_mask_blend_epi32(_mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q), r, _mm512_set1_epi32(0x7FC0));
}

void silu_mul_row(const bf16_t* g, const bf16_t* u, bf16_t* y, int64_t n, ExpFn exp16) {
  const __m512 one = _mm512_set1_ps(1.0f), sign = _mm512_set1_ps(-0.0f);
  for (int64_t i = 0; i < n; i += 16) {
    const __m512 x = load16(g + i);
    const __m512i s = bf16_round16(_mm512_div_ps(x, _mm512_add_ps(one, exp16(_mm512_xor_ps(x, sign)))));
    const __m512 p = _mm512_mul_ps(_mm512_castsi512_ps(_mm512_slli_epi32(s, 16)), load16(u + i));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(y + i), _mm512_cvtepi32_epi16(bf16_round16(p)));
  }
}

#pragma GCC pop_options

}  // namespace

bool silu_mul_available() { return cpu_has_bf16() && sleef_exp() != nullptr; }

// gu (..., 2 * inter) bfloat16, gate then up in each row; returns silu(gate) * up, (..., inter).
torch::Tensor silu_mul_bf16(const torch::Tensor& gu, int64_t inter) {
  TORCH_CHECK(silu_mul_available(), "silu_mul_bf16 needs a CPU with AVX512-BF16 and PyTorch's SLEEF exp");
  TORCH_CHECK(gu.device().is_cpu() && gu.scalar_type() == torch::kBFloat16, "silu_mul_bf16 takes a bfloat16 CPU tensor");
  TORCH_CHECK(inter > 0 && inter % 16 == 0 && gu.dim() >= 1 && gu.size(-1) == 2 * inter,
              "silu_mul_bf16: the last dimension must be 2 * inter, inter a multiple of 16");
  const auto x = gu.contiguous();
  auto sizes = x.sizes().vec();
  sizes.back() = inter;
  auto y = torch::empty(sizes, x.options());
  const int64_t rows = x.numel() / (2 * inter);
  const bf16_t* src = reinterpret_cast<const bf16_t*>(x.data_ptr<at::BFloat16>());
  bf16_t* dst = reinterpret_cast<bf16_t*>(y.data_ptr<at::BFloat16>());
  const ExpFn exp16 = sleef_exp();
  // About 8,192 elements a task: below that a second thread costs more than it saves.
  const int64_t grain = std::max<int64_t>(1, 8192 / inter);
  at::parallel_for(0, rows, grain, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      silu_mul_row(src + r * 2 * inter, src + r * 2 * inter + inter, dst + r * inter, inter, exp16);
  });
  return y;
}

}  // namespace racer
