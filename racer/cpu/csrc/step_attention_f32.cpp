// Attention for the few query rows of one decoding step (a draft tree, a chain or one token) in
// float32 over a grouped-query KV cache (AVX2/FMA): the dtype of CPUs without AVX512-BF16.
//
// Why not PyTorch's CPU flash attention: inside a verify forward of the default model (context
// 300, 2-core EPYC) the packed call spent 72 us a layer on one query token and 144 on eight, and
// the Python around it (reshapes, the repeated mask, a contiguous copy) 24-50 more: 2.9 ms of a
// 26 ms one-token forward and 5.8 of a 38 ms eight-token one. And its result for a row depends on
// how many rows share the call, so a tree node's logits could differ from those of the one-token
// forward that decodes the same token in the last bits (float32 ties).
//
// Each query row attends to a list of keys in logical order, as in the bfloat16 kernel
// (step_attention.cpp): the prefix 0..C-1 that every row of the call sees, then its own further
// visible keys in cache order. A row's output is a function of its query and that list alone:
//   - score = q . k summed over the head dimension in order by one FMA chain per key, times the
//     scale (keys transposed 8 at a time, so one FMA adds a query element's products to 8 keys);
//   - softmax: the max, exp(s - max) (Cephes' polynomial), the sum lane-wise by list position
//     mod 8 then one fixed reduction;
//   - values summed by FMA in list order, then divided by the sum.
// So a tree node and the one-token step that decodes the same token get the same bits; with the
// batch-invariant tiled linear kernel so does the whole forward.
#include <torch/extension.h>
#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "avx2_rows.h"
#include "step_keys.h"

namespace racer {
namespace {

constexpr int KEYS = 8;             // keys per transposed block (one score vector)
constexpr int64_t F32_ROWS = 64;    // query rows per task when there are more

// r[j] lane i <- r[i] lane j.
inline void transpose8(__m256 r[8]) {
  __m256 a[8], b[8];
  for (int i = 0; i < 8; i += 2) {
    a[i] = _mm256_unpacklo_ps(r[i], r[i + 1]);
    a[i + 1] = _mm256_unpackhi_ps(r[i], r[i + 1]);
  }
  for (int i = 0; i < 8; i += 4) {
    b[i] = _mm256_shuffle_ps(a[i], a[i + 2], 0x44);
    b[i + 1] = _mm256_shuffle_ps(a[i], a[i + 2], 0xEE);
    b[i + 2] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0x44);
    b[i + 3] = _mm256_shuffle_ps(a[i + 1], a[i + 3], 0xEE);
  }
  for (int c = 0; c < 4; ++c) {
    r[c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x20);
    r[4 + c] = _mm256_permute2f128_ps(b[c], b[4 + c], 0x31);
  }
}

// kt[d] lane i = element d of key rows[i] (zero past n rows).
inline void transpose_keys(const float* const* rows, int n, int D, __m256* kt) {
  for (int h = 0; h < D / 8; ++h) {
    __m256 r[8];
    for (int i = 0; i < 8; ++i) r[i] = i < n ? _mm256_loadu_ps(rows[i] + 8 * h) : _mm256_setzero_ps();
    transpose8(r);
    for (int j = 0; j < 8; ++j) kt[8 * h + j] = r[j];
  }
}

// out[c][0..8) = scale * (q[c] . key i) for the 8 keys of kt.
template <int NC>
inline void score_chunk(const __m256* kt, int D, const float* const* q, float scale, float* const* out) {
  __m256 acc[NC];
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) acc[c] = _mm256_setzero_ps();
  for (int d = 0; d < D; ++d) {
    const __m256 k = kt[d];
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) acc[c] = _mm256_fmadd_ps(_mm256_broadcast_ss(q[c] + d), k, acc[c]);
  }
  const __m256 s = _mm256_set1_ps(scale);
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) _mm256_storeu_ps(out[c], _mm256_mul_ps(acc[c], s));
}

inline void scores(const __m256* kt, int D, const float* const* q, float scale, float* const* out, int nc) {
  for (int c = 0; c < nc; c += 8) {
    switch (std::min(8, nc - c)) {
      case 8: score_chunk<8>(kt, D, q + c, scale, out + c); break;
      case 7: score_chunk<7>(kt, D, q + c, scale, out + c); break;
      case 6: score_chunk<6>(kt, D, q + c, scale, out + c); break;
      case 5: score_chunk<5>(kt, D, q + c, scale, out + c); break;
      case 4: score_chunk<4>(kt, D, q + c, scale, out + c); break;
      case 3: score_chunk<3>(kt, D, q + c, scale, out + c); break;
      case 2: score_chunk<2>(kt, D, q + c, scale, out + c); break;
      default: score_chunk<1>(kt, D, q + c, scale, out + c); break;
    }
  }
}

