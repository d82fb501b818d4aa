// The Python module of racer's CPU kernels (racer/cpu/build.py builds it from every file here).
#include <torch/extension.h>

namespace racer {
torch::Tensor tiled_linear(const torch::Tensor& x, const torch::Tensor& weight, const c10::optional<torch::Tensor>& bias);
torch::Tensor pack_bf16(const torch::Tensor& weight);
torch::Tensor packed_linear_bf16(const torch::Tensor& x, const torch::Tensor& packed, int64_t n_out,
                                 const c10::optional<torch::Tensor>& bias);
bool cpu_has_bf16();
torch::Tensor step_attention_bf16(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                  const c10::optional<torch::Tensor>& visible, double scale);
torch::Tensor step_attention_f32(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                 const c10::optional<torch::Tensor>& visible, double scale);
torch::Tensor argmax_rows(const torch::Tensor& logits);
std::tuple<torch::Tensor, torch::Tensor> topk_rows(const torch::Tensor& logits, int64_t k, bool probs);
torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& weight, double eps);
torch::Tensor rope_rows(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin);
bool silu_mul_available();
torch::Tensor silu_mul_bf16(const torch::Tensor& gu, int64_t inter);
void compact_rows(const std::vector<torch::Tensor>& buffers, int64_t past, const std::vector<int64_t>& path);
std::vector<int64_t> write_store_rows(torch::Tensor table, torch::Tensor table_p, const std::vector<int64_t>& tokens,
                                      const std::vector<int64_t>& accepted, const torch::Tensor& topk,
                                      const c10::optional<torch::Tensor>& probs);
std::vector<torch::Tensor> tree_inputs(const std::vector<int64_t>& tokens, const std::vector<int64_t>& parents,
                                       int64_t past, torch::ScalarType dtype);
}  // namespace racer

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("tiled_linear", &racer::tiled_linear, "y = x W^T + b for a few float32 rows (AVX2/FMA)");
  m.def("pack_bf16", &racer::pack_bf16, "a bfloat16 weight in packed_linear_bf16's layout (AVX512-BF16)");
  m.def("packed_linear_bf16", &racer::packed_linear_bf16,
        "y = x W^T + b in bfloat16 for any number of rows, W from pack_bf16 (AVX512-BF16)");
  m.def("cpu_has_bf16", &racer::cpu_has_bf16, "whether this CPU runs the bfloat16 kernels");
  m.def("step_attention_bf16", &racer::step_attention_bf16,
        "attention of a few bfloat16 query rows (a draft tree or one token) over a grouped-query KV cache (AVX512-BF16)");
  m.def("step_attention_f32", &racer::step_attention_f32,
        "attention of a few float32 query rows (a draft tree or one token) over a grouped-query KV cache (AVX2)");
  m.def("argmax_rows", &racer::argmax_rows, "first index of each row's largest logit (AVX2)");
  m.def("rms_norm", &racer::rms_norm, "Llama-family RMSNorm of float32 or bfloat16 rows (AVX2)");
  m.def("rope_rows", &racer::rope_rows, "rotary position embedding of float32 or bfloat16 query/key rows");
  m.def("compact_rows", &racer::compact_rows,
        "move a draft tree's accepted path down behind the prefix in every KV buffer, in place");
  m.def("silu_mul_available", &racer::silu_mul_available,
        "whether silu_mul_bf16 runs here (AVX512-BF16, PyTorch's SLEEF exp found)");
  m.def("silu_mul_bf16", &racer::silu_mul_bf16,
        "silu(gate) * up of a fused bfloat16 gate|up product, bit-identical to PyTorch's two ops (AVX512-BF16)");
  m.def("write_store_rows", &racer::write_store_rows,
        "write a verified tree's top-k rows into a copy-logit store's tables; returns the tokens written");
  m.def("tree_inputs", &racer::tree_inputs,
        "a draft tree's token ids, positions, visibility and additive mask for its verify forward");
  m.def("topk_rows", &racer::topk_rows, "each row's k largest logits' ids, descending, and their softmax probabilities (AVX2)");
}
