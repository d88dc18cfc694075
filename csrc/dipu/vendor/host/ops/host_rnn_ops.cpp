// The host vendor's fused LSTM and GRU cells. The CPU has no kernel for these operators (its
// recurrent layers take another route), so they are written here with ATen tensor arithmetic in the
// operands' accumulation type (float for half and bfloat16), following the formulation of
// diopi.h: gates = input_gates + hidden_gates + input_bias + hidden_bias, added in that order.
#include <ATen/TensorOperators.h>
#include <ATen/ops/cat.h>
#include <ATen/ops/sum.h>
#include <ATen/ops/zeros_like.h>

#include <vector>

#include <diopi/diopi.h>

#include "vendor/host/ops/kernel_runner.h"

using namespace dipu::host;

namespace {

at::ScalarType accumulation_type(at::ScalarType type) { return type == at::kDouble ? at::kDouble : at::kFloat; }

at::Tensor widened(diopiConstTensorHandle_t operand, at::ScalarType type) { return view(operand).to(type); }

// Both biases are given or neither is.
at::Tensor gates_with_bias(const at::Tensor& gates, diopiConstTensorHandle_t input_bias,
                           diopiConstTensorHandle_t hidden_bias, at::ScalarType type) {
  if (input_bias == nullptr) return gates;
  return gates + widened(input_bias, type) + widened(hidden_bias, type);
}

// The gradient of a bias is its gate gradient summed over the rows.
void store_bias_gradient(const char* function, diopiTensorHandle_t grad_bias, diopiTensorHandle_t grad_gates) {
  if (grad_bias != nullptr) store(function, grad_bias, view(grad_gates).sum(0));
}

}  // namespace

