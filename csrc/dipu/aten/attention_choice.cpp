// Picks the scaled-dot-product-attention kernel for dipu tensors with the CPU's rules, so
// F.scaled_dot_product_attention takes the same path (and gives the same bits) as on the CPU.
#include <ATen/native/transformers/attention.h>
#include <ATen/ops/_fused_sdp_choice_ops.h>

namespace dipu::aten {
namespace {

int64_t choose_sdp_backend(const at::Tensor& query, const at::Tensor& key, const at::Tensor& value,
                           const std::optional<at::Tensor>& attn_mask, double dropout_p, bool is_causal,
                           std::optional<double> scale, bool enable_gqa) {
  return at::_ops::_fused_sdp_choice::redispatch(c10::DispatchKeySet(c10::DispatchKey::CPU), query, key, value,
                                                 attn_mask, dropout_p, is_causal, scale, enable_gqa);
}

}  // namespace
}  // namespace dipu::aten

namespace at::native {
REGISTER_PRIVATEUSE1_DISPATCH(_fused_sdp_choice_stub, &dipu::aten::choose_sdp_backend);
}  // namespace at::native
