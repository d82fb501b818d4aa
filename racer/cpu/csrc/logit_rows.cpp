// Per-row argmax and top-k (with softmax probabilities) of a few rows of logits, float32 or
// bfloat16, in one or two passes over each row (AVX2; the exponentials AVX-512 where the CPU has it).
//
// Why: after every verify forward the decode loop needs each node's argmax (greedy acceptance)
// and, for the copy-logit drafters, its top-k ids and their probabilities. PyTorch spent about
// 1.7 ms on that for 5 bf16 rows of a 49,152-token vocabulary (argmax 0.53 ms, topk 0.2,
// logsumexp 0.82 with its float32 copy; 2-core EPYC): 7 % of a RACER step. Here it is one pass for
// the top k, whose first entry is the max, and one for the sum of exponentials: 8 bf16 rows of
// 49,152 in 71 us against 109 with a pass of its own for the max and 8-lane exponentials; the loop
// reads greedy acceptance's argmax from the same top k (another 27 us saved).
//
// argmax_rows returns the first index of the largest value, as torch.argmax does. topk_rows
// returns ids sorted by value, descending, ties by lower id (torch.topk leaves ties unordered).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <immintrin.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "avx2_rows.h"
#include "avx512_exp.h"

namespace racer {
namespace {

using avx2::as_float;
using avx2::exp_nonpositive;
using avx2::hmax;
using avx2::hsum;
using avx2::load8;

template <typename T>
float row_max(const T* x, int64_t V) {
  __m256 m = _mm256_set1_ps(-INFINITY);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) m = _mm256_max_ps(m, load8(x + i));
  float best = hmax(m);
  for (; i < V; ++i) best = std::max(best, as_float(x[i]));
  return best;
}

template <typename T>
int64_t row_argmax(const T* x, int64_t V) {
  // A NaN is the largest value to torch.argmax; logits never hold one, but keep its answer.
  const float m = row_max(x, V);
  const __m256 mv = _mm256_set1_ps(m);
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const __m256 v = load8(x + i);
    const int hit = _mm256_movemask_ps(_mm256_or_ps(_mm256_cmp_ps(v, mv, _CMP_EQ_OQ), _mm256_cmp_ps(v, v, _CMP_UNORD_Q)));
    if (hit) return i + __builtin_ctz(hit);
  }
  for (; i < V; ++i) {
    const float v = as_float(x[i]);
    if (v == m || std::isnan(v)) return i;
  }
  return 0;
}

// sum of e^(x[i] - m) over the row, 8 lanes at a time.
template <typename T>
float exp_sum8(const T* x, int64_t V, float m) {
  const __m256 mv = _mm256_set1_ps(m);
  __m256 s = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) s = _mm256_add_ps(s, exp_nonpositive(_mm256_sub_ps(load8(x + i), mv)));
  float sum = hsum(s);
  for (; i < V; ++i) sum += std::exp(as_float(x[i]) - m);
  return sum;
}

#pragma GCC push_options
#pragma GCC target("avx512f")
inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }
inline __m512 load16(const at::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// exp_sum8 16 lanes at a time, with the same polynomial: half the instructions on a CPU with
// AVX-512, where this pass is most of a row's top-k with probabilities.
template <typename T>
float exp_sum16(const T* x, int64_t V, float m) {
  const __m512 mv = _mm512_set1_ps(m);
  __m512 s = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= V; i += 16) s = _mm512_add_ps(s, avx512::exp_nonpositive(_mm512_sub_ps(load16(x + i), mv)));
  float sum = _mm512_reduce_add_ps(s);
  for (; i < V; ++i) sum += std::exp(as_float(x[i]) - m);
  return sum;
}
#pragma GCC pop_options

const bool has_avx512 = [] {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f");
}();

