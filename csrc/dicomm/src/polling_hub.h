// What the polled transports (shm, ibverbs) share above their connections: one lock serialising
// every call into them, polling by waiting threads (Progress), a background thread that takes
// over while nobody waits, housekeeping every 10 ms (dead peers, deadlines) and shutdown. A
// transport supplies its connection setup and how its background thread rests when idle;
// PolledTransport is the Transport the engine sees for either.
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "polled_connection.h"

namespace dicomm {

class PollingHub : public Progress {
 public:
  explicit PollingHub(std::chrono::nanoseconds active_wait_window) : active_wait_window_(active_wait_window) {}
  bool poll() override;
  std::chrono::nanoseconds activeWaitWindow() const override { return active_wait_window_; }
  void enterActiveWait() override;
  void leaveActiveWait() override;

  // Runs the transport's setup with the peer and adds the connection to those polled.
  std::shared_ptr<PolledConnection> connect(PeerSetup& setup);
  // Starts the background thread once every connection exists.
  virtual void start();
  // Stops the background thread and closes every connection with `why`. Idempotent.
  void shutdown(const std::string& why);
  std::mutex& mutex() { return mu_; }

 protected:
  // The transport's own setup over setup.socket; returns a connection that owns the socket.
  virtual std::shared_ptr<PolledConnection> setUp(PeerSetup& setup) = 0;
  // One turn of the background thread between housekeeping: poll, or rest while waiting threads
  // poll or nothing moves.
  virtual void pollOrRest() = 0;
  // Wakes the background thread from its rest (at shutdown).
  virtual void wakeBackground() {}

  // Polls every connection; the caller holds mutex().
  bool progressLocked();
  bool stopping() const { return stopping_.load(); }
  std::atomic<uint32_t> active_waiters_{0};  // threads polling in Request::wait
  // Idle polls the background thread yields between before it rests: none when waiters never spin
  // (an oversubscribed host), where a yielding thread only takes cores from busy peers.
  int idleYieldsBeforeRest(int when_spinning) const { return active_wait_window_.count() > 0 ? when_spinning : 1; }

 private:
  void runBackground();
  void housekeeping();

  const std::chrono::nanoseconds active_wait_window_;
  std::mutex mu_;
  std::vector<std::shared_ptr<PolledConnection>> connections_;
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

// A polled transport as the engine sees it: connections whose posts take the hub's lock, the
// hub as the waiters' Progress, shutdown at destruction.
class PolledTransport : public Transport {
 public:
  PolledTransport(TransportKind kind, std::shared_ptr<PollingHub> hub) : kind_(kind), hub_(std::move(hub)) {}
  ~PolledTransport() override { hub_->shutdown("endpoint closed"); }

  TransportKind kind() const override { return kind_; }
  std::shared_ptr<Connection> connect(PeerSetup setup) override;
  void start() override { hub_->start(); }
  void shutdown(const std::string& why) override { hub_->shutdown(why); }
  std::shared_ptr<Progress> waiterProgress() override { return hub_; }

 private:
  const TransportKind kind_;
  std::shared_ptr<PollingHub> hub_;
};

}  // namespace dicomm
