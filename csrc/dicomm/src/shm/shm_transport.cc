// The same-host transport: per peer, two shared-memory rings (one per direction) plus
// cross-memory-attach writes for large messages. One lock serialises all shm connections of
// an endpoint; a waiting thread polls them itself, and a background thread takes over (parked
// on this process's doorbell, a memfd peers take from us by pid and descriptor) when nobody waits.
#include <linux/futex.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <unistd.h>

#include <climits>
#include <fstream>
#include <mutex>
#include <sstream>

#include "dicomm/job_secret.h"
#include "polling_hub.h"
#include "shm/segment.h"
#include "shm/shm_connection.h"
#include "text_fields.h"

namespace dicomm {
namespace {

constexpr long kParkedSleepNs = 10'000'000;
constexpr long kWaiterActiveSleepNs = 1'000'000;
constexpr int kIdleSpinsBeforePark = 64;
constexpr uint64_t kCmaProbeValue = 0x44434d4150524f42ull;

// Where Yama restricts ptrace to descendants, allow peers (same user) to write into us.
void allowPeerMemoryWrites() {
  std::ifstream scope("/proc/sys/kernel/yama/ptrace_scope");
  int value = 0;
  if (scope >> value && value == 1) prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0);
}

const char* const kSetupMessage = "shm setup message";

uint64_t requireNumber(const TextFields& fields, const std::string& name) {
  return uint64_t(requireInteger<CommError>(fields, name, kSetupMessage));
}

// The peer's `what` ("ring" or "bell"), announced as what_fd and what_nonce in its setup message.
AnonymousSegment takeFromPeer(int64_t pid, const TextFields& theirs, const std::string& what, size_t bytes,
                              const std::string& who) {
  const uint64_t fd = requireNumber(theirs, what + "_fd");
  if (fd > uint64_t(INT_MAX))
    throw CommError(who + " announced an invalid shm " + what + " descriptor " + std::to_string(fd));
  return AnonymousSegment::takeFromPeer(pid, int(fd), requireNumber(theirs, what + "_nonce"), bytes,
                                        who + "'s shm " + what);
}

// Polls every shm connection of an endpoint. Its background thread parks on this process's
// doorbell when idle; peers ring it after writing a frame.
class ShmHub : public PollingHub {
 public:
  explicit ShmHub(const Options& options) : PollingHub(options.activeWaitWindow()), options_(options) {
    bell_segment_ = AnonymousSegment::create("dicomm-bell", kBellSegmentBytes);
    bell_ = new (bell_segment_.data()) Bell();
  }

  void enterActiveWait() override {
    PollingHub::enterActiveWait();
    bell_->parked.store(0, std::memory_order_relaxed);
  }

  void start() override {
    // Every peer has taken our doorbell by now (each connect waited for its peer's mapping).
    bell_segment_.stopSharing();
    PollingHub::start();
  }

 private:
  std::shared_ptr<PolledConnection> setUp(PeerSetup& setup) override {
    const std::string who = "rank " + std::to_string(setup.peer.rank);
    ShmLink link;
    const size_t capacity = options_.shm_ring_bytes;
    link.inbound_segment = AnonymousSegment::create("dicomm-ring", ringSegmentBytes(capacity));
    auto* inbound_control = new (link.inbound_segment.data()) RingControl();
    inbound_control->head.store(0);
    inbound_control->tail.store(0);
    inbound_control->cma_probe.store(0);
    link.inbound = Ring(link.inbound_segment.data(), capacity);

    std::ostringstream mine;
    mine << "ring_fd=" << link.inbound_segment.fd() << "\nring_nonce=" << link.inbound_segment.nonce()
         << "\nring_bytes=" << capacity << "\nbell_fd=" << bell_segment_.fd()
         << "\nbell_nonce=" << bell_segment_.nonce()
         << "\nprobe_address=" << reinterpret_cast<uint64_t>(&inbound_control->cma_probe)
         << "\ndevice_direct=" << (options_.device_memory && options_.device_direct ? 1 : 0) << "\n";
    FrameHeader hello;
    hello.kind = FrameKind::Hello;
    sendFrame(setup.socket.fd(), hello, mine.str(), setup.deadline, who);
    std::string theirs_text;
    recvFrame(setup.socket.fd(), &theirs_text, options_.frameLimits(), setup.deadline, who);
    const auto theirs = parseTextFields(theirs_text);
    const uint64_t peer_capacity = requireNumber(theirs, "ring_bytes");
    if (peer_capacity < 4096 || (peer_capacity & (peer_capacity - 1)) != 0 || peer_capacity > (uint64_t(1) << 30)) {
      throw CommError(who + " announced an invalid shm ring size " + std::to_string(peer_capacity));
    }
    link.outbound_segment = takeFromPeer(setup.peer.pid, theirs, "ring", ringSegmentBytes(peer_capacity), who);
    link.outbound = Ring(link.outbound_segment.data(), peer_capacity);
    link.peer_bell_segment = takeFromPeer(setup.peer.pid, theirs, "bell", kBellSegmentBytes, who);
    link.peer_bell = static_cast<Bell*>(link.peer_bell_segment.data());
    link.peer_pid = setup.peer.pid;
    const uint64_t peer_probe_address = requireNumber(theirs, "probe_address");
    link.can_write_peer_memory = options_.shm_cross_memory_attach && probeCrossMemoryWrite(link, peer_probe_address);
    const auto peer_device_direct = theirs.find("device_direct");
    link.device_direct = options_.device_memory && options_.device_direct && peer_device_direct != theirs.end() &&
                         peer_device_direct->second == "1";

    // Both sides have mapped everything: nobody needs to take our ring any more.
    FrameHeader mapped;
    mapped.kind = FrameKind::HelloReply;
    sendFrame(setup.socket.fd(), mapped, "", setup.deadline, who);
    std::string ignored;
    recvFrame(setup.socket.fd(), &ignored, options_.frameLimits(), setup.deadline, who);
    link.inbound_segment.stopSharing();

    auto connection = std::make_shared<ShmConnection>(setup.peer.rank, std::move(link), options_);
    connection->adoptControlSocket(std::move(setup.socket));
    return connection;
  }

