#include "dicomm/inbox.h"

#include <algorithm>
#include <cstring>

namespace dicomm {
namespace {
constexpr size_t kStoredInitialReserve = size_t(1) << 20;
}

Inbox::Inbox(int peer, FrameLimits limits) : peer_(peer), limits_(limits) {}

bool Inbox::fits(const RequestPtr& recv, uint64_t total, bool device_source) {
  if (recv->onDevice() && !device_source && total != 0) {
    recv->fail("message of " + std::to_string(total) + " bytes from rank " + std::to_string(peer_) + " (tag " +
               std::to_string(recv->tag()) +
               ") is in host memory; this receive is in device memory and takes only "
               "device memory (post a host receive, or send from device memory)");
    return false;
  }
  if (total <= recv->capacity()) return true;
  recv->fail("message of " + std::to_string(total) + " bytes from rank " + std::to_string(peer_) + " (tag " +
             std::to_string(recv->tag()) + ") does not fit the " + std::to_string(recv->capacity()) +
             "-byte receive buffer");
  return false;
}

void Inbox::deliverStored(Stored& stored, const RequestPtr& recv) {
  if (!fits(recv, stored.total)) return;
  if (stored.total != 0) std::memcpy(recv->data(), stored.bytes.data(), stored.total);
  recv->complete(stored.total);
}

std::optional<Inbox::Grant> Inbox::post(const RequestPtr& recv) {
  auto found = stored_.find(recv->tag());
  if (found == stored_.end() || found->second.empty()) {
    posted_[recv->tag()].push_back(recv);
    return std::nullopt;
  }
  std::shared_ptr<Stored> stored = found->second.front();
  found->second.pop_front();
  if (found->second.empty()) stored_.erase(found);
  if (!stored->rendezvous) unexpected_bytes_ -= stored->total;
  if (stored->rendezvous) {
    const bool device_source = stored->announcement.flags & kFlagDeviceRegion;
    return Grant{recv, stored->announcement, fits(recv, stored->total, device_source)};
  }
  if (stored->complete) {
    deliverStored(*stored, recv);
  } else {
    stored->claimed_by = recv;
  }
  return std::nullopt;
}

void Inbox::checkNextSeq(uint64_t seq) {
  if (seq != next_seq_) {
    throw FrameError("malformed frame: message sequence " + std::to_string(seq) + " from rank " +
                     std::to_string(peer_) + ", expected " + std::to_string(next_seq_));
  }
  ++next_seq_;
}

uint8_t* Inbox::destination(const FrameHeader& h) {
  if (h.offset == 0 && !(assembly_ && assembly_->seq == h.seq)) {
    if (assembly_) {
      throw FrameError("malformed frame: message " + std::to_string(h.seq) + " began before message " +
                       std::to_string(assembly_->seq) + " finished");
    }
    checkNextSeq(h.seq);
    Assembly assembly;
    assembly.seq = h.seq;
    assembly.total = h.total_bytes;
    auto queue = posted_.find(h.tag);
    if (queue != posted_.end() && !queue->second.empty()) {
      RequestPtr recv = queue->second.front();
      queue->second.pop_front();
      if (queue->second.empty()) posted_.erase(queue);
      if (fits(recv, h.total_bytes)) assembly.recv = recv;
    } else {
      if (h.total_bytes > limits_.max_unexpected_bytes - std::min(unexpected_bytes_, limits_.max_unexpected_bytes)) {
        throw FrameError("rank " + std::to_string(peer_) + " sent a " + std::to_string(h.total_bytes) +
                         "-byte message on tag " + std::to_string(h.tag) + " with " +
                         std::to_string(unexpected_bytes_) +
                         " bytes already waiting for receives nobody posted: past the budget of " +
                         std::to_string(limits_.max_unexpected_bytes) + " bytes per peer (DICOMM_UNEXPECTED_BYTES)");
      }
      unexpected_bytes_ += h.total_bytes;
      auto stored = std::make_shared<Stored>();
      stored->seq = h.seq;
      stored->total = h.total_bytes;
      stored->bytes.reserve(std::min<uint64_t>(h.total_bytes, kStoredInitialReserve));
      stored_[h.tag].push_back(stored);
      assembly.stored = stored;
    }
    assembly_ = std::move(assembly);
  } else if (!assembly_ || assembly_->seq != h.seq || assembly_->total != h.total_bytes ||
             assembly_->received != h.offset) {
    throw FrameError("malformed frame: Data slice at offset " + std::to_string(h.offset) + " of message " +
                     std::to_string(h.seq) + " does not continue the message in progress");
  }
  Assembly& a = *assembly_;
  if (a.stored && a.stored->claimed_by) {
    // Its receive was posted while the message was arriving: from this frame on, the bytes go
    // straight into it (what arrived so far is copied over once).
    RequestPtr recv = a.stored->claimed_by;
    a.stored->claimed_by.reset();
    if (fits(recv, a.total)) {
      if (a.received) std::memcpy(recv->data(), a.stored->bytes.data(), a.received);
      a.recv = recv;
    }
    a.stored.reset();
  }
  if (a.recv) return a.recv->data() + h.offset;
  if (a.stored) {
    a.stored->bytes.resize(h.offset + h.payload_bytes);
    return a.stored->bytes.data() + h.offset;
  }
  return nullptr;
}

void Inbox::landed(const FrameHeader& h) {
  Assembly& a = *assembly_;
  a.received += h.payload_bytes;
  if (a.received < a.total) return;
  if (a.recv) a.recv->complete(a.total);
  if (a.stored) {
    a.stored->complete = true;
    if (a.stored->claimed_by) {
      deliverStored(*a.stored, a.stored->claimed_by);
      a.stored->claimed_by.reset();
    }
  }
  assembly_.reset();
}

std::optional<Inbox::Grant> Inbox::announce(const FrameHeader& h) {
  if (assembly_) {
    throw FrameError("malformed frame: ReadyToSend for message " + std::to_string(h.seq) + " inside message " +
                     std::to_string(assembly_->seq));
  }
  checkNextSeq(h.seq);
  auto queue = posted_.find(h.tag);
  if (queue != posted_.end() && !queue->second.empty()) {
    RequestPtr recv = queue->second.front();
    queue->second.pop_front();
    if (queue->second.empty()) posted_.erase(queue);
    const bool ok = fits(recv, h.total_bytes, h.flags & kFlagDeviceRegion);
    return Grant{recv, h, ok};
  }
  auto stored = std::make_shared<Stored>();
  stored->seq = h.seq;
  stored->total = h.total_bytes;
  stored->rendezvous = true;
  stored->announcement = h;
  stored_[h.tag].push_back(stored);
  return std::nullopt;
}

void Inbox::awaitDone(uint64_t seq, const RequestPtr& recv) { awaiting_done_[seq] = recv; }

RequestPtr Inbox::takeAwaitingDone(uint64_t seq) {
  auto found = awaiting_done_.find(seq);
  if (found == awaiting_done_.end()) {
    throw FrameError("malformed frame: Done for message " + std::to_string(seq) + " that was never granted");
  }
  RequestPtr recv = found->second;
  awaiting_done_.erase(found);
  return recv;
}

bool Inbox::postFromArrived(const RequestPtr& recv) {
  auto found = stored_.find(recv->tag());
  if (found == stored_.end() || found->second.empty()) return false;
  std::shared_ptr<Stored> stored = found->second.front();
  found->second.pop_front();
  if (found->second.empty()) stored_.erase(found);
  if (!stored->rendezvous) unexpected_bytes_ -= stored->total;
  deliverStored(*stored, recv);
  return true;
}

void Inbox::failAll(const std::string& why) {
  for (auto& [tag, queue] : posted_) {
    for (auto& recv : queue) recv->fail(why);
  }
  posted_.clear();
  if (assembly_) {
    if (assembly_->recv) assembly_->recv->fail(why);
    if (assembly_->stored && assembly_->stored->claimed_by) assembly_->stored->claimed_by->fail(why);
  }
  assembly_.reset();
  for (auto it = stored_.begin(); it != stored_.end();) {
    auto& queue = it->second;
    for (auto& stored : queue) {
      if (stored->claimed_by) stored->claimed_by->fail(why);
    }
    // Keep the leading run of complete eager messages: they arrived before the close.
    size_t keep = 0;
    while (keep < queue.size() && queue[keep]->complete && !queue[keep]->rendezvous) ++keep;
    queue.erase(queue.begin() + long(keep), queue.end());
    it = queue.empty() ? stored_.erase(it) : std::next(it);
  }
  for (auto& [seq, recv] : awaiting_done_) recv->fail(why);
  awaiting_done_.clear();
}

std::optional<std::string> Inbox::expire(Clock::time_point now) {
  const std::string overdue = "timed out waiting for a message from rank " + std::to_string(peer_);
  for (auto it = posted_.begin(); it != posted_.end();) {
    auto& queue = it->second;
    while (!queue.empty() && queue.front()->deadline() <= now) {
      queue.front()->fail(overdue + " (tag " + std::to_string(queue.front()->tag()) + ")");
      queue.pop_front();
    }
    it = queue.empty() ? posted_.erase(it) : std::next(it);
  }
  auto inTransferOverdue = [&](const RequestPtr& recv) { return recv && recv->deadline() <= now; };
  if (assembly_ &&
      (inTransferOverdue(assembly_->recv) || (assembly_->stored && inTransferOverdue(assembly_->stored->claimed_by)))) {
    return "timed out in the middle of a message from rank " + std::to_string(peer_);
  }
  for (auto& [seq, recv] : awaiting_done_) {
    if (inTransferOverdue(recv)) {
      return "timed out waiting for rank " + std::to_string(peer_) + " to finish writing message " +
             std::to_string(seq);
    }
  }
  return std::nullopt;
}

size_t Inbox::postedCount() const {
  size_t n = 0;
  for (auto& [tag, queue] : posted_) n += queue.size();
  return n;
}

size_t Inbox::storedCount() const {
  size_t n = 0;
  for (auto& [tag, queue] : stored_) n += queue.size();
  return n;
}

}  // namespace dicomm
