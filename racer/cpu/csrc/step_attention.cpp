// Attention for the few query rows of one decoding step (a draft tree, a chain or one token) in
// bfloat16 over a grouped-query KV cache, for CPUs with AVX512-BF16.
//
// Why not PyTorch's CPU flash attention: at context 600 it spent about 100 us a layer on one
// query token and 170 on five (SmolLM2-135M, 2-core EPYC), most of it fixed cost; and the result
// for a query row depends on how many rows share the call, so in bf16 a tree node's logits were
// one rounding away from those of the one-token forward that decodes the same token (ties).
//
// Each query row attends to a list of keys in logical order: the prefix 0..C-1 that every row of
// the call sees, then its own further visible keys in cache order (a tree node's ancestors, then
// itself). A row's output is a function of its query and that list alone:
//   - score = the head dimension's bf16 pairs summed by sequential vdpbf16ps into one float32
//     lane, times the scale;
//   - softmax in float32: the max, exp(s - max), the sum lane-wise by list position mod 16 then
//     one fixed reduction; probabilities rounded to bf16 for the value product, as PyTorch's
//     flash kernel does;
//   - values summed by vdpbf16ps over pairs of list positions (2m, 2m+1), in list order, then
//     divided by the sum and rounded once to bf16.
// A tree node at depth d and the one-token step that decodes the same token see the same list, so
// they get the same bits, and with the batch-invariant linear kernel so does the whole forward:
// bf16 tree decoding equals one-token greedy decoding exactly, not to within ties.
//
// Shared work: the prefix's keys are transposed once per 16 and its values interleaved once per
// pair of keys for all rows and all query heads of a key/value head.
//
// More than ROW_BLOCK query rows (a prefill, a chat turn's new tokens) run as blocks of ROW_BLOCK
// consecutive rows, each with its own shared prefix (the keys every row of the block sees), one
// task per block and key/value head, the costliest first, taken by whichever thread is free. A
// row's list, and so its bits, is the same whatever block it falls in: a prefill gives the bits of
// feeding its tokens one at a time. PyTorch's flash kernel took 2.2-2.7x as long on prompts of
// 256-1,536 tokens (9 query / 3 key-value heads of 64, 2 threads). One key/value head per task,
// or, where the key/value heads do not divide among the threads (the default model: 3 on 2
// cores, so one core did two heads' work while the other waited), a key/value head's query tokens
// split into as many runs as there are threads from 4 query tokens up, each run a task that
// transposes the prefix again: every row still sees the same list and sums it in the same order, so
// the bits do not change.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include "avx512_exp.h"
#include "step_keys.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512bf16")

