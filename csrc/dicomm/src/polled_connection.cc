// The post, liveness, deadline and close paths that shm and ibverbs connections share.
#include "polled_connection.h"

#include <sys/socket.h>

#include <cerrno>

namespace dicomm {

PolledConnection::PolledConnection(const char* transport, int peer, const Options& options)
    : QueuedConnection(peer, options), limits_(options.frameLimits()), transport_(transport) {}

void PolledConnection::adoptControlSocket(Socket control) {
  control_ = std::move(control);
  setNonBlocking(control_.fd());
}

std::string PolledConnection::describe() const {
  return std::string(transport_) + " connection to rank " + std::to_string(peer_);
}

void PolledConnection::postSend(const RequestPtr& send) {
  if (queueSend(send)) pushPosted();
}

void PolledConnection::postRecv(const RequestPtr& recv) {
  if (finishIfClosed(recv)) return;
  if (auto g = inbox_.post(recv)) grant(*g);
  pushPosted();
}

bool PolledConnection::progress() {
  if (closed_) return false;
  try {
    return advance();
  } catch (const std::exception& e) {
    closeWithError(describe() + " closed: " + e.what());
  }
  return true;
}

bool PolledConnection::checkAlive() {
  if (closed_) return false;
  char byte;
  const ssize_t n = ::recv(control_.fd(), &byte, 1, MSG_DONTWAIT | MSG_PEEK);
  if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
    progress();  // deliver what the peer wrote before it went away
    closeWithError("rank " + std::to_string(peer_) + " is gone (its " + transport_ +
                   " control socket closed; peer exited?)");
    return false;
  }
  return keepAlive(n > 0);
}

void PolledConnection::expire(Clock::time_point now) {
  if (closed_) return;
  if (auto overdue = expireTransfers(now)) {
    closeWithError(*overdue);
    return;
  }
  for (auto& [seq, send] : awaiting_clear_) {
    // Stays in the map: a late ClearToSend must still be answered (with a refusal).
    if (send->deadline() <= now) {
      send->fail("timed out waiting for rank " + std::to_string(peer_) + " to post the matching receive");
    }
  }
}

void PolledConnection::closeWithError(const std::string& why) {
  if (!closeQueues(why)) return;
  for (auto& [seq, send] : awaiting_clear_) send->fail(why);
  awaiting_clear_.clear();
  closeTransfers(why);
  control_out_.clear();
  ::shutdown(control_.fd(), SHUT_RDWR);
}

FrameHeader PolledConnection::clearToSend(const FrameHeader& ready_to_send) {
  FrameHeader cts;
  cts.kind = FrameKind::ClearToSend;
  cts.tag = ready_to_send.tag;
  cts.seq = ready_to_send.seq;
  cts.total_bytes = ready_to_send.total_bytes;
  return cts;
}

RequestPtr PolledConnection::takeAwaiting(std::map<uint64_t, RequestPtr>& awaiting, const FrameHeader& h,
                                          const char* state) {
  auto found = awaiting.find(h.seq);
  if (found == awaiting.end()) {
    throw FrameError("malformed frame: " + std::string(frameKindName(h.kind)) + " for message " +
                     std::to_string(h.seq) + " that is not " + state);
  }
  RequestPtr send = found->second;
  awaiting.erase(found);
  return send;
}

RequestPtr PolledConnection::takeClearedSend(const FrameHeader& cts, const char* refusal_reason) {
  RequestPtr send = takeAwaiting(awaiting_clear_, cts, "waiting");
  if (cts.flags & kFlagRefused) {
    send->fail("rank " + std::to_string(peer_) + " refused message " + std::to_string(cts.seq) + " of " +
               std::to_string(send->capacity()) + " bytes (" + refusal_reason + ")");
    return nullptr;
  }
  if (cts.total_bytes != send->capacity()) {
    throw FrameError("malformed frame: ClearToSend for message " + std::to_string(cts.seq) + " names " +
                     std::to_string(cts.total_bytes) + " bytes, the message has " + std::to_string(send->capacity()));
  }
  return send;
}

}  // namespace dicomm
