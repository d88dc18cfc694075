// The host vendor's DIOPI kernels for network layers: activations, normalization, convolution,
// pooling, dropout's backward, mask checks and the mean-squared-error loss. Like the others they run the CPU's own ATen
// kernel on views of the operands, so the default profile gives the CPU's bits.
#include <ATen/ops/_adaptive_avg_pool2d.h>
#include <ATen/ops/_adaptive_avg_pool2d_backward.h>
#include <ATen/ops/all.h>
#include <ATen/ops/clamp_min.h>
#include <ATen/ops/convolution.h>
#include <ATen/ops/convolution_backward.h>
#include <ATen/ops/gelu.h>
#include <ATen/ops/gelu_backward.h>
#include <ATen/ops/isneginf.h>
#include <ATen/ops/max_pool2d_with_indices.h>
#include <ATen/ops/max_pool2d_with_indices_backward.h>
#include <ATen/ops/mse_loss.h>
#include <ATen/ops/mse_loss_backward.h>
#include <ATen/ops/native_batch_norm.h>
#include <ATen/ops/native_batch_norm_backward.h>
#include <ATen/ops/native_dropout_backward.h>
#include <ATen/ops/native_group_norm.h>
#include <ATen/ops/native_group_norm_backward.h>
#include <ATen/ops/native_layer_norm.h>
#include <ATen/ops/native_layer_norm_backward.h>
#include <ATen/ops/relu.h>
#include <ATen/ops/sigmoid.h>
#include <ATen/ops/sigmoid_backward.h>
#include <ATen/ops/tanh.h>
#include <ATen/ops/tanh_backward.h>
#include <ATen/ops/threshold_backward.h>

#include <array>

#include <diopi/diopi.h>

#include "vendor/host/ops/kernel_runner.h"

using namespace dipu::host;

namespace {

at::IntArrayRef dims(diopiSize_t size) { return at::IntArrayRef(size.data, size.len < 0 ? 0 : size.len); }

// The dtype the CPU keeps layer- and batch-norm statistics in: float when a reduced-precision input
// comes with float32 parameters, else the input's own. (torch's Meta kernels say float in every case,
// so the saved statistics reach a backward in the dtype the CPU's kernel expects only after this.)
at::ScalarType statistics_type(const at::Tensor& input, const std::optional<at::Tensor>& weight) {
  bool reduced = input.scalar_type() == at::kBFloat16 || input.scalar_type() == at::kHalf;
  bool mixed = reduced && weight.has_value() && weight->scalar_type() == at::kFloat;
  return mixed ? at::kFloat : input.scalar_type();
}

std::optional<at::Tensor> statistics(diopiConstTensorHandle_t saved, at::ScalarType type) {
  if (saved == nullptr) return std::nullopt;
  return view(saved).to(type);
}

// N, C and the product of the remaining sizes of a group-norm input.
std::array<int64_t, 3> group_norm_shape(const at::Tensor& input) {
  int64_t rows = input.size(0) * input.size(1);
  return {input.size(0), input.size(1), rows == 0 ? 0 : input.numel() / rows};
}

// The ReLU the CPU runs: clamp_min(x, 0).
at::Tensor& clamp_min_zero_out(at::Tensor& out, const at::Tensor& input) { return at::clamp_min_out(out, input, 0); }

}  // namespace

extern "C" {

DEFINE_UNARY(diopiRelu, clamp_min_zero_out)
DEFINE_UNARY(diopiTanh, at::tanh_out)
DEFINE_UNARY(diopiSigmoid, at::sigmoid_out)
DEFINE_BINARY(diopiTanhBackward, at::tanh_backward_out)
DEFINE_BINARY(diopiSigmoidBackward, at::sigmoid_backward_out)
DEFINE_UNARY(diopiIsNegInf, at::isneginf_out)

diopiError_t diopiAll(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input, diopiSize_t dim,
                      bool keepdim) {
  return run_into("diopiAll", out,
                  [&](at::Tensor& result) { at::all_out(result, view(input), to_dims(dim), keepdim); });
}

diopiError_t diopiDropoutBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t mask, double scale) {
  return run_into("diopiDropoutBackward", grad_input, [&](at::Tensor& result) {
    at::native_dropout_backward_out(result, view(grad_output), view(mask), scale);
  });
}

diopiError_t diopiReluInp(diopiContextHandle_t, diopiTensorHandle_t input) {
  return run_into("diopiReluInp", input, [&](at::Tensor& self) { self.relu_(); });
}

diopiError_t diopiThresholdBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    const diopiScalar_t* threshold) {
  return run_into("diopiThresholdBackward", grad_input, [&](at::Tensor& result) {
    at::threshold_backward_out(result, view(grad_output), view(input), to_scalar(threshold));
  });
}

diopiError_t diopiGelu(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                       const char* approximate) {
  return run_into("diopiGelu", out, [&](at::Tensor& result) { at::gelu_out(result, view(input), approximate); });
}

