// One same-host peer. Small messages travel as Data frames through a shared-memory ring;
// large ones (above shm_eager_bytes) are copied once, directly between the two processes' buffers:
//   sender: ReadyToSend(source address) -> receiver: ClearToSend(destination address, split)
//   sender writes [0, split) with process_vm_writev, then Done;
//   receiver reads [split, total) with process_vm_readv at the same time, then Pulled.
// Below shm_split_bytes (or where the receiver cannot read the sender) split = total and the sender
// copies everything. A send completes on Pulled (its buffer is read until then), a receive on Done
// after its own share landed. The TCP socket from setup stays open only to notice the peer's death.
#pragma once

#include <deque>
#include <map>
#include <string>
#include <vector>

#include "dicomm/inbox.h"
#include "dicomm/transport.h"
#include "shm/bell.h"
#include "shm/ring.h"
#include "shm/segment.h"

namespace dicomm {

struct ShmLink {
  SharedSegment inbound_segment;   // created here; the peer produces into it
  SharedSegment outbound_segment;  // created by the peer; we produce into it
  SharedSegment peer_bell_segment;
  Ring inbound;
  Ring outbound;
  Bell* peer_bell = nullptr;
  int64_t peer_pid = 0;
  bool can_write_peer_memory = false;  // process_vm_writev into the peer works
};

// Not thread-safe by itself: the shm transport serialises all calls with one lock.
class ShmConnection : public Connection {
 public:
  ShmConnection(int peer, Socket control, ShmLink link, const Options& options);

  void postSend(const RequestPtr& send) override;
  void postRecv(const RequestPtr& recv) override;

  // Moves frames both ways; true when anything moved.
  bool progress();
  // Checks the control socket; false once the peer is gone (the connection is then closed).
  bool checkAlive();
  void expire(Clock::time_point now);
  void closeWithError(const std::string& why);
  bool closed() const { return closed_; }

 private:
  struct Outgoing {
    RequestPtr request;
    uint64_t seq = 0;
    uint64_t offset = 0;
    bool started = false;
  };

  // A granted receive whose tail this side reads from the sender itself.
  struct Pull {
    RequestPtr recv;
    FrameHeader announcement;  // the sender's ReadyToSend: seq, tag, size, source address
    uint64_t from = 0;         // the receiver's share starts here
  };

  bool pushOutgoing();
  bool pollIncoming();
  // Reads the shares of granted receives (their ClearToSend went out first) and answers Pulled.
  bool runPulls();
  uint64_t senderShare(const FrameHeader& ready_to_send) const;
  void onFrame(const FrameHeader& h, uint64_t payload_position);
  void grant(const Inbox::Grant& g);
  void onClearToSend(const FrameHeader& h);
  void onPulled(const FrameHeader& h);
  void writeToPeer(const Request& send, const FrameHeader& cts);
  void readFromPeer(const Pull& pull);
  enum class CrossCopy { IntoPeer, FromPeer };
  // `bytes` between this process's `local` and the peer's `remote` address (cross memory attach).
  void copyAcross(CrossCopy direction, uint8_t* local, uint64_t remote, size_t bytes);
  void queueControl(const FrameHeader& h) { control_out_.push_back(h); }
  std::string describe() const { return "shm connection to rank " + std::to_string(peer_); }

  const int peer_;
  Socket control_;
  ShmLink link_;
  const size_t eager_bytes_;
  const size_t split_bytes_;
  const FrameLimits limits_;
  Inbox inbox_;
  std::deque<FrameHeader> control_out_;
  std::deque<Outgoing> outgoing_;
  std::map<uint64_t, RequestPtr> awaiting_clear_;
  std::map<uint64_t, RequestPtr> awaiting_pulled_;  // sends whose tail the receiver is reading
  std::vector<Pull> pulls_;
  uint64_t next_send_seq_ = 0;
  bool pushed_since_bell_ = false;
  bool closed_ = false;
  std::string failure_;
};

}  // namespace dicomm
