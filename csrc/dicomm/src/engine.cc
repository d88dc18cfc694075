#include "dicomm/engine.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include <cstdio>
#include <fstream>
#include <set>
#include <sstream>

#include "dicomm/device_memory.h"
#include "dicomm/job_secret.h"
#include "dicomm/peer.h"
#include "hello_desk.h"
#include "text_fields.h"

namespace dicomm {
namespace {

std::string peerKey(const Options& options, int rank) { return options.store_prefix + "/peer/" + std::to_string(rank); }

// Where a rank that gave up its setup while dialling says why, so the ranks waiting for it stop
// waiting at once (the store is trusted; a stranger on the network cannot write there).
std::string setupFailedKey(const Options& options, int rank) {
  return options.store_prefix + "/setup-failed/" + std::to_string(rank);
}

constexpr size_t kTokenBytes = 16;

// How often a listener waiting for higher ranks looks in the store for one that gave up.
constexpr auto kGaveUpPollInterval = std::chrono::milliseconds(100);

}  // namespace

Engine::Engine(Store& store, int rank, int world_size, Options options)
    : rank_(rank), world_size_(world_size), options_(std::move(options)) {
  options_.validate();
  if (world_size_ < 1) throw std::invalid_argument("world size must be at least 1, got " + std::to_string(world_size_));
  if (rank_ < 0 || rank_ >= world_size_) {
    throw std::invalid_argument("rank " + std::to_string(rank_) + " is outside [0, " + std::to_string(world_size_) +
                                ")");
  }
  for (const char c : options_.token) {
    if (c == '\n' || c == '\r' || c == '\0') throw std::invalid_argument("job token must not contain line breaks");
  }
  connections_.resize(size_t(world_size_));
  kinds_.resize(size_t(world_size_), TransportKind::Tcp);
  progress_.resize(size_t(world_size_));
  rendezvous(store);
}

Engine::~Engine() { close(); }

Transport& Engine::transport(TransportKind kind) {
  auto found = transports_.find(kind);
  if (found != transports_.end()) return *found->second;
  std::unique_ptr<Transport> created;
  switch (kind) {
    case TransportKind::Tcp: created = makeTcpTransport(options_); break;
    case TransportKind::Shm: created = makeShmTransport(options_); break;
    case TransportKind::Ibverbs: created = makeIbverbsTransport(options_); break;
  }
  return *transports_.emplace(kind, std::move(created)).first->second;
}

TransportKind Engine::chooseTransport(const PeerDescriptor& peer) {
  const std::string preference = options_.transportFor(peer.rank);
  const TransportKind kind = selectTransport(preference, self_, peer);
  if (preference == "auto" && kind == TransportKind::Tcp) {
    notes_.push_back("rank " + std::to_string(rank_) + " -> rank " + std::to_string(peer.rank) +
                     " uses tcp: " + probeIbverbs().message);
  }
  return kind;
}

void Engine::rendezvous(Store& store) {
  const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                           std::chrono::duration<double>(options_.connect_timeout_s));
  self_.rank = rank_;
  self_.address = options_.advertise_address.empty() ? defaultAdvertiseAddress() : options_.advertise_address;
  listener_ = listenTcp(options_.bind_address.empty() ? self_.address : options_.bind_address, &self_.port);
  const char* host_override = std::getenv("DICOMM_HOST_ID");
  self_.host_id = (host_override && *host_override) ? host_override : localHostId();
  self_.pid = int64_t(getpid());
  const IbverbsProbe probe = probeIbverbs();
  self_.ibverbs = probe.available;
  self_.ibverbs_device = probe.device;

