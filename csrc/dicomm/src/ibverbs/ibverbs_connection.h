// One peer over an RDMA reliable connection (set up with librdmacm). Small messages are SENDs of
// Data frames from registered slots into the peer's pre-posted receive slots; large messages
// (and every message the CPU cannot copy) are written straight into the receiver's registered
// buffer with RDMA WRITE WITH IMMEDIATE after ReadyToSend / ClearToSend(address, rkey).
// Flow control: the receiver RDMA-writes its running count of consumed slots into a word the
// sender registered, so returning credit never needs a credit itself.
#pragma once

#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "polled_connection.h"

namespace dicomm {

constexpr int kIbRecvSlots = 64;
constexpr int kIbSendSlots = 64;
constexpr size_t kIbSlotPayload = size_t(64) << 10;
constexpr size_t kIbSlotBytes = kFrameHeaderBytes + kIbSlotPayload;

struct alignas(64) IbCounters {
  volatile uint64_t peer_consumed;  // written by the peer's NIC
  uint64_t consumed_source;         // what we write into the peer's peer_consumed
};

struct IbRemoteCounter {
  uint64_t address = 0;
  uint32_t rkey = 0;
};

class IbverbsConnection : public PolledConnection {
 public:
  // Takes ownership of `id` (with its QP and CQs).
  IbverbsConnection(int peer, rdma_cm_id* id, const Options& options);
  ~IbverbsConnection() override;

  // Registers slabs and posts every receive slot; call before the QP is connected.
  void prepare();
  IbRemoteCounter localCounter() const;
  void setRemoteCounter(const IbRemoteCounter& remote) { remote_counter_ = remote; }

 private:
  struct Write {
    RequestPtr send;
    ibv_mr* mr = nullptr;
  };
  struct Cleared {
    RequestPtr send;
    FrameHeader cts;
  };
  struct Granted {
    RequestPtr recv;
    ibv_mr* mr = nullptr;
    uint64_t seq = 0;
  };

  bool advance() override;
  void pushPosted() override { progress(); }
  void grant(const Inbox::Grant& g) override;
  void onClearToSend(const FrameHeader& h) override;
  void onTransportFrame(const FrameHeader& h) override;
  std::optional<std::string> expireTransfers(Clock::time_point now) override;
  void closeTransfers(const std::string& why) override;
  bool keepAlive(bool bytes_waiting) override;

  bool pushOutgoing();
  bool pollCompletions();
  void onReceive(const ibv_wc& wc);
  bool startWrite(const Cleared& cleared);  // false: no credit yet
  bool sendFrame(const FrameHeader& h, const uint8_t* payload);
  void postWrite(const Request& send, uint64_t seq, const FrameHeader& cts, ibv_mr* mr, uint64_t write_id);
  void postReceive(int slot);
  void reportConsumed(bool force);
  uint64_t creditsLeft() const;

  rdma_cm_id* id_;
  std::vector<uint8_t> recv_slab_;
  std::vector<uint8_t> send_slab_;
  IbCounters counters_{};
  ibv_mr* recv_mr_ = nullptr;
  ibv_mr* send_mr_ = nullptr;
  ibv_mr* counters_mr_ = nullptr;
  IbRemoteCounter remote_counter_;
  std::vector<int> free_send_slots_;
  std::deque<Cleared> cleared_;
  std::map<uint32_t, Granted> granted_;  // by low 32 bits of seq (the immediate)
  std::map<uint64_t, Write> writes_;
  uint64_t next_write_id_ = 0;
  uint64_t frames_sent_ = 0;  // SENDs and WRITE_WITH_IMMs, each consuming one peer slot
  uint64_t consumed_ = 0;     // our slots consumed (and re-posted)
  uint64_t consumed_reported_ = 0;
};

}  // namespace dicomm
