// The ibverbs connection: SENDs into pre-posted slots, RDMA WRITE WITH IMMEDIATE for rendezvous.
#include "ibverbs/ibverbs_connection.h"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

namespace dicomm {
namespace {

constexpr uint64_t kRecvTag = uint64_t(1) << 56;
constexpr uint64_t kSendTag = uint64_t(2) << 56;
constexpr uint64_t kWriteTag = uint64_t(3) << 56;
constexpr uint64_t kWritePartTag = uint64_t(4) << 56;
constexpr uint64_t kCounterTag = uint64_t(5) << 56;
constexpr uint64_t kTagMask = uint64_t(0xff) << 56;
constexpr uint64_t kMaxWriteBytes = uint64_t(1) << 30;

}  // namespace

IbverbsConnection::IbverbsConnection(int peer, rdma_cm_id* id, const Options& options)
    : PolledConnection("ibverbs", peer, options),
      id_(id),
      recv_slab_(size_t(kIbRecvSlots) * kIbSlotBytes),
      send_slab_(size_t(kIbSendSlots) * kIbSlotBytes) {
  for (int i = kIbSendSlots - 1; i >= 0; --i) free_send_slots_.push_back(i);
}

IbverbsConnection::~IbverbsConnection() {
  closeWithError("endpoint closed");
  for (auto& [id, write] : writes_) ibv_dereg_mr(write.mr);
  for (auto& [imm, granted] : granted_) ibv_dereg_mr(granted.mr);
  if (recv_mr_) ibv_dereg_mr(recv_mr_);
  if (send_mr_) ibv_dereg_mr(send_mr_);
  if (counters_mr_) ibv_dereg_mr(counters_mr_);
  if (id_) rdma_destroy_ep(id_);
}

void IbverbsConnection::prepare() {
  recv_mr_ = ibv_reg_mr(id_->pd, recv_slab_.data(), recv_slab_.size(), IBV_ACCESS_LOCAL_WRITE);
  send_mr_ = ibv_reg_mr(id_->pd, send_slab_.data(), send_slab_.size(), 0);
  counters_mr_ = ibv_reg_mr(id_->pd, &counters_, sizeof(counters_), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
  if (!recv_mr_ || !send_mr_ || !counters_mr_) {
    throw CommError(describe() + ": cannot register memory: " + std::strerror(errno));
  }
  for (int slot = 0; slot < kIbRecvSlots; ++slot) postReceive(slot);
}

IbRemoteCounter IbverbsConnection::localCounter() const {
  return IbRemoteCounter{reinterpret_cast<uint64_t>(&counters_.peer_consumed), counters_mr_->rkey};
}

void IbverbsConnection::postReceive(int slot) {
  ibv_sge sge{reinterpret_cast<uint64_t>(recv_slab_.data() + size_t(slot) * kIbSlotBytes), uint32_t(kIbSlotBytes),
              recv_mr_->lkey};
  ibv_recv_wr wr{};
  ibv_recv_wr* bad = nullptr;
  wr.wr_id = kRecvTag | uint64_t(slot);
  wr.sg_list = &sge;
  wr.num_sge = 1;
  if (ibv_post_recv(id_->qp, &wr, &bad) != 0) throw CommError(describe() + ": ibv_post_recv failed");
}

uint64_t IbverbsConnection::creditsLeft() const {
  const uint64_t in_use = frames_sent_ - counters_.peer_consumed;
  return in_use >= uint64_t(kIbRecvSlots) ? 0 : uint64_t(kIbRecvSlots) - in_use;
}

bool IbverbsConnection::sendFrame(const FrameHeader& h, const uint8_t* payload) {
  if (free_send_slots_.empty() || creditsLeft() == 0) return false;
  const int slot = free_send_slots_.back();
  uint8_t* where = send_slab_.data() + size_t(slot) * kIbSlotBytes;
  const auto header = encodeFrameHeader(h);
  std::memcpy(where, header.data(), header.size());
  if (h.payload_bytes) std::memcpy(where + kFrameHeaderBytes, payload, h.payload_bytes);
  ibv_sge sge{reinterpret_cast<uint64_t>(where), uint32_t(kFrameHeaderBytes + h.payload_bytes), send_mr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = kSendTag | uint64_t(slot);
  wr.opcode = IBV_WR_SEND;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED;
  if (ibv_post_send(id_->qp, &wr, &bad) != 0) throw CommError(describe() + ": ibv_post_send failed");
  free_send_slots_.pop_back();
  ++frames_sent_;
  return true;
}

void IbverbsConnection::postWrite(const Request& send, uint64_t seq, const FrameHeader& cts, ibv_mr* mr,
                                  uint64_t write_id) {
  uint64_t offset = 0;
  const uint64_t total = send.capacity();
  do {
    const uint64_t part = std::min<uint64_t>(kMaxWriteBytes, total - offset);
    const bool last = offset + part == total;
    ibv_sge sge{reinterpret_cast<uint64_t>(send.data() + offset), uint32_t(part), mr->lkey};
    ibv_send_wr wr{};
    ibv_send_wr* bad = nullptr;
    wr.wr_id = last ? (kWriteTag | write_id) : kWritePartTag;
    wr.opcode = last ? IBV_WR_RDMA_WRITE_WITH_IMM : IBV_WR_RDMA_WRITE;
    wr.sg_list = &sge;
    wr.num_sge = 1;
    wr.send_flags = IBV_SEND_SIGNALED;
    wr.imm_data = htonl(uint32_t(seq));
    wr.wr.rdma.remote_addr = cts.remote_address + offset;
    wr.wr.rdma.rkey = uint32_t(cts.offset);
    if (ibv_post_send(id_->qp, &wr, &bad) != 0) throw CommError(describe() + ": posting RDMA WRITE failed");
    offset += part;
  } while (offset < total);
  ++frames_sent_;
}

void IbverbsConnection::reportConsumed(bool force) {
  if (consumed_ == consumed_reported_) return;
  if (!force && consumed_ - consumed_reported_ < uint64_t(kIbRecvSlots / 4)) return;
  counters_.consumed_source = consumed_;
  ibv_sge sge{reinterpret_cast<uint64_t>(&counters_.consumed_source), sizeof(uint64_t), counters_mr_->lkey};
  ibv_send_wr wr{};
  ibv_send_wr* bad = nullptr;
  wr.wr_id = kCounterTag;
  wr.opcode = IBV_WR_RDMA_WRITE;
  wr.sg_list = &sge;
  wr.num_sge = 1;
  wr.send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE;
  wr.wr.rdma.remote_addr = remote_counter_.address;
  wr.wr.rdma.rkey = remote_counter_.rkey;
  if (ibv_post_send(id_->qp, &wr, &bad) != 0) throw CommError(describe() + ": posting the credit write failed");
  consumed_reported_ = consumed_;
}

void IbverbsConnection::grant(const Inbox::Grant& g) {
  FrameHeader cts = clearToSend(g.announcement);
  ibv_mr* mr = nullptr;
  if (g.fits) {
    mr = ibv_reg_mr(id_->pd, g.recv->data(), g.recv->capacity(), IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE);
    if (!mr) g.recv->fail(describe() + ": cannot register the receive buffer: " + std::strerror(errno));
  }
  if (mr) {
    cts.remote_address = reinterpret_cast<uint64_t>(g.recv->data());
    cts.offset = mr->rkey;
    granted_[uint32_t(cts.seq)] = Granted{g.recv, mr, cts.seq};
  } else {
    cts.flags = kFlagRefused;
  }
  control_out_.push_back(cts);
}

bool IbverbsConnection::pushOutgoing() {
  bool moved = false;
  while (!control_out_.empty() && sendFrame(control_out_.front(), nullptr)) {
    control_out_.pop_front();
    moved = true;
  }
  if (!control_out_.empty()) return moved;
  while (!cleared_.empty() && startWrite(cleared_.front())) {
    cleared_.pop_front();
    moved = true;
  }
  while (!outgoing_.empty()) {
    PolledOutgoing& out = outgoing_.front();
    FrameHeader h;
    h.tag = out.request->tag();
    h.seq = out.seq;
    h.total_bytes = out.request->capacity();
    if (out.request->capacity() <= kIbSlotPayload) {
      h.kind = FrameKind::Data;
      h.payload_bytes = out.request->capacity();
      if (!sendFrame(h, out.request->data())) break;
      out.request->complete(out.request->capacity());
    } else {
      h.kind = FrameKind::ReadyToSend;
      if (!sendFrame(h, nullptr)) break;
      awaiting_clear_[out.seq] = out.request;
    }
    outgoing_.pop_front();
    moved = true;
  }
  return moved;
}

void IbverbsConnection::onClearToSend(const FrameHeader& h) {
  RequestPtr send = takeClearedSend(h, "its receive buffer is too small or unregistrable");
  if (send) cleared_.push_back(Cleared{send, h});
}

bool IbverbsConnection::startWrite(const Cleared& cleared) {
  const RequestPtr& send = cleared.send;
  FrameHeader refusal;
  refusal.kind = FrameKind::Done;
  refusal.flags = kFlagRefused;
  refusal.seq = cleared.cts.seq;
  if (!send->isPending()) {  // timed out here meanwhile: its buffer may be gone
    control_out_.push_back(refusal);
    return true;
  }
  if (creditsLeft() == 0) return false;
  ibv_mr* mr = ibv_reg_mr(id_->pd, send->data(), send->capacity(), 0);
  if (!mr) {
    send->fail(describe() + ": cannot register the send buffer: " + std::strerror(errno));
    control_out_.push_back(refusal);
    return true;
  }
  const uint64_t write_id = next_write_id_++;
  writes_[write_id] = Write{send, mr};
  postWrite(*send, cleared.cts.seq, cleared.cts, mr, write_id);
  return true;
}

void IbverbsConnection::onTransportFrame(const FrameHeader& h) {
  switch (h.kind) {
    case FrameKind::Done: {
      auto found = granted_.find(uint32_t(h.seq));
      if (found == granted_.end()) throw FrameError("malformed frame: Done for a message that was never granted");
      found->second.recv->fail("rank " + std::to_string(peer_) + " abandoned message " + std::to_string(h.seq));
      ibv_dereg_mr(found->second.mr);
      granted_.erase(found);
      return;
    }
    default:
      throw FrameError(std::string("malformed frame: unexpected ") + frameKindName(h.kind) + " frame on ibverbs");
  }
}

void IbverbsConnection::onReceive(const ibv_wc& wc) {
  const int slot = int(wc.wr_id & ~kTagMask);
  if (slot < 0 || slot >= kIbRecvSlots) throw CommError(describe() + ": completion for an unknown receive slot");
  if (wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM) {
    auto found = granted_.find(ntohl(wc.imm_data));
    if (found == granted_.end()) throw FrameError("malformed frame: RDMA write for a message that was never granted");
    Granted granted = found->second;
    granted_.erase(found);
    ibv_dereg_mr(granted.mr);
    granted.recv->complete(granted.recv->capacity() < wc.byte_len ? granted.recv->capacity() : size_t(wc.byte_len));
  } else {
    const uint8_t* frame = recv_slab_.data() + size_t(slot) * kIbSlotBytes;
    if (wc.byte_len < kFrameHeaderBytes) throw FrameError("malformed frame: ibverbs message shorter than a header");
    const FrameHeader h = decodeFrameHeader(frame, wc.byte_len, limits_);
    if (kFrameHeaderBytes + h.payload_bytes != wc.byte_len) {
      throw FrameError("malformed frame: header announces " + std::to_string(h.payload_bytes) + " payload bytes, " +
                       std::to_string(wc.byte_len - kFrameHeaderBytes) + " arrived");
    }
    dispatchFrame(h,
                  [&](uint8_t* destination) { std::memcpy(destination, frame + kFrameHeaderBytes, h.payload_bytes); });
  }
  postReceive(slot);
  ++consumed_;
}

bool IbverbsConnection::pollCompletions() {
  bool moved = false;
  ibv_wc wcs[16];
  ibv_cq* queues[2] = {id_->recv_cq, id_->send_cq == id_->recv_cq ? nullptr : id_->send_cq};
  for (ibv_cq* cq : queues) {
    if (!cq) continue;
    int n;
    while ((n = ibv_poll_cq(cq, 16, wcs)) > 0) {
      moved = true;
      for (int i = 0; i < n; ++i) {
        const ibv_wc& wc = wcs[i];
        if (wc.status != IBV_WC_SUCCESS) {
          throw CommError(describe() + ": completion error: " + ibv_wc_status_str(wc.status) + " (peer gone?)");
        }
        const uint64_t tag = wc.wr_id & kTagMask;
        if (tag == kRecvTag) {
          onReceive(wc);
        } else if (tag == kSendTag) {
          free_send_slots_.push_back(int(wc.wr_id & ~kTagMask));
        } else if (tag == kWriteTag) {
          auto found = writes_.find(wc.wr_id & ~kTagMask);
          if (found != writes_.end()) {
            ibv_dereg_mr(found->second.mr);
            found->second.send->complete(found->second.send->capacity());
            writes_.erase(found);
          }
        }
      }
    }
    if (n < 0) throw CommError(describe() + ": ibv_poll_cq failed");
  }
  return moved;
}

bool IbverbsConnection::advance() {
  bool moved = pollCompletions();
  reportConsumed(false);
  moved |= pushOutgoing();
  return moved;
}

bool IbverbsConnection::keepAlive(bool) {
  try {
    reportConsumed(true);
  } catch (const std::exception& e) {
    closeWithError(e.what());
    return false;
  }
  return true;
}

std::optional<std::string> IbverbsConnection::expireTransfers(Clock::time_point now) {
  if (auto overdue = inbox_.expire(now)) return overdue;
  for (auto& [imm, granted] : granted_) {
    if (granted.recv->deadline() <= now) {
      return "timed out waiting for rank " + std::to_string(peer_) + " to write message " + std::to_string(granted.seq);
    }
  }
  return expireSends(now);  // never started: a send leaves whole
}

void IbverbsConnection::closeTransfers(const std::string& why) {
  for (auto& cleared : cleared_) cleared.send->fail(why);
  cleared_.clear();
  for (auto& [id, write] : writes_) write.send->fail(why);
  for (auto& [imm, granted] : granted_) granted.recv->fail(why);
  if (id_) rdma_disconnect(id_);
}

}  // namespace dicomm