  std::string token = options_.token;
  const std::string token_key = options_.store_prefix + "/token";
  if (token.empty()) {
    if (rank_ == 0) {
      token = randomHex(kTokenBytes, "a job token");
      store.set(token_key, token);
    } else {
      token = store.get(token_key, deadline);
    }
  }
  store.set(peerKey(options_, rank_), self_.encode());
  try {
    dialLowerRanks(store, token, deadline);
  } catch (const std::exception& e) {
    try {
      store.set(setupFailedKey(options_, rank_), e.what());
    } catch (const std::exception&) {  // the store is gone too: the waiting ranks time out instead
    }
    throw;
  }
  acceptHigherRanks(store, token, deadline);
  listener_.reset();
  for (auto& [kind, t] : transports_) t->start();
  for (int q = 0; q < world_size_; ++q) {
    if (q != rank_) progress_[size_t(q)] = transport(kinds_[size_t(q)]).waiterProgress();
  }
}

PeerDescriptor Engine::lookUpPeer(Store& store, int q, Clock::time_point deadline) {
  PeerDescriptor peer = PeerDescriptor::decode(store.get(peerKey(options_, q), deadline));
  if (peer.rank != q)
    throw CommError("store key " + peerKey(options_, q) + " describes rank " + std::to_string(peer.rank));
  return peer;
}

void Engine::dialLowerRanks(Store& store, const std::string& token, Clock::time_point deadline) {
  for (int q = 0; q < rank_; ++q) {
    const PeerDescriptor peer = lookUpPeer(store, q, deadline);
    const TransportKind kind = chooseTransport(peer);
    const std::string name = "rank " + std::to_string(q) + " at " + peer.address + ":" + std::to_string(peer.port);
    Socket socket = connectTcp(peer.address, peer.port, deadline);
    std::string asked;
    const FrameHeader challenge_header = recvFrame(socket.fd(), &asked, options_.frameLimits(), deadline, name);
    if (challenge_header.kind != FrameKind::Hello) {
      throw CommError(name + " opened the setup with a " + frameKindName(challenge_header.kind) +
                      " frame, not a challenge");
    }
    const Challenge challenge = Challenge::decode(asked);
    if (challenge.rank != q) throw CommError(name + " answered as rank " + std::to_string(challenge.rank));
    const Hello hello = Hello::answer(challenge, rank_, kind, token);
    FrameHeader header;
    header.kind = FrameKind::Hello;
    sendFrame(socket.fd(), header, hello.encode(), deadline, name);
    std::string answer;
    const FrameHeader reply = recvFrame(socket.fd(), &answer, options_.frameLimits(), deadline, name);
    if (reply.kind != FrameKind::HelloReply) {
      throw CommError(name + " answered the setup with a " + frameKindName(reply.kind) + " frame");
    }
    if (reply.flags & kFlagRefused) throw CommError(name + " refused the connection: " + answer);
    const TextFields accepted = parseTextFields(answer);
    const auto proof = accepted.find("proof");
    if (proof == accepted.end() || !sameProof(hello.listenerProof(token, challenge), proof->second)) {
      throw CommError(name +
                      " did not prove it holds this job's token (job token mismatch: the listener belongs to "
                      "another job)");
    }
    connectPeer(peer, kind, /*initiator=*/true, std::move(socket), deadline);
  }
}

void Engine::connectPeer(const PeerDescriptor& peer, TransportKind kind, bool initiator, Socket socket,
                         Clock::time_point deadline) {
  PeerSetup setup;
  setup.self = self_;
  setup.peer = peer;
  setup.initiator = initiator;
  setup.socket = std::move(socket);
  setup.deadline = deadline;
  std::shared_ptr<Connection> connection = transport(kind).connect(std::move(setup));
  const LinkShape link = options_.linkFor(peer.rank);
  if (link.shaped()) {
    if (!pacer_) pacer_ = std::make_shared<Pacer>();
    connection = std::make_shared<ShapedConnection>(std::move(connection), link, pacer_);
  }
  connections_[size_t(peer.rank)] = std::move(connection);
  kinds_[size_t(peer.rank)] = kind;
}

