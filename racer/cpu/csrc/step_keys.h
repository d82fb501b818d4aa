// What both step-attention kernels (bfloat16: step_attention.cpp, float32: step_attention_f32.cpp)
// share: each query row's list of keys, and the tasks the rows and key/value heads split into.
// Internal linkage: each kernel's file is compiled for its own instruction set, so neither may
// call the other's copy.
#pragma once
#include <torch/extension.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <atomic>
#include <functional>
#include <string>
#include <vector>

namespace racer {
namespace {

// Per block of `row_block` consecutive rows: the keys all its rows see (0..prefix[b]-1), and each
// row's further visible keys in cache order (a tree node's ancestors, then itself). `visible`:
// None (causal: row t sees keys 0..L-T+t) or bool (T, L), True = visible.
inline void key_lists(const c10::optional<torch::Tensor>& visible, int64_t T, int64_t L, int64_t row_block,
                      const std::string& who, std::vector<int64_t>& prefix,
                      std::vector<std::vector<int64_t>>& tails) {
  const int64_t blocks = (T + row_block - 1) / row_block;
  prefix.assign(blocks, 0);
  tails.assign(T, {});
  if (visible.has_value() && visible->defined()) {
    TORCH_CHECK(visible->scalar_type() == torch::kBool && visible->dim() == 2 && visible->size(0) == T &&
                visible->size(1) == L, who, ": visible must be bool (tokens, keys)");
    const auto vis = visible->contiguous();
    const bool* m = vis.data_ptr<bool>();
    for (int64_t b = 0; b < blocks; ++b) {
      const int64_t t0 = b * row_block, t1 = std::min(T, t0 + row_block);
      int64_t C = L;
      for (int64_t t = t0; t < t1; ++t) {
        int64_t run = 0;
        while (run < L && m[t * L + run]) ++run;
        C = std::min(C, run);
      }
      prefix[b] = C;
      for (int64_t t = t0; t < t1; ++t) {
        for (int64_t i = C; i < L; ++i)
          if (m[t * L + i]) tails[t].push_back(i);
        TORCH_CHECK(C + (int64_t)tails[t].size() > 0, who, ": a query row sees no key");
      }
    }
    return;
  }
  for (int64_t b = 0; b < blocks; ++b) {
    const int64_t t0 = b * row_block, t1 = std::min(T, t0 + row_block);
    const int64_t C = prefix[b] = L - T + t0 + 1;
    for (int64_t t = t0; t < t1; ++t)
      for (int64_t i = C; i <= L - T + t; ++i) tails[t].push_back(i);
  }
}

// Runs group(b, g, t0, t1) for key/value head g and query tokens t0..t1-1 of row block b, over
// every block and head, on PyTorch's threads. One block (a decoding step): one task per key/value
// head, or, where the heads do not divide among the threads (the default model: 3 on 2 cores, so
// one core did two heads' work while the other waited), each head's query tokens split into as
// many runs as there are threads from 4 tokens up (below that a run's rows cost less than
// transposing the prefix once more: interleaved timings, context 200-1,000, no gain at 2 tokens,
// 10-25 % at 4-16). Several blocks (a prefill): tasks (block, head), the last blocks (the most
// keys) first, each taken by the next free thread, since blocks differ in cost.
inline void for_tasks(int64_t T, int64_t G, int64_t row_block,
                      const std::function<void(int64_t, int64_t, int, int)>& group) {
  const int64_t blocks = (T + row_block - 1) / row_block;
  const int64_t threads = std::max<int64_t>(1, at::get_num_threads());
  if (blocks == 1) {
    const int64_t runs = (G % threads == 0 || T < 4) ? 1 : std::min<int64_t>(T, threads);
    at::parallel_for(0, G * runs, 1, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) {
        const int64_t g = i / runs, r = i % runs;
        group(0, g, (int)(T * r / runs), (int)(T * (r + 1) / runs));
      }
    });
    return;
  }
  std::atomic<int64_t> next{0};
  const int64_t tasks = blocks * G;
  at::parallel_for(0, threads, 1, [&](int64_t w0, int64_t w1) {
    for (int64_t w = w0; w < w1; ++w)
      for (int64_t i = next++; i < tasks; i = next++) {
        const int64_t b = blocks - 1 - i / G, g = i % G;
        group(b, g, (int)(b * row_block), (int)std::min(T, (b + 1) * row_block));
      }
  });
}

}  // namespace
}  // namespace racer