namespace racer {
bool cpu_has_bf16();

namespace {

using bf16_t = uint16_t;
constexpr int KEY_BLOCK = 16;   // keys per transposed block (one score vector)
constexpr int PAIR_BLOCK = 32;  // key pairs per interleaved value block
constexpr int64_t ROW_BLOCK = 64;  // query rows per task when there are more

// r[j] lane i <- r[i] lane j, 32-bit elements.
inline void transpose16(__m512i r[16]) {
  __m512i a[16], b[16];
  for (int i = 0; i < 16; i += 2) {
    a[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
    a[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
  }
  for (int i = 0; i < 16; i += 4) {
    b[i] = _mm512_unpacklo_epi64(a[i], a[i + 2]);
    b[i + 1] = _mm512_unpackhi_epi64(a[i], a[i + 2]);
    b[i + 2] = _mm512_unpacklo_epi64(a[i + 1], a[i + 3]);
    b[i + 3] = _mm512_unpackhi_epi64(a[i + 1], a[i + 3]);
  }
  // b[4q + c], 128-bit lane L: column 4L + c of rows 4q..4q+3; transpose the 128-bit lanes.
  for (int c = 0; c < 4; ++c) {
    const __m512i e0 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0x44);
    const __m512i e1 = _mm512_shuffle_i32x4(b[c], b[4 + c], 0xEE);
    const __m512i e2 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0x44);
    const __m512i e3 = _mm512_shuffle_i32x4(b[8 + c], b[12 + c], 0xEE);
    r[c] = _mm512_shuffle_i32x4(e0, e2, 0x88);
    r[4 + c] = _mm512_shuffle_i32x4(e0, e2, 0xDD);
    r[8 + c] = _mm512_shuffle_i32x4(e1, e3, 0x88);
    r[12 + c] = _mm512_shuffle_i32x4(e1, e3, 0xDD);
  }
}

// kt[p] lane i = bf16 pair p of key row rows[i] (zero past n rows): the layout that lets one
// vdpbf16ps add a query pair's products to 16 keys' scores.
inline void transpose_keys(const bf16_t* const* rows, int n, int dpairs, __m512i* kt) {
  for (int h = 0; h < dpairs / 16; ++h) {
    __m512i r[16];
    for (int i = 0; i < 16; ++i) r[i] = i < n ? _mm512_loadu_si512(rows[i] + 32 * h) : _mm512_setzero_si512();
    transpose16(r);
    for (int j = 0; j < 16; ++j) kt[16 * h + j] = r[j];
  }
}

// vi[16 * (NV*m + 2h (+1)) ...]: value rows a, b of pair m interleaved, half h's low (high) words; lane
// 4L + j of the low vector holds dimension 32h + 8L + j, of the high one 32h + 8L + 4 + j.
inline void interleave_values(const bf16_t* a, const bf16_t* b, int dpairs, int32_t* vi) {
  for (int h = 0; h < dpairs / 16; ++h) {
    const __m512i va = a ? _mm512_loadu_si512(a + 32 * h) : _mm512_setzero_si512();
    const __m512i vb = b ? _mm512_loadu_si512(b + 32 * h) : _mm512_setzero_si512();
    _mm512_storeu_si512(vi + 16 * (2 * h), _mm512_unpacklo_epi16(va, vb));
    _mm512_storeu_si512(vi + 16 * (2 * h + 1), _mm512_unpackhi_epi16(va, vb));
  }
}

// out[c][0..16) = scale * (q[c] . key i) for the 16 keys of kt.
template <int NC>
inline void score_chunk(const __m512i* kt, int dpairs, const uint32_t* const* q, float scale, float* const* out) {
  __m512 acc[NC];
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) acc[c] = _mm512_setzero_ps();
  for (int p = 0; p < dpairs; ++p) {
    const __m512bh k = (__m512bh)kt[p];
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) acc[c] = _mm512_dpbf16_ps(acc[c], k, (__m512bh)_mm512_set1_epi32((int)q[c][p]));
  }
  const __m512 s = _mm512_set1_ps(scale);
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c) _mm512_storeu_ps(out[c], _mm512_mul_ps(acc[c], s));
}

inline void scores(const __m512i* kt, int dpairs, const uint32_t* const* q, float scale, float* const* out, int nc) {
  for (int c = 0; c < nc; c += 8) {
    switch (std::min(8, nc - c)) {
      case 8: score_chunk<8>(kt, dpairs, q + c, scale, out + c); break;
      case 7: score_chunk<7>(kt, dpairs, q + c, scale, out + c); break;
      case 6: score_chunk<6>(kt, dpairs, q + c, scale, out + c); break;
      case 5: score_chunk<5>(kt, dpairs, q + c, scale, out + c); break;
      case 4: score_chunk<4>(kt, dpairs, q + c, scale, out + c); break;
      case 3: score_chunk<3>(kt, dpairs, q + c, scale, out + c); break;
      case 2: score_chunk<2>(kt, dpairs, q + c, scale, out + c); break;
      default: score_chunk<1>(kt, dpairs, q + c, scale, out + c); break;
    }
  }
}

// acc[c] += sum over pairs m of p[c][m] . vi[m] (bf16 pairs), pairs in order.
template <int NV, int NC>
inline void value_chunk(const int32_t* vi, int pairs, const uint32_t* const* p, float* const* acc) {
  __m512 a[NC][NV];
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) a[c][j] = _mm512_loadu_ps(acc[c] + 16 * j);
  for (int m = 0; m < pairs; ++m) {
    __m512bh v[NV];
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) v[j] = (__m512bh)_mm512_loadu_si512(vi + 16 * (NV * m + j));
#pragma GCC unroll 8
    for (int c = 0; c < NC; ++c) {
      const __m512bh w = (__m512bh)_mm512_set1_epi32((int)p[c][m]);
#pragma GCC unroll 8
      for (int j = 0; j < NV; ++j) a[c][j] = _mm512_dpbf16_ps(a[c][j], v[j], w);
    }
  }
