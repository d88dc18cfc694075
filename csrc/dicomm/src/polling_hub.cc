// The lock, waiter polling, background thread, housekeeping and shutdown of the polled transports.
#include "polling_hub.h"

namespace dicomm {
namespace {

constexpr auto kHousekeepingInterval = std::chrono::milliseconds(10);

// Serialises the user's posts with the hub's polling.
class LockedConnection : public Connection {
 public:
  LockedConnection(std::shared_ptr<PollingHub> hub, std::shared_ptr<PolledConnection> connection)
      : hub_(std::move(hub)), connection_(std::move(connection)) {}
  void postSend(const RequestPtr& send) override {
    std::lock_guard<std::mutex> lock(hub_->mutex());
    connection_->postSend(send);
  }
  void postRecv(const RequestPtr& recv) override {
    std::lock_guard<std::mutex> lock(hub_->mutex());
    connection_->postRecv(recv);
  }
  bool deviceDirect() const override { return connection_->deviceDirect(); }

 private:
  std::shared_ptr<PollingHub> hub_;
  std::shared_ptr<PolledConnection> connection_;
};

}  // namespace

bool PollingHub::poll() {
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock()) return false;
  return progressLocked();
}

void PollingHub::enterActiveWait() { active_waiters_.fetch_add(1, std::memory_order_seq_cst); }

void PollingHub::leaveActiveWait() { active_waiters_.fetch_sub(1, std::memory_order_seq_cst); }

bool PollingHub::progressLocked() {
  bool moved = false;
  for (auto& c : connections_) moved |= c->progress();
  return moved;
}

std::shared_ptr<PolledConnection> PollingHub::connect(PeerSetup& setup) {
  auto connection = setUp(setup);
  std::lock_guard<std::mutex> lock(mu_);
  connections_.push_back(connection);
  return connection;
}

void PollingHub::start() {
  if (!thread_.joinable()) thread_ = std::thread([this] { runBackground(); });
}

void PollingHub::shutdown(const std::string& why) {
  if (stopping_.exchange(true)) return;
  wakeBackground();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> lock(mu_);
  for (auto& c : connections_) c->closeWithError(why);
}

void PollingHub::housekeeping() {
  std::lock_guard<std::mutex> lock(mu_);
  const auto now = Clock::now();
  for (auto& c : connections_) {
    if (c->checkAlive()) c->expire(now);
  }
}

void PollingHub::runBackground() {
  auto next_housekeeping = Clock::now();
  while (!stopping()) {
    if (Clock::now() >= next_housekeeping) {
      housekeeping();
      next_housekeeping = Clock::now() + kHousekeepingInterval;
    }
    pollOrRest();
  }
}

std::shared_ptr<Connection> PolledTransport::connect(PeerSetup setup) {
  return std::make_shared<LockedConnection>(hub_, hub_->connect(setup));
}

}  // namespace dicomm
