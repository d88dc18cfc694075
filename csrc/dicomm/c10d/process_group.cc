#include "process_group.h"

#include <c10/core/impl/VirtualGuardImpl.h>
#include <torch/csrc/distributed/c10d/exception.h>

#include <chrono>
#include <thread>
#include <type_traits>

namespace dicomm {
namespace {

// Point-to-point tags are the user's (32-bit) tag; collectives own the tags with the top bit set,
// numbered by call order, with 8 bits for the steps inside one call.
constexpr uint64_t kCollectiveTagBit = uint64_t(1) << 63;
constexpr int kCollectiveStepBits = 8;

uint64_t pointToPointTag(int tag) { return uint64_t(uint32_t(tag)); }

void checkTensorCount(const std::vector<at::Tensor>& tensors, const char* op) {
  TORCH_CHECK(tensors.size() == 1, "dicomm ", op, " takes exactly one tensor per process, got ", tensors.size());
}

size_t elementCount(const at::Tensor& t) { return size_t(t.numel()); }

// Elementwise kernels on raw host memory: single-threaded loops the compiler vectorises, so four
// processes sharing two cores do not also fight over intra-op thread pools.
template <typename T, typename Op>
void elementwise(void* out, const void* a, const void* b, size_t count, Op op) {
  T* o = static_cast<T*>(out);
  const T* x = static_cast<const T*>(a);
  const T* y = static_cast<const T*>(b);
  for (size_t i = 0; i < count; ++i) o[i] = op(x[i], y[i]);
}

template <typename T>
bool isNan(T v) {
  if constexpr (std::is_integral_v<T>) {
    return false;
  } else {
    return v != v;
  }
}

template <typename T>
ReduceInto arithmetic(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::AVG:
      return [](void* o, const void* a, const void* b, size_t n) {
        elementwise<T>(o, a, b, n, [](T x, T y) { return static_cast<T>(x + y); });
      };
    case c10d::ReduceOp::PRODUCT:
      return [](void* o, const void* a, const void* b, size_t n) {
        elementwise<T>(o, a, b, n, [](T x, T y) { return static_cast<T>(x * y); });
      };
    case c10d::ReduceOp::MIN:  // NaN wins, as in torch.minimum
      return [](void* o, const void* a, const void* b, size_t n) {
        elementwise<T>(o, a, b, n, [](T x, T y) { return isNan(x) ? x : isNan(y) ? y : (y < x ? y : x); });
      };
    case c10d::ReduceOp::MAX:
      return [](void* o, const void* a, const void* b, size_t n) {
        elementwise<T>(o, a, b, n, [](T x, T y) { return isNan(x) ? x : isNan(y) ? y : (x < y ? y : x); });
      };
    default: break;
  }
  if constexpr (std::is_integral_v<T>) {
    switch (op) {
      case c10d::ReduceOp::BAND:
        return [](void* o, const void* a, const void* b, size_t n) {
          elementwise<T>(o, a, b, n, [](T x, T y) { return static_cast<T>(x & y); });
        };
      case c10d::ReduceOp::BOR:
        return [](void* o, const void* a, const void* b, size_t n) {
          elementwise<T>(o, a, b, n, [](T x, T y) { return static_cast<T>(x | y); });
        };
      case c10d::ReduceOp::BXOR:
        return [](void* o, const void* a, const void* b, size_t n) {
          elementwise<T>(o, a, b, n, [](T x, T y) { return static_cast<T>(x ^ y); });
        };
      default: break;
    }
  }
  return nullptr;
}

// bool as bytes holding 0 or 1: sum and max are "or", product and min are "and".
ReduceInto logical(c10d::ReduceOp::RedOpType op) {
  switch (op) {
    case c10d::ReduceOp::SUM:
    case c10d::ReduceOp::MAX:
    case c10d::ReduceOp::BOR: return arithmetic<uint8_t>(c10d::ReduceOp::BOR);
    case c10d::ReduceOp::PRODUCT:
    case c10d::ReduceOp::MIN:
    case c10d::ReduceOp::BAND: return arithmetic<uint8_t>(c10d::ReduceOp::BAND);
    case c10d::ReduceOp::BXOR: return arithmetic<uint8_t>(c10d::ReduceOp::BXOR);
    default: return nullptr;
  }
}

// out = a op b on `count` elements of `dtype`; throws for combinations that make no sense.
ReduceInto reducer(const c10d::ReduceOp& op, at::ScalarType dtype, const char* name) {
  const bool floating = at::isFloatingType(dtype) || at::isComplexType(dtype);
  TORCH_CHECK(op.op_ != c10d::ReduceOp::AVG || floating, "dicomm ", name, ": AVG needs a floating point tensor, got ",
              dtype);
  TORCH_CHECK(
      !floating || (op.op_ != c10d::ReduceOp::BAND && op.op_ != c10d::ReduceOp::BOR && op.op_ != c10d::ReduceOp::BXOR),
      "dicomm ", name, ": bitwise reductions need an integer or bool tensor, got ", dtype);
  ReduceInto kernel;
  switch (dtype) {
    case at::kFloat: kernel = arithmetic<float>(op.op_); break;
    case at::kDouble: kernel = arithmetic<double>(op.op_); break;
    case at::kHalf: kernel = arithmetic<c10::Half>(op.op_); break;
    case at::kBFloat16: kernel = arithmetic<c10::BFloat16>(op.op_); break;
    case at::kChar: kernel = arithmetic<int8_t>(op.op_); break;
    case at::kByte: kernel = arithmetic<uint8_t>(op.op_); break;
    case at::kShort: kernel = arithmetic<int16_t>(op.op_); break;
    case at::kInt: kernel = arithmetic<int32_t>(op.op_); break;
    case at::kLong: kernel = arithmetic<int64_t>(op.op_); break;
    case at::kBool: kernel = logical(op.op_); break;
    default: break;
  }
  TORCH_CHECK(kernel, "dicomm ", name, " does not support reduce op ", int(op.op_), " on ", dtype,
              " (PREMUL_SUM and complex tensors outside SUM/AVG are not supported)");
  return kernel;
}

void divideForAverage(const c10d::ReduceOp& op, const at::Tensor& host, int size) {
  if (op.op_ == c10d::ReduceOp::AVG) host.div_(size);
}

void checkSameShape(const std::vector<at::Tensor>& list, const at::Tensor& like, const char* op, const char* what) {
  for (const auto& t : list) {
    TORCH_CHECK(t.numel() == like.numel() && t.scalar_type() == like.scalar_type(), "dicomm ", op, ": every ", what,
                " must have the input's dtype and element count (", like.scalar_type(), ", ", like.numel(), "), got ",
                t.scalar_type(), ", ", t.numel());
  }
}

void checkRoot(int64_t root, int size, const char* op) {
  TORCH_CHECK(root >= 0 && root < size, "dicomm ", op, ": root rank ", root, " is outside [0, ", size, ")");
}

// The per-rank tensors of gather (its outputs) and scatter (its inputs), staged on the host with
// `stage`: the root passes one list of `size` tensors like `local`, the other ranks pass none.
std::vector<HostTensor> stageRootList(const std::vector<std::vector<at::Tensor>>& lists, bool is_root, int size,
                                      const at::Tensor& local, const char* op, const char* role,
                                      HostTensor (*stage)(const at::Tensor&)) {
  std::vector<HostTensor> staged;
  if (!is_root) {
    TORCH_CHECK(lists.empty() || lists[0].empty(), "dicomm ", op, ": only the root passes ", role, " tensors");
    return staged;
  }
  TORCH_CHECK(lists.size() == 1 && lists[0].size() == size_t(size), "dicomm ", op, ": the root needs one list of ",
              size, " ", role, " tensors");
  checkSameShape(lists[0], local, op, role);
  for (const auto& t : lists[0]) staged.push_back(stage(t));
  return staged;
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The backend

namespace {

// Rendezvous through the process group's store.
class C10dStore : public Store {
 public:
  explicit C10dStore(c10::intrusive_ptr<c10d::Store> store) : store_(std::move(store)) {}
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, std::vector<uint8_t>(value.begin(), value.end()));
  }
  std::string get(const std::string& key) override {
    const auto value = store_->get(key);
    return std::string(value.begin(), value.end());
  }
  std::string get(const std::string& key, Clock::time_point deadline) override {
    while (!store_->check({key})) {
      if (Clock::now() >= deadline) throw storeKeyMissing(key);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return get(key);
  }
  std::optional<bool> has(const std::string& key) override { return store_->check({key}); }

 private:
  c10::intrusive_ptr<c10d::Store> store_;
};

}  // namespace

ProcessGroupDiComm::ProcessGroupDiComm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                       std::chrono::milliseconds timeout, std::map<int, LinkShape> peer_links,
                                       std::shared_ptr<const DeviceMemory> device_memory, c10::DeviceType device_type)
    : Backend(rank, size), device_memory_type_(device_type) {
  dicomm::Options options = dicomm::Options::fromEnvironment();
  for (auto& [peer, link] : peer_links) options.peer_links[peer] = link;
  options.device_memory = std::move(device_memory);
  options.timeout_s = std::chrono::duration<double>(timeout).count();
  options.connect_timeout_s = options.timeout_s;
  options.store_prefix = "dicomm";
  C10dStore rendezvous(store);
  try {
    options.validate();
    engine_ = std::make_unique<Engine>(rendezvous, rank, size, options);
  } catch (const std::exception& e) {
    throwBackendError("dicomm: rank " + std::to_string(rank) + " of " + std::to_string(size) +
                      " could not join the group: " + e.what());
  }
  watcher_ = std::make_shared<SerialThread>();
  queue_ = std::make_unique<SerialThread>();
  init();
}