#pragma GCC unroll 8
  for (int c = 0; c < NC; ++c)
#pragma GCC unroll 8
    for (int j = 0; j < NV; ++j) _mm512_storeu_ps(acc[c] + 16 * j, a[c][j]);
}

template <int NV>
inline void values(const int32_t* vi, int pairs, const uint32_t* const* p, float* const* acc, int nc) {
  constexpr int W = NV == 4 ? 6 : 3;  // accumulators NV * W <= 24 of the 32 registers
  for (int c = 0; c < nc; c += W) {
    const int k = std::min(W, nc - c);
    if (k == W) { value_chunk<NV, W>(vi, pairs, p + c, acc + c); continue; }
    switch (k) {
      case 5: value_chunk<NV, 5 < W ? 5 : 1>(vi, pairs, p + c, acc + c); break;
      case 4: value_chunk<NV, 4 < W ? 4 : 1>(vi, pairs, p + c, acc + c); break;
      case 3: value_chunk<NV, 3 < W ? 3 : 1>(vi, pairs, p + c, acc + c); break;
      case 2: value_chunk<NV, 2>(vi, pairs, p + c, acc + c); break;
      default: value_chunk<NV, 1>(vi, pairs, p + c, acc + c); break;
    }
  }
}

// Softmax numerators of s[0..n) as bf16 into p[0..n rounded up to 16) (zeros past n); returns
// their float32 sum.
inline float softmax_numerators(const float* s, int n, bf16_t* p) {
  __m512 mx = _mm512_set1_ps(-INFINITY);
  for (int i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    mx = _mm512_mask_max_ps(mx, k, mx, _mm512_maskz_loadu_ps(k, s + i));
  }
  const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(mx));
  __m512 sum = _mm512_setzero_ps();
  for (int i = 0; i < n; i += 16) {
    const __mmask16 k = n - i >= 16 ? (__mmask16)0xFFFF : (__mmask16)((1u << (n - i)) - 1);
    const __m512 e = _mm512_maskz_mov_ps(k, avx512::exp_nonpositive(_mm512_sub_ps(_mm512_maskz_loadu_ps(k, s + i), m)));
    sum = _mm512_add_ps(sum, e);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p + i), (__m256i)_mm512_cvtneps_pbh(e));
  }
  return _mm512_reduce_add_ps(sum);
}

struct Step {
  const bf16_t *q, *k, *v;
  int64_t q_st, q_sh, k_sh, k_ss, v_sh, v_ss;  // strides in elements: query token/head, cache head/position
  int64_t H, G, T, L, D;
  int64_t C;                                  // keys 0..C-1 visible to every row
  const std::vector<std::vector<int64_t>>* tails;  // each row's further visible keys, ascending
  float scale;
  bf16_t* out;  // (T, H, D)
};

