// Per-connection matching of arriving messages with posted receives.
// Messages of one tag match receives of that tag in posting order; messages that arrive before
// their receive are kept (bytes for eager Data, the announcement for rendezvous) until it is posted.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "dicomm/frame.h"
#include "dicomm/request.h"

namespace dicomm {

class Inbox {
 public:
  Inbox(int peer, FrameLimits limits);

  // A rendezvous message matched with its receive: the transport grants (or refuses) it.
  struct Grant {
    RequestPtr recv;
    FrameHeader announcement;
    bool fits = true;
  };

  // Posts a user receive. Returns a Grant when a rendezvous announcement was waiting for it.
  std::optional<Grant> post(const RequestPtr& recv);

  // Eager path, one Data frame at a time in arrival order. `destination` returns where the
  // payload goes (nullptr: discard it); throws FrameError on a sequencing violation.
  uint8_t* destination(const FrameHeader& data);
  void landed(const FrameHeader& data);

  // Rendezvous path: a ReadyToSend arrived. Returns a Grant when a receive was already posted.
  std::optional<Grant> announce(const FrameHeader& ready_to_send);
  // Granted receives wait here for their Done (or immediate) by sequence number.
  void awaitDone(uint64_t seq, const RequestPtr& recv);
  RequestPtr takeAwaitingDone(uint64_t seq);

  // Fails everything in flight; messages that arrived completely stay receivable.
  void failAll(const std::string& why);
  // After the connection closed: serves `recv` from a completely arrived message, if any.
  bool postFromArrived(const RequestPtr& recv);
  // Fails posted receives past their deadline. Returns a reason when a message already in
  // transfer is overdue: the stream is then unusable and the connection must close.
  std::optional<std::string> expire(Clock::time_point now);

  size_t postedCount() const;
  size_t storedCount() const;

 private:
  struct Stored {
    uint64_t seq = 0;
    uint64_t total = 0;
    bool rendezvous = false;
    FrameHeader announcement;
    std::vector<uint8_t> bytes;
    bool complete = false;
    RequestPtr claimed_by;  // receive posted while the bytes were still arriving
  };
  struct Assembly {
    uint64_t seq = 0;
    uint64_t total = 0;
    uint64_t received = 0;
    RequestPtr recv;
    std::shared_ptr<Stored> stored;
  };

  void checkNextSeq(uint64_t seq);
  void deliverStored(Stored& stored, const RequestPtr& recv);
  // Whether a message of `total` bytes may land in `recv` (else it fails `recv`): it must fit, and a
  // receive in device memory takes only device-direct messages (nothing else can reach it).
  bool fits(const RequestPtr& recv, uint64_t total, bool device_source = false);

  const int peer_;
  const FrameLimits limits_;
  uint64_t next_seq_ = 0;
  std::unordered_map<uint64_t, std::deque<RequestPtr>> posted_;
  std::unordered_map<uint64_t, std::deque<std::shared_ptr<Stored>>> stored_;
  std::optional<Assembly> assembly_;
  uint64_t unexpected_bytes_ = 0;  // eager bytes stored for receives not yet posted
  std::map<uint64_t, RequestPtr> awaiting_done_;
};

}  // namespace dicomm
