#include "work.h"

#include <torch/csrc/distributed/c10d/exception.h>

namespace dicomm {

void throwBackendError(const std::string& what) { C10_THROW_ERROR(DistBackendError, what); }

std::exception_ptr backendError(const std::string& what) {
  try {
    throwBackendError(what);
  } catch (...) {
    return std::current_exception();
  }
}

namespace {

c10::intrusive_ptr<c10::ivalue::Future> tensorListFuture() {
  return c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
}

void completeFuture(c10::ivalue::Future& future, c10d::Work& work, const std::vector<at::Tensor>& outputs) {
  if (work.isSuccess()) {
    future.markCompleted(c10::IValue(outputs));
  } else {
    future.setError(work.exception());
  }
}

std::chrono::milliseconds remaining(Clock::time_point deadline) {
  return std::max(std::chrono::milliseconds(1),
                  std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()));
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// HostTensor

HostTensor HostTensor::deviceDirect(const at::Tensor& tensor) {
  HostTensor h;
  h.host_ = tensor;
  return h;
}

HostTensor HostTensor::input(const at::Tensor& tensor) {
  HostTensor h;
  if (tensor.device().is_cpu() && tensor.is_contiguous()) {
    h.host_ = tensor;
  } else {
    h.host_ = tensor.to(at::kCPU).contiguous();
  }
  return h;
}

HostTensor HostTensor::output(const at::Tensor& tensor) {
  HostTensor h;
  if (tensor.device().is_cpu() && tensor.is_contiguous()) {
    h.host_ = tensor;
  } else {
    h.host_ = at::empty(tensor.sizes(), tensor.options().device(at::kCPU).memory_format(at::MemoryFormat::Contiguous));
    h.target_ = tensor;
  }
  return h;
}

HostTensor HostTensor::inPlace(const at::Tensor& tensor) {
  HostTensor h = output(tensor);
  if (h.target_.defined()) h.host_.copy_(tensor);
  return h;
}

void HostTensor::copyBack() const {
  if (target_.defined()) target_.copy_(host_);
}

// ---------------------------------------------------------------------------------------------
// Point-to-point works

P2PItem::P2PItem(RequestPtr request, bool is_send, int peer, int tag, HostTensor tensor)
    : request_(std::move(request)), is_send_(is_send), peer_(peer), tag_(tag), tensor_(std::move(tensor)) {}

std::string P2PItem::describe() const {
  return std::string("dicomm ") + (is_send_ ? "send to" : "recv from") + " rank " + std::to_string(peer_) + " (tag " +
         std::to_string(tag_) + ", " + std::to_string(tensor_.bytes()) + " bytes)";
}

std::string P2PItem::settle() {
  std::call_once(settled_, [this] {
    if (!request_) return;  // zero bytes: nothing was posted
    if (!request_->succeeded()) {
      error_ = describe() + " failed: " + request_->error();
    } else if (request_->bytes() != tensor_.bytes()) {
      error_ = describe() + " got a message of " + std::to_string(request_->bytes()) + " bytes";
    } else if (!is_send_) {
      tensor_.copyBack();
    }
  });
  return error_;
}

P2PWork::P2PWork(int rank, c10d::OpType type, std::vector<std::shared_ptr<P2PItem>> items,
                 std::vector<at::Tensor> tensors, std::shared_ptr<SerialThread> watcher)
    : Work(rank, type), items_(std::move(items)), tensors_(std::move(tensors)), watcher_(std::move(watcher)) {}

void P2PWork::settle() {
  std::string errors;
  for (auto& item : items_) {
    const std::string e = item->settle();
    if (!e.empty()) errors += (errors.empty() ? "" : "; ") + e;
  }
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return;
    completed_ = true;
    if (!errors.empty()) exception_ = backendError(errors);
    future = future_;
  }
  cv_.notify_all();
  if (future) completeFuture(*future, *this, tensors_);
}

bool P2PWork::isCompleted() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (completed_) return true;
  }
  for (auto& item : items_) {
    if (item->request() && !item->request()->test()) return false;
  }
  settle();
  return true;
}

