// The device-direct transport: per peer, an RDMA reliable connection established with
// librdmacm (the lower rank listens, the higher rank connects), memory registered with the
// device, keys exchanged at connection time. Like shm, a waiting thread polls completion
// queues itself and a background thread takes over when nobody waits.
#include <arpa/inet.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>

#include "ibverbs/ibverbs_connection.h"

namespace dicomm {
namespace {

constexpr auto kHousekeepingInterval = std::chrono::milliseconds(10);

struct AddrInfo {
  rdma_addrinfo* info = nullptr;
  ~AddrInfo() {
    if (info) rdma_freeaddrinfo(info);
  }
};

ibv_qp_init_attr queuePairAttributes() {
  ibv_qp_init_attr attr{};
  attr.cap.max_send_wr = 2 * kIbSendSlots + 8;
  attr.cap.max_recv_wr = kIbRecvSlots;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = sizeof(uint64_t);
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 1;
  return attr;
}

[[noreturn]] void rdmaFailure(const std::string& what) {
  throw CommError("ibverbs setup: " + what + " failed: " + std::strerror(errno));
}

std::string encodeCounter(const IbRemoteCounter& c) {
  return "counter_address=" + std::to_string(c.address) + "\ncounter_rkey=" + std::to_string(c.rkey) + "\n";
}

IbRemoteCounter decodeCounter(const std::string& text) {
  IbRemoteCounter c;
  std::istringstream in(text);
  std::string line;
  bool have_address = false, have_key = false;
  while (std::getline(in, line)) {
    const auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    const std::string key = line.substr(0, eq), value = line.substr(eq + 1);
    try {
      if (key == "counter_address") c.address = std::stoull(value), have_address = true;
      if (key == "counter_rkey") c.rkey = uint32_t(std::stoul(value)), have_key = true;
    } catch (const std::exception&) {
      throw CommError("ibverbs setup: malformed field " + key);
    }
  }
  if (!have_address || !have_key) throw CommError("ibverbs setup: the peer did not send its credit counter");
  return c;
}

class IbverbsHub : public Progress {
 public:
  explicit IbverbsHub(const Options& options) : options_(options) {}

  bool poll() override {
    std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
    if (!lock.owns_lock()) return false;
    return progressLocked();
  }
  void enterActiveWait() override { active_waiters_.fetch_add(1); }
  void leaveActiveWait() override { active_waiters_.fetch_sub(1); }

  bool progressLocked() {
    bool moved = false;
    for (auto& c : connections_) moved |= c->progress();
    return moved;
  }

  std::shared_ptr<IbverbsConnection> connect(PeerSetup& setup) {
    const std::string who = "rank " + std::to_string(setup.peer.rank);
    ibv_qp_init_attr attr = queuePairAttributes();
    rdma_addrinfo hints{};
    hints.ai_port_space = RDMA_PS_TCP;
    AddrInfo found;
    rdma_cm_id* id = nullptr;
    std::shared_ptr<IbverbsConnection> connection;
    if (!setup.initiator) {
      hints.ai_flags = RAI_PASSIVE;
      if (rdma_getaddrinfo(setup.self.address.c_str(), "0", &hints, &found.info) != 0) rdmaFailure("rdma_getaddrinfo");
      rdma_cm_id* listen_id = nullptr;
      if (rdma_create_ep(&listen_id, found.info, nullptr, &attr) != 0) rdmaFailure("rdma_create_ep (listen)");
      std::unique_ptr<rdma_cm_id, void (*)(rdma_cm_id*)> listener(listen_id, rdma_destroy_ep);
      if (rdma_listen(listen_id, 1) != 0) rdmaFailure("rdma_listen");
      FrameHeader h;
      h.kind = FrameKind::Hello;
      sendFrame(setup.socket.fd(), h, "rdma_port=" + std::to_string(ntohs(rdma_get_src_port(listen_id))) + "\n",
                setup.deadline, who);
      if (rdma_get_request(listen_id, &id) != 0) rdmaFailure("rdma_get_request");
      connection = std::make_shared<IbverbsConnection>(setup.peer.rank, id, Socket(), options_);
      connection->prepare();
      if (rdma_accept(id, nullptr) != 0) rdmaFailure("rdma_accept");
    } else {
      std::string text;
      recvFrame(setup.socket.fd(), &text, options_.frameLimits(), setup.deadline, who);
      const auto eq = text.find('=');
      const std::string port = eq == std::string::npos ? "" : text.substr(eq + 1, text.find('\n') - eq - 1);
      if (rdma_getaddrinfo(setup.peer.address.c_str(), port.c_str(), &hints, &found.info) != 0) {
        rdmaFailure("rdma_getaddrinfo " + setup.peer.address + ":" + port);
      }
      if (rdma_create_ep(&id, found.info, nullptr, &attr) != 0) rdmaFailure("rdma_create_ep");
      connection = std::make_shared<IbverbsConnection>(setup.peer.rank, id, Socket(), options_);
      connection->prepare();
      if (rdma_connect(id, nullptr) != 0) rdmaFailure("rdma_connect");
    }
    // Registered credit counters travel over the (token-checked) setup socket.
    FrameHeader h;
    h.kind = FrameKind::Hello;
    sendFrame(setup.socket.fd(), h, encodeCounter(connection->localCounter()), setup.deadline, who);
    std::string theirs;
    recvFrame(setup.socket.fd(), &theirs, options_.frameLimits(), setup.deadline, who);
    connection->setRemoteCounter(decodeCounter(theirs));
    connection->adoptControlSocket(std::move(setup.socket));
    std::lock_guard<std::mutex> lock(mu_);
    connections_.push_back(connection);
    return connection;
  }

