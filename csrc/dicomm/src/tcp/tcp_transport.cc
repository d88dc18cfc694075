// The CPU-mediated transport: one non-blocking socket per peer, driven by one epoll thread.
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <thread>
#include <vector>

#include "tcp/tcp_connection.h"

namespace dicomm {
namespace {

constexpr auto kExpiryScanInterval = std::chrono::milliseconds(50);

class TcpTransport : public Transport {
 public:
  explicit TcpTransport(const Options& options) : options_(options) {
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (epoll_fd_ < 0 || wake_fd_ < 0) throw CommError("tcp transport: cannot create epoll/eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
  }

  ~TcpTransport() override {
    shutdown("endpoint closed");
    ::close(wake_fd_);
    ::close(epoll_fd_);
  }

  TransportKind kind() const override { return TransportKind::Tcp; }

  std::shared_ptr<Connection> connect(PeerSetup setup) override {
    if (options_.tcp_socket_buffer_bytes) setBufferSizes(setup.socket.fd(), int(options_.tcp_socket_buffer_bytes));
    if (options_.tcp_notsent_lowat_bytes) setNotSentLowWater(setup.socket.fd(), int(options_.tcp_notsent_lowat_bytes));
    chooseCongestionControl(setup.socket.fd());
    auto connection = std::make_shared<TcpConnection>(setup.peer.rank, std::move(setup.socket), epoll_fd_, options_);
    epoll_event ev{};
    ev.events = EPOLLIN | EPOLLRDHUP;
    ev.data.ptr = connection.get();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, connection->fd(), &ev) != 0) {
      throw CommError("tcp transport: cannot watch the socket of rank " + std::to_string(setup.peer.rank));
    }
    connections_.push_back(connection);
    return connection;
  }

  void chooseCongestionControl(int fd) const {
    const std::string& choice = options_.tcp_congestion;
    if (choice.empty() || choice == "default") return;
    if (choice != "auto") return setCongestionControl(fd, choice);
    if (!peerIsOnThisHost(fd)) return;
    try {
      setCongestionControl(fd, "reno");
    } catch (const CommError&) {
      // A kernel that does not let this user choose reno keeps its default: "auto" asked for nothing.
    }
  }

  void start() override {
    if (!thread_.joinable()) thread_ = std::thread([this] { run(); });
  }

  void shutdown(const std::string& why) override {
    if (stopping_.exchange(true)) return;
    const uint64_t one = 1;
    (void)!::write(wake_fd_, &one, sizeof(one));
    if (thread_.joinable()) thread_.join();
    for (auto& connection : connections_) connection->closeWithError(why);
  }

 private:
  void run() {
    std::vector<epoll_event> events(64);
    auto next_scan = Clock::now() + kExpiryScanInterval;
    while (!stopping_.load()) {
      const int n = epoll_wait(epoll_fd_, events.data(), int(events.size()), 50);
      for (int i = 0; i < n; ++i) {
        auto* connection = static_cast<TcpConnection*>(events[i].data.ptr);
        if (!connection) continue;  // wake-up
        if (events[i].events & EPOLLOUT) connection->onWritable();
        if (events[i].events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) connection->onReadable();
      }
      const auto now = Clock::now();
      if (now >= next_scan) {
        for (auto& connection : connections_) connection->expire(now);
        next_scan = now + kExpiryScanInterval;
      }
    }
  }

  const Options options_;
  int epoll_fd_ = -1;
  int wake_fd_ = -1;
  std::vector<std::shared_ptr<TcpConnection>> connections_;
  std::thread thread_;
  std::atomic<bool> stopping_{false};
};

}  // namespace

std::unique_ptr<Transport> makeTcpTransport(const Options& options) { return std::make_unique<TcpTransport>(options); }

}  // namespace dicomm
