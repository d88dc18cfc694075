// The shm connection: frames through the rings, rendezvous copies with cross memory attach.
#include "shm/shm_connection.h"

#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace dicomm {

ShmConnection::ShmConnection(int peer, ShmLink link, const Options& options)
    : PolledConnection("shm", peer, options),
      link_(std::move(link)),
      eager_bytes_(link_.can_write_peer_memory ? options.shm_eager_bytes : SIZE_MAX),
      split_bytes_(options.shm_split_bytes),
      device_memory_(link_.device_direct ? options.device_memory : nullptr) {}

void ShmConnection::pushPosted() {
  pushOutgoing();
  if (runPulls()) pushOutgoing();
}

bool ShmConnection::advance() {
  bool moved = pollIncoming();
  moved |= pushOutgoing();
  if (runPulls()) moved |= pushOutgoing();
  return moved;
}

bool ShmConnection::pushOutgoing() {
  bool moved = false;
  Ring& ring = link_.outbound;
  while (!control_out_.empty()) {
    if (!ring.push(control_out_.front(), nullptr)) goto ring_full;
    control_out_.pop_front();
    moved = true;
  }
  while (!outgoing_.empty()) {
    PolledOutgoing& out = outgoing_.front();
    const Request& request = *out.request;
    FrameHeader h;
    h.tag = request.tag();
    h.seq = out.seq;
    h.total_bytes = request.capacity();
    if (request.onDevice()) {
      if (!pushRegionAnnouncement(ring, h, request)) goto ring_full;
      moved = true;
      continue;
    }
    if (request.capacity() > eager_bytes_) {
      h.kind = FrameKind::ReadyToSend;
      h.remote_address = reinterpret_cast<uint64_t>(request.data());
      if (!ring.push(h, nullptr)) goto ring_full;
      awaiting_clear_[out.seq] = out.request;
      outgoing_.pop_front();
      moved = true;
      continue;
    }
    h.kind = FrameKind::Data;
    while (!out.started || out.offset < request.capacity()) {
      h.offset = out.offset;
      h.payload_bytes = std::min<uint64_t>(ring.maxPayload(), request.capacity() - out.offset);
      if (!ring.push(h, request.data() + out.offset)) goto ring_full;
      out.started = true;
      out.offset += h.payload_bytes;
      moved = true;
    }
    RequestPtr done = out.request;
    outgoing_.pop_front();
    done->complete(done->capacity());
  }
ring_full:
  if (moved) ringBell(link_.peer_bell);
  return moved;
}

bool ShmConnection::pushRegionAnnouncement(Ring& ring, FrameHeader h, const Request& send) {
  RequestPtr request = outgoing_.front().request;
  dicomm_region_handle region;
  try {
    region = device_memory_->exportRegion(send.data(), send.capacity());
  } catch (const CommError& e) {
    outgoing_.pop_front();
    request->fail(e.what());
    return true;
  }
  h.kind = FrameKind::ReadyToSend;
  h.flags = kFlagDeviceRegion;
  h.payload_bytes = kRegionHandleBytes;
  if (!ring.push(h, region.bytes)) return false;
  awaiting_clear_[h.seq] = request;  // answered by Pulled once the receiver has copied it
  outgoing_.pop_front();
  return true;
}

bool ShmConnection::pollIncoming() {
  Ring& ring = link_.inbound;
  bool moved = false;
  while (!closed_) {
    uint64_t tail = 0;
    const uint64_t readable = ring.readable(&tail);
    if (readable == 0) break;
    if (readable > ring.capacity() || readable < kFrameHeaderBytes) {
      throw FrameError("malformed frame: shared ring positions are corrupt (" + std::to_string(readable) +
                       " bytes readable of " + std::to_string(ring.capacity()) + ")");
    }
    uint8_t raw[kFrameHeaderBytes];
    ring.copyOut(tail, raw, sizeof(raw));
    const FrameHeader h = decodeFrameHeader(raw, sizeof(raw), limits_);
    if (h.payload_bytes > ring.maxPayload() || frameFootprint(h.payload_bytes) > readable) {
      throw FrameError("malformed frame: " + std::string(frameKindName(h.kind)) + " payload of " +
                       std::to_string(h.payload_bytes) + " bytes overruns the shared ring");
    }
    if (h.kind == FrameKind::ReadyToSend && (h.flags & kFlagDeviceRegion)) {
      if (!device_memory_) {
        throw FrameError("malformed frame: rank " + std::to_string(peer_) +
                         " announced device memory on a connection that did not agree to device-direct");
      }
      dicomm_region_handle region;
      ring.copyOut(tail + kFrameHeaderBytes, region.bytes, kRegionHandleBytes);
      announced_regions_[h.seq] = region;
    }
    dispatchFrame(h,
                  [&](uint8_t* destination) { ring.copyOut(tail + kFrameHeaderBytes, destination, h.payload_bytes); });
    ring.consume(tail, frameFootprint(h.payload_bytes));
    moved = true;
  }
  return moved;
}

