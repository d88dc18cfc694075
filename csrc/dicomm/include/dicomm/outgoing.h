// What the byte-streaming transports (tcp, the shm ring) share about their queues of outgoing
// messages: how a deadline ends a send that waits in the queue and one already partly on the wire.
#pragma once

#include <optional>
#include <string>

#include "dicomm/request.h"

namespace dicomm {

// Fails the sends of `outgoing` (entries with `request` and `started`) past their deadline that have
// not started. Returns why the connection must close when an overdue send has started: its bytes
// are partly on the wire, so the stream cannot carry another message.
template <typename Queue>
std::optional<std::string> expireOutgoing(Queue& outgoing, Clock::time_point now, int peer) {
  for (auto it = outgoing.begin(); it != outgoing.end();) {
    if (it->request->deadline() > now) {
      ++it;
    } else if (it->started) {
      return "timed out sending a message to rank " + std::to_string(peer) + " (peer not reading?)";
    } else {
      it->request->fail("timed out before rank " + std::to_string(peer) + " accepted the message");
      it = outgoing.erase(it);
    }
  }
  return std::nullopt;
}

}  // namespace dicomm
