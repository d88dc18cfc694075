// The listener's front desk during setup: every connection to the listener gets a fresh
// challenge (peer.h) and its own thread that waits a short time for the connecting peer's Hello, so connections that
// never speak (or speak garbage) cannot hold up the peers of the job. At most kMaxPendingHellos wait at once; a newer
// connection displaces the oldest one still waiting.
#pragma once

#include <deque>
#include <list>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "dicomm/frame.h"
#include "dicomm/peer.h"
#include "dicomm/socket.h"

namespace dicomm {

class HelloDesk {
 public:
  struct Arrival {
    Socket socket;
    Challenge challenge;  // what this connection was asked to prove the job token against
    Hello hello;
    std::string error;  // non-empty: no valid Hello arrived in time (the connection is dropped)
  };

  // `rank`: the listener's, sent in every challenge.
  HelloDesk(const Socket& listener, int rank, FrameLimits limits, Clock::duration hello_timeout);
  ~HelloDesk();  // shuts the still-waiting connections down and joins their threads
  HelloDesk(const HelloDesk&) = delete;
  HelloDesk& operator=(const HelloDesk&) = delete;

  // The next connection whose Hello arrived or failed; nullopt once `deadline` passes first.
  // Throws CommError when no challenge nonce can be drawn (never challenges with a weak one).
  std::optional<Arrival> next(Clock::time_point deadline);

 private:
  struct Waiting {
    int fd;
    std::thread reader;
    bool finished = false;  // guarded by mu_
  };

  void acceptOne();
  void displaceOldestWaitingLocked();
  void joinFinished();

  const Socket& listener_;
  const int rank_;
  const FrameLimits limits_;
  const Clock::duration hello_timeout_;
  std::mutex mu_;
  std::deque<Arrival> arrived_;  // guarded by mu_
  std::list<Waiting> waiting_;   // structure changed by the owner's thread only
};

}  // namespace dicomm
