// Operators whose CPU kernel is a composition of other operators and runs unchanged on dipu tensors,
// each part dispatched to the device: dropout, so that its draws come from the dipu generator (the
// CPU fallback would hand the CPU kernel the CPU's default generator).
#include <ATen/ops/native_dropout_native.h>
#include <torch/library.h>

TORCH_LIBRARY_IMPL(aten, PrivateUse1, m) { m.impl("native_dropout", TORCH_FN(at::native::native_dropout_cpu)); }
