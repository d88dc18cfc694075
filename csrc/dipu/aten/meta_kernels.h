// Shape functions for operators that only non-CPU devices reach and for which torch ships no Meta
// kernel, or one that fails on some arguments (the LSTM cell's, without biases). The DIOPI table marks
// their entries `meta: shim`; the generated kernels call these with meta tensors to allocate outputs.
// They are not registered with the dispatcher: nothing outside the shim's own kernels sees them.
#pragma once

#include <ATen/core/Tensor.h>

#include <array>
#include <optional>
#include <tuple>

namespace dipu::aten::meta {

at::Tensor convolution_overrideable(const at::Tensor& input, const at::Tensor& weight,
                                    const std::optional<at::Tensor>& bias, c10::SymIntArrayRef stride,
                                    c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed,
                                    c10::SymIntArrayRef output_padding, c10::SymInt groups);

std::tuple<at::Tensor, at::Tensor, at::Tensor> convolution_backward_overrideable(
    const at::Tensor& grad_output, const at::Tensor& input, const at::Tensor& weight, c10::SymIntArrayRef stride,
    c10::SymIntArrayRef padding, c10::SymIntArrayRef dilation, bool transposed, c10::SymIntArrayRef output_padding,
    c10::SymInt groups, std::array<bool, 3> output_mask);

std::tuple<at::Tensor, at::Tensor, at::Tensor> _thnn_fused_lstm_cell(const at::Tensor& input_gates,
                                                                     const at::Tensor& hidden_gates,
                                                                     const at::Tensor& cx,
                                                                     const std::optional<at::Tensor>& input_bias,
                                                                     const std::optional<at::Tensor>& hidden_bias);

std::tuple<at::Tensor, at::Tensor> _thnn_fused_gru_cell(const at::Tensor& input_gates, const at::Tensor& hidden_gates,
                                                        const at::Tensor& hx,
                                                        const std::optional<at::Tensor>& input_bias,
                                                        const std::optional<at::Tensor>& hidden_bias);

std::tuple<at::Tensor, at::Tensor, at::Tensor, at::Tensor, at::Tensor> _thnn_fused_gru_cell_backward(
    const at::Tensor& grad_hy, const at::Tensor& workspace, bool has_bias);

}  // namespace dipu::aten::meta