void ShmConnection::onTransportFrame(const FrameHeader& h) {
  switch (h.kind) {
    case FrameKind::Pulled: onPulled(h); return;
    case FrameKind::Done: {
      RequestPtr recv = inbox_.takeAwaitingDone(h.seq);
      if (h.flags & kFlagRefused) {
        recv->fail("rank " + std::to_string(peer_) + " could not write message " + std::to_string(h.seq) +
                   " into this process (process_vm_writev failed)");
      } else {
        recv->complete(h.total_bytes);
      }
      return;
    }
    default:
      throw FrameError(std::string("malformed frame: unexpected ") + frameKindName(h.kind) + " frame on a shm ring");
  }
}

void ShmConnection::grant(const Inbox::Grant& g) {
  if (g.announcement.flags & kFlagDeviceRegion) {
    auto region = announced_regions_.find(g.announcement.seq);
    if (region == announced_regions_.end()) {
      throw FrameError("malformed frame: device message " + std::to_string(g.announcement.seq) + " has no region");
    }
    Pull pull{g.recv, g.announcement, 0, region->second};
    announced_regions_.erase(region);
    if (g.fits) {
      pulls_.push_back(pull);
    } else {
      FrameHeader refused = clearToSend(g.announcement);
      refused.kind = FrameKind::Pulled;
      refused.flags = kFlagDeviceRegion | kFlagRefused;
      control_out_.push_back(refused);
    }
    return;
  }
  FrameHeader cts = clearToSend(g.announcement);
  if (g.fits) {
    cts.remote_address = reinterpret_cast<uint64_t>(g.recv->data());
    cts.offset = senderShare(g.announcement);
    if (cts.offset < cts.total_bytes) pulls_.push_back(Pull{g.recv, g.announcement, cts.offset});
    inbox_.awaitDone(cts.seq, g.recv);
  } else {
    cts.flags = kFlagRefused;
  }
  control_out_.push_back(cts);
}

uint64_t ShmConnection::senderShare(const FrameHeader& ready_to_send) const {
  const uint64_t total = ready_to_send.total_bytes;
  const bool split =
      split_bytes_ != 0 && total >= split_bytes_ && link_.can_write_peer_memory && ready_to_send.remote_address != 0;
  constexpr uint64_t kPage = 4096;
  return split ? (total / 2) & ~(kPage - 1) : total;
}

bool ShmConnection::runPulls() {
  if (pulls_.empty()) return false;
  std::vector<Pull> pulls;
  pulls.swap(pulls_);
  for (const Pull& pull : pulls) {
    FrameHeader pulled;
    pulled.kind = FrameKind::Pulled;
    pulled.tag = pull.announcement.tag;
    pulled.seq = pull.announcement.seq;
    pulled.total_bytes = pull.announcement.total_bytes;
    if (pull.region) pulled.flags = kFlagDeviceRegion;
    if (!pull.recv->isPending()) {
      pulled.flags |= kFlagRefused;  // failed here meanwhile: its buffer may be gone
    } else {
      try {
        if (pull.region) {
          readRegion(pull);
          pull.recv->complete(pull.announcement.total_bytes);
        } else {
          readFromPeer(pull);
        }
      } catch (const CommError& e) {
        pulled.flags |= kFlagRefused;
        pull.recv->fail(e.what());
      }
    }
    control_out_.push_back(pulled);
  }
  return true;
}

void ShmConnection::onPulled(const FrameHeader& h) {
  const bool region = h.flags & kFlagDeviceRegion;
  RequestPtr send =
      region ? takeAwaiting(awaiting_clear_, h, "waiting") : takeAwaiting(awaiting_pulled_, h, "being read");
  if (region && (h.flags & kFlagRefused)) {
    send->fail("rank " + std::to_string(peer_) + " refused or could not read device message " + std::to_string(h.seq) +
               " of " + std::to_string(send->capacity()) + " bytes (see its receive's error)");
    return;
  }
  if (h.flags & kFlagRefused) {
    send->fail("rank " + std::to_string(peer_) + " could not read its share of message " + std::to_string(h.seq) +
               " from this process (process_vm_readv failed)");
  } else {
    send->complete(send->capacity());  // no-op when it failed here meanwhile
  }
}

