#include "shm/shm_connection.h"

#include "dicomm/outgoing.h"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>

namespace dicomm {
namespace {

// The send a rendezvous frame answers; a frame for a message in no such state is malformed.
RequestPtr takeAwaiting(std::map<uint64_t, RequestPtr>& awaiting, const FrameHeader& h, const char* state) {
  auto found = awaiting.find(h.seq);
  if (found == awaiting.end()) {
    throw FrameError("malformed frame: " + std::string(frameKindName(h.kind)) + " for message " +
                     std::to_string(h.seq) + " that is not " + state);
  }
  RequestPtr send = found->second;
  awaiting.erase(found);
  return send;
}

}  // namespace

ShmConnection::ShmConnection(int peer, Socket control, ShmLink link, const Options& options)
    : peer_(peer),
      control_(std::move(control)),
      link_(std::move(link)),
      eager_bytes_(link_.can_write_peer_memory ? options.shm_eager_bytes : SIZE_MAX),
      split_bytes_(options.shm_split_bytes),
      limits_(options.frameLimits()),
      inbox_(peer, options.frameLimits()) {
  setNonBlocking(control_.fd());
}

void ShmConnection::postSend(const RequestPtr& send) {
  if (closed_) {
    send->fail(failure_);
    return;
  }
  Outgoing out;
  out.request = send;
  out.seq = next_send_seq_++;
  outgoing_.push_back(std::move(out));
  pushOutgoing();
}

void ShmConnection::postRecv(const RequestPtr& recv) {
  if (closed_) {
    if (!inbox_.postFromArrived(recv)) recv->fail(failure_);
    return;
  }
  if (auto g = inbox_.post(recv)) grant(*g);
  pushOutgoing();
  if (runPulls()) pushOutgoing();
}

bool ShmConnection::progress() {
  if (closed_) return false;
  try {
    bool moved = pollIncoming();
    moved |= pushOutgoing();
    if (runPulls()) moved |= pushOutgoing();
    return moved;
  } catch (const FrameError& e) {
    closeWithError(describe() + " closed: " + e.what());
  } catch (const std::exception& e) {
    closeWithError(describe() + " closed: " + e.what());
  }
  return true;
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
    Outgoing& out = outgoing_.front();
    const Request& request = *out.request;
    FrameHeader h;
    h.tag = request.tag();
    h.seq = out.seq;
    h.total_bytes = request.capacity();
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
    onFrame(h, tail + kFrameHeaderBytes);
    ring.consume(tail, frameFootprint(h.payload_bytes));
    moved = true;
  }
  return moved;
}

void ShmConnection::onFrame(const FrameHeader& h, uint64_t payload_position) {
  switch (h.kind) {
    case FrameKind::Data: {
      uint8_t* destination = inbox_.destination(h);
      if (destination && h.payload_bytes) link_.inbound.copyOut(payload_position, destination, h.payload_bytes);
      inbox_.landed(h);
      return;
    }
    case FrameKind::ReadyToSend:
      if (auto g = inbox_.announce(h)) grant(*g);
      return;
    case FrameKind::ClearToSend:
      onClearToSend(h);
      return;
    case FrameKind::Pulled:
      onPulled(h);
      return;
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
  FrameHeader cts;
  cts.kind = FrameKind::ClearToSend;
  cts.tag = g.announcement.tag;
  cts.seq = g.announcement.seq;
  cts.total_bytes = g.announcement.total_bytes;
  if (g.fits) {
    cts.remote_address = reinterpret_cast<uint64_t>(g.recv->data());
    cts.offset = senderShare(g.announcement);
    if (cts.offset < cts.total_bytes) pulls_.push_back(Pull{g.recv, g.announcement, cts.offset});
    inbox_.awaitDone(cts.seq, g.recv);
  } else {
    cts.flags = kFlagRefused;
  }
  queueControl(cts);
}

uint64_t ShmConnection::senderShare(const FrameHeader& ready_to_send) const {
  const uint64_t total = ready_to_send.total_bytes;
  const bool split = split_bytes_ != 0 && total >= split_bytes_ && link_.can_write_peer_memory &&
                     ready_to_send.remote_address != 0;
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
    if (!pull.recv->isPending()) {
      pulled.flags = kFlagRefused;  // failed here meanwhile: its buffer may be gone
    } else {
      try {
        readFromPeer(pull);
      } catch (const CommError& e) {
        pulled.flags = kFlagRefused;
        pull.recv->fail(e.what());
      }
    }
    queueControl(pulled);
  }
  return true;
}

