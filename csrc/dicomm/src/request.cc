#include "dicomm/request.h"

#include <linux/futex.h>
#include <sched.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <climits>
#include <ctime>

namespace dicomm {
namespace {

enum State : uint32_t { kPending = 0, kFinishing = 1, kDone = 2, kFailed = 3 };

std::atomic<int64_t> live_requests{0};

constexpr int kSpinsBeforeYield = 8;  // then yield: a peer sharing this core gets it at once

void futexWait(std::atomic<uint32_t>* word, uint32_t expected, std::chrono::nanoseconds timeout) {
  timespec ts;
  ts.tv_sec = time_t(timeout.count() / 1000000000);
  ts.tv_nsec = long(timeout.count() % 1000000000);
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT_PRIVATE, expected, &ts, nullptr, 0);
}

void futexWakeAll(std::atomic<uint32_t>* word) {
  syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE_PRIVATE, INT_MAX, nullptr, nullptr, 0);
}

inline void cpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

Request::Request(Direction direction, int peer, uint64_t tag, uint8_t* data, size_t capacity,
                 Clock::time_point deadline)
    : direction_(direction), peer_(peer), tag_(tag), data_(data), capacity_(capacity), deadline_(deadline) {
  live_requests.fetch_add(1, std::memory_order_relaxed);
}

Request::~Request() { live_requests.fetch_sub(1, std::memory_order_relaxed); }

int64_t Request::liveCount() { return live_requests.load(std::memory_order_relaxed); }

bool Request::isPending() const {
  const uint32_t s = state_.load(std::memory_order_acquire);
  return s == kPending || s == kFinishing;
}

bool Request::succeeded() const { return state_.load(std::memory_order_acquire) == kDone; }

size_t Request::bytes() const { return isPending() ? 0 : bytes_; }

std::string Request::error() const { return isPending() ? std::string() : error_; }

bool Request::finish(uint32_t final_state, size_t bytes, const std::string& why) {
  uint32_t expected = kPending;
  if (!state_.compare_exchange_strong(expected, kFinishing, std::memory_order_acq_rel)) return false;
  bytes_ = bytes;
  error_ = why;
  if (final_state == kDone && before_complete_) {
    try {
      before_complete_(*this, bytes);
    } catch (const std::exception& e) {
      final_state = kFailed;
      error_ = e.what();
    }
  }
  before_complete_ = nullptr;
  state_.store(final_state, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) != 0) futexWakeAll(&state_);
  return true;
}

void Request::complete(size_t bytes) { finish(kDone, bytes, std::string()); }

void Request::fail(const std::string& why) { finish(kFailed, 0, why); }

bool Request::test() {
  if (isPending() && progress_) progress_->poll();
  return !isPending();
}

void Request::activeWait(Clock::time_point until) {
  progress_->enterActiveWait();
  int idle_polls = 0;
  while (isPending()) {
    if (progress_->poll()) {
      idle_polls = 0;
      continue;
    }
    if (++idle_polls < kSpinsBeforeYield) {
      cpuRelax();
      continue;
    }
    sched_yield();
    if ((idle_polls & 63) == 0 && Clock::now() >= until) break;
  }
  progress_->leaveActiveWait();
}

void Request::passiveWait(Clock::time_point until) {
  constexpr auto kSlice = std::chrono::milliseconds(100);
  while (isPending()) {
    const auto now = Clock::now();
    if (now >= until) return;
    const auto slice = std::min<Clock::duration>(until - now, kSlice);
    sleepers_.fetch_add(1, std::memory_order_seq_cst);
    const uint32_t observed = state_.load(std::memory_order_seq_cst);
    if (observed == kPending || observed == kFinishing) {
      futexWait(&state_, observed, std::chrono::duration_cast<std::chrono::nanoseconds>(slice));
    }
    sleepers_.fetch_sub(1, std::memory_order_seq_cst);
  }
}

size_t Request::wait(double timeout_s) {
  const auto until =
      timeout_s < 0
          ? Clock::time_point::max()
          : Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(timeout_s));
  if (isPending() && progress_ && progress_->activeWaitWindow().count() > 0) {
    activeWait(std::min(until, Clock::now() + progress_->activeWaitWindow()));
  }
  if (isPending() && progress_) progress_->blockingWait(*this, until);
  if (isPending()) passiveWait(until);
  const uint32_t s = state_.load(std::memory_order_acquire);
  if (s == kDone) return bytes_;
  if (s == kFailed) throw CommError(error_);
  throw WaitTimeout("wait timed out after " + std::to_string(timeout_s) + " s; the request is still pending");
}

}  // namespace dicomm
