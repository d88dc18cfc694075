// Link emulation: a token bucket (bandwidth) plus a one-way delay (latency) on the bytes a
// connection sends, under any transport. It wraps the transport's Connection, so tcp, shm and
// ibverbs stay unchanged.
//
// The arrival rule: a message of n bytes posted at t arrives at
//     max(previous arrival, t + latency) + n / bandwidth
// and is handed to the transport at that moment (the transport's own time comes on top). The
// sender never waits for an acknowledgement: isend returns at once, so many messages are in flight;
// a send completes when the transport has delivered it. Receives pass through unchanged.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <memory>
#include <mutex>
#include <queue>
#include <string>
#include <thread>
#include <vector>

#include "dicomm/link_shape.h"
#include "dicomm/request.h"
#include "dicomm/transport.h"

namespace dicomm {

// The arrival rule of one link. Not locked: its owner serialises calls.
class ArrivalClock {
 public:
  explicit ArrivalClock(LinkShape shape) : shape_(shape) {}
  Clock::time_point arrival(Clock::time_point now, size_t bytes);

 private:
  LinkShape shape_;
  Clock::time_point last_arrival_ = Clock::time_point::min();
};

// One thread that hands each held send to its connection at its release time.
class Pacer {
 public:
  Pacer();
  ~Pacer();
  Pacer(const Pacer&) = delete;
  Pacer& operator=(const Pacer&) = delete;

  // Sends of one connection must be scheduled with non-decreasing release times: they leave in
  // that order (ties in scheduling order).
  void schedule(Clock::time_point release, std::shared_ptr<Connection> connection, RequestPtr send);
  // Fails the sends still held with `why` and stops the thread. Idempotent.
  void shutdown(const std::string& why);

 private:
  struct Held {
    Clock::time_point release;
    uint64_t order;
    std::shared_ptr<Connection> connection;
    RequestPtr send;
  };
  struct Later {
    bool operator()(const Held& a, const Held& b) const {
      return a.release != b.release ? a.release > b.release : a.order > b.order;
    }
  };
  void run();

  std::mutex mutex_;
  std::condition_variable changed_;
  std::priority_queue<Held, std::vector<Held>, Later> held_;
  uint64_t next_order_ = 0;
  bool stopping_ = false;
  std::string failure_;
  std::thread thread_;
};

// A connection whose sends cross an emulated link: each is held by the pacer until its arrival.
class ShapedConnection : public Connection {
 public:
  ShapedConnection(std::shared_ptr<Connection> inner, LinkShape shape, std::shared_ptr<Pacer> pacer);
  void postSend(const RequestPtr& send) override;
  void postRecv(const RequestPtr& recv) override { inner_->postRecv(recv); }
  bool deviceDirect() const override { return inner_->deviceDirect(); }

 private:
  std::shared_ptr<Connection> inner_;
  std::shared_ptr<Pacer> pacer_;
  std::mutex mutex_;
  ArrivalClock clock_;
};

}  // namespace dicomm
