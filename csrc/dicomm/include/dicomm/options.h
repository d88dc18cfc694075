// Endpoint configuration: defaults, then DICOMM_* environment variables, then API arguments.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>

#include "dicomm/frame.h"
#include "dicomm/link_shape.h"

namespace dicomm {

class DeviceMemory;

// The largest Data frame any peer may send; one constant so peers with different settings agree.
constexpr uint64_t kMaxChunkBytes = uint64_t(256) << 20;
constexpr size_t kMaxPendingHellos = 64;

enum class TransportKind : uint8_t { Tcp = 1, Shm = 2, Ibverbs = 3 };

const char* transportName(TransportKind kind);
// Parses "tcp", "shm" or "ibverbs"; throws std::invalid_argument naming `what` otherwise.
TransportKind parseTransportName(const std::string& name, const std::string& what);

struct Options {
  std::string token;  // empty: rank 0 draws one and shares it via the store
  std::string store_prefix = "dicomm";
  std::string transport = "auto";             // auto | tcp | shm | ibverbs, for every peer
  std::map<int, std::string> peer_transport;  // per-peer override of `transport`
  double timeout_s = 300.0;                   // a pending request fails after this long
  double connect_timeout_s = 300.0;           // setup (store, connections) fails after this long
  std::string bind_address;                   // empty: the advertised address (never every interface)
  std::string advertise_address;              // empty: this host's name resolved, else 127.0.0.1
  // A connection to the listener must present the job token within this long; at most
  // kMaxPendingHellos such connections wait at once (the oldest is dropped for a newer one).
  double hello_timeout_s = 2.0;
  // Bytes of messages from one peer kept while no receive is posted for them; past it the
  // connection closes with an error naming the peer and the tag.
  uint64_t unexpected_bytes_per_peer = uint64_t(512) << 20;
  size_t tcp_chunk_bytes = size_t(4) << 20;
  size_t tcp_socket_buffer_bytes = size_t(4) << 20;  // SO_SNDBUF/SO_RCVBUF; 0 leaves kernel autotuning
  // Congestion control of the tcp connections (TCP_CONGESTION). "auto" (the default): reno for a
  // peer on this host, the kernel's default (net.ipv4.tcp_congestion_control) for any other, where
  // a long or lossy path needs what the host's administrator chose; "default" (or empty): the
  // kernel's for every peer; another name: that algorithm for every peer. On loopback BBR, a common
  // default, sizes its window from the bandwidth-delay product, a few segments where the round trip
  // takes microseconds, so a message larger than that waits for acknowledgements.
  std::string tcp_congestion = "auto";
  // TCP_NOTSENT_LOWAT: the kernel holds at most this many bytes of a send not yet on the wire
  // (the rest waits in the user's buffer); 0 leaves it unlimited. Bytes queued in the kernel go
  // out from whichever core processes the acknowledgement that lets them, and on loopback
  // segments sent from two cores arrive out of order (spurious retransmissions).
  size_t tcp_notsent_lowat_bytes = size_t(1) << 20;
  size_t shm_ring_bytes = size_t(4) << 20;
  size_t shm_eager_bytes = size_t(64) << 10;
  // Cross-memory messages at least this large are copied half by each side at once (the sender
  // writes the head, the receiver reads the tail): two cores instead of one. 0 never splits.
  size_t shm_split_bytes = size_t(128) << 10;
  bool shm_cross_memory_attach = true;  // false: large shm messages stream through the ring
  uint64_t max_message_bytes = uint64_t(1) << 40;
  // How to reach device memory (device_memory.h); null: Memory::Device requests need copy hooks.
  std::shared_ptr<const DeviceMemory> device_memory;
  // With device_memory on both sides of a shm connection, device requests move device-direct
  // (registered memory, no host staging); false stages them through host memory (the baseline).
  bool device_direct = true;
  // How long a thread waiting on a request polls a polled transport (shm, ibverbs) itself before it
  // sleeps until the transport's progress thread completes the request, in microseconds. -1 (auto):
  // 5000 while this host's ranks (LOCAL_WORLD_SIZE) fit its cores, else 0, since a spinning waiter
  // on an oversubscribed host takes the core a peer it waits for needs (Open MPI's degraded mode).
  int64_t spin_wait_us = -1;
  LinkShape link;                       // emulated link to every peer (default: none)
  std::map<int, LinkShape> peer_links;  // per-peer override of `link`

  // Defaults overridden by DICOMM_TRANSPORT, DICOMM_TIMEOUT_S, DICOMM_CONNECT_TIMEOUT_S, DICOMM_JOB_TOKEN,
  // DICOMM_BIND_ADDR, DICOMM_ADVERTISE_ADDR, DICOMM_TCP_CHUNK_BYTES, DICOMM_TCP_SOCKET_BUFFER_BYTES,
  // DICOMM_TCP_CONGESTION, DICOMM_TCP_NOTSENT_LOWAT_BYTES,
  // DICOMM_SHM_RING_BYTES, DICOMM_SHM_EAGER_BYTES, DICOMM_SHM_SPLIT_BYTES, DICOMM_SHM_CMA (0/1),
  // DICOMM_HELLO_TIMEOUT_S, DICOMM_UNEXPECTED_BYTES (`unexpected_bytes_per_peer`),
  // DICOMM_MAX_MESSAGE_BYTES, DICOMM_DEVICE_DIRECT (0/1), DICOMM_SPIN_US, DICOMM_LINK_GBPS and
  // DICOMM_LINK_LATENCY_US (`link`). A malformed value throws std::invalid_argument naming the variable.
  static Options fromEnvironment();
  // Throws std::invalid_argument naming the first field out of range.
  void validate() const;
  std::string transportFor(int peer) const;
  LinkShape linkFor(int peer) const;
  FrameLimits frameLimits() const;
  // spin_wait_us resolved (auto looks at LOCAL_WORLD_SIZE and this process's CPU affinity).
  std::chrono::microseconds activeWaitWindow() const;
};

}  // namespace dicomm
