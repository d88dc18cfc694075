#include "dicomm/socket.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <thread>

namespace dicomm {
namespace {

int millisLeft(Clock::time_point deadline) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
  if (left <= 0) return 0;
  return left > 1000 ? 1000 : int(left);
}

[[noreturn]] void throwErrno(const std::string& what) { throw CommError(what + ": " + std::strerror(errno)); }

// Waits until fd is ready for `events`; false when the deadline passes first.
bool waitReady(int fd, short events, Clock::time_point deadline) {
  while (true) {
    pollfd p{fd, events, 0};
    const int rc = poll(&p, 1, millisLeft(deadline));
    if (rc > 0) return true;
    if (rc < 0 && errno != EINTR) throwErrno("poll");
    if (Clock::now() >= deadline) return false;
  }
}

}  // namespace

Socket::~Socket() { reset(); }

Socket& Socket::operator=(Socket&& other) noexcept {
  if (this != &other) {
    reset();
    fd_ = other.release();
  }
  return *this;
}

int Socket::release() {
  const int fd = fd_;
  fd_ = -1;
  return fd;
}

void Socket::reset() {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
}

Socket listenTcp(const std::string& bind_address, uint16_t* port) {
  Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!s) throwErrno("socket");
  const int one = 1;
  setsockopt(s.fd(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = 0;
  if (inet_pton(AF_INET, bind_address.c_str(), &addr.sin_addr) != 1) {
    throw CommError("bind address '" + bind_address + "' is not an IPv4 address (DICOMM_BIND_ADDR)");
  }
  if (::bind(s.fd(), reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) throwErrno("bind " + bind_address);
  if (::listen(s.fd(), 128) != 0) throwErrno("listen");
  socklen_t len = sizeof(addr);
  getsockname(s.fd(), reinterpret_cast<sockaddr*>(&addr), &len);
  *port = ntohs(addr.sin_port);
  return s;
}

Socket acceptTcp(const Socket& listener, Clock::time_point deadline) {
  while (true) {
    if (!waitReady(listener.fd(), POLLIN, deadline)) return Socket();
    const int fd = ::accept4(listener.fd(), nullptr, nullptr, SOCK_CLOEXEC);
    if (fd >= 0) return Socket(fd);
    if (errno != EINTR && errno != EAGAIN && errno != ECONNABORTED) throwErrno("accept");
  }
}

Socket connectTcp(const std::string& host, uint16_t port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &found);
  if (rc != 0) throw CommError("cannot resolve peer address '" + host + "': " + gai_strerror(rc));
  std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(found, freeaddrinfo);
  const std::string where = host + ":" + std::to_string(port);
  auto backoff = std::chrono::milliseconds(2);
  while (true) {
    Socket s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!s) throwErrno("socket");
    if (::connect(s.fd(), found->ai_addr, found->ai_addrlen) == 0) return s;
    const int err = errno;
    if (Clock::now() >= deadline) {
      throw CommError("cannot connect to " + where + ": " + std::strerror(err) + " (gave up at the timeout)");
    }
    if (err != ECONNREFUSED && err != EINTR && err != ETIMEDOUT && err != EAGAIN) {
      throw CommError("cannot connect to " + where + ": " + std::strerror(err));
    }
    std::this_thread::sleep_for(backoff);
    backoff = std::min(backoff * 2, std::chrono::milliseconds(200));
  }
}

void setNoDelay(int fd) {
  const int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

void setNonBlocking(int fd) {
  const int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags | O_NONBLOCK);
}

void setBufferSizes(int fd, int bytes) {
  // The FORCE options pass net.core.wmem_max/rmem_max (they need CAP_NET_ADMIN); without the
  // capability the plain ones apply, capped at those limits.
  if (setsockopt(fd, SOL_SOCKET, SO_SNDBUFFORCE, &bytes, sizeof(bytes)) != 0) {
    setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &bytes, sizeof(bytes));
  }
  if (setsockopt(fd, SOL_SOCKET, SO_RCVBUFFORCE, &bytes, sizeof(bytes)) != 0) {
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &bytes, sizeof(bytes));
  }
}

namespace {
std::string kernelList(const char* path) {
  std::ifstream file(path);
  std::string names;
  std::getline(file, names);
  return names.empty() ? "unknown" : names;
}
}  // namespace

