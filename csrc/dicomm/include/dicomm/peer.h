// What each rank publishes about itself in the store, and the setup handshake on a new connection.
#pragma once

#include <cstdint>
#include <string>

#include "dicomm/options.h"

namespace dicomm {

struct PeerDescriptor {
  int rank = -1;
  std::string address;
  uint16_t port = 0;
  std::string host_id;  // equal on both sides: same kernel and namespaces, so shm can work
  int64_t pid = 0;
  bool ibverbs = false;  // an active RDMA port was found at start-up
  std::string ibverbs_device;

  std::string encode() const;
  // Throws CommError naming the field that is missing or malformed.
  static PeerDescriptor decode(const std::string& text);
};

// Boot id, host name and IPC/PID namespaces: the things two processes must share for shm.
std::string localHostId();

struct Hello {
  int rank = -1;
  std::string token;
  TransportKind transport = TransportKind::Tcp;

  std::string encode() const;
  static Hello decode(const std::string& payload);  // throws FrameError
};

// The transport for a pair, from the initiator's point of view: its preference for that peer
// ("auto" or a name) and both descriptors. Throws CommError when a forced choice cannot work.
TransportKind selectTransport(const std::string& preference, const PeerDescriptor& self, const PeerDescriptor& peer);

}  // namespace dicomm