// Key/value head g for query tokens t0..t1-1 (rows c = (t - t0) * n + j: query head g * n + j).
template <int NV>
void group(const Step& st, int64_t g, int t0, int t1) {
  const int n = (int)(st.H / st.G), T = t1 - t0, dp = (int)(st.D / 2), nc = n * T;
  const int64_t C = st.C;
  int64_t longest = C;
  for (int t = t0; t < t1; ++t) longest = std::max<int64_t>(longest, C + (int64_t)(*st.tails)[t].size());
  const int64_t ld = (longest + 2 * KEY_BLOCK) & ~int64_t(KEY_BLOCK - 1);  // room for a whole last block

  // Query rows c = t * n + j (query head g * n + j) as bf16 pairs.
  std::vector<uint32_t> qbuf((size_t)nc * dp);
  std::vector<const uint32_t*> qrow(nc);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j) {
      const int c = t * n + j;
      std::memcpy(&qbuf[(size_t)c * dp], st.q + (t0 + t) * st.q_st + (g * n + j) * st.q_sh, st.D * sizeof(bf16_t));
      qrow[c] = &qbuf[(size_t)c * dp];
    }
  std::vector<float> S((size_t)nc * ld);
  std::vector<float*> srow(nc);
  const bf16_t* kbase = st.k + g * st.k_sh;
  const bf16_t* vbase = st.v + g * st.v_sh;
  auto key = [&](int64_t i) { return kbase + i * st.k_ss; };
  auto val = [&](int64_t i) { return vbase + i * st.v_ss; };

  alignas(64) __m512i kt[64];
  const bf16_t* rows[KEY_BLOCK];
  // Scores against the shared prefix, every row at once.
  for (int64_t b = 0; b < C; b += KEY_BLOCK) {
    const int r = (int)std::min<int64_t>(KEY_BLOCK, C - b);
    for (int i = 0; i < r; ++i) rows[i] = key(b + i);
    transpose_keys(rows, r, dp, kt);
    for (int c = 0; c < nc; ++c) srow[c] = &S[(size_t)c * ld + b];
    scores(kt, dp, qrow.data(), st.scale, srow.data(), nc);
  }
  // Each row's own keys, at list positions C...
  for (int t = 0; t < T; ++t) {
    const auto& tail = (*st.tails)[t0 + t];
    for (size_t b = 0; b < tail.size(); b += KEY_BLOCK) {
      const int r = (int)std::min<size_t>(KEY_BLOCK, tail.size() - b);
      for (int i = 0; i < r; ++i) rows[i] = key(tail[b + i]);
      transpose_keys(rows, r, dp, kt);
      for (int j = 0; j < n; ++j) srow[j] = &S[(size_t)(t * n + j) * ld + C + b];
      scores(kt, dp, qrow.data() + t * n, st.scale, srow.data(), n);
    }
  }
  // Softmax numerators (bf16, zero-padded) and sums.
  std::vector<bf16_t> P((size_t)nc * ld);
  std::vector<float> sums(nc);
  std::vector<const uint32_t*> prow(nc);
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j) {
      const int c = t * n + j;
      sums[c] = softmax_numerators(&S[(size_t)c * ld], (int)(C + (*st.tails)[t0 + t].size()), &P[(size_t)c * ld]);
    }
  // Values: the shared prefix's whole pairs for every row, then each row's remaining pairs.
  std::vector<float> acc((size_t)nc * NV * 16, 0.0f);
  std::vector<float*> arow(nc);
  for (int c = 0; c < nc; ++c) arow[c] = &acc[(size_t)c * NV * 16];
  // int32 storage, unaligned access: std::vector drops __m512i's 64-byte alignment.
  std::vector<int32_t> vi((size_t)PAIR_BLOCK * NV * 16);
  const int64_t shared_pairs = C / 2;
  for (int64_t m0 = 0; m0 < shared_pairs; m0 += PAIR_BLOCK) {
    const int pairs = (int)std::min<int64_t>(PAIR_BLOCK, shared_pairs - m0);
    for (int m = 0; m < pairs; ++m)
      interleave_values(val(2 * (m0 + m)), val(2 * (m0 + m) + 1), dp, &vi[(size_t)m * NV * 16]);
    for (int c = 0; c < nc; ++c) prow[c] = reinterpret_cast<const uint32_t*>(&P[(size_t)c * ld]) + m0;
    values<NV>(vi.data(), pairs, prow.data(), arow.data(), nc);
  }
  for (int t = 0; t < T; ++t) {
    const auto& tail = (*st.tails)[t0 + t];
    const int64_t len = C + (int64_t)tail.size();
    auto vrow = [&](int64_t i) -> const bf16_t* { return i >= len ? nullptr : i < C ? val(i) : val(tail[i - C]); };
    const int64_t pairs_total = (len + 1) / 2;
    for (int64_t m0 = shared_pairs; m0 < pairs_total; m0 += PAIR_BLOCK) {
      const int pairs = (int)std::min<int64_t>(PAIR_BLOCK, pairs_total - m0);
      for (int m = 0; m < pairs; ++m) interleave_values(vrow(2 * (m0 + m)), vrow(2 * (m0 + m) + 1), dp, &vi[(size_t)m * NV * 16]);
      for (int j = 0; j < n; ++j) prow[j] = reinterpret_cast<const uint32_t*>(&P[(size_t)(t * n + j) * ld]) + m0;
      values<NV>(vi.data(), pairs, prow.data(), arow.data() + t * n, n);
    }
  }
  // out = acc / sum, undoing the interleaved lane order.
  for (int t = 0; t < T; ++t)
    for (int j = 0; j < n; ++j) {
      const int c = t * n + j;
      bf16_t* o = st.out + ((t0 + t) * st.H + g * n + j) * st.D;
      const float* a = arow[c];
      const float s = sums[c];
      for (int h = 0; h < dp / 16; ++h)
        for (int L = 0; L < 4; ++L)
          for (int i = 0; i < 4; ++i) {
            o[32 * h + 8 * L + i] = at::BFloat16(a[16 * (2 * h) + 4 * L + i] / s).x;
            o[32 * h + 8 * L + 4 + i] = at::BFloat16(a[16 * (2 * h + 1) + 4 * L + i] / s).x;
          }
    }
}

}  // namespace

