// Thin helpers over POSIX TCP sockets: listen, connect with retry, deadline-bounded blocking I/O
// for connection setup, and whole frames (header plus small payload) on a blocking socket.
#pragma once

#include <cstdint>
#include <string>

#include "dicomm/frame.h"
#include "dicomm/request.h"

namespace dicomm {

class Socket {
 public:
  Socket() = default;
  explicit Socket(int fd) : fd_(fd) {}
  ~Socket();
  Socket(Socket&& other) noexcept : fd_(other.release()) {}
  Socket& operator=(Socket&& other) noexcept;
  Socket(const Socket&) = delete;
  Socket& operator=(const Socket&) = delete;

  int fd() const { return fd_; }
  int release();
  void reset();
  explicit operator bool() const { return fd_ >= 0; }

 private:
  int fd_ = -1;
};

// Listens on bind_address with an ephemeral port; returns the port through `port`.
Socket listenTcp(const std::string& bind_address, uint16_t* port);
// Accepts one connection, or returns an empty Socket when the deadline passes.
Socket acceptTcp(const Socket& listener, Clock::time_point deadline);
// Connects, retrying refused attempts until the deadline (the peer may not listen yet).
Socket connectTcp(const std::string& host, uint16_t port, Clock::time_point deadline);

void setNoDelay(int fd);
void setNonBlocking(int fd);
void setBufferSizes(int fd, int bytes);
// Selects the socket's congestion control; throws CommError naming it, with what this kernel
// offers, when the kernel refuses it (unknown, or not permitted to this user).
void setCongestionControl(int fd, const std::string& name);
// Whether the connected socket's peer is on this host (a loopback address, or the socket's own).
bool peerIsOnThisHost(int fd);
void setNotSentLowWater(int fd, int bytes);  // TCP_NOTSENT_LOWAT

// Blocking exact-size I/O bounded by a deadline; throw CommError naming `peer_name`.
void sendAll(int fd, const void* data, size_t size, Clock::time_point deadline, const std::string& peer_name);
void recvAll(int fd, void* data, size_t size, Clock::time_point deadline, const std::string& peer_name);

void sendFrame(int fd, const FrameHeader& header, const std::string& payload, Clock::time_point deadline,
               const std::string& peer_name);
// Reads one frame whose payload must be at most kMaxHelloPayloadBytes; throws FrameError if malformed.
FrameHeader recvFrame(int fd, std::string* payload, const FrameLimits& limits, Clock::time_point deadline,
                      const std::string& peer_name);

// This host's address as others should dial it: DICOMM_ADVERTISE_ADDR, else the host name's
// first IPv4 address, else 127.0.0.1.
std::string defaultAdvertiseAddress();

}  // namespace dicomm
