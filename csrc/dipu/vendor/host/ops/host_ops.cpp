// The host vendor's DIOPI kernels: each runs the CPU's own ATen kernel on views of the operands,
// then applies the emulated chip's precision behaviour, and is paced to its relative speed.
#include <ATen/ops/_log_softmax.h>
#include <ATen/ops/_log_softmax_backward_data.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu.h>
#include <ATen/ops/_scaled_dot_product_flash_attention_for_cpu_backward.h>
#include <ATen/ops/_softmax.h>
#include <ATen/ops/_softmax_backward_data.h>
#include <ATen/ops/add.h>
#include <ATen/ops/addcdiv.h>
#include <ATen/ops/addcmul.h>
#include <ATen/ops/addmm.h>
#include <ATen/ops/bmm.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/div.h>
#include <ATen/ops/embedding_dense_backward.h>
#include <ATen/ops/exp.h>
#include <ATen/ops/index_select.h>
#include <ATen/ops/lerp.h>
#include <ATen/ops/mean.h>
#include <ATen/ops/mm.h>
#include <ATen/ops/mul.h>
#include <ATen/ops/neg.h>
#include <ATen/ops/nll_loss_backward.h>
#include <ATen/ops/nll_loss_forward.h>
#include <ATen/ops/pow.h>
#include <ATen/ops/rsqrt.h>
#include <ATen/ops/silu.h>
#include <ATen/ops/silu_backward.h>
#include <ATen/ops/sqrt.h>
#include <ATen/ops/sub.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/where.h>

#include <vector>

#include <diopi/diopi.h>

#include "vendor/host/ops/kernel_runner.h"

using namespace dipu::host;

