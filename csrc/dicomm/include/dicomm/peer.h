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

// The setup handshake, in which the job token never crosses the wire:
//   listener -> dialer  Hello frame carrying a Challenge: the listener's rank and a fresh nonce;
//   dialer -> listener  Hello: its rank, transport, own fresh nonce and proof = HMAC(token, both
//                       nonces, both ranks, transport);
//   listener -> dialer  HelloReply: refused with the reason, or accepted with the listener's
//                       own proof over the same values (so the dialer knows it reached its job).
struct Challenge {
  int rank = -1;      // the listener's
  std::string nonce;  // fresh for this connection

  // A challenge with a nonce drawn now (throws CommError if none can be drawn).
  static Challenge fresh(int rank);
  std::string encode() const;
  static Challenge decode(const std::string& payload);  // throws FrameError
};

struct Hello {
  int rank = -1;  // the dialer's
  TransportKind transport = TransportKind::Tcp;
  std::string nonce;  // the dialer's, fresh for this connection
  std::string proof;

  // The dialer's answer to `challenge`, with a nonce drawn now (throws CommError if none can be).
  static Hello answer(const Challenge& challenge, int rank, TransportKind transport, const std::string& token);
  // Whether `proof` shows the dialer holds `token` and answers this very `challenge`.
  bool proves(const std::string& token, const Challenge& challenge) const;
  // The proof a listener holding `token` returns in its HelloReply.
  std::string listenerProof(const std::string& token, const Challenge& challenge) const;

  std::string encode() const;
  static Hello decode(const std::string& payload);  // throws FrameError
};

// The transport for a pair, from the initiator's point of view: its preference for that peer
// ("auto" or a name) and both descriptors. Throws CommError when a forced choice cannot work.
TransportKind selectTransport(const std::string& preference, const PeerDescriptor& self, const PeerDescriptor& peer);

}  // namespace dicomm
