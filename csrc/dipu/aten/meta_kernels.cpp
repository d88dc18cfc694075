#include "meta_kernels.h"

#include <ATen/native/ConvUtils.h>
#include <ATen/ops/empty.h>

namespace dipu::aten::meta {
namespace {

// The GRU cell keeps five hidden-sized blocks per row for its backward.
constexpr int64_t kGruWorkspaceBlocks = 5;

at::Tensor empty(c10::SymIntArrayRef shape, const at::Tensor& like) { return at::empty_symint(shape, like.options()); }

}  // namespace

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& /*bias*/, c10::SymIntArrayRef stride,
                                    c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed,
                                    c10::SymIntArrayRef output_padding, c10::SymInt groups) {
  auto shape = transposed
                   ? at::native::conv_input_size(input.sym_sizes(), weight.sym_sizes(), padding, output_padding, stride,
                                                 dilation, groups)
                   : at::native::conv_output_size(input.sym_sizes(), weight.sym_sizes(), padding, stride, dilation);
  return at::empty_symint(shape, input.options().memory_format(input.suggest_memory_format()));
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& /*grad_output*/, const at::Tensor& input, const at::Tensor& weight,
    c10::SymIntArrayRef /*stride*/, c10::SymIntArrayRef /*padding*/, c10::SymIntArrayRef /*dilation*/, bool transposed,
    c10::SymIntArrayRef /*output_padding*/, c10::SymInt groups, std::array<bool, 3> output_mask) {
  at::Tensor grad_input, grad_weight, grad_bias;
  if (output_mask[0]) grad_input = empty(input.sym_sizes(), input);
  if (output_mask[1]) grad_weight = empty(weight.sym_sizes(), weight);
  if (output_mask[2]) {
    c10::SymInt channels = transposed ? weight.sym_size(1) * groups : weight.sym_size(0);
    grad_bias = empty({channels}, weight);
  }
  return {grad_input, grad_weight, grad_bias};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> _thnn_fused_lstm_cell(const at::Tensor& input_gates,
                                                                     const at::Tensor& /*hidden_gates*/,
                                                                     const at::Tensor& cx,
                                                                     const std::optional<at::Tensor>& /*input_bias*/,
                                                                     const std::optional<at::Tensor>& /*hidden_bias*/) {
  return {empty(cx.sym_sizes(), cx), empty(cx.sym_sizes(), cx), empty(input_gates.sym_sizes(), input_gates)};
}

std::tuple<at::Tensor, at::Tensor> _thnn_fused_gru_cell(const at::Tensor& /*input_gates*/,
                                                        const at::Tensor& /*hidden_gates*/, const at::Tensor& hx,
                                                        const std::optional<at::Tensor>& /*input_bias*/,
                                                        const std::optional<at::Tensor>& /*hidden_bias*/) {
  return {empty(hx.sym_sizes(), hx), empty({hx.sym_size(0), hx.sym_size(1) * kGruWorkspaceBlocks}, hx)};
}

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> _thnn_fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias) {
  c10::SymInt rows = workspace.sym_size(0);
  c10::SymInt gates = workspace.sym_size(1) / kGruWorkspaceBlocks * 3;
  at::Tensor grad_input_bias, grad_hidden_bias;
  if (has_bias) {
    grad_input_bias = empty({gates}, workspace);
    grad_hidden_bias = empty({gates}, workspace);
  }
  return {empty({rows, gates}, workspace), empty({rows, gates}, workspace), empty(grad_hy.sym_sizes(), grad_hy),
          grad_input_bias, grad_hidden_bias};
}

}  // namespace dipu::aten::meta
