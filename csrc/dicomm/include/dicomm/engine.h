// The transport-neutral engine: one connection per peer, set up through a key-value store,
// carrying tagged asynchronous sends and receives. It knows transports only through transport.h.
#pragma once

#include <atomic>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "dicomm/options.h"
#include "dicomm/request.h"
#include "dicomm/shaping.h"
#include "dicomm/store.h"
#include "dicomm/transport.h"

namespace dicomm {

// How device memory reaches host memory and back. The engine stages a device buffer through a
// host buffer with these before handing it to any transport (the CPU-mediated path).
struct CopyHooks {
  std::function<void(void* host, const void* device, size_t bytes)> to_host;
  std::function<void(void* device, const void* host, size_t bytes)> from_host;
};

enum class Memory : uint8_t { Host, Device };

class Engine {
 public:
  // Publishes this rank in the store, connects to every other rank (checking the job token),
  // and picks a transport per peer. Blocks until all peers are connected or the timeout passes.
  Engine(Store& store, int rank, int world_size, Options options);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  int rank() const { return rank_; }
  int worldSize() const { return world_size_; }
  const Options& options() const { return options_; }

  RequestPtr isend(int peer, uint64_t tag, const void* data, size_t size, Memory memory = Memory::Host);
  RequestPtr irecv(int peer, uint64_t tag, void* data, size_t capacity, Memory memory = Memory::Host);
  // How Memory::Device requests are staged where they cannot move device-direct; without hooks
  // they are staged with the options' device_memory copies. One of the two is required.
  void setCopyHooks(CopyHooks hooks);
  TransportKind transportOf(int peer) const;
  // Whether Memory::Device requests to `peer` move device-direct (no host staging).
  bool deviceDirect(int peer) const;
  // The emulated link to `peer` (Options::link, peer_links); not shaped() when there is none.
  LinkShape linkOf(int peer) const;
  // Notes from setup worth a user's attention (fallbacks, refused connections), one line each.
  const std::vector<std::string>& notes() const { return notes_; }

  // Fails pending requests with "endpoint closed" and releases every resource. Idempotent.
  void close();

 private:
  void rendezvous(Store& store);
  PeerDescriptor lookUpPeer(Store& store, int rank, Clock::time_point deadline);
  void dialLowerRanks(Store& store, const std::string& token, Clock::time_point deadline);
  void acceptHigherRanks(Store& store, const std::string& token, Clock::time_point deadline);
  // Throws, naming the rank, when one of `waiting` published in the store that its setup failed.
  void throwIfAPeerGaveUp(Store& store, const std::set<int>& waiting);
  // Hands a socket whose Hello exchange succeeded to the chosen transport's own setup.
  void connectPeer(const PeerDescriptor& peer, TransportKind kind, bool initiator, Socket socket,
                   Clock::time_point deadline);
  Transport& transport(TransportKind kind);
  void checkPeer(int peer, const char* operation) const;
  void requireOtherRank(int peer) const;
  TransportKind chooseTransport(const PeerDescriptor& peer);
  std::shared_ptr<const CopyHooks> stagingHooks(const char* operation) const;

  const int rank_;
  const int world_size_;
  Options options_;
  PeerDescriptor self_;
  Socket listener_;
  std::map<TransportKind, std::unique_ptr<Transport>> transports_;
  std::vector<std::shared_ptr<Connection>> connections_;
  std::vector<TransportKind> kinds_;
  std::vector<std::shared_ptr<Progress>> progress_;
  std::shared_ptr<Pacer> pacer_;  // created with the first shaped connection
  std::vector<std::string> notes_;
  std::shared_ptr<const CopyHooks> copy_hooks_;
  std::atomic<bool> closed_{false};
};

}  // namespace dicomm