void Engine::acceptHigherRanks(Store& store, const std::string& token, Clock::time_point deadline) {
  std::set<int> waiting;
  for (int q = rank_ + 1; q < world_size_; ++q) waiting.insert(q);
  std::string last_refusal;
  const auto hello_timeout =
      std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.hello_timeout_s));
  HelloDesk desk(listener_, rank_, options_.frameLimits(), hello_timeout);
  while (!waiting.empty()) {
    std::optional<HelloDesk::Arrival> arrival = desk.next(std::min(deadline, Clock::now() + kGaveUpPollInterval));
    if (!arrival && Clock::now() < deadline) {
      throwIfAPeerGaveUp(store, waiting);
      continue;
    }
    if (!arrival) {
      std::ostringstream what;
      what << "timed out waiting for rank(s)";
      for (int q : waiting) what << " " << q;
      what << " to connect to rank " << rank_;
      if (!last_refusal.empty()) what << " (refused meanwhile: " << last_refusal << ")";
      throw CommError(what.str());
    }
    Socket& socket = arrival->socket;
    const std::string anonymous = "a connecting peer";
    const auto hello_deadline = std::min(deadline, Clock::now() + hello_timeout);
    auto refuse = [&](const std::string& why) {
      last_refusal = why;
      notes_.push_back("rank " + std::to_string(rank_) + " refused a connection: " + why);
      FrameHeader reply;
      reply.kind = FrameKind::HelloReply;
      reply.flags = kFlagRefused;
      try {
        sendFrame(socket.fd(), reply, why, hello_deadline, anonymous);
      } catch (const std::exception&) {
      }
    };
    if (!arrival->error.empty()) {
      last_refusal = arrival->error;
      notes_.push_back("rank " + std::to_string(rank_) + " dropped a connection: " + arrival->error);
      continue;
    }
    const Hello& hello = arrival->hello;
    if (!hello.proves(token, arrival->challenge)) {
      refuse("job token mismatch (the peer belongs to another job)");
      continue;
    }
    if (!waiting.count(hello.rank)) {
      refuse("rank " + std::to_string(hello.rank) + " is not expected here (out of range or already connected)");
      continue;
    }
    // The peer published its descriptor before dialling, so this look-up does not wait.
    PeerDescriptor peer;
    try {
      peer = lookUpPeer(store, hello.rank, deadline);
    } catch (const std::exception& e) {
      refuse(e.what());
      continue;
    }
    const std::string preference = options_.transportFor(hello.rank);
    if (preference != "auto" && parseTransportName(preference, "transport") != hello.transport) {
      refuse(std::string("transport mismatch: rank ") + std::to_string(hello.rank) + " chose " +
             transportName(hello.transport) + ", rank " + std::to_string(rank_) + " requires " + preference);
      continue;
    }
    try {
      selectTransport(transportName(hello.transport), self_, peer);
    } catch (const std::exception& e) {
      refuse(e.what());
      continue;
    }
    FrameHeader reply;
    reply.kind = FrameKind::HelloReply;
    sendFrame(socket.fd(), reply, "proof=" + hello.listenerProof(token, arrival->challenge) + "\n", hello_deadline,
              "rank " + std::to_string(hello.rank));
    connectPeer(peer, hello.transport, /*initiator=*/false, std::move(socket), deadline);
    waiting.erase(hello.rank);
  }
}

void Engine::throwIfAPeerGaveUp(Store& store, const std::set<int>& waiting) {
  for (int q : waiting) {
    const std::string key = setupFailedKey(options_, q);
    const std::optional<bool> gave_up = store.has(key);
    if (!gave_up) return;  // the store cannot tell without waiting: the connect timeout decides
    if (*gave_up) {
      throw CommError("rank " + std::to_string(q) + " gave up connecting to rank " + std::to_string(rank_) + ": " +
                      store.get(key));
    }
  }
}

void Engine::checkPeer(int peer, const char* operation) const {
  if (closed_.load()) throw CommError(std::string(operation) + " on a closed endpoint");
  if (peer < 0 || peer >= world_size_ || peer == rank_) {
    throw std::invalid_argument(std::string(operation) + ": peer " + std::to_string(peer) +
                                " is not another rank in [0, " + std::to_string(world_size_) + ")");
  }
}

void Engine::setCopyHooks(CopyHooks hooks) {
  if (!hooks.to_host || !hooks.from_host) throw std::invalid_argument("copy hooks need both to_host and from_host");
  std::atomic_store(&copy_hooks_, std::shared_ptr<const CopyHooks>(std::make_shared<CopyHooks>(std::move(hooks))));
}