void ShmConnection::onPulled(const FrameHeader& h) {
  RequestPtr send = takeAwaiting(awaiting_pulled_, h, "being read");
  if (h.flags & kFlagRefused) {
    send->fail("rank " + std::to_string(peer_) + " could not read its share of message " + std::to_string(h.seq) +
               " from this process (process_vm_readv failed)");
  } else {
    send->complete(send->capacity());  // no-op when it failed here meanwhile
  }
}

void ShmConnection::onClearToSend(const FrameHeader& h) {
  RequestPtr send = takeAwaiting(awaiting_clear_, h, "waiting");
  if (h.flags & kFlagRefused) {
    send->fail("rank " + std::to_string(peer_) + " refused message " + std::to_string(h.seq) + " of " +
               std::to_string(send->capacity()) + " bytes (its receive buffer is too small)");
    return;
  }
  if (h.total_bytes != send->capacity()) {
    throw FrameError("malformed frame: ClearToSend for message " + std::to_string(h.seq) + " names " +
                     std::to_string(h.total_bytes) + " bytes, the message has " + std::to_string(send->capacity()));
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
    queueControl(done);
    return;
  }
  try {
    writeToPeer(*send, h);
  } catch (const CommError& e) {
    done.flags = kFlagRefused;
    queueControl(done);
    send->fail(e.what());
    return;
  }
  queueControl(done);
  if (!peer_reads_tail) send->complete(send->capacity());
}

void ShmConnection::writeToPeer(const Request& send, const FrameHeader& cts) {
  copyAcross(CrossCopy::IntoPeer, send.data(), cts.remote_address, cts.offset);
}

void ShmConnection::readFromPeer(const Pull& pull) {
  copyAcross(CrossCopy::FromPeer, pull.recv->data() + pull.from, pull.announcement.remote_address + pull.from,
             pull.announcement.total_bytes - pull.from);
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

bool ShmConnection::checkAlive() {
  if (closed_) return false;
  char byte;
  const ssize_t n = ::recv(control_.fd(), &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    progress();  // deliver what the peer wrote before it went away
    closeWithError("rank " + std::to_string(peer_) + " is gone (its shm control socket closed; peer exited?)");
    return false;
  }
  if (n > 0) {
    closeWithError(describe() + " closed: unexpected bytes on the control socket");
    return false;
  }
  return true;
}

void ShmConnection::expire(Clock::time_point now) {
  if (closed_) return;
  if (auto overdue = inbox_.expire(now)) {
    closeWithError(*overdue);
    return;
  }
  if (auto overdue = expireOutgoing(outgoing_, now, peer_)) {
    closeWithError(*overdue);
    return;
  }
  for (auto& [seq, send] : awaiting_pulled_) {
    if (send->isPending() && send->deadline() <= now) {
      closeWithError("timed out waiting for rank " + std::to_string(peer_) + " to finish reading message " +
                     std::to_string(seq));
      return;
    }
  }
  for (auto& [seq, send] : awaiting_clear_) {
    // Stays in the map: a late ClearToSend must still be answered (with a refusal).
    if (send->deadline() <= now) {
      send->fail("timed out waiting for rank " + std::to_string(peer_) + " to post the matching receive");
    }
  }
}

void ShmConnection::closeWithError(const std::string& why) {
  if (closed_) return;
  closed_ = true;
  failure_ = why;
  inbox_.failAll(why);
  for (auto& out : outgoing_) out.request->fail(why);
  outgoing_.clear();
  for (auto& [seq, send] : awaiting_clear_) send->fail(why);
  awaiting_clear_.clear();
  for (auto& [seq, send] : awaiting_pulled_) send->fail(why);
  awaiting_pulled_.clear();
  pulls_.clear();
  control_out_.clear();
  ::shutdown(control_.fd(), SHUT_RDWR);
}

}  // namespace dicomm