void setCongestionControl(int fd, const std::string& name) {
  if (setsockopt(fd, IPPROTO_TCP, TCP_CONGESTION, name.data(), socklen_t(name.size())) == 0) return;
  throw CommError("tcp congestion control '" + name +
                  "' (DICOMM_TCP_CONGESTION) refused by the kernel: " + std::strerror(errno) +
                  "; available: " + kernelList("/proc/sys/net/ipv4/tcp_available_congestion_control") +
                  "; allowed to every user: " + kernelList("/proc/sys/net/ipv4/tcp_allowed_congestion_control"));
}

bool peerIsOnThisHost(int fd) {
  sockaddr_storage mine{}, theirs{};
  socklen_t mine_size = sizeof(mine), theirs_size = sizeof(theirs);
  if (getsockname(fd, reinterpret_cast<sockaddr*>(&mine), &mine_size) != 0 ||
      getpeername(fd, reinterpret_cast<sockaddr*>(&theirs), &theirs_size) != 0 || mine.ss_family != theirs.ss_family) {
    return false;
  }
  if (theirs.ss_family == AF_INET) {
    const auto& a = reinterpret_cast<const sockaddr_in&>(mine).sin_addr;
    const auto& b = reinterpret_cast<const sockaddr_in&>(theirs).sin_addr;
    return (ntohl(b.s_addr) >> 24) == 127 || a.s_addr == b.s_addr;
  }
  if (theirs.ss_family == AF_INET6) {
    const auto& a = reinterpret_cast<const sockaddr_in6&>(mine).sin6_addr;
    const auto& b = reinterpret_cast<const sockaddr_in6&>(theirs).sin6_addr;
    return IN6_IS_ADDR_LOOPBACK(&b) || std::memcmp(&a, &b, sizeof(a)) == 0;
  }
  return false;
}

void setNotSentLowWater(int fd, int bytes) { setsockopt(fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &bytes, sizeof(bytes)); }

void sendAll(int fd, const void* data, size_t size, Clock::time_point deadline, const std::string& peer_name) {
  auto p = static_cast<const uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= size_t(n);
      continue;
    }
    if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) {
      if (!waitReady(fd, POLLOUT, deadline)) throw CommError("timed out sending to " + peer_name);
      continue;
    }
    throwErrno("send to " + peer_name);
  }
}

void recvAll(int fd, void* data, size_t size, Clock::time_point deadline, const std::string& peer_name) {
  auto p = static_cast<uint8_t*>(data);
  while (size > 0) {
    const ssize_t n = ::recv(fd, p, size, MSG_DONTWAIT);
    if (n > 0) {
      p += n;
      size -= size_t(n);
      continue;
    }
    if (n == 0) throw CommError(peer_name + " closed the connection");
    if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) {
      if (!waitReady(fd, POLLIN, deadline)) throw CommError("timed out waiting for " + peer_name);
      continue;
    }
    throwErrno("receive from " + peer_name);
  }
}

void sendFrame(int fd, const FrameHeader& header, const std::string& payload, Clock::time_point deadline,
               const std::string& peer_name) {
  FrameHeader h = header;
  h.payload_bytes = payload.size();
  const auto bytes = encodeFrameHeader(h);
  std::string wire(reinterpret_cast<const char*>(bytes.data()), bytes.size());
  wire += payload;
  sendAll(fd, wire.data(), wire.size(), deadline, peer_name);
}

FrameHeader recvFrame(int fd, std::string* payload, const FrameLimits& limits, Clock::time_point deadline,
                      const std::string& peer_name) {
  uint8_t raw[kFrameHeaderBytes];
  recvAll(fd, raw, sizeof(raw), deadline, peer_name);
  FrameHeader h = decodeFrameHeader(raw, sizeof(raw), limits);
  if (h.payload_bytes > kMaxHelloPayloadBytes) {
    throw FrameError("malformed frame: " + std::string(frameKindName(h.kind)) + " during setup carries " +
                     std::to_string(h.payload_bytes) + " payload bytes");
  }
  payload->assign(h.payload_bytes, '\0');
  if (h.payload_bytes) recvAll(fd, payload->data(), payload->size(), deadline, peer_name);
  return h;
}

std::string defaultAdvertiseAddress() {
  char name[256] = {0};
  if (gethostname(name, sizeof(name) - 1) == 0) {
    addrinfo hints{};
    hints.ai_family = AF_INET;
    hints.ai_socktype = SOCK_STREAM;
    addrinfo* found = nullptr;
    if (getaddrinfo(name, nullptr, &hints, &found) == 0 && found) {
      char text[INET_ADDRSTRLEN] = {0};
      inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, text, sizeof(text));
      freeaddrinfo(found);
      return text;
    }
  }
  return "127.0.0.1";
}

}  // namespace dicomm