void ShmConnection::onClearToSend(const FrameHeader& h) {
  RequestPtr send = takeClearedSend(h, "its receive buffer is too small");
  if (!send) return;
  if (send->onDevice()) {
    throw FrameError("malformed frame: ClearToSend for device message " + std::to_string(h.seq) +
                     ", which the receiver must read itself");
  }
  if (h.offset > h.total_bytes) {
    throw FrameError("malformed frame: ClearToSend for message " + std::to_string(h.seq) + " splits at " +
                     std::to_string(h.offset) + ", beyond its " + std::to_string(h.total_bytes) + " bytes");
  }
  const bool peer_reads_tail = h.offset < h.total_bytes;
  if (peer_reads_tail) awaiting_pulled_[h.seq] = send;  // its Pulled arrives even if this side fails
  FrameHeader done;
  done.kind = FrameKind::Done;
  done.tag = h.tag;
  done.seq = h.seq;
  done.total_bytes = h.total_bytes;
  if (!send->isPending()) {
    done.flags = kFlagRefused;  // timed out here meanwhile: the buffer may be gone, do not write
    control_out_.push_back(done);
    return;
  }
  try {
    writeToPeer(*send, h);
  } catch (const CommError& e) {
    done.flags = kFlagRefused;
    control_out_.push_back(done);
    send->fail(e.what());
    return;
  }
  control_out_.push_back(done);
  if (!peer_reads_tail) send->complete(send->capacity());
}

void ShmConnection::writeToPeer(const Request& send, const FrameHeader& cts) {
  copyAcross(CrossCopy::IntoPeer, send.data(), cts.remote_address, cts.offset);
}

void ShmConnection::readFromPeer(const Pull& pull) {
  copyAcross(CrossCopy::FromPeer, pull.recv->data() + pull.from, pull.announcement.remote_address + pull.from,
             pull.announcement.total_bytes - pull.from);
}

void ShmConnection::readRegion(const Pull& pull) {
  std::unique_ptr<DeviceMemory::OpenRegion> opened;
  try {
    opened = device_memory_->open(*pull.region, link_.peer_pid);
  } catch (const CommError& e) {
    throw CommError("device message " + std::to_string(pull.announcement.seq) + " from rank " + std::to_string(peer_) +
                    ": " + e.what());
  }
  const uint64_t total = pull.announcement.total_bytes;
  if (total > opened->bytes()) {
    throw CommError("rank " + std::to_string(peer_) + " announced " + std::to_string(total) +
                    " bytes in a device region of " + std::to_string(opened->bytes()) + " bytes; refused");
  }
  const RequestPtr& recv = pull.recv;
  device_memory_->copy(recv->data(), opened->data(), total,
                       recv->onDevice() ? CopyKind::DeviceToDevice : CopyKind::DeviceToHost);
}

void ShmConnection::copyAcross(CrossCopy direction, uint8_t* local, uint64_t remote, size_t bytes) {
  const bool into_peer = direction == CrossCopy::IntoPeer;
  const std::string call = into_peer ? "process_vm_writev into rank " : "process_vm_readv from rank ";
  size_t done = 0;
  while (done < bytes) {
    iovec mine{local + done, bytes - done};
    iovec theirs{reinterpret_cast<void*>(remote + done), bytes - done};
    const ssize_t n = into_peer ? process_vm_writev(pid_t(link_.peer_pid), &mine, 1, &theirs, 1, 0)
                                : process_vm_readv(pid_t(link_.peer_pid), &mine, 1, &theirs, 1, 0);
    if (n < 0) {
      if (errno == EINTR) continue;
      throw CommError(call + std::to_string(peer_) + " failed: " + std::strerror(errno));
    }
    if (n == 0) throw CommError(call + std::to_string(peer_) + " made no progress");
    done += size_t(n);
  }
}

bool ShmConnection::keepAlive(bool bytes_waiting) {
  if (bytes_waiting) {
    closeWithError(describe() + " closed: unexpected bytes on the control socket");
    return false;
  }
  return true;
}

std::optional<std::string> ShmConnection::expireTransfers(Clock::time_point now) {
  if (auto overdue = inbox_.expire(now)) return overdue;
  if (auto overdue = expireSends(now)) return overdue;
  for (auto& [seq, send] : awaiting_pulled_) {
    if (send->isPending() && send->deadline() <= now) {
      return "timed out waiting for rank " + std::to_string(peer_) + " to finish reading message " +
             std::to_string(seq);
    }
  }
  return std::nullopt;
}

void ShmConnection::closeTransfers(const std::string& why) {
  for (auto& [seq, send] : awaiting_pulled_) send->fail(why);
  awaiting_pulled_.clear();
  pulls_.clear();
  announced_regions_.clear();
}

}  // namespace dicomm