// The k largest of row x, descending (ties: lower id first), and with probs their softmax
// probabilities.
template <typename T>
void row_topk(const T* x, int64_t V, int64_t k, int64_t* ids, float* probs) {
  std::vector<float> val(k, -INFINITY);
  std::vector<int64_t> idx(k, -1);
  int64_t filled = 0;
  auto insert = [&](float v, int64_t i) {
    if (filled == k && !(v > val[k - 1])) return;
    int64_t j = filled < k ? filled++ : k - 1;
    while (j > 0 && val[j - 1] < v) {  // strictly smaller move down: an equal earlier id stays first
      val[j] = val[j - 1];
      idx[j] = idx[j - 1];
      --j;
    }
    val[j] = v;
    idx[j] = i;
  };
  int64_t i = 0;
  for (; i + 8 <= V; i += 8) {
    const __m256 v = load8(x + i);
    const float thr = filled == k ? val[k - 1] : -INFINITY;
    int hit = filled < k ? 0xFF : _mm256_movemask_ps(_mm256_cmp_ps(v, _mm256_set1_ps(thr), _CMP_GT_OQ));
    while (hit) {
      const int lane = __builtin_ctz(hit);
      hit &= hit - 1;
      insert(as_float(x[i + lane]), i + lane);
    }
  }
  for (; i < V; ++i) insert(as_float(x[i]), i);
  for (int64_t j = 0; j < k; ++j) ids[j] = idx[j];
  if (!probs) return;
  // The first entry is the row's largest value, so the max needs no pass of its own (a row of
  // NaN or -inf leaves none: then it is read as before).
  const float m = idx[0] >= 0 && std::isfinite(val[0]) ? val[0] : row_max(x, V);
  const float lse = m + std::log(has_avx512 ? exp_sum16(x, V, m) : exp_sum8(x, V, m));
  for (int64_t j = 0; j < k; ++j) probs[j] = idx[j] < 0 ? 0.0f : std::exp(val[j] - lse);
}

torch::Tensor rows_of(const torch::Tensor& logits, const char* who) {
  TORCH_CHECK(logits.device().is_cpu(), who, " runs on the CPU");
  TORCH_CHECK(logits.scalar_type() == torch::kFloat32 || logits.scalar_type() == torch::kBFloat16,
              who, " takes float32 or bfloat16 logits");
  TORCH_CHECK(logits.dim() == 2 && logits.size(1) > 0, who, " takes (rows, vocabulary) logits");
  return logits.contiguous();
}

}  // namespace

torch::Tensor argmax_rows(const torch::Tensor& logits) {
  const auto x = rows_of(logits, "argmax_rows");
  const int64_t R = x.size(0), V = x.size(1);
  auto out = torch::empty({R}, torch::kInt64);
  int64_t* o = out.data_ptr<int64_t>();
  at::parallel_for(0, R, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r)
      o[r] = x.scalar_type() == torch::kFloat32 ? row_argmax(x.data_ptr<float>() + r * V, V)
                                                 : row_argmax(x.data_ptr<at::BFloat16>() + r * V, V);
  });
  return out;
}

std::tuple<torch::Tensor, torch::Tensor> topk_rows(const torch::Tensor& logits, int64_t k, bool probs) {
  const auto x = rows_of(logits, "topk_rows");
  const int64_t R = x.size(0), V = x.size(1);
  TORCH_CHECK(k >= 1 && k <= V, "topk_rows: k must be between 1 and the vocabulary size");
  auto ids = torch::empty({R, k}, torch::kInt64);
  auto p = probs ? torch::empty({R, k}, torch::kFloat32) : torch::Tensor();
  int64_t* io = ids.data_ptr<int64_t>();
  float* po = probs ? p.data_ptr<float>() : nullptr;
  at::parallel_for(0, R, 2, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      float* pr = po ? po + r * k : nullptr;
      if (x.scalar_type() == torch::kFloat32) row_topk(x.data_ptr<float>() + r * V, V, k, io + r * k, pr);
      else row_topk(x.data_ptr<at::BFloat16>() + r * V, V, k, io + r * k, pr);
    }
  });
  return {ids, p};
}

}  // namespace racer