namespace {

// A host buffer for one staged message; left uninitialised, since a copy fills it.
std::shared_ptr<uint8_t[]> hostStaging(size_t bytes) {
  return std::shared_ptr<uint8_t[]>(new uint8_t[bytes ? bytes : 1]);
}

}  // namespace

std::shared_ptr<const CopyHooks> Engine::stagingHooks(const char* operation) const {
  if (auto hooks = std::atomic_load(&copy_hooks_)) return hooks;
  if (auto device = options_.device_memory) {
    auto hooks = std::make_shared<CopyHooks>();
    hooks->to_host = [device](void* host, const void* from, size_t n) {
      device->copy(host, from, n, CopyKind::DeviceToHost);
    };
    hooks->from_host = [device](void* to, const void* host, size_t n) {
      device->copy(to, host, n, CopyKind::HostToDevice);
    };
    return hooks;
  }
  throw std::invalid_argument(std::string(operation) +
                              " of device memory needs copy hooks (setCopyHooks) or device memory functions");
}

bool Engine::deviceDirect(int peer) const {
  return peer >= 0 && peer < world_size_ && peer != rank_ && connections_[size_t(peer)]->deviceDirect();
}

RequestPtr Engine::isend(int peer, uint64_t tag, const void* data, size_t size, Memory memory) {
  checkPeer(peer, "isend");
  std::shared_ptr<uint8_t[]> staging;
  const bool direct = memory == Memory::Device && size > 0 && deviceDirect(peer);
  if (memory == Memory::Device && !direct) {
    const auto hooks = stagingHooks("isend");
    staging = hostStaging(size);
    if (size) hooks->to_host(staging.get(), data, size);
    data = staging.get();
  }
  auto request = std::make_shared<Request>(
      Direction::Send, peer, tag, static_cast<uint8_t*>(const_cast<void*>(data)), size,
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_s)));
  if (staging) request->keepAlive(staging);
  if (direct) request->setOnDevice();
  request->setProgress(progress_[size_t(peer)]);
  connections_[size_t(peer)]->postSend(request);
  return request;
}

RequestPtr Engine::irecv(int peer, uint64_t tag, void* data, size_t capacity, Memory memory) {
  checkPeer(peer, "irecv");
  void* target = data;
  std::shared_ptr<uint8_t[]> staging;
  std::shared_ptr<const CopyHooks> hooks;
  const bool direct = memory == Memory::Device && capacity > 0 && deviceDirect(peer);
  if (memory == Memory::Device && !direct) {
    hooks = stagingHooks("irecv");
    staging = hostStaging(capacity);
    target = staging.get();
  }
  auto request = std::make_shared<Request>(
      Direction::Recv, peer, tag, static_cast<uint8_t*>(target), capacity,
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.timeout_s)));
  if (staging) {
    request->keepAlive(staging);
    request->setBeforeComplete([hooks, data](Request& r, size_t bytes) {
      if (bytes) hooks->from_host(data, r.data(), bytes);
    });
  }
  if (direct) request->setOnDevice();
  request->setProgress(progress_[size_t(peer)]);
  connections_[size_t(peer)]->postRecv(request);
  return request;
}

void Engine::requireOtherRank(int peer) const {
  if (peer < 0 || peer >= world_size_ || peer == rank_) {
    throw std::invalid_argument("peer " + std::to_string(peer) + " is not another rank in [0, " +
                                std::to_string(world_size_) + ")");
  }
}

TransportKind Engine::transportOf(int peer) const {
  requireOtherRank(peer);
  return kinds_[size_t(peer)];
}

LinkShape Engine::linkOf(int peer) const {
  requireOtherRank(peer);
  return options_.linkFor(peer);
}

void Engine::close() {
  if (closed_.exchange(true)) return;
  if (pacer_) pacer_->shutdown("endpoint closed");
  for (auto& [kind, t] : transports_) t->shutdown("endpoint closed");
}

}  // namespace dicomm
