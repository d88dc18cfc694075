// One same-host peer. Small messages travel as Data frames through a shared-memory ring;
// large ones (above shm_eager_bytes) are copied once, directly between the two processes' buffers:
//   sender: ReadyToSend(source address) -> receiver: ClearToSend(destination address, split)
//   sender writes [0, split) with process_vm_writev, then Done;
//   receiver reads [split, total) with process_vm_readv at the same time, then Pulled.
// Below shm_split_bytes (or where the receiver cannot read the sender) split = total and the sender
// copies everything. A send completes on Pulled (its buffer is read until then), a receive on Done
// after its own share landed. The TCP socket from setup stays open only to notice the peer's death.
// Device-direct (both sides have device memory functions): a send in device memory announces its
// registered region (ReadyToSend carrying the region handle); the receiver opens the region, checks
// it belongs to the sender and holds the message, copies it with the vendor's copy straight into its
// receive buffer and answers Pulled. No host staging, one copy.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "dicomm/device_memory.h"
#include "polled_connection.h"
#include "shm/anonymous_segment.h"
#include "shm/bell.h"
#include "shm/ring.h"

namespace dicomm {

struct ShmLink {
  AnonymousSegment inbound_segment;   // created here; the peer produces into it
  AnonymousSegment outbound_segment;  // taken from the peer; we produce into it
  AnonymousSegment peer_bell_segment;
  Ring inbound;
  Ring outbound;
  Bell* peer_bell = nullptr;
  int64_t peer_pid = 0;
  bool can_write_peer_memory = false;  // process_vm_writev into the peer works
  bool device_direct = false;          // both sides move device memory through registered regions
};

class ShmConnection : public PolledConnection {
 public:
  ShmConnection(int peer, ShmLink link, const Options& options);
  bool deviceDirect() const override { return link_.device_direct; }

 private:
  // A granted receive whose tail this side reads from the sender itself.
  struct Pull {
    RequestPtr recv;
    FrameHeader announcement;                    // the sender's ReadyToSend: seq, tag, size, source address
    uint64_t from = 0;                           // the receiver's share starts here
    std::optional<dicomm_region_handle> region;  // device-direct: the sender's registered region
  };

  bool advance() override;
  void pushPosted() override;
  void grant(const Inbox::Grant& g) override;
  void onClearToSend(const FrameHeader& h) override;
  void onTransportFrame(const FrameHeader& h) override;
  std::optional<std::string> expireTransfers(Clock::time_point now) override;
  void closeTransfers(const std::string& why) override;
  bool keepAlive(bool bytes_waiting) override;

  bool pushOutgoing();
  bool pollIncoming();
  // Reads the shares of granted receives (their ClearToSend went out first) and answers Pulled.
  bool runPulls();
  uint64_t senderShare(const FrameHeader& ready_to_send) const;
  void onPulled(const FrameHeader& h);
  void writeToPeer(const Request& send, const FrameHeader& cts);
  void readFromPeer(const Pull& pull);
  void readRegion(const Pull& pull);
  bool pushRegionAnnouncement(Ring& ring, FrameHeader h, const Request& send);
  enum class CrossCopy { IntoPeer, FromPeer };
  // `bytes` between this process's `local` and the peer's `remote` address (cross memory attach).
  void copyAcross(CrossCopy direction, uint8_t* local, uint64_t remote, size_t bytes);

  ShmLink link_;
  const size_t eager_bytes_;
  const size_t split_bytes_;
  std::map<uint64_t, RequestPtr> awaiting_pulled_;  // sends whose tail the receiver is reading
  std::vector<Pull> pulls_;
  std::shared_ptr<const DeviceMemory> device_memory_;
  std::map<uint64_t, dicomm_region_handle> announced_regions_;  // by seq, until granted
};

}  // namespace dicomm
