#include "tcp/tcp_connection.h"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace dicomm {
namespace {

constexpr auto kWaiterPollSlice = std::chrono::milliseconds(100);  // re-checks the deadline this often
// Spinning through larger messages halved 16 and 64 MiB ping-pongs when other jobs loaded the
// host's cores (docs/dicomm.md, tcp), and bought nothing at those sizes on a quiet one.
constexpr uint64_t kLargestSpunMessageBytes = uint64_t(2) << 20;

bool spinsThrough(uint64_t streaming_message_bytes) {
  return streaming_message_bytes > 0 && streaming_message_bytes <= kLargestSpunMessageBytes;
}

// What a receive on a tcp connection offers its waiting thread: read the socket itself. No
// spinning: the thread sleeps in poll(2) on the socket.
class TcpWaiterRead : public Progress {
 public:
  explicit TcpWaiterRead(std::weak_ptr<TcpConnection> connection) : connection_(std::move(connection)) {}
  bool poll() override { return false; }
  std::chrono::nanoseconds activeWaitWindow() const override { return std::chrono::nanoseconds(0); }
  void blockingWait(const Request& request, Clock::time_point until) override {
    if (auto connection = connection_.lock()) connection->readWhileWaiting(request, until);
  }

 private:
  std::weak_ptr<TcpConnection> connection_;
};

}  // namespace

TcpConnection::TcpConnection(int peer, Socket socket, int epoll_fd, const Options& options)
    : QueuedConnection(peer, options),
      socket_(std::move(socket)),
      epoll_fd_(epoll_fd),
      chunk_bytes_(options.tcp_chunk_bytes),
      largest_read_threshold_(options.tcp_socket_buffer_bytes / 8),
      stream_spin_window_(options.activeWaitWindow()),
      reader_(inbox_, options.frameLimits()) {
  setNonBlocking(socket_.fd());
  setNoDelay(socket_.fd());
}

TcpConnection::~TcpConnection() = default;

std::string TcpConnection::describe() const { return "tcp connection to rank " + std::to_string(peer_); }

void TcpConnection::postSend(const RequestPtr& send) {
  std::lock_guard<std::mutex> lock(mu_);
  if (queueSend(send) && outgoing_.size() == 1) flushLocked();
}

void TcpConnection::postRecv(const RequestPtr& recv) {
  std::lock_guard<std::mutex> lock(mu_);
  if (!waiter_progress_) waiter_progress_ = std::make_shared<TcpWaiterRead>(weak_from_this());
  recv->setProgress(waiter_progress_);
  if (!finishIfClosed(recv)) inbox_.post(recv);
}

void TcpConnection::readWhileWaiting(const Request& request, Clock::time_point until) {
  bool spin = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || waiter_reads_ || !request.isPending()) return;
    waiter_reads_ = true;
    watchLocked();
    readAvailableLocked();  // what arrived before the epoll thread let go
    spin = spinsThrough(reader_.streamingMessageBytes());
  }
  // While a message of at most kLargestSpunMessageBytes streams in, the peer is writing the rest
  // of it now: the waiter reads on without sleeping (for at most the spin window), so the end of
  // the message finds it awake. Between messages (the peer may be computing) and through larger
  // ones (read in SO_RCVLOWAT batches) it sleeps in poll(2).
  const auto spin_until = std::min(until, Clock::now() + stream_spin_window_);
  while (request.isPending()) {
    const auto now = Clock::now();
    if (now >= until) break;
    if (!spin || now >= spin_until) {
      {
        std::lock_guard<std::mutex> lock(mu_);
        if (closed_) break;
        setReadThresholdLocked();
      }
      const auto slice = std::min<Clock::duration>(until - now, kWaiterPollSlice);
      pollfd watched{socket_.fd(), POLLIN | POLLRDHUP, 0};
      ::poll(&watched, 1, int(std::chrono::ceil<std::chrono::milliseconds>(slice).count()));
    }
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_) break;
    readAvailableLocked();
    spin = spinsThrough(reader_.streamingMessageBytes());
  }
  std::lock_guard<std::mutex> lock(mu_);
  waiter_reads_ = false;
  setReadThresholdLocked();
  watchLocked();
}