// acc[c][0..32) += sum over keys i of p[c][i] * value(i)[0..32), keys in order; `value(i)` points
// at the 32 elements of key i's value row this call sums.
template <int NC, class Value>
inline void value_chunk(int64_t i0, int64_t i1, const Value& value, const float* const* p, float* const* acc) {
  __m256 a[NC][4];
#pragma GCC unroll 4
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) a[c][j] = _mm256_loadu_ps(acc[c] + 8 * j);
  for (int64_t i = i0; i < i1; ++i) {
    const float* v = value(i);
    __m256 pc[NC];
#pragma GCC unroll 4
    for (int c = 0; c < NC; ++c) pc[c] = _mm256_broadcast_ss(p[c] + i);
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) {
      const __m256 vj = _mm256_loadu_ps(v + 8 * j);
#pragma GCC unroll 4
      for (int c = 0; c < NC; ++c) a[c][j] = _mm256_fmadd_ps(pc[c], vj, a[c][j]);
    }
  }
#pragma GCC unroll 4
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) _mm256_storeu_ps(acc[c] + 8 * j, a[c][j]);
}

// s[0..n) replaced by the softmax numerators exp(s - max); returns their sum.
inline float softmax_numerators(float* s, int64_t n) {
  __m256 mx = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) mx = _mm256_max_ps(mx, _mm256_loadu_ps(s + i));
  float m = avx2::hmax(mx);
  for (int64_t r = i; r < n; ++r) m = std::max(m, s[r]);
  const __m256 mv = _mm256_set1_ps(m);
  __m256 sum = _mm256_setzero_ps();
  for (i = 0; i + 8 <= n; i += 8) {
    const __m256 e = avx2::exp_nonpositive(_mm256_sub_ps(_mm256_loadu_ps(s + i), mv));
    sum = _mm256_add_ps(sum, e);
    _mm256_storeu_ps(s + i, e);
  }
  if (i < n) {
    // The last, partial vector: the same exp, lanes past n neither read, summed nor written.
    const __m256i keep = _mm256_cmpgt_epi32(_mm256_set1_epi32((int)(n - i)), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 e = _mm256_and_ps(_mm256_castsi256_ps(keep),
                                   avx2::exp_nonpositive(_mm256_sub_ps(_mm256_maskload_ps(s + i, keep), mv)));
    sum = _mm256_add_ps(sum, e);
    _mm256_maskstore_ps(s + i, keep, e);
  }
  return avx2::hsum(sum);
}

struct Step {
  const float *q, *k, *v;
  int64_t q_st, q_sh, k_sh, k_ss, v_sh, v_ss;  // strides in elements: query token/head, cache head/position
  int64_t H, G, T, L, D;
  int64_t C;                                  // keys 0..C-1 visible to every row
  const std::vector<std::vector<int64_t>>* tails;  // each row's further visible keys, ascending
  float scale;
  float* out;  // (T, H, D)
};

