// A draft tree's verify-forward inputs on the CPU, in one call: its token ids and positions, which
// keys each node sees (the step kernel's visibility) and the additive mask the model is handed.
//
// Why: this runs right before every tree forward, after the drafting and sizing have walked their
// Python lists; built from numpy and torch ops (a visibility array, a tensor from it, a zeroed mask,
// a masked fill, the positions) it took 0.12-0.14 ms a step in decoding, on caches the last forward
// had just evicted (2-core EPYC, default model, ~8 nodes a step).
#include <torch/extension.h>

#include <limits>
#include <vector>

namespace racer {

namespace {

template <typename T>
void fill_mask(torch::Tensor& mask, const std::vector<uint8_t>& anc, int64_t n, int64_t past) {
  // The dtype's lowest value blocks a key: what `torch.finfo(dtype).min` gives (racer/tree.py).
  const T blocked = std::numeric_limits<T>::lowest();
  const T open = T(0.0f);
  T* m = mask.data_ptr<T>();
  const int64_t L = past + n;
  for (int64_t i = 0; i < n; ++i) {
    T* row = m + i * L;
    for (int64_t j = 0; j < past; ++j) row[j] = open;
    for (int64_t j = 0; j < n; ++j) row[past + j] = anc[i * n + j] ? open : blocked;
  }
}

}  // namespace

std::vector<torch::Tensor> tree_inputs(const std::vector<int64_t>& tokens, const std::vector<int64_t>& parents,
                                       int64_t past, torch::ScalarType dtype) {
  const int64_t n = static_cast<int64_t>(tokens.size());
  TORCH_CHECK(n >= 1 && static_cast<int64_t>(parents.size()) == n, "tree_inputs: one parent per token");
  TORCH_CHECK(past >= 0, "tree_inputs: a negative past length");
  TORCH_CHECK(parents[0] == -1, "tree_inputs: node 0 is the root");
  // Row i of the ancestor matrix: node i, its parent's row (a parent precedes its children).
  std::vector<uint8_t> anc(static_cast<size_t>(n * n), 0);
  std::vector<int64_t> depth(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    const int64_t p = parents[i];
    if (i > 0) {
      TORCH_CHECK(p >= 0 && p < i, "tree_inputs: node ", i, " has parent ", p, ": not topological");
      std::copy(anc.begin() + p * n, anc.begin() + (p + 1) * n, anc.begin() + i * n);
      depth[i] = depth[p] + 1;
    }
    anc[i * n + i] = 1;
  }
  auto ids = torch::empty({1, n}, torch::kInt64);
  auto pos = torch::empty({1, n}, torch::kInt64);
  int64_t* id = ids.data_ptr<int64_t>();
  int64_t* ps = pos.data_ptr<int64_t>();
  for (int64_t i = 0; i < n; ++i) {
    id[i] = tokens[i];
    ps[i] = past + depth[i];
  }
  const int64_t L = past + n;
  auto visible = torch::empty({n, L}, torch::kBool);
  bool* v = visible.data_ptr<bool>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < past; ++j) v[i * L + j] = true;
    for (int64_t j = 0; j < n; ++j) v[i * L + past + j] = anc[i * n + j] != 0;
  }
  auto mask = torch::empty({1, 1, n, L}, dtype);
  switch (dtype) {
    case torch::kFloat32: fill_mask<float>(mask, anc, n, past); break;
    case torch::kBFloat16: fill_mask<c10::BFloat16>(mask, anc, n, past); break;
    case torch::kFloat16: fill_mask<c10::Half>(mask, anc, n, past); break;
    case torch::kFloat64: fill_mask<double>(mask, anc, n, past); break;
    default: TORCH_CHECK(false, "tree_inputs: a floating mask dtype, not ", dtype);
  }
  return {ids, pos, visible, mask};
}

}  // namespace racer
