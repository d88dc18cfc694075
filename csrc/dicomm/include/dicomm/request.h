// An asynchronous send or receive: what to move, where, and how it ended.
// Transports finish a request exactly once (complete or fail); users wait or test.
#pragma once

#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>

namespace dicomm {

using Clock = std::chrono::steady_clock;

class CommError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class WaitTimeout : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

class Request;

// A transport whose progress the waiting thread may drive itself (shm polls rings; tcp reads the
// socket in the waiting thread).
class Progress {
 public:
  virtual ~Progress() = default;
  // Advances the transport without blocking; false when nothing moved (or another thread polls).
  virtual bool poll() = 0;
  virtual void enterActiveWait() {}
  virtual void leaveActiveWait() {}
  // How long a waiter polls before it sleeps (0: it sleeps at once and the transport's own
  // thread completes the request).
  virtual std::chrono::nanoseconds activeWaitWindow() const { return std::chrono::milliseconds(5); }
  // Blocks the waiting thread inside the transport, doing the transport's work for `request`
  // itself, until it finishes or `until` passes (returns earlier when another thread already does
  // this work: the caller then sleeps until the transport completes the request).
  virtual void blockingWait(const Request& request, Clock::time_point until) {
    (void)request;
    (void)until;
  }
};

enum class Direction : uint8_t { Send, Recv };

class Request {
 public:
  Request(Direction direction, int peer, uint64_t tag, uint8_t* data, size_t capacity, Clock::time_point deadline);
  ~Request();
  Request(const Request&) = delete;
  Request& operator=(const Request&) = delete;

  Direction direction() const { return direction_; }
  int peer() const { return peer_; }
  uint64_t tag() const { return tag_; }
  uint8_t* data() const { return data_; }
  size_t capacity() const { return capacity_; }
  Clock::time_point deadline() const { return deadline_; }
  // The buffer is device memory the transport reaches through its DeviceMemory (device-direct).
  bool onDevice() const { return on_device_; }
  void setOnDevice() { on_device_ = true; }

  bool isPending() const;
  bool succeeded() const;
  // Drives waiter-driven progress once, then reports whether the request finished.
  bool test();
  // Blocks until the request finishes and returns the bytes moved; throws CommError when it
  // failed, WaitTimeout when timeout_s (>= 0) elapses first (the request then stays pending).
  size_t wait(double timeout_s = -1);
  size_t bytes() const;
  std::string error() const;

  // Transport side. The first outcome wins; later calls are ignored.
  void complete(size_t bytes);
  void fail(const std::string& why);
  void setProgress(std::shared_ptr<Progress> progress) { progress_ = std::move(progress); }
  // Runs on completion, before waiters see it (device staging copies out here).
  void setBeforeComplete(std::function<void(Request&, size_t bytes)> hook) { before_complete_ = std::move(hook); }
  // Keeps `resource` (a staging buffer) alive as long as the request.
  void keepAlive(std::shared_ptr<void> resource) { keep_alive_ = std::move(resource); }

  static int64_t liveCount();

 private:
  bool finish(uint32_t final_state, size_t bytes, const std::string& why);
  void activeWait(Clock::time_point until);
  void passiveWait(Clock::time_point until);

  const Direction direction_;
  const int peer_;
  const uint64_t tag_;
  uint8_t* const data_;
  const size_t capacity_;
  const Clock::time_point deadline_;
  bool on_device_ = false;
  std::shared_ptr<Progress> progress_;
  std::function<void(Request&, size_t)> before_complete_;
  std::shared_ptr<void> keep_alive_;
  std::atomic<uint32_t> state_{0};
  std::atomic<uint32_t> sleepers_{0};
  size_t bytes_ = 0;
  std::string error_;
};

using RequestPtr = std::shared_ptr<Request>;

}  // namespace dicomm