extern "C" {

diopiError_t diopiLstmCell(diopiContextHandle_t, diopiTensorHandle_t hy, diopiTensorHandle_t cy,
                           diopiTensorHandle_t workspace, diopiConstTensorHandle_t input_gates,
                           diopiConstTensorHandle_t hidden_gates, diopiConstTensorHandle_t cx,
                           diopiConstTensorHandle_t input_bias, diopiConstTensorHandle_t hidden_bias) {
  return run([&] {
    at::ScalarType type = accumulation_type(view(input_gates).scalar_type());
    at::Tensor gates =
        gates_with_bias(widened(input_gates, type) + widened(hidden_gates, type), input_bias, hidden_bias, type);
    std::vector<at::Tensor> chunks = gates.chunk(4, 1);
    at::Tensor in_gate = chunks[0].sigmoid();
    at::Tensor forget_gate = chunks[1].sigmoid();
    at::Tensor cell_gate = chunks[2].tanh();
    at::Tensor out_gate = chunks[3].sigmoid();
    at::Tensor cell = forget_gate * widened(cx, type) + in_gate * cell_gate;
    store("diopiLstmCell", hy, out_gate * cell.tanh());
    store("diopiLstmCell", cy, cell);
    store("diopiLstmCell", workspace, at::cat({in_gate, forget_gate, cell_gate, out_gate}, 1));
  });
}

diopiError_t diopiLstmCellBackward(diopiContextHandle_t, diopiTensorHandle_t grad_gates, diopiTensorHandle_t grad_cx,
                                   diopiTensorHandle_t grad_bias, diopiConstTensorHandle_t grad_hy,
                                   diopiConstTensorHandle_t grad_cy, diopiConstTensorHandle_t cx,
                                   diopiConstTensorHandle_t cy, diopiConstTensorHandle_t workspace) {
  if (grad_gates == nullptr) return diopiSuccess;  // neither hy nor cy had a gradient
  return run([&] {
    at::ScalarType type = accumulation_type(view(workspace).scalar_type());
    std::vector<at::Tensor> saved = widened(workspace, type).chunk(4, 1);
    const at::Tensor &in_gate = saved[0], &forget_gate = saved[1], &cell_gate = saved[2], &out_gate = saved[3];
    at::Tensor zero = at::zeros_like(widened(cx, type));
    at::Tensor d_hy = grad_hy ? widened(grad_hy, type) : zero;
    at::Tensor d_cy = grad_cy ? widened(grad_cy, type) : zero;
    at::Tensor tanh_cell = widened(cy, type).tanh();
    at::Tensor d_out = d_hy * tanh_cell;
    at::Tensor d_cell = d_hy * out_gate * (1 - tanh_cell * tanh_cell) + d_cy;
    at::Tensor d_in = d_cell * cell_gate;
    at::Tensor d_forget = d_cell * widened(cx, type);
    at::Tensor d_candidate = d_cell * in_gate;
    store("diopiLstmCellBackward", grad_cx, d_cell * forget_gate);
    store("diopiLstmCellBackward", grad_gates,
          at::cat({d_in * (1 - in_gate) * in_gate, d_forget * (1 - forget_gate) * forget_gate,
                   d_candidate * (1 - cell_gate * cell_gate), d_out * (1 - out_gate) * out_gate},
                  1));
    store_bias_gradient("diopiLstmCellBackward", grad_bias, grad_gates);
  });
}

diopiError_t diopiGruCell(diopiContextHandle_t, diopiTensorHandle_t hy, diopiTensorHandle_t workspace,
                          diopiConstTensorHandle_t input_gates, diopiConstTensorHandle_t hidden_gates,
                          diopiConstTensorHandle_t hx, diopiConstTensorHandle_t input_bias,
                          diopiConstTensorHandle_t hidden_bias) {
  return run([&] {
    at::ScalarType type = accumulation_type(view(input_gates).scalar_type());
    std::vector<at::Tensor> in = widened(input_gates, type).chunk(3, 1);
    std::vector<at::Tensor> hidden = widened(hidden_gates, type).chunk(3, 1);
    std::vector<at::Tensor> in_bias(3), hidden_bias_chunks(3);
    if (input_bias != nullptr) {
      in_bias = widened(input_bias, type).chunk(3, 0);
      hidden_bias_chunks = widened(hidden_bias, type).chunk(3, 0);
    }
    auto biased = [&](at::Tensor value, const at::Tensor& bias) { return bias.defined() ? value + bias : value; };
    at::Tensor reset = biased(biased(in[0] + hidden[0], in_bias[0]), hidden_bias_chunks[0]).sigmoid();
    at::Tensor update = biased(biased(in[1] + hidden[1], in_bias[1]), hidden_bias_chunks[1]).sigmoid();
    at::Tensor hidden_new = biased(hidden[2], hidden_bias_chunks[2]);
    at::Tensor candidate = (biased(in[2], in_bias[2]) + reset * hidden_new).tanh();
    at::Tensor previous = view(hx);
    store("diopiGruCell", hy, candidate + update * (previous.to(type) - candidate));
    store("diopiGruCell", workspace, at::cat({reset, update, candidate, previous.to(type), hidden_new}, 1));
  });
}

diopiError_t diopiGruCellBackward(diopiContextHandle_t, diopiTensorHandle_t grad_input_gates,
                                  diopiTensorHandle_t grad_hidden_gates, diopiTensorHandle_t grad_hx,
                                  diopiTensorHandle_t grad_input_bias, diopiTensorHandle_t grad_hidden_bias,
                                  diopiConstTensorHandle_t grad_hy, diopiConstTensorHandle_t workspace) {
  return run([&] {
    at::ScalarType type = accumulation_type(view(workspace).scalar_type());
    std::vector<at::Tensor> saved = widened(workspace, type).chunk(5, 1);
    const at::Tensor &reset = saved[0], &update = saved[1], &candidate = saved[2], &previous = saved[3],
                     &hidden_new = saved[4];
    at::Tensor d_hy = widened(grad_hy, type);
    at::Tensor d_update = d_hy * (previous - candidate) * (1 - update) * update;
    at::Tensor d_candidate = d_hy * (1 - update) * (1 - candidate * candidate);
    at::Tensor d_reset = d_candidate * hidden_new * (1 - reset) * reset;
    store("diopiGruCellBackward", grad_hx, d_hy * update);
    store("diopiGruCellBackward", grad_input_gates, at::cat({d_reset, d_update, d_candidate}, 1));
    store("diopiGruCellBackward", grad_hidden_gates, at::cat({d_reset, d_update, d_candidate * reset}, 1));
    store_bias_gradient("diopiGruCellBackward", grad_input_bias, grad_input_gates);
    store_bias_gradient("diopiGruCellBackward", grad_hidden_bias, grad_hidden_gates);
  });
}

}  // extern "C"