  void start() {
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }

  void shutdown(const std::string& why) {
    if (stopping_.exchange(true)) return;
    if (thread_.joinable()) thread_.join();
    std::lock_guard<std::mutex> lock(mu_);
    for (auto& c : connections_) c->closeWithError(why);
  }

  std::mutex& mutex() { return mu_; }

 private:
  void run() {
    auto next_housekeeping = Clock::now();
    int idle = 0;
    while (!stopping_.load()) {
      if (Clock::now() >= next_housekeeping) {
        std::lock_guard<std::mutex> lock(mu_);
        const auto now = Clock::now();
        for (auto& c : connections_) {
          if (c->checkAlive()) c->expire(now);
        }
        next_housekeeping = now + kHousekeepingInterval;
      }
      if (active_waiters_.load() == 0 && poll()) {
        idle = 0;
        continue;
      }
      if (++idle < 64) {
        std::this_thread::yield();
      } else {
        std::this_thread::sleep_for(std::chrono::microseconds(50));
      }
    }
  }

  const Options options_;
  std::mutex mu_;
  std::vector<std::shared_ptr<IbverbsConnection>> connections_;
  std::atomic<int> active_waiters_{0};
  std::atomic<bool> stopping_{false};
  std::thread thread_;
};

class LockedIbverbsConnection : public Connection {
 public:
  LockedIbverbsConnection(std::shared_ptr<IbverbsHub> hub, std::shared_ptr<IbverbsConnection> connection)
      : hub_(std::move(hub)), connection_(std::move(connection)) {}
  void postSend(const RequestPtr& send) override {
    std::lock_guard<std::mutex> lock(hub_->mutex());
    connection_->postSend(send);
  }
  void postRecv(const RequestPtr& recv) override {
    std::lock_guard<std::mutex> lock(hub_->mutex());
    connection_->postRecv(recv);
  }

 private:
  std::shared_ptr<IbverbsHub> hub_;
  std::shared_ptr<IbverbsConnection> connection_;
};

class IbverbsTransport : public Transport {
 public:
  explicit IbverbsTransport(const Options& options) : hub_(std::make_shared<IbverbsHub>(options)) {}
  ~IbverbsTransport() override { hub_->shutdown("endpoint closed"); }
  TransportKind kind() const override { return TransportKind::Ibverbs; }
  std::shared_ptr<Connection> connect(PeerSetup setup) override {
    return std::make_shared<LockedIbverbsConnection>(hub_, hub_->connect(setup));
  }
  void start() override { hub_->start(); }
  void shutdown(const std::string& why) override { hub_->shutdown(why); }
  std::shared_ptr<Progress> waiterProgress() override { return hub_; }

 private:
  std::shared_ptr<IbverbsHub> hub_;
};

}  // namespace

std::unique_ptr<Transport> makeIbverbsTransport(const Options& options) {
  const IbverbsProbe probe = probeIbverbs();
  if (!probe.available) throw CommError(probe.message);
  return std::make_unique<IbverbsTransport>(options);
}

}  // namespace dicomm
