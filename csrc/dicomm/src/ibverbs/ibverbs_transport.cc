// The device-direct transport: per peer, an RDMA reliable connection established with
// librdmacm (the lower rank listens, the higher rank connects), memory registered with the
// device, keys exchanged at connection time. Like shm, a waiting thread polls completion
// queues itself and a background thread takes over when nobody waits.
#include <arpa/inet.h>

#include <cerrno>
#include <cstring>
#include <thread>

#include "ibverbs/ibverbs_connection.h"
#include "polling_hub.h"
#include "text_fields.h"

namespace dicomm {
namespace {

constexpr int kIdleYieldsBeforeSleep = 64;
constexpr auto kIdleSleep = std::chrono::microseconds(50);

struct AddrInfo {
  rdma_addrinfo* info = nullptr;
  ~AddrInfo() {
    if (info) rdma_freeaddrinfo(info);
  }
};

ibv_qp_init_attr queuePairAttributes() {
  ibv_qp_init_attr attr{};
  attr.cap.max_send_wr = 2 * kIbSendSlots + 8;
  attr.cap.max_recv_wr = kIbRecvSlots;
  attr.cap.max_send_sge = 1;
  attr.cap.max_recv_sge = 1;
  attr.cap.max_inline_data = sizeof(uint64_t);
  attr.qp_type = IBV_QPT_RC;
  attr.sq_sig_all = 1;
  return attr;
}

[[noreturn]] void rdmaFailure(const std::string& what) {
  throw CommError("ibverbs setup: " + what + " failed: " + std::strerror(errno));
}

std::string encodeCounter(const IbRemoteCounter& c) {
  return "counter_address=" + std::to_string(c.address) + "\ncounter_rkey=" + std::to_string(c.rkey) + "\n";
}

const char* const kSetupMessage = "ibverbs setup message";

IbRemoteCounter decodeCounter(const std::string& text) {
  const TextFields fields = parseTextFields(text);
  IbRemoteCounter c;
  c.address = uint64_t(requireInteger<CommError>(fields, "counter_address", kSetupMessage));
  c.rkey = uint32_t(requireInteger<CommError>(fields, "counter_rkey", kSetupMessage));
  return c;
}

// Polls the completion queues of every ibverbs connection of an endpoint. Its background thread
// yields, then sleeps briefly, when idle.
class IbverbsHub : public PollingHub {
 public:
  explicit IbverbsHub(const Options& options) : PollingHub(options.activeWaitWindow()), options_(options) {}

 private:
  std::shared_ptr<PolledConnection> setUp(PeerSetup& setup) override {
    const std::string who = "rank " + std::to_string(setup.peer.rank);
    ibv_qp_init_attr attr = queuePairAttributes();
    rdma_addrinfo hints{};
    hints.ai_port_space = RDMA_PS_TCP;
    AddrInfo found;
    rdma_cm_id* id = nullptr;
    std::shared_ptr<IbverbsConnection> connection;
    if (!setup.initiator) {
      hints.ai_flags = RAI_PASSIVE;
      if (rdma_getaddrinfo(setup.self.address.c_str(), "0", &hints, &found.info) != 0) rdmaFailure("rdma_getaddrinfo");
      rdma_cm_id* listen_id = nullptr;
      if (rdma_create_ep(&listen_id, found.info, nullptr, &attr) != 0) rdmaFailure("rdma_create_ep (listen)");
      std::unique_ptr<rdma_cm_id, void (*)(rdma_cm_id*)> listener(listen_id, rdma_destroy_ep);
      if (rdma_listen(listen_id, 1) != 0) rdmaFailure("rdma_listen");
      FrameHeader h;
      h.kind = FrameKind::Hello;
      sendFrame(setup.socket.fd(), h, "rdma_port=" + std::to_string(ntohs(rdma_get_src_port(listen_id))) + "\n",
                setup.deadline, who);
      if (rdma_get_request(listen_id, &id) != 0) rdmaFailure("rdma_get_request");
      connection = std::make_shared<IbverbsConnection>(setup.peer.rank, id, options_);
      connection->prepare();
      if (rdma_accept(id, nullptr) != 0) rdmaFailure("rdma_accept");
    } else {
      std::string text;
      recvFrame(setup.socket.fd(), &text, options_.frameLimits(), setup.deadline, who);
      const std::string port = requireField<CommError>(parseTextFields(text), "rdma_port", kSetupMessage);
      if (rdma_getaddrinfo(setup.peer.address.c_str(), port.c_str(), &hints, &found.info) != 0) {
        rdmaFailure("rdma_getaddrinfo " + setup.peer.address + ":" + port);
      }
      if (rdma_create_ep(&id, found.info, nullptr, &attr) != 0) rdmaFailure("rdma_create_ep");
      connection = std::make_shared<IbverbsConnection>(setup.peer.rank, id, options_);
      connection->prepare();
      if (rdma_connect(id, nullptr) != 0) rdmaFailure("rdma_connect");
    }
    // Registered credit counters travel over the (token-checked) setup socket.
    FrameHeader h;
    h.kind = FrameKind::Hello;
    sendFrame(setup.socket.fd(), h, encodeCounter(connection->localCounter()), setup.deadline, who);
    std::string theirs;
    recvFrame(setup.socket.fd(), &theirs, options_.frameLimits(), setup.deadline, who);
    connection->setRemoteCounter(decodeCounter(theirs));
    connection->adoptControlSocket(std::move(setup.socket));
    return connection;
  }

  void pollOrRest() override {
    if (active_waiters_.load() == 0 && poll()) {
      idle_polls_ = 0;
      return;
    }
    if (++idle_polls_ < idleYieldsBeforeRest(kIdleYieldsBeforeSleep)) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(kIdleSleep);
    }
  }

  const Options options_;
  int idle_polls_ = 0;
};

}  // namespace

std::unique_ptr<Transport> makeIbverbsTransport(const Options& options) {
  const IbverbsProbe probe = probeIbverbs();
  if (!probe.available) throw CommError(probe.message);
  return std::make_unique<PolledTransport>(TransportKind::Ibverbs, std::make_shared<IbverbsHub>(options));
}

}  // namespace dicomm