diopiError_t diopiGeluBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                               const char* approximate) {
  return run_into("diopiGeluBackward", grad_input, [&](at::Tensor& result) {
    at::gelu_backward_out(result, view(grad_output), view(input), approximate);
  });
}

diopiError_t diopiLayerNorm(diopiContextHandle_t, diopiTensorHandle_t out, diopiTensorHandle_t save_mean,
                            diopiTensorHandle_t save_invstd, diopiConstTensorHandle_t input,
                            diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias,
                            diopiSize_t normalized_shape, double eps) {
  return run([&] {
    auto [result, mean, rstd] =
        at::native_layer_norm(view(input), dims(normalized_shape), optional_view(weight), optional_view(bias), eps);
    store("diopiLayerNorm", out, result);
    store("diopiLayerNorm", save_mean, mean);
    store("diopiLayerNorm", save_invstd, rstd);
  });
}

diopiError_t diopiLayerNormBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                    diopiTensorHandle_t grad_weight, diopiTensorHandle_t grad_bias,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    diopiConstTensorHandle_t mean, diopiConstTensorHandle_t rstd,
                                    diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias,
                                    diopiSize_t normalized_shape) {
  return run([&] {
    std::array<bool, 3> wanted{grad_input != nullptr, grad_weight != nullptr, grad_bias != nullptr};
    at::Tensor x = view(input);
    std::optional<at::Tensor> w = optional_view(weight);
    at::ScalarType type = statistics_type(x, w);
    auto [d_input, d_weight, d_bias] =
        at::native_layer_norm_backward(view(grad_output), x, dims(normalized_shape), *statistics(mean, type),
                                       *statistics(rstd, type), w, optional_view(bias), wanted);
    store("diopiLayerNormBackward", grad_input, d_input);
    store("diopiLayerNormBackward", grad_weight, d_weight);
    store("diopiLayerNormBackward", grad_bias, d_bias);
  });
}

diopiError_t diopiGroupNorm(diopiContextHandle_t, diopiTensorHandle_t out, diopiTensorHandle_t save_mean,
                            diopiTensorHandle_t save_rstd, diopiConstTensorHandle_t input,
                            diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias, int64_t group, double eps) {
  return run([&] {
    at::Tensor x = view(input);
    auto [n, c, hxw] = group_norm_shape(x);
    auto [result, mean, rstd] =
        at::native_group_norm(x, optional_view(weight), optional_view(bias), n, c, hxw, group, eps);
    store("diopiGroupNorm", out, result);
    store("diopiGroupNorm", save_mean, mean);
    store("diopiGroupNorm", save_rstd, rstd);
  });
}

diopiError_t diopiGroupNormBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                    diopiTensorHandle_t grad_weight, diopiTensorHandle_t grad_bias,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    diopiConstTensorHandle_t mean, diopiConstTensorHandle_t rstd,
                                    diopiConstTensorHandle_t weight, int64_t group) {
  return run([&] {
    std::array<bool, 3> wanted{grad_input != nullptr, grad_weight != nullptr, grad_bias != nullptr};
    at::Tensor x = view(input);
    std::optional<at::Tensor> w = optional_view(weight);
    at::ScalarType type = statistics_type(x, w);
    auto [n, c, hxw] = group_norm_shape(x);
    auto [d_input, d_weight, d_bias] = at::native_group_norm_backward(
        view(grad_output), x, *statistics(mean, type), *statistics(rstd, type), w, n, c, hxw, group, wanted);
    store("diopiGroupNormBackward", grad_input, d_input);
    store("diopiGroupNormBackward", grad_weight, d_weight);
    store("diopiGroupNormBackward", grad_bias, d_bias);
  });
}

diopiError_t diopiBatchNorm(diopiContextHandle_t, diopiTensorHandle_t out, diopiTensorHandle_t save_mean,
                            diopiTensorHandle_t save_invstd, diopiConstTensorHandle_t input,
                            diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias,
                            diopiConstTensorHandle_t running_mean, diopiConstTensorHandle_t running_var, bool training,
                            double momentum, double eps) {
  return run([&] {
    auto [result, mean, invstd] =
        at::native_batch_norm(view(input), optional_view(weight), optional_view(bias), optional_view(running_mean),
                              optional_view(running_var), training, momentum, eps);
    store("diopiBatchNorm", out, result);
    if (training) {  // outside training the CPU saves no statistics (empty tensors)
      store("diopiBatchNorm", save_mean, mean);
      store("diopiBatchNorm", save_invstd, invstd);
    }
  });
}