// q (1, H, T, D); k, v (1, G, L, D) with H a multiple of G (query heads g*n..g*n+n-1 share key/
// value head g); visible: None (causal: row t sees keys 0..L-T+t) or bool (T, L), True = visible,
// every row seeing at least one key. Returns (1, T, H, D).
torch::Tensor step_attention_bf16(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const c10::optional<torch::Tensor>& visible, double scale) {
  TORCH_CHECK(cpu_has_bf16(), "step_attention_bf16 needs a CPU with AVX512-BF16");
  TORCH_CHECK(q.scalar_type() == torch::kBFloat16 && k.scalar_type() == torch::kBFloat16 &&
              v.scalar_type() == torch::kBFloat16, "step_attention_bf16 takes bfloat16 tensors");
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(), "step_attention_bf16 runs on the CPU");
  TORCH_CHECK(q.dim() == 4 && k.dim() == 4 && v.dim() == 4 && q.size(0) == 1 && k.size(0) == 1 && v.size(0) == 1,
              "step_attention_bf16: q, k, v must be (1, heads, tokens, head_dim)");
  const int64_t H = q.size(1), T = q.size(2), D = q.size(3), G = k.size(1), L = k.size(2);
  TORCH_CHECK(D == 64 || D == 128, "step_attention_bf16: head_dim must be 64 or 128");
  TORCH_CHECK(k.size(3) == D && v.size(3) == D && v.size(1) == G && v.size(2) == L, "step_attention_bf16: k, v shapes");
  TORCH_CHECK(G > 0 && H % G == 0, "step_attention_bf16: query heads must be a multiple of key/value heads");
  TORCH_CHECK(T >= 1 && T <= L, "step_attention_bf16: 1 <= tokens <= keys");
  const auto qc = q.stride(3) == 1 ? q : q.contiguous();
  const auto kc = k.stride(3) == 1 ? k : k.contiguous();
  const auto vc = v.stride(3) == 1 ? v : v.contiguous();

  // Per block of rows: the keys all its rows see (0..C-1), and each row's further visible keys.
  std::vector<int64_t> prefix;
  std::vector<std::vector<int64_t>> tails;
  key_lists(visible, T, L, ROW_BLOCK, "step_attention_bf16", prefix, tails);

  auto out = torch::empty({1, T, H, D}, q.options().memory_format(at::MemoryFormat::Contiguous));
  Step st{reinterpret_cast<const bf16_t*>(qc.data_ptr<at::BFloat16>()),
          reinterpret_cast<const bf16_t*>(kc.data_ptr<at::BFloat16>()),
          reinterpret_cast<const bf16_t*>(vc.data_ptr<at::BFloat16>()),
          qc.stride(2), qc.stride(1), kc.stride(1), kc.stride(2), vc.stride(1), vc.stride(2),
          H, G, T, L, D, prefix[0], &tails, (float)scale, reinterpret_cast<bf16_t*>(out.data_ptr<at::BFloat16>())};
  for_tasks(T, G, ROW_BLOCK, [&](int64_t b, int64_t g, int t0, int t1) {
    Step sb = st;
    sb.C = prefix[b];
    if (D == 64) group<4>(sb, g, t0, t1); else group<8>(sb, g, t0, t1);
  });
  return out;
}

}  // namespace racer

#pragma GCC pop_options