extern "C" {

const char* diopiGetLastError(void) { return last_error().c_str(); }

DEFINE_BINARY(diopiMm, at::mm_out)
DEFINE_BINARY(diopiBmm, at::bmm_out)
DEFINE_BINARY(diopiMul, at::mul_out)
DEFINE_BINARY(diopiDiv, at::div_out)
DEFINE_BINARY_ALPHA(diopiAdd, at::add_out)
DEFINE_BINARY_ALPHA(diopiSub, at::sub_out)
DEFINE_BINARY_INPLACE(diopiMulInp, mul_)
DEFINE_BINARY_INPLACE(diopiDivInp, div_)
DEFINE_UNARY(diopiRsqrt, at::rsqrt_out)
DEFINE_UNARY(diopiSqrt, at::sqrt_out)
DEFINE_UNARY(diopiExp, at::exp_out)
DEFINE_UNARY(diopiSilu, at::silu_out)

diopiError_t diopiAddInp(diopiContextHandle_t, diopiTensorHandle_t input, diopiConstTensorHandle_t other,
                         const diopiScalar_t* alpha) {
  return run_into("diopiAddInp", input, [&](at::Tensor& self) { self.add_(view(other), to_scalar(alpha)); });
}

diopiError_t diopiAddmm(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                        diopiConstTensorHandle_t mat1, diopiConstTensorHandle_t mat2, const diopiScalar_t* beta,
                        const diopiScalar_t* alpha) {
  return run_into("diopiAddmm", out, [&](at::Tensor& result) {
    at::addmm_out(result, view(input), view(mat1), view(mat2), to_scalar(beta), to_scalar(alpha));
  });
}

// Negation and selection are exact on every chip: never rounded.
diopiError_t diopiNeg(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input) {
  return run([&] {
    at::Tensor result = view(out);
    at::neg_out(result, view(input));
  });
}

diopiError_t diopiWhere(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t condition,
                        diopiConstTensorHandle_t input, diopiConstTensorHandle_t other) {
  return run([&] {
    at::Tensor result = view(out);
    at::where_out(result, view(condition), view(input), view(other));
  });
}

diopiError_t diopiIndexSelect(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                              int64_t dim, diopiConstTensorHandle_t index) {
  return run([&] {
    at::Tensor result = view(out);
    at::index_select_out(result, view(input), dim, view(index));
  });
}

diopiError_t diopiCat(diopiContextHandle_t, diopiTensorHandle_t out, const diopiConstTensorHandle_t* tensors,
                      int64_t num_tensors, int64_t dim) {
  return run([&] {
    std::vector<at::Tensor> inputs;
    inputs.reserve(num_tensors);
    for (int64_t i = 0; i < num_tensors; ++i) inputs.push_back(view(tensors[i]));
    at::Tensor result = view(out);
    at::cat_out(result, inputs, dim);
  });
}

diopiError_t diopiPowTensorScalar(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                                  const diopiScalar_t* exponent) {
  return run_into("diopiPowTensorScalar", out,
                  [&](at::Tensor& result) { at::pow_out(result, view(input), to_scalar(exponent)); });
}

diopiError_t diopiMaskedFillInp(diopiContextHandle_t, diopiTensorHandle_t input, diopiConstTensorHandle_t mask,
                                const diopiScalar_t* value) {
  return run([&] { view(input).masked_fill_(view(mask), to_scalar(value)); });
}

diopiError_t diopiFill(diopiContextHandle_t, diopiTensorHandle_t input, const diopiScalar_t* value) {
  return run([&] { view(input).fill_(to_scalar(value)); });
}

diopiError_t diopiCopyInp(diopiContextHandle_t, diopiConstTensorHandle_t src, diopiTensorHandle_t dest) {
  return run([&] { view(dest).copy_(view(src)); });
}

diopiError_t diopiAddcmul(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2,
                          const diopiScalar_t* value) {
  return run_into("diopiAddcmul", out, [&](at::Tensor& result) {
    at::addcmul_out(result, view(input), view(tensor1), view(tensor2), to_scalar(value));
  });
}

diopiError_t diopiAddcdiv(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                          diopiConstTensorHandle_t tensor1, diopiConstTensorHandle_t tensor2,
                          const diopiScalar_t* value) {
  return run_into("diopiAddcdiv", out, [&](at::Tensor& result) {
    at::addcdiv_out(result, view(input), view(tensor1), view(tensor2), to_scalar(value));
  });
}

diopiError_t diopiLerpScalar(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                             diopiConstTensorHandle_t end, const diopiScalar_t* weight) {
  return run_into("diopiLerpScalar", out,
                  [&](at::Tensor& result) { at::lerp_out(result, view(input), view(end), to_scalar(weight)); });
}

diopiError_t diopiSiluBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                               diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input) {
  return run_into("diopiSiluBackward", grad_input,
                  [&](at::Tensor& result) { at::silu_backward_out(result, view(grad_output), view(input)); });
}

diopiError_t diopiSoftmax(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input, int64_t dim) {
  return run_into("diopiSoftmax", out, [&](at::Tensor& result) {
    at::Tensor self = view(input);
    at::_softmax_out(result, self, dim, result.scalar_type() != self.scalar_type());
  });
}

diopiError_t diopiLogSoftmax(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input,
                             int64_t dim) {
  return run_into("diopiLogSoftmax", out, [&](at::Tensor& result) {
    at::Tensor self = view(input);
    at::_log_softmax_out(result, self, dim, result.scalar_type() != self.scalar_type());
  });
}

diopiError_t diopiSoftmaxBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output, int64_t dim) {
  return run_into("diopiSoftmaxBackward", grad_input, [&](at::Tensor& result) {
    at::_softmax_backward_data_out(result, view(grad_output), view(output), dim, result.scalar_type());
  });
}

diopiError_t diopiLogSoftmaxBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                     diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t output,
                                     int64_t dim) {
  return run_into("diopiLogSoftmaxBackward", grad_input, [&](at::Tensor& result) {
    at::_log_softmax_backward_data_out(result, view(grad_output), view(output), dim, result.scalar_type());
  });
}

diopiError_t diopiSum(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input, diopiSize_t dim,
                      bool keepdim) {
  return run_into("diopiSum", out,
                  [&](at::Tensor& result) { at::sum_out(result, view(input), to_dims(dim), keepdim); });
}