  // Cross-memory writes go only to the process that maps the peer's ring: the announced pid and
  // address must show, read without writing, a fresh random word placed in that ring first.
  static bool probeCrossMemoryWrite(const ShmLink& link, uint64_t peer_probe_address) {
    auto* ring_control = static_cast<RingControl*>(link.outbound_segment.data());
    const uint64_t nonce = randomWord("a cross-memory probe word") | 1;
    ring_control->cma_probe.store(nonce);
    uint64_t seen = 0;
    iovec into{&seen, sizeof(seen)};
    iovec from{reinterpret_cast<void*>(peer_probe_address), sizeof(seen)};
    if (process_vm_readv(pid_t(link.peer_pid), &into, 1, &from, 1, 0) != ssize_t(sizeof(seen)) || seen != nonce) {
      return false;  // not the ring's process, or not allowed: messages stream through the ring
    }
    uint64_t value = kCmaProbeValue;
    iovec local{&value, sizeof(value)};
    iovec remote{reinterpret_cast<void*>(peer_probe_address), sizeof(value)};
    if (process_vm_writev(pid_t(link.peer_pid), &local, 1, &remote, 1, 0) != ssize_t(sizeof(value))) return false;
    // The peer's probe word lives in the ring we produce into: our own mapping shows the write.
    auto* control = static_cast<RingControl*>(link.outbound_segment.data());
    return control->cma_probe.load() == kCmaProbeValue;
  }

  void pollOrRest() override {
    if (active_waiters_.load() > 0) {
      // Waiting threads poll; stay out of their way but keep housekeeping going.
      const uint32_t waiters = active_waiters_.load();
      timespec ts{0, kWaiterActiveSleepNs};
      syscall(SYS_futex, reinterpret_cast<uint32_t*>(&active_waiters_), FUTEX_WAIT_PRIVATE, waiters, &ts, nullptr, 0);
      return;
    }
    if (poll()) {
      idle_polls_ = 0;
      return;
    }
    if (++idle_polls_ < idleYieldsBeforeRest(kIdleSpinsBeforePark)) {
      sched_yield();
      return;
    }
    idle_polls_ = 0;
    bell_->parked.store(1, std::memory_order_seq_cst);
    const uint32_t rings = bell_->rings.load(std::memory_order_seq_cst);
    bool moved;
    {
      std::lock_guard<std::mutex> lock(mutex());
      moved = progressLocked();
    }
    if (!moved && !stopping() && active_waiters_.load() == 0) sleepOnBell(bell_, rings, kParkedSleepNs);
    bell_->parked.store(0, std::memory_order_seq_cst);
  }

  void wakeBackground() override {
    bell_->rings.fetch_add(1);
    syscall(SYS_futex, reinterpret_cast<uint32_t*>(&bell_->rings), FUTEX_WAKE, 1, nullptr, nullptr, 0);
  }

  const Options options_;
  AnonymousSegment bell_segment_;
  Bell* bell_ = nullptr;
  int idle_polls_ = 0;
};

}  // namespace

std::unique_ptr<Transport> makeShmTransport(const Options& options) {
  static std::once_flag swept;
  std::call_once(swept, removeSegmentsOfDeadProcesses);
  auto hub = std::make_shared<ShmHub>(options);
  allowPeerMemoryWrites();
  return std::make_unique<PolledTransport>(TransportKind::Shm, std::move(hub));
}

}  // namespace dicomm
