// The CPU fallback: runs any ATen operator on the CPU for dipu tensors. When the vendor's memory
// is host-accessible the CPU kernels work on aliases of the device memory; otherwise every storage
// an operator touches is copied to the host through the vendor's memcpy and mutated storages are
// copied back. Every fallback is counted per operator and can be logged (DIPU_LOG_FALLBACK=1).
#pragma once

#include <ATen/core/dispatch/Dispatcher.h>
#include <ATen/core/stack.h>

#include <map>
#include <string>

namespace dipu::aten {

void cpu_fallback(const c10::OperatorHandle& op, torch::jit::Stack* stack);

// Why the next fallback on this thread happens (default: the operator is not in the DIOPI table).
void note_fallback_reason(const char* reason);

std::map<std::string, int64_t> fallback_counts();
void reset_fallback_counts();
void set_fallback_logging(bool enabled);
bool fallback_logging();

}  // namespace dipu::aten