diopiError_t diopiMean(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t input, diopiSize_t dim,
                       bool keepdim) {
  return run_into("diopiMean", out,
                  [&](at::Tensor& result) { at::mean_out(result, view(input), to_dims(dim), keepdim); });
}

diopiError_t diopiEmbeddingBackward(diopiContextHandle_t, diopiTensorHandle_t out, diopiConstTensorHandle_t grad,
                                    diopiConstTensorHandle_t indices, int64_t num_weights, int64_t padding_idx,
                                    bool scale_grad_by_freq) {
  return run_into("diopiEmbeddingBackward", out, [&](at::Tensor& result) {
    result.copy_(at::embedding_dense_backward(view(grad), view(indices), num_weights, padding_idx, scale_grad_by_freq));
  });
}

diopiError_t diopiNLLLoss(diopiContextHandle_t, diopiTensorHandle_t out, diopiTensorHandle_t total_weight,
                          diopiConstTensorHandle_t input, diopiConstTensorHandle_t target,
                          diopiConstTensorHandle_t weight, int64_t reduction, int64_t ignore_index) {
  return run_into("diopiNLLLoss", out, [&](at::Tensor& result) {
    at::Tensor weights_total = view(total_weight);
    at::nll_loss_forward_out(result, weights_total, view(input), view(target), optional_view(weight), reduction,
                             ignore_index);
  });
}

diopiError_t diopiNLLLossBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input,
                                  diopiConstTensorHandle_t grad_output, diopiConstTensorHandle_t input,
                                  diopiConstTensorHandle_t target, diopiConstTensorHandle_t weight, int64_t reduction,
                                  int64_t ignore_index, diopiConstTensorHandle_t total_weight) {
  return run_into("diopiNLLLossBackward", grad_input, [&](at::Tensor& result) {
    at::nll_loss_backward_out(result, view(grad_output), view(input), view(target), optional_view(weight), reduction,
                              ignore_index, view(total_weight));
  });
}

diopiError_t diopiFlashAttention(diopiContextHandle_t, diopiTensorHandle_t out, diopiTensorHandle_t logsumexp,
                                 diopiConstTensorHandle_t query, diopiConstTensorHandle_t key,
                                 diopiConstTensorHandle_t value, double dropout_p, bool is_causal,
                                 diopiConstTensorHandle_t attn_mask, const double* scale) {
  return run([&] {
    auto [output, lse] = at::_scaled_dot_product_flash_attention_for_cpu(
        view(query), view(key), view(value), dropout_p, is_causal, optional_view(attn_mask), optional_double(scale));
    at::Tensor result = view(out);
    result.copy_(output);
    view(logsumexp).copy_(lse);
    emulate_precision("diopiFlashAttention", result);
  });
}

diopiError_t diopiFlashAttentionBackward(diopiContextHandle_t, diopiTensorHandle_t grad_query,
                                         diopiTensorHandle_t grad_key, diopiTensorHandle_t grad_value,
                                         diopiConstTensorHandle_t grad_out, diopiConstTensorHandle_t query,
                                         diopiConstTensorHandle_t key, diopiConstTensorHandle_t value,
                                         diopiConstTensorHandle_t out, diopiConstTensorHandle_t logsumexp,
                                         double dropout_p, bool is_causal, diopiConstTensorHandle_t attn_mask,
                                         const double* scale) {
  return run([&] {
    auto [dq, dk, dv] = at::_scaled_dot_product_flash_attention_for_cpu_backward(
        view(grad_out), view(query), view(key), view(value), view(out), view(logsumexp), dropout_p, is_causal,
        optional_view(attn_mask), optional_double(scale));
    at::Tensor results[] = {view(grad_query), view(grad_key), view(grad_value)};
    results[0].copy_(dq);
    results[1].copy_(dk);
    results[2].copy_(dv);
    for (auto& result : results) emulate_precision("diopiFlashAttentionBackward", result);
  });
}

}  // extern "C"
