// The "dicomm" c10d Backend: torch.distributed point-to-point and collectives over a DiComm
// engine. Sends and receives are posted on the calling thread (no copy for contiguous CPU
// tensors); collectives run in call order on one worker thread, built from point-to-point
// messages (collectives.h). Tensors the transport cannot address are staged through host memory.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "collectives.h"
#include "dicomm/device_memory.h"
#include "dicomm/engine.h"
#include "serial_thread.h"
#include "work.h"

namespace dicomm {

class ProcessGroupDiComm : public c10d::Backend {
 public:
  // Rendezvous through `store` (the process group's prefixed store); `timeout` bounds setup and
  // every pending operation; `peer_links` emulates a link to some group ranks (shaping.h).
  // `device_memory` (may be null) reaches the memory of `device_type` tensors: point-to-point
  // traffic of such tensors then moves device-direct wherever the engine agreed it with the peer.
  ProcessGroupDiComm(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                     std::chrono::milliseconds timeout, std::map<int, LinkShape> peer_links = {},
                     std::shared_ptr<const DeviceMemory> device_memory = nullptr,
                     c10::DeviceType device_type = c10::DeviceType::PrivateUse1);
  ~ProcessGroupDiComm() override;

  const std::string getBackendName() const override { return "dicomm"; }
  bool supportsCoalescing() const override { return true; }
  void startCoalescing() override;
  c10::intrusive_ptr<c10d::Work> endCoalescing() override;
  // The transport carrying traffic to `peer` ("shm", "tcp", "ibverbs").
  std::string transportOf(int peer) const;

  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;

  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceCoalescedOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _allgather_base(at::Tensor& output, at::Tensor& input,
                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::AllgatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter(std::vector<at::Tensor>& outputs,
                                                std::vector<std::vector<at::Tensor>>& inputs,
                                                const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                      const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                 std::vector<at::Tensor>& inputs,
                                                                 const c10d::ReduceScatterOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_split_sizes,
                                               std::vector<int64_t>& input_split_sizes,
                                               const c10d::AllToAllOptions& opts) override;
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts) override;

  void shutdown() override;
  void abort() override;

 private:
  using Body = std::function<void(CollectiveChannel&, Scratch&)>;
  c10::intrusive_ptr<c10d::Work> pointToPoint(at::Tensor& tensor, bool is_send, int peer, int tag);
  bool movesDeviceDirect(const at::Tensor& tensor, int peer) const;
  // Queues `body` as collective `name`; `outputs` are what the work's result and future hold.
  c10::intrusive_ptr<c10d::Work> enqueue(c10d::OpType type, const std::string& name, std::vector<at::Tensor> outputs,
                                         Body body);
  void checkUsable() const;
  void recordFailure(const std::string& why);

  std::unique_ptr<Engine> engine_;
  const c10::DeviceType device_memory_type_;
  std::shared_ptr<SerialThread> watcher_;  // completes futures of works nobody waits on
  Scratch scratch_;
  uint64_t next_collective_ = 0;
  std::atomic<bool> coalescing_{false};
  std::vector<std::shared_ptr<P2PItem>> coalesced_items_;
  std::vector<at::Tensor> coalesced_tensors_;
  std::vector<c10::intrusive_ptr<c10d::Work>> coalesced_collectives_;
  mutable std::mutex failure_mutex_;
  std::string failure_;                  // first collective failure: the group is unusable afterwards
  std::unique_ptr<SerialThread> queue_;  // collectives, in call order
};

}  // namespace dicomm
