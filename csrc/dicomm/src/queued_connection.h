// What every transport's connection keeps for one peer: the receives it matches (Inbox), the
// sends not yet handed over in posting order, and whether (and why) it has closed. How a post,
// a deadline and a close treat those queues is written here once for tcp, shm and ibverbs.
// Not locked: the connection serialises calls (tcp with its own mutex, the polled transports
// with their hub's lock).
#pragma once

#include <deque>
#include <optional>
#include <string>

#include "dicomm/inbox.h"
#include "dicomm/transport.h"

namespace dicomm {

// `Outgoing` is the transport's record of one queued send: at least `RequestPtr request`,
// `uint64_t seq` and `bool started` (some of its bytes are already on the way).
template <typename Outgoing>
class QueuedConnection : public Connection {
 protected:
  QueuedConnection(int peer, const Options& options) : peer_(peer), inbox_(peer, options.frameLimits()) {}

  // Queues a send behind the earlier ones; on a closed connection it fails at once (false).
  bool queueSend(const RequestPtr& send) {
    if (closed_) {
      send->fail(failure_);
      return false;
    }
    Outgoing out;
    out.request = send;
    out.seq = next_send_seq_++;
    outgoing_.push_back(std::move(out));
    return true;
  }

  // On a closed connection a receive completes from a message that arrived before the close, or
  // fails; true then.
  bool finishIfClosed(const RequestPtr& recv) {
    if (!closed_) return false;
    if (!inbox_.postFromArrived(recv)) recv->fail(failure_);
    return true;
  }

  // Fails the queued sends past their deadline that have not started. Returns why the connection
  // must close when an overdue send has started: its bytes are partly on the way, so the stream
  // cannot carry another message.
  std::optional<std::string> expireSends(Clock::time_point now) {
    for (auto it = outgoing_.begin(); it != outgoing_.end();) {
      if (it->request->deadline() > now) {
        ++it;
      } else if (it->started) {
        return "timed out sending a message to rank " + std::to_string(peer_) + " (peer not reading?)";
      } else {
        it->request->fail("timed out before rank " + std::to_string(peer_) + " accepted the message");
        it = outgoing_.erase(it);
      }
    }
    return std::nullopt;
  }

  // Marks the connection closed and fails every pending receive and queued send with `why`
  // (completely arrived messages stay receivable). False when it was already closed.
  bool closeQueues(const std::string& why) {
    if (closed_) return false;
    closed_ = true;
    failure_ = why;
    inbox_.failAll(why);
    for (auto& out : outgoing_) out.request->fail(why);
    outgoing_.clear();
    return true;
  }

  const int peer_;
  Inbox inbox_;
  std::deque<Outgoing> outgoing_;
  bool closed_ = false;

 private:
  std::string failure_;
  uint64_t next_send_seq_ = 0;
};

}  // namespace dicomm
