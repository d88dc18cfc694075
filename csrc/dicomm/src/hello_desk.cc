#include "hello_desk.h"

#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

#include "dicomm/options.h"

namespace dicomm {
namespace {
constexpr int kPollMillis = 20;
}

HelloDesk::HelloDesk(const Socket& listener, int rank, FrameLimits limits, Clock::duration hello_timeout)
    : listener_(listener), rank_(rank), limits_(limits), hello_timeout_(hello_timeout) {}

HelloDesk::~HelloDesk() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& w : waiting_) {
      if (!w.finished) ::shutdown(w.fd, SHUT_RDWR);
    }
  }
  for (auto& w : waiting_) w.reader.join();
}

void HelloDesk::displaceOldestWaitingLocked() {
  for (auto& w : waiting_) {
    if (!w.finished) {
      ::shutdown(w.fd, SHUT_RDWR);  // its reader fails at once and reports the connection dropped
      return;
    }
  }
}

void HelloDesk::acceptOne() {
  const Challenge challenge = Challenge::fresh(rank_);
  const int fd = ::accept4(listener_.fd(), nullptr, nullptr, SOCK_CLOEXEC);
  if (fd < 0) {
    if (errno == EINTR || errno == EAGAIN || errno == ECONNABORTED) return;
    throw CommError(std::string("accept: ") + std::strerror(errno));
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    size_t still_waiting = 0;
    for (auto& w : waiting_) still_waiting += w.finished ? 0 : 1;
    if (still_waiting >= kMaxPendingHellos) displaceOldestWaitingLocked();
  }
  waiting_.push_back(Waiting{fd, std::thread(), false});
  Waiting* self = &waiting_.back();
  const Clock::time_point hello_deadline = Clock::now() + hello_timeout_;
  self->reader = std::thread([this, self, fd, hello_deadline, challenge] {
    Arrival arrival;
    arrival.socket = Socket(fd);
    arrival.challenge = challenge;
    try {
      FrameHeader asked;
      asked.kind = FrameKind::Hello;
      sendFrame(fd, asked, challenge.encode(), hello_deadline, "a connecting peer");
      std::string payload;
      const FrameHeader h = recvFrame(fd, &payload, limits_, hello_deadline, "a connecting peer");
      if (h.kind != FrameKind::Hello) throw FrameError(std::string("expected Hello, got ") + frameKindName(h.kind));
      arrival.hello = Hello::decode(payload);
    } catch (const std::exception& e) {
      arrival.error = e.what();
    }
    std::lock_guard<std::mutex> lock(mu_);
    self->finished = true;
    arrived_.push_back(std::move(arrival));
  });
}

void HelloDesk::joinFinished() {
  for (auto it = waiting_.begin(); it != waiting_.end();) {
    bool finished;
    {
      std::lock_guard<std::mutex> lock(mu_);
      finished = it->finished;
    }
    if (finished) {
      it->reader.join();
      it = waiting_.erase(it);
    } else {
      ++it;
    }
  }
}

std::optional<HelloDesk::Arrival> HelloDesk::next(Clock::time_point deadline) {
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!arrived_.empty()) {
        Arrival arrival = std::move(arrived_.front());
        arrived_.pop_front();
        return arrival;
      }
    }
    joinFinished();
    if (Clock::now() >= deadline) return std::nullopt;
    pollfd p{listener_.fd(), POLLIN, 0};
    const int rc = ::poll(&p, 1, kPollMillis);
    if (rc < 0 && errno != EINTR) throw CommError(std::string("poll: ") + std::strerror(errno));
    if (rc > 0) acceptOne();
  }
}

}  // namespace dicomm