diopiError_t diopiBatchNormBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                    diopiTensorHandle_t grad_weight, diopiTensorHandle_t grad_bias,
                                    diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                    diopiConstTensorHandle_t weight, diopiConstTensorHandle_t running_mean,
                                    diopiConstTensorHandle_t running_var, diopiConstTensorHandle_t save_mean,
                                    diopiConstTensorHandle_t save_invstd, bool training, double eps) {
  return run([&] {
    std::array<bool, 3> wanted{grad_input != nullptr, grad_weight != nullptr, grad_bias != nullptr};
    at::Tensor x = view(input);
    std::optional<at::Tensor> w = optional_view(weight);
    at::ScalarType type = statistics_type(x, w);
    auto [d_input, d_weight, d_bias] =
        at::native_batch_norm_backward(view(grad_output), x, w, optional_view(running_mean), optional_view(running_var),
                                       training ? statistics(save_mean, type) : std::nullopt,
                                       training ? statistics(save_invstd, type) : std::nullopt, training, eps, wanted);
    store("diopiBatchNormBackward", grad_input, d_input);
    store("diopiBatchNormBackward", grad_weight, d_weight);
    store("diopiBatchNormBackward", grad_bias, d_bias);
  });
}

diopiError_t diopiConvolution(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                              diopiConstTensorHandle_t weight, diopiConstTensorHandle_t bias, diopiSize_t stride,
                              diopiSize_t padding, diopiSize_t dilation, bool transposed, diopiSize_t output_padding,
                              int64_t groups) {
  return run([&] {
    store("diopiConvolution", out,
          at::convolution(view(input), view(weight), optional_view(bias), dims(stride), dims(padding), dims(dilation),
                          transposed, dims(output_padding), groups));
  });
}

diopiError_t diopiConvolutionBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                      diopiTensorHandle_t grad_weight, diopiTensorHandle_t grad_bias,
                                      diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                      diopiConstTensorHandle_t weight, diopiSize_t stride, diopiSize_t padding,
                                      diopiSize_t dilation, bool transposed, diopiSize_t output_padding,
                                      int64_t groups) {
  return run([&] {
    at::Tensor w = view(weight);
    std::array<bool, 3> wanted{grad_input != nullptr, grad_weight != nullptr, grad_bias != nullptr};
    std::optional<std::vector<int64_t>> bias_sizes;
    if (grad_bias != nullptr) bias_sizes = std::vector<int64_t>{transposed ? w.size(1) * groups : w.size(0)};
    auto [d_input, d_weight, d_bias] = at::convolution_backward(
        view(grad_output), view(input), w, bias_sizes ? at::OptionalIntArrayRef(*bias_sizes) : std::nullopt,
        dims(stride), dims(padding), dims(dilation), transposed, dims(output_padding), groups, wanted);
    store("diopiConvolutionBackward", grad_input, d_input);
    store("diopiConvolutionBackward", grad_weight, d_weight);
    store("diopiConvolutionBackward", grad_bias, d_bias);
  });
}

diopiError_t diopiMaxPool2dWithIndices(diopiContextHandle_t, diopiTensorHandle_t out, diopiTensorHandle_t indices,
                                       diopiConstTensorHandle_t input, diopiSize_t kernel_size, diopiSize_t stride,
                                       diopiSize_t padding, diopiSize_t dilation, bool ceil_mode) {
  return run([&] {
    at::Tensor result = view(out);
    at::Tensor positions = view(indices);
    at::max_pool2d_with_indices_out(result, positions, view(input), dims(kernel_size), dims(stride), dims(padding),
                                    dims(dilation), ceil_mode);
    emulate_precision("diopiMaxPool2dWithIndices", result);
  });
}

diopiError_t diopiMaxPool2dWithIndicesBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                               diopiSize_t kernel_size, diopiSize_t stride, diopiSize_t padding,
                                               diopiSize_t dilation, bool ceil_mode, diopiConstTensorHandle_t indices) {
  return run_into("diopiMaxPool2dWithIndicesBackward", grad_input, [&](at::Tensor& result) {
    at::max_pool2d_with_indices_backward_out(result, view(grad_output), view(input), dims(kernel_size), dims(stride),
                                             dims(padding), dims(dilation), ceil_mode, view(indices));
  });
}

diopiError_t diopiAdaptiveAvgPool2d(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                                    diopiSize_t output_size) {
  return run([&] { store("diopiAdaptiveAvgPool2d", out, at::_adaptive_avg_pool2d(view(input), dims(output_size))); });
}

diopiError_t diopiAdaptiveAvgPool2dBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                            diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input) {
  return run([&] {
    store("diopiAdaptiveAvgPool2dBackward", grad_input,
          at::_adaptive_avg_pool2d_backward(view(grad_output), view(input)));
  });
}

diopiError_t diopiMSELoss(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          diopiConstTensorHandle_t target, int64_t reduction) {
  return run([&] { store("diopiMSELoss", out, at::mse_loss(view(input), view(target), reduction)); });
}

diopiError_t diopiMSELossBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                  diopiConstTensorHandle_t target, int64_t reduction) {
  return run_into("diopiMSELossBackward", grad_input, [&](at::Tensor& result) {
    at::mse_loss_backward_out(result, view(grad_output), view(input), view(target), reduction);
  });
}

}  // extern "C"