// Key/value head g for query tokens t0..t1-1 (rows c = (t - t0) * n + j: query head g * n + j).
void group(const Step& st, int64_t g, int t0, int t1) {
  const int n = (int)(st.H / st.G), T = t1 - t0, D = (int)st.D, nc = n * T;
  const int64_t C = st.C;
  int64_t longest = C;
  for (int t = t0; t < t1; ++t) longest = std::max<int64_t>(longest, C + (int64_t)(*st.tails)[t].size());
  const int64_t ld = (longest + 2 * KEYS) & ~int64_t(KEYS - 1);  // room for a whole last block
  std::vector<const float*> qrow(nc);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j) qrow[t * n + j] = st.q + (t0 + t) * st.q_st + (g * n + j) * st.q_sh;
  const float* kbase = st.k + g * st.k_sh;
  const float* vbase = st.v + g * st.v_sh;
  auto key = [&](int64_t i) { return kbase + i * st.k_ss; };

  std::vector<float> S((size_t)nc * ld);
  std::vector<float*> srow(nc);
  std::vector<__m256> kt(D);
  const float* rows[KEYS];
  // Scores against the shared prefix, every row at once, then each row's own keys at positions C...
  for (int64_t b = 0; b < C; b += KEYS) {
    const int r = (int)std::min<int64_t>(KEYS, C - b);
    for (int i = 0; i < r; ++i) rows[i] = key(b + i);
    transpose_keys(rows, r, D, kt.data());
    for (int c = 0; c < nc; ++c) srow[c] = &S[(size_t)c * ld + b];
    scores(kt.data(), D, qrow.data(), st.scale, srow.data(), nc);
  }
  for (int t = 0; t < T; ++t) {
    const auto& tail = (*st.tails)[t0 + t];
    for (size_t b = 0; b < tail.size(); b += KEYS) {
      const int r = (int)std::min<size_t>(KEYS, tail.size() - b);
      for (int i = 0; i < r; ++i) rows[i] = key(tail[b + i]);
      transpose_keys(rows, r, D, kt.data());
      for (int j = 0; j < n; ++j) srow[j] = &S[(size_t)(t * n + j) * ld + C + b];
      scores(kt.data(), D, qrow.data() + t * n, st.scale, srow.data(), n);
    }
  }
  std::vector<float> sums(nc);
  std::vector<const float*> prow(nc);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j) {
      const int c = t * n + j;
      sums[c] = softmax_numerators(&S[(size_t)c * ld], C + (int64_t)(*st.tails)[t0 + t].size());
      prow[c] = &S[(size_t)c * ld];
    }
  // Values, 32 elements of the head at a time: the shared prefix for three rows at once (12
  // accumulators; two rows at once ran 1.05-1.16x slower at 1-16 tokens), then each row's own keys
  // (the probabilities of list position i sit at index i of the row).
  std::vector<float> acc((size_t)nc * D, 0.0f);
  std::vector<float*> arow(nc);
  for (int h = 0; h < D; h += 32) {
    for (int c = 0; c < nc; ++c) arow[c] = &acc[(size_t)c * D + h];
    auto shared = [&](int64_t i) { return vbase + i * st.v_ss + h; };
    int c = 0;
    for (; c + 3 <= nc; c += 3) value_chunk<3>(0, C, shared, prow.data() + c, arow.data() + c);
    if (nc - c == 2) value_chunk<2>(0, C, shared, prow.data() + c, arow.data() + c);
    else if (c < nc) value_chunk<1>(0, C, shared, prow.data() + c, arow.data() + c);
    for (int t = 0; t < T; ++t) {
      const auto& tail = (*st.tails)[t0 + t];
      // The row's probabilities for its own keys sit at list positions C...; the value of list
      // position C + i is cache row tail[i].
      auto own = [&](int64_t i) { return vbase + tail[i - C] * st.v_ss + h; };
      for (int j = 0; j < n; ++j)
        value_chunk<1>(C, C + (int64_t)tail.size(), own, prow.data() + t * n + j, arow.data() + t * n + j);
    }
  }
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j) {
      const int c = t * n + j;
      float* o = st.out + ((t0 + t) * st.H + g * n + j) * st.D;
      const __m256 s = _mm256_set1_ps(sums[c]);
      for (int d = 0; d < D; d += 8) _mm256_storeu_ps(o + d, _mm256_div_ps(_mm256_loadu_ps(&acc[(size_t)c * D + d]), s));
    }
}

}  // namespace

// q (1, H, T, D); k, v (1, G, L, D) float32, H a multiple of G (query heads g*n..g*n+n-1 share
// key/value head g), D a multiple of 32; visible: None (causal: row t sees keys 0..L-T+t) or bool
// (T, L), True = visible, every row seeing at least one key. Returns (1, T, H, D).
torch::Tensor step_attention_f32(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const c10::optional<torch::Tensor>& visible, double scale) {
  TORCH_CHECK(q.scalar_type() == torch::kFloat32 && k.scalar_type() == torch::kFloat32 &&
              v.scalar_type() == torch::kFloat32, "step_attention_f32 takes float32 tensors");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "step_attention_f32 runs on the CPU");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(0) == 1 && k.size(0) == 1 && v.size(0) == 1,
              "step_attention_f32: q, k, v must be (1, heads, tokens, head_dim)");
  const int64_t H = q.size(1), T = q.size(2), D = q.size(3), G = k.size(1), L = k.size(2);
  TORCH_CHECK(D > 0 && D % 32 == 0, "step_attention_f32: head_dim must be a multiple of 32");
  TORCH_CHECK(k.size(3) == D && v.size(3) == D && v.size(1) == G && v.size(2) == L, "step_attention_f32: k, v shapes");
  TORCH_CHECK(G > 0 && H % G == 0, "step_attention_f32: query heads must be a multiple of key/value heads");
  TORCH_CHECK(T >= 1 && T <= L, "step_attention_f32: 1 <= tokens <= keys");
  const auto qc = q.stride(3) == 1 ? q : q.contiguous();
  const auto kc = k.stride(3) == 1 ? k : k.contiguous();
  const auto vc = v.stride(3) == 1 ? v : v.contiguous();
  std::vector<int64_t> prefix;
  std::vector<std::vector<int64_t>> tails;
  key_lists(visible, T, L, F32_ROWS, "step_attention_f32", prefix, tails);
  auto out = torch::empty({1, T, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  const Step st{qc.data_ptr<float>(), kc.data_ptr<float>(), vc.data_ptr<float>(),
                qc.stride(2), qc.stride(1), kc.stride(1), kc.stride(2), vc.stride(1), vc.stride(2),
                H, G, T, L, D, prefix[0], &tails, (float)scale, out.data_ptr<float>()};
  for_tasks(T, G, F32_ROWS, [&](int64_t b, int64_t g, int t0, int t1) {
    Step sb = st;
    sb.C = prefix[b];
    group(sb, g, t0, t1);
  });
  return out;
}

}  // namespace racer