bool P2PWork::wait(std::chrono::milliseconds timeout) {
  const bool bounded = timeout != kNoTimeout;
  const auto deadline = Clock::now() + timeout;
  for (auto& item : items_) {
    const RequestPtr& request = item->request();
    if (!request) continue;
    try {
      request->wait(bounded ? std::chrono::duration<double>(remaining(deadline)).count() : -1.0);
    } catch (const WaitTimeout&) {
      throwBackendError(item->describe() + ": wait timed out after " + std::to_string(timeout.count()) +
                        " ms; the operation is still pending");
    } catch (const CommError&) {
      // Reported by settle() with the operation's description.
    }
  }
  settle();
  std::lock_guard<std::mutex> lock(mutex_);
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

c10::intrusive_ptr<c10::ivalue::Future> P2PWork::getFuture() {
  bool done;
  c10::intrusive_ptr<c10::ivalue::Future> future;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (future_) return future_;
    future_ = tensorListFuture();
    future = future_;
    done = completed_;
  }
  if (done) {
    completeFuture(*future, *this, tensors_);
  } else {
    watcher_->push([work = c10::intrusive_ptr<P2PWork>::reclaim_copy(this)] {
      try {
        work->wait(kNoTimeout);  // settles the work, which completes its future
      } catch (const std::exception&) {
      }
    });
  }
  return future;
}

// ---------------------------------------------------------------------------------------------
// Collective and grouped works

CollectiveWork::CollectiveWork(int rank, c10d::OpType type, std::string description, std::vector<at::Tensor> outputs)
    : Work(rank, type),
      description_(std::move(description)),
      outputs_(std::move(outputs)),
      future_(tensorListFuture()) {}

void CollectiveWork::complete(std::exception_ptr error) {
  finish(error);
  if (error) {
    future_->setError(error);
  } else {
    future_->markCompleted(c10::IValue(outputs_));
  }
}

bool CollectiveWork::wait(std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  if (timeout == kNoTimeout) {
    cv_.wait(lock, [this] { return completed_; });
  } else if (!cv_.wait_for(lock, timeout, [this] { return completed_; })) {
    throwBackendError(description_ + ": wait timed out after " + std::to_string(timeout.count()) +
                      " ms; the collective is still running");
  }
  if (exception_) std::rethrow_exception(exception_);
  return true;
}

GroupWork::GroupWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> parts, std::shared_ptr<SerialThread> watcher)
    : Work(rank, c10d::OpType::COALESCED), parts_(std::move(parts)), watcher_(std::move(watcher)) {}

bool GroupWork::isCompleted() {
  for (auto& p : parts_) {
    if (!p->isCompleted()) return false;
  }
  return true;
}

bool GroupWork::isSuccess() const {
  for (auto& p : parts_) {
    if (!p->isSuccess()) return false;
  }
  return true;
}

std::exception_ptr GroupWork::exception() const {
  for (auto& p : parts_) {
    if (auto e = p->exception()) return e;
  }
  return nullptr;
}

bool GroupWork::wait(std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (auto& p : parts_) p->wait(timeout == kNoTimeout ? kNoTimeout : remaining(deadline));
  return true;
}

std::vector<at::Tensor> GroupWork::result() {
  std::vector<at::Tensor> all;
  for (auto& p : parts_) {
    auto r = p->result();
    all.insert(all.end(), r.begin(), r.end());
  }
  return all;
}

c10::intrusive_ptr<c10::ivalue::Future> GroupWork::getFuture() {
  std::lock_guard<std::mutex> lock(future_mutex_);
  if (!future_) {
    future_ = tensorListFuture();
    watcher_->push([work = c10::intrusive_ptr<GroupWork>::reclaim_copy(this), future = future_] {
      try {
        work->wait(kNoTimeout);
      } catch (const std::exception&) {
      }
      completeFuture(*future, *work, work->result());
    });
  }
  return future_;
}

}  // namespace dicomm
