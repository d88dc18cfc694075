// The contract every transport implements. The engine is written against this header only:
// a new transport is a new folder with a Transport that turns an authenticated socket into a
// Connection and moves the bytes of posted requests.
#pragma once

#include <memory>
#include <string>

#include "dicomm/frame.h"
#include "dicomm/options.h"
#include "dicomm/peer.h"
#include "dicomm/request.h"
#include "dicomm/socket.h"

namespace dicomm {

struct PeerSetup {
  PeerDescriptor self;
  PeerDescriptor peer;
  bool initiator = false;  // this side dialled (the higher rank)
  Socket socket;           // connected, token checked; the connection owns it from here on
  Clock::time_point deadline;
};

// One peer. Sends to it leave in posting order; receives match per tag in posting order.
class Connection {
 public:
  virtual ~Connection() = default;
  virtual void postSend(const RequestPtr& send) = 0;
  virtual void postRecv(const RequestPtr& recv) = 0;
  // Whether requests on device memory (Request::onDevice) may be posted here: both sides agreed
  // at setup to move device memory directly.
  virtual bool deviceDirect() const { return false; }
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual TransportKind kind() const = 0;
  // Runs the transport's own setup over setup.socket (blocking until setup.deadline).
  virtual std::shared_ptr<Connection> connect(PeerSetup setup) = 0;
  // Starts background progress once every connection exists.
  virtual void start() = 0;
  // For transports a waiting thread may drive itself (polling); null when only the
  // transport's own thread makes progress.
  virtual std::shared_ptr<Progress> waiterProgress() { return nullptr; }
  // Fails every pending request with `why`, stops threads, releases resources. Idempotent.
  virtual void shutdown(const std::string& why) = 0;
};

std::unique_ptr<Transport> makeTcpTransport(const Options& options);
std::unique_ptr<Transport> makeShmTransport(const Options& options);
// Throws CommError when ibverbs is not compiled in or no device is usable.
std::unique_ptr<Transport> makeIbverbsTransport(const Options& options);

struct IbverbsProbe {
  bool compiled = false;
  bool available = false;
  std::string device;   // first device with an active port
  std::string message;  // one line saying what was found
};
IbverbsProbe probeIbverbs();

}  // namespace dicomm
