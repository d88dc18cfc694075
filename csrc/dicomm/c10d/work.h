// What the dicomm backend hands back to torch: tensors as the transport sees them (staged through
// host memory when needed) and the Work objects for point-to-point requests, collectives and
// coalesced groups, with futures and errors that name the operation and the peer.
#pragma once

#include <torch/csrc/distributed/c10d/Work.hpp>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "dicomm/request.h"
#include "serial_thread.h"

namespace dicomm {

// torch.distributed.DistBackendError carrying `what` (one line).
[[noreturn]] void throwBackendError(const std::string& what);
std::exception_ptr backendError(const std::string& what);

// A tensor as the transport sees it: contiguous host memory. For a contiguous CPU tensor that
// is the tensor itself; otherwise a host copy (inputs) or a host buffer copied back (outputs).
// The one exception is `deviceDirect`: a contiguous device tensor the transport reaches through the
// vendor's registered memory, passed as it is.
class HostTensor {
 public:
  static HostTensor deviceDirect(const at::Tensor& tensor);
  static HostTensor input(const at::Tensor& tensor);
  static HostTensor output(const at::Tensor& tensor);
  // An output that starts with the tensor's values (all_reduce).
  static HostTensor inPlace(const at::Tensor& tensor);
  void* data() const { return host_.data_ptr(); }
  size_t bytes() const { return host_.nbytes(); }
  const at::Tensor& host() const { return host_; }
  // Copies a staged output back into the caller's tensor; nothing to do when not staged.
  void copyBack() const;

 private:
  at::Tensor host_;
  at::Tensor target_;  // defined only when an output was staged
};

// One posted send or receive and the tensor it serves; settled (checked, copied back) once.
class P2PItem {
 public:
  P2PItem(RequestPtr request, bool is_send, int peer, int tag, HostTensor tensor);
  const RequestPtr& request() const { return request_; }
  // Empty when it succeeded (and, for a receive, the staged data is back in place).
  std::string settle();
  std::string describe() const;

 private:
  RequestPtr request_;
  const bool is_send_;
  const int peer_;
  const int tag_;
  HostTensor tensor_;
  std::once_flag settled_;
  std::string error_;
};

// Point-to-point requests, one or a coalesced batch, as one Work.
class P2PWork : public c10d::Work {
 public:
  P2PWork(int rank, c10d::OpType type, std::vector<std::shared_ptr<P2PItem>> items, std::vector<at::Tensor> tensors,
          std::shared_ptr<SerialThread> watcher);
  bool isCompleted() override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override { return tensors_; }

 private:
  void settle();

  std::vector<std::shared_ptr<P2PItem>> items_;
  std::vector<at::Tensor> tensors_;
  std::shared_ptr<SerialThread> watcher_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// A collective, finished by the worker thread.
class CollectiveWork : public c10d::Work {
 public:
  CollectiveWork(int rank, c10d::OpType type, std::string description, std::vector<at::Tensor> outputs);
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override { return future_; }
  std::vector<at::Tensor> result() override { return outputs_; }
  void complete(std::exception_ptr error);

 private:
  const std::string description_;
  std::vector<at::Tensor> outputs_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
};

// Several works (a coalesced group holding collectives) as one.
class GroupWork : public c10d::Work {
 public:
  GroupWork(int rank, std::vector<c10::intrusive_ptr<c10d::Work>> parts, std::shared_ptr<SerialThread> watcher);
  bool isCompleted() override;
  bool isSuccess() const override;
  std::exception_ptr exception() const override;
  bool wait(std::chrono::milliseconds timeout) override;
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override;
  std::vector<at::Tensor> result() override;

 private:
  std::vector<c10::intrusive_ptr<c10d::Work>> parts_;
  std::shared_ptr<SerialThread> watcher_;
  c10::intrusive_ptr<c10::ivalue::Future> future_;
  std::mutex future_mutex_;
};

}  // namespace dicomm