ProcessGroupDiComm::~ProcessGroupDiComm() { shutdown(); }

void ProcessGroupDiComm::shutdown() {
  queue_.reset();  // runs what was queued (each bounded by the timeout), then stops
  watcher_.reset();
  if (engine_) engine_->close();
}

void ProcessGroupDiComm::abort() {
  recordFailure("the process group was aborted");
  if (engine_) engine_->close();
}

std::string ProcessGroupDiComm::transportOf(int peer) const { return transportName(engine_->transportOf(peer)); }

void ProcessGroupDiComm::checkUsable() const {
  TORCH_CHECK(queue_, "dicomm: the process group was shut down");
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (!failure_.empty())
    throwBackendError("dicomm: the process group is unusable after an earlier failure: " + failure_);
}

void ProcessGroupDiComm::recordFailure(const std::string& why) {
  std::lock_guard<std::mutex> lock(failure_mutex_);
  if (failure_.empty()) failure_ = why;
}

// ---- coalescing ----

void ProcessGroupDiComm::startCoalescing() {
  TORCH_CHECK(!coalescing_.exchange(true), "dicomm: startCoalescing called twice without endCoalescing");
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::endCoalescing() {
  TORCH_CHECK(coalescing_.exchange(false), "dicomm: endCoalescing called without startCoalescing");
  auto p2p = c10::make_intrusive<P2PWork>(rank_, c10d::OpType::COALESCED, std::move(coalesced_items_),
                                          std::move(coalesced_tensors_), watcher_);
  coalesced_items_.clear();
  coalesced_tensors_.clear();
  if (coalesced_collectives_.empty()) return p2p;
  std::vector<c10::intrusive_ptr<c10d::Work>> parts{p2p};
  parts.insert(parts.end(), coalesced_collectives_.begin(), coalesced_collectives_.end());
  coalesced_collectives_.clear();
  return c10::make_intrusive<GroupWork>(rank_, std::move(parts), watcher_);
}

// ---- point-to-point ----

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::pointToPoint(at::Tensor& tensor, bool is_send, int peer, int tag) {
  checkUsable();
  TORCH_CHECK(peer >= 0 && peer < size_ && peer != rank_, "dicomm ", is_send ? "send" : "recv", ": peer ", peer,
              " is not another rank of this group of ", size_);
  const bool direct = movesDeviceDirect(tensor, peer);
  HostTensor host = direct    ? HostTensor::deviceDirect(tensor)
                    : is_send ? HostTensor::input(tensor)
                              : HostTensor::output(tensor);
  const Memory memory = direct ? Memory::Device : Memory::Host;
  RequestPtr request;
  if (host.bytes() > 0) {
    if (direct) {
      // The transport reads (or overwrites) the memory now: the device's queued work on it goes first.
      c10::impl::VirtualGuardImpl guard(tensor.device().type());
      guard.synchronizeStream(guard.getStream(tensor.device()));
    }
    request = is_send ? engine_->isend(peer, pointToPointTag(tag), host.data(), host.bytes(), memory)
                      : engine_->irecv(peer, pointToPointTag(tag), host.data(), host.bytes(), memory);
  }
  auto item = std::make_shared<P2PItem>(std::move(request), is_send, peer, tag, std::move(host));
  if (coalescing_.load(std::memory_order_relaxed)) {
    coalesced_items_.push_back(item);
    coalesced_tensors_.push_back(tensor);
  }
  return c10::make_intrusive<P2PWork>(rank_, is_send ? c10d::OpType::SEND : c10d::OpType::RECV,
                                      std::vector<std::shared_ptr<P2PItem>>{std::move(item)},
                                      std::vector<at::Tensor>{tensor}, watcher_);
}

bool ProcessGroupDiComm::movesDeviceDirect(const at::Tensor& tensor, int peer) const {
  return tensor.device().type() == device_memory_type_ && tensor.is_contiguous() && engine_->deviceDirect(peer);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  checkTensorCount(tensors, "send");
  return pointToPoint(tensors[0], true, dst, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  checkTensorCount(tensors, "recv");
  return pointToPoint(tensors[0], false, src, tag);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  TORCH_CHECK(false, "dicomm: recv from any source is not supported; pass the source rank (src=)");
}

// ---- collectives ----

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::enqueue(c10d::OpType type, const std::string& name,
                                                           std::vector<at::Tensor> outputs, Body body) {
  checkUsable();
  const uint64_t sequence = next_collective_++;
  const std::string description = "dicomm " + name + " #" + std::to_string(sequence) + " (rank " +
                                  std::to_string(rank_) + " of " + std::to_string(size_) + ")";
  auto work = c10::make_intrusive<CollectiveWork>(rank_, type, description, std::move(outputs));
  const uint64_t tag_base = kCollectiveTagBit | (sequence << kCollectiveStepBits);
  queue_->push([this, work, tag_base, description, body = std::move(body)] {
    std::exception_ptr error;
    try {
      {
        std::lock_guard<std::mutex> lock(failure_mutex_);
        if (!failure_.empty()) throw CommError("the process group is unusable after an earlier failure: " + failure_);
      }
      at::NoGradGuard no_grad;
      CollectiveChannel channel(*engine_, tag_base, description);
      body(channel, scratch_);
    } catch (const std::exception& e) {
      const std::string what = dynamic_cast<const c10::Error*>(&e)
                                   ? description + ": " + dynamic_cast<const c10::Error*>(&e)->what_without_backtrace()
                               : std::string(e.what()).rfind(description, 0) == 0 ? e.what()
                                                                                  : description + ": " + e.what();
      recordFailure(what);
      error = backendError(what);
    }
    work->complete(error);
  });
  if (coalescing_.load(std::memory_order_relaxed)) coalesced_collectives_.push_back(work);
  return work;
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::barrier(const c10d::BarrierOptions& opts) {
  return enqueue(c10d::OpType::BARRIER, "barrier", {},
                 [](CollectiveChannel& channel, Scratch&) { dicomm::barrier(channel); });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::broadcast(std::vector<at::Tensor>& tensors,
                                                             const c10d::BroadcastOptions& opts) {
  checkTensorCount(tensors, "broadcast");
  checkRoot(opts.rootRank, size_, "broadcast");
  const int root = int(opts.rootRank);
  HostTensor host = rank_ == root ? HostTensor::input(tensors[0]) : HostTensor::output(tensors[0]);
  return enqueue(c10d::OpType::BROADCAST, "broadcast", tensors, [host, root](CollectiveChannel& channel, Scratch&) {
    dicomm::broadcast(channel, host.data(), host.bytes(), root);
    if (channel.rank() != root) host.copyBack();
  });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::allreduce(std::vector<at::Tensor>& tensors,
                                                             const c10d::AllreduceOptions& opts) {
  checkTensorCount(tensors, "all_reduce");
  const at::Tensor& tensor = tensors[0];
  TORCH_CHECK(tensor.layout() == at::kStrided, "dicomm all_reduce supports dense tensors only");
  ReduceInto reduce = reducer(opts.reduceOp, tensor.scalar_type(), "all_reduce");
  HostTensor host = HostTensor::inPlace(tensor);
  const c10d::ReduceOp op = opts.reduceOp;
  const size_t element_bytes = tensor.element_size();
  return enqueue(c10d::OpType::ALLREDUCE, "all_reduce", tensors,
                 [host, reduce, op, element_bytes](CollectiveChannel& channel, Scratch& scratch) {
                   dicomm::allreduce(channel, scratch, host.data(), elementCount(host.host()), element_bytes, reduce);
                   divideForAverage(op, host.host(), channel.size());
                   host.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                                       const c10d::AllreduceCoalescedOptions& opts) {
  TORCH_CHECK(!tensors.empty(), "dicomm all_reduce_coalesced needs at least one tensor");
  for (const auto& t : tensors) {
    TORCH_CHECK(t.scalar_type() == tensors[0].scalar_type(),
                "dicomm all_reduce_coalesced needs tensors of one dtype, got ", tensors[0].scalar_type(), " and ",
                t.scalar_type());
  }
  ReduceInto reduce = reducer(opts.reduceOp, tensors[0].scalar_type(), "all_reduce_coalesced");
  std::vector<at::Tensor> flat_parts;
  for (const auto& t : tensors) flat_parts.push_back(t.to(at::kCPU).reshape({-1}));
  at::Tensor flat = at::cat(flat_parts);
  const c10d::ReduceOp op = opts.reduceOp;
  std::vector<at::Tensor> targets = tensors;
  return enqueue(c10d::OpType::ALLREDUCE_COALESCED, "all_reduce_coalesced", tensors,
                 [flat, targets, reduce, op](CollectiveChannel& channel, Scratch& scratch) {
                   dicomm::allreduce(channel, scratch, flat.data_ptr(), elementCount(flat), flat.element_size(),
                                     reduce);
                   divideForAverage(op, flat, channel.size());
                   int64_t offset = 0;
                   for (const auto& t : targets) {
                     t.copy_(flat.narrow(0, offset, t.numel()).view(t.sizes()));
                     offset += t.numel();
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::reduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::ReduceOptions& opts) {
  checkTensorCount(tensors, "reduce");
  checkRoot(opts.rootRank, size_, "reduce");
  const at::Tensor& tensor = tensors[0];
  ReduceInto reduce = reducer(opts.reduceOp, tensor.scalar_type(), "reduce");
  // The root's tensor is overwritten with the result; other ranks' tensors stay as they were.
  at::Tensor host = tensor.to(at::kCPU).contiguous();
  if (host.data_ptr() == tensor.data_ptr()) host = host.clone();
  const int root = int(opts.rootRank);
  const c10d::ReduceOp op = opts.reduceOp;
  at::Tensor target = tensor;
  return enqueue(c10d::OpType::REDUCE, "reduce", tensors,
                 [host, target, reduce, op, root](CollectiveChannel& channel, Scratch& scratch) {
                   dicomm::reduce(channel, scratch, host.data_ptr(), elementCount(host), host.element_size(), reduce,
                                  root);
                   if (channel.rank() == root) {
                     divideForAverage(op, host, channel.size());
                     target.copy_(host);
                   }
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                             std::vector<at::Tensor>& inputs,
                                                             const c10d::AllgatherOptions& opts) {
  checkTensorCount(inputs, "all_gather");
  TORCH_CHECK(outputs.size() == 1 && outputs[0].size() == size_t(size_), "dicomm all_gather needs one list of ", size_,
              " output tensors");
  checkSameShape(outputs[0], inputs[0], "all_gather", "output");
  HostTensor input = HostTensor::input(inputs[0]);
  std::vector<HostTensor> slots;
  for (const auto& t : outputs[0]) slots.push_back(HostTensor::output(t));
  return enqueue(c10d::OpType::ALLGATHER, "all_gather", outputs[0],
                 [input, slots](CollectiveChannel& channel, Scratch&) {
                   std::vector<void*> pointers;
                   for (const auto& s : slots) pointers.push_back(s.data());
                   dicomm::allgather(channel, input.data(), input.bytes(), pointers);
                   for (const auto& s : slots) s.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                                   const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(output.numel() == input.numel() * size_ && output.scalar_type() == input.scalar_type(),
              "dicomm all_gather_into_tensor: the output must hold ", size_, " x ", input.numel(), " elements of ",
              input.scalar_type());
  HostTensor in = HostTensor::input(input);
  HostTensor out = HostTensor::output(output);
  return enqueue(c10d::OpType::_ALLGATHER_BASE, "all_gather_into_tensor", {output},
                 [in, out](CollectiveChannel& channel, Scratch&) {
                   std::vector<void*> pointers;
                   for (int q = 0; q < channel.size(); ++q)
                     pointers.push_back(static_cast<uint8_t*>(out.data()) + q * in.bytes());
                   dicomm::allgather(channel, in.data(), in.bytes(), pointers);
                   out.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                                   std::vector<at::Tensor>& inputs,
                                                                                   const c10d::AllgatherOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "dicomm all_gather_into_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  for (size_t i = 0; i < inputs.size(); ++i) parts.push_back(_allgather_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<GroupWork>(rank_, std::move(parts), watcher_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                          std::vector<at::Tensor>& inputs,
                                                          const c10d::GatherOptions& opts) {
  checkTensorCount(inputs, "gather");
  checkRoot(opts.rootRank, size_, "gather");
  const int root = int(opts.rootRank);
  const std::vector<HostTensor> slots =
      stageRootList(outputs, rank_ == root, size_, inputs[0], "gather", "output", &HostTensor::output);
  HostTensor input = HostTensor::input(inputs[0]);
  return enqueue(c10d::OpType::GATHER, "gather", rank_ == root ? outputs[0] : std::vector<at::Tensor>{},
                 [input, slots, root](CollectiveChannel& channel, Scratch&) {
                   std::vector<void*> pointers;
                   for (const auto& s : slots) pointers.push_back(s.data());
                   dicomm::gather(channel, input.data(), input.bytes(), pointers, root);
                   for (const auto& s : slots) s.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::scatter(std::vector<at::Tensor>& outputs,
                                                           std::vector<std::vector<at::Tensor>>& inputs,
                                                           const c10d::ScatterOptions& opts) {
  checkTensorCount(outputs, "scatter");
  checkRoot(opts.rootRank, size_, "scatter");
  const int root = int(opts.rootRank);
  const std::vector<HostTensor> slots =
      stageRootList(inputs, rank_ == root, size_, outputs[0], "scatter", "input", &HostTensor::input);
  HostTensor output = HostTensor::output(outputs[0]);
  return enqueue(c10d::OpType::SCATTER, "scatter", outputs,
                 [output, slots, root](CollectiveChannel& channel, Scratch&) {
                   std::vector<const void*> pointers;
                   for (const auto& s : slots) pointers.push_back(s.data());
                   dicomm::scatter(channel, pointers, output.data(), output.bytes(), root);
                   output.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                                  std::vector<std::vector<at::Tensor>>& inputs,
                                                                  const c10d::ReduceScatterOptions& opts) {
  checkTensorCount(outputs, "reduce_scatter");
  TORCH_CHECK(inputs.size() == 1 && inputs[0].size() == size_t(size_), "dicomm reduce_scatter needs one list of ",
              size_, " input tensors");
  checkSameShape(inputs[0], outputs[0], "reduce_scatter", "input");
  ReduceInto reduce = reducer(opts.reduceOp, outputs[0].scalar_type(), "reduce_scatter");
  std::vector<HostTensor> slots;
  for (const auto& t : inputs[0]) slots.push_back(HostTensor::input(t));
  HostTensor output = HostTensor::output(outputs[0]);
  const c10d::ReduceOp op = opts.reduceOp;
  return enqueue(c10d::OpType::REDUCE_SCATTER, "reduce_scatter", outputs,
                 [slots, output, reduce, op](CollectiveChannel& channel, Scratch& scratch) {
                   std::vector<const void*> pointers;
                   for (const auto& s : slots) pointers.push_back(s.data());
                   dicomm::reduceScatter(channel, scratch, pointers, output.data(), elementCount(output.host()),
                                         output.host().element_size(), reduce);
                   divideForAverage(op, output.host(), channel.size());
                   output.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                        const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(input.numel() == output.numel() * size_ && output.scalar_type() == input.scalar_type(),
              "dicomm reduce_scatter_tensor: the input must hold ", size_, " x ", output.numel(), " elements of ",
              output.scalar_type());
  ReduceInto reduce = reducer(opts.reduceOp, output.scalar_type(), "reduce_scatter_tensor");
  HostTensor in = HostTensor::input(input);
  HostTensor out = HostTensor::output(output);
  const c10d::ReduceOp op = opts.reduceOp;
  return enqueue(c10d::OpType::_REDUCE_SCATTER_BASE, "reduce_scatter_tensor", {output},
                 [in, out, reduce, op](CollectiveChannel& channel, Scratch& scratch) {
                   std::vector<const void*> pointers;
                   for (int q = 0; q < channel.size(); ++q) {
                     pointers.push_back(static_cast<const uint8_t*>(in.data()) + q * out.bytes());
                   }
                   dicomm::reduceScatter(channel, scratch, pointers, out.data(), elementCount(out.host()),
                                         out.host().element_size(), reduce);
                   divideForAverage(op, out.host(), channel.size());
                   out.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs, const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "dicomm reduce_scatter_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  std::vector<c10::intrusive_ptr<c10d::Work>> parts;
  for (size_t i = 0; i < inputs.size(); ++i) parts.push_back(_reduce_scatter_base(outputs[i], inputs[i], opts));
  return c10::make_intrusive<GroupWork>(rank_, std::move(parts), watcher_);
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                                 std::vector<int64_t>& output_split_sizes,
                                                                 std::vector<int64_t>& input_split_sizes,
                                                                 const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "dicomm all_to_all_single: input and output dtypes differ");
  auto splits = [this](const at::Tensor& t, const std::vector<int64_t>& sizes, const char* what) {
    std::vector<size_t> bytes(static_cast<size_t>(size_));
    const int64_t rows = t.dim() == 0 ? 1 : t.size(0);
    const size_t row_bytes = rows == 0 ? 0 : t.nbytes() / size_t(rows);
    if (sizes.empty()) {
      TORCH_CHECK(rows % size_ == 0, "dicomm all_to_all_single: ", what, " has ", rows,
                  " rows, not divisible by the group size ", size_);
      for (auto& b : bytes) b = size_t(rows / size_) * row_bytes;
    } else {
      TORCH_CHECK(sizes.size() == size_t(size_), "dicomm all_to_all_single: ", what, " split sizes need ", size_,
                  " entries, got ", sizes.size());
      int64_t sum = 0;
      for (size_t q = 0; q < sizes.size(); ++q) {
        bytes[q] = size_t(sizes[q]) * row_bytes;
        sum += sizes[q];
      }
      TORCH_CHECK(sum == rows, "dicomm all_to_all_single: ", what, " split sizes sum to ", sum, ", the tensor has ",
                  rows, " rows");
    }
    return bytes;
  };
  const std::vector<size_t> send_bytes = splits(input, input_split_sizes, "input");
  const std::vector<size_t> recv_bytes = splits(output, output_split_sizes, "output");
  HostTensor in = HostTensor::input(input);
  HostTensor out = HostTensor::output(output);
  return enqueue(c10d::OpType::ALLTOALL_BASE, "all_to_all_single", {output},
                 [in, out, send_bytes, recv_bytes](CollectiveChannel& channel, Scratch&) {
                   std::vector<ConstBytes> sends;
                   std::vector<Bytes> recvs;
                   size_t send_offset = 0, recv_offset = 0;
                   for (int q = 0; q < channel.size(); ++q) {
                     sends.push_back({static_cast<const uint8_t*>(in.data()) + send_offset, send_bytes[size_t(q)]});
                     recvs.push_back({static_cast<uint8_t*>(out.data()) + recv_offset, recv_bytes[size_t(q)]});
                     send_offset += send_bytes[size_t(q)];
                     recv_offset += recv_bytes[size_t(q)];
                   }
                   dicomm::allToAll(channel, sends, recvs);
                   out.copyBack();
                 });
}

c10::intrusive_ptr<c10d::Work> ProcessGroupDiComm::alltoall(std::vector<at::Tensor>& outputs,
                                                            std::vector<at::Tensor>& inputs,
                                                            const c10d::AllToAllOptions& opts) {
  TORCH_CHECK(outputs.size() == size_t(size_) && inputs.size() == size_t(size_), "dicomm all_to_all needs ", size_,
              " input and ", size_, " output tensors");
  std::vector<HostTensor> ins, outs;
  for (const auto& t : inputs) ins.push_back(HostTensor::input(t));
  for (const auto& t : outputs) outs.push_back(HostTensor::output(t));
  return enqueue(c10d::OpType::ALLTOALL, "all_to_all", outputs, [ins, outs](CollectiveChannel& channel, Scratch&) {
    std::vector<ConstBytes> sends;
    std::vector<Bytes> recvs;
    for (const auto& h : ins) sends.push_back({h.data(), h.bytes()});
    for (const auto& h : outs) recvs.push_back({h.data(), h.bytes()});
    dicomm::allToAll(channel, sends, recvs);
    for (const auto& h : outs) h.copyBack();
  });
}

}  // namespace dicomm
