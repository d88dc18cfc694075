#include "dicomm/shaping.h"

#include <sched.h>
#include <sys/prctl.h>

#include <cmath>
#include <stdexcept>

namespace dicomm {
namespace {

// The pacer's sleeps end within about this much of their deadline (the default is 50 us).
constexpr unsigned long kTimerSlackNs = 1000;
// A sleeping thread wakes tens of microseconds late on a busy host; the pacer sleeps until this
// long before a release and yields the processor in a loop for the rest.
constexpr auto kSpinWindow = std::chrono::microseconds(50);

}  // namespace

bool LinkShape::shaped() const { return std::isfinite(bandwidth_bytes_per_s) || latency_s > 0; }

void LinkShape::validate(const std::string& what) const {
  if (!(bandwidth_bytes_per_s > 0)) {
    throw std::invalid_argument(what + ": bandwidth must be positive, got " + std::to_string(bandwidth_bytes_per_s) +
                                " bytes/s");
  }
  if (!(latency_s >= 0) || !std::isfinite(latency_s)) {
    throw std::invalid_argument(what + ": latency must not be negative, got " + std::to_string(latency_s) + " s");
  }
}

Clock::time_point ArrivalClock::arrival(Clock::time_point now, size_t bytes) {
  const auto latency = std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(shape_.latency_s));
  const Clock::time_point start = std::max(last_arrival_, now + latency);
  const double serialisation_s =
      std::isfinite(shape_.bandwidth_bytes_per_s) ? double(bytes) / shape_.bandwidth_bytes_per_s : 0.0;
  last_arrival_ = start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(serialisation_s));
  return last_arrival_;
}

Pacer::Pacer() : thread_([this] { run(); }) {}

Pacer::~Pacer() { shutdown("endpoint closed"); }

void Pacer::schedule(Clock::time_point release, std::shared_ptr<Connection> connection, RequestPtr send) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!stopping_) {
      const bool earliest = held_.empty() || release < held_.top().release;
      held_.push(Held{release, next_order_++, std::move(connection), send});
      if (earliest) changed_.notify_one();
      return;
    }
  }
  send->fail(failure_);
}

void Pacer::shutdown(const std::string& why) {
  std::vector<RequestPtr> dropped;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (stopping_) return;
    stopping_ = true;
    failure_ = why;
    while (!held_.empty()) {
      dropped.push_back(held_.top().send);
      held_.pop();
    }
  }
  changed_.notify_one();
  for (auto& send : dropped) send->fail(why);
  if (thread_.joinable()) thread_.join();
}

void Pacer::run() {
  prctl(PR_SET_TIMERSLACK, kTimerSlackNs, 0, 0, 0);
  std::unique_lock<std::mutex> lock(mutex_);
  while (!stopping_) {
    if (held_.empty()) {
      changed_.wait(lock);
      continue;
    }
    const Clock::time_point release = held_.top().release;
    const Clock::time_point now = Clock::now();
    if (now < release - kSpinWindow) {
      changed_.wait_until(lock, release - kSpinWindow);
      continue;
    }
    if (now < release) {
      lock.unlock();
      while (Clock::now() < release) sched_yield();
      lock.lock();
      continue;
    }
    Held due = held_.top();
    held_.pop();
    lock.unlock();
    try {
      due.connection->postSend(due.send);
    } catch (const std::exception& e) {
      due.send->fail(e.what());
    }
    lock.lock();
  }
}

ShapedConnection::ShapedConnection(std::shared_ptr<Connection> inner, LinkShape shape, std::shared_ptr<Pacer> pacer)
    : inner_(std::move(inner)), pacer_(std::move(pacer)), clock_(shape) {}

void ShapedConnection::postSend(const RequestPtr& send) {
  // Under one lock, so concurrent senders' release times and scheduling order agree.
  std::lock_guard<std::mutex> lock(mutex_);
  pacer_->schedule(clock_.arrival(Clock::now(), send->capacity()), inner_, send);
}

}  // namespace dicomm
