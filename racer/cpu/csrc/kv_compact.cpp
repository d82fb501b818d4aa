// Keep only the accepted path's entries of a draft tree in a KV cache, for every layer in one call.
//
// Why: after a verify forward the cache holds the prefix and then one entry per tree node; the
// accepted path's entries must move down behind the prefix. In PyTorch that is an index_select and
// a copy per key and value tensor per layer, 120 small ops on the default model: 0.43 ms a step
// (2-core EPYC, path of 3 in a tree of 8 at context 300), about 3 % of a RACER step. Here it is a
// few row moves per head. A path's node indices only increase (a child comes after its parent),
// so moving rows down in place in path order never overwrites a row still to be read.
#include <torch/extension.h>

#include <cstring>
#include <vector>

namespace racer {

void compact_rows(const std::vector<torch::Tensor>& buffers, int64_t past, const std::vector<int64_t>& path) {
  const int64_t n = static_cast<int64_t>(path.size());
  for (int64_t j = 0; j < n; ++j) {
    TORCH_CHECK(path[j] >= j && (j == 0 || path[j] > path[j - 1]), "compact_rows: the path must increase");
  }
  for (const auto& t : buffers) {
    TORCH_CHECK(t.device().is_cpu() && t.dim() == 4 && t.stride(3) == 1,
                "compact_rows: (B, H, capacity, D) CPU buffers with contiguous rows");
    TORCH_CHECK(n == 0 || past + path[n - 1] < t.size(2), "compact_rows: the path runs past the buffer");
    const int64_t es = t.element_size();
    const int64_t row = t.size(3) * es;
    char* base = static_cast<char*>(t.data_ptr());
    for (int64_t b = 0; b < t.size(0); ++b)
      for (int64_t h = 0; h < t.size(1); ++h) {
        char* head = base + (b * t.stride(0) + h * t.stride(1)) * es;
        for (int64_t j = 0; j < n; ++j)
          if (path[j] != j)
            std::memmove(head + (past + j) * t.stride(2) * es, head + (past + path[j]) * t.stride(2) * es, row);
      }
  }
}

}  // namespace racer