bool TcpConnection::writeFrontLocked() {
  TcpOutgoing& out = outgoing_.front();
  const Request& request = *out.request;
  while (true) {
    if (out.header_sent == kFrameHeaderBytes && out.frame_payload_sent == out.frame_payload) {
      // Previous frame (if any) is out; start the next one unless the message is finished.
      if (out.started && out.offset == request.capacity()) return true;
      FrameHeader h;
      h.kind = FrameKind::Data;
      h.tag = request.tag();
      h.seq = out.seq;
      h.total_bytes = request.capacity();
      h.offset = out.offset;
      h.payload_bytes = std::min<uint64_t>(chunk_bytes_, request.capacity() - out.offset);
      const auto bytes = encodeFrameHeader(h);
      std::memcpy(out.header, bytes.data(), bytes.size());
      out.header_sent = 0;
      out.frame_payload = h.payload_bytes;
      out.frame_payload_sent = 0;
      out.started = true;
    }
    iovec iov[2];
    int count = 0;
    if (out.header_sent < kFrameHeaderBytes) {
      iov[count++] = {out.header + out.header_sent, kFrameHeaderBytes - out.header_sent};
    }
    if (out.frame_payload_sent < out.frame_payload) {
      iov[count++] = {request.data() + out.offset + out.frame_payload_sent,
                      size_t(out.frame_payload - out.frame_payload_sent)};
    }
    msghdr msg{};
    msg.msg_iov = iov;
    msg.msg_iovlen = size_t(count);
    const ssize_t n = ::sendmsg(socket_.fd(), &msg, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return false;
      throw CommError(describe() + " failed while sending: " + std::strerror(errno));
    }
    size_t sent = size_t(n);
    const size_t header_part = std::min(sent, kFrameHeaderBytes - out.header_sent);
    out.header_sent += header_part;
    sent -= header_part;
    out.frame_payload_sent += sent;
    if (out.header_sent == kFrameHeaderBytes && out.frame_payload_sent == out.frame_payload) {
      out.offset += out.frame_payload;
    }
  }
}

void TcpConnection::flushLocked() {
  try {
    while (!outgoing_.empty()) {
      if (!writeFrontLocked()) {
        setWantWriteLocked(true);
        return;
      }
      RequestPtr done = outgoing_.front().request;
      outgoing_.pop_front();
      done->complete(done->capacity());
    }
    setWantWriteLocked(false);
  } catch (const std::exception& e) {
    closeLocked(e.what());
  }
}

void TcpConnection::setWantWriteLocked(bool want) {
  if (want == want_write_) return;
  want_write_ = want;
  watchLocked();
}

void TcpConnection::watchLocked() {
  if (closed_) return;
  epoll_event ev{};
  ev.events = (waiter_reads_ ? 0u : uint32_t(EPOLLIN | EPOLLRDHUP)) | (want_write_ ? uint32_t(EPOLLOUT) : 0u);
  ev.data.ptr = this;
  epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, socket_.fd(), &ev);
}

void TcpConnection::onWritable() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!closed_) flushLocked();
}

void TcpConnection::onReadable() {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_ || waiter_reads_) return;
  readAvailableLocked();
  setReadThresholdLocked();
}

void TcpConnection::readAvailableLocked() {
  try {
    while (true) {
      auto [where, size] = reader_.target();
      const ssize_t n = ::recv(socket_.fd(), where, size, MSG_DONTWAIT);
      if (n > 0) {
        reader_.advance(size_t(n));
        continue;
      }
      if (n == 0) {
        throw CommError("rank " + std::to_string(peer_) + " closed the tcp connection" +
                        (reader_.atFrameBoundary() ? "" : " in the middle of a frame") + " (peer exited?)");
      }
      if (errno == EAGAIN || errno == EWOULDBLOCK) return;
      if (errno == EINTR) continue;
      throw CommError(describe() + " failed while receiving: " + std::strerror(errno));
    }
  } catch (const FrameError& e) {
    closeLocked(describe() + " closed: " + e.what());
  } catch (const std::exception& e) {
    closeLocked(e.what());
  }
}

void TcpConnection::setReadThresholdLocked() {
  if (closed_) return;
  // While a large payload streams in, wake only when a sizeable piece can be read at once.
  const int threshold = int(std::max<uint64_t>(1, std::min<uint64_t>(reader_.payloadLeft(), largest_read_threshold_)));
  if (threshold == read_threshold_) return;
  read_threshold_ = threshold;
  setsockopt(socket_.fd(), SOL_SOCKET, SO_RCVLOWAT, &read_threshold_, sizeof(read_threshold_));
}

void TcpConnection::expire(Clock::time_point now) {
  std::lock_guard<std::mutex> lock(mu_);
  if (closed_) return;
  if (auto overdue = inbox_.expire(now)) {
    closeLocked(*overdue);
    return;
  }
  if (auto overdue = expireSends(now)) closeLocked(*overdue);
}

void TcpConnection::closeWithError(const std::string& why) {
  std::lock_guard<std::mutex> lock(mu_);
  closeLocked(why);
}

void TcpConnection::closeLocked(const std::string& why) {
  if (closed_) return;
  epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, socket_.fd(), nullptr);
  ::shutdown(socket_.fd(), SHUT_RDWR);
  closeQueues(why);
}

}  // namespace dicomm
