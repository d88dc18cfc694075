// What the polled transports (shm, ibverbs) share about one peer. Their connections move data
// only when polled (PollingHub serialises every call with one lock), queue control frames ahead
// of data, announce large sends with ReadyToSend and write them once the receiver's ClearToSend
// names the destination, and keep the setup socket open only to notice the peer's death.
// A transport supplies how frames move (advance) and its transfers in flight.
#pragma once

#include <deque>
#include <map>
#include <optional>
#include <string>

#include "queued_connection.h"

namespace dicomm {

struct PolledOutgoing {
  RequestPtr request;
  uint64_t seq = 0;
  uint64_t offset = 0;   // payload bytes already pushed, for a send streamed in pieces
  bool started = false;  // some of its payload is already pushed
};

class PolledConnection : public QueuedConnection<PolledOutgoing> {
 public:
  // The setup socket, from the end of setup on: its closing means the peer is gone.
  void adoptControlSocket(Socket control);

  void postSend(const RequestPtr& send) override;
  void postRecv(const RequestPtr& recv) override;
  // Moves frames both ways; true when anything moved. A failure closes the connection.
  bool progress();
  // Checks the control socket (and the transport's own liveness duties); false once closed.
  bool checkAlive();
  // Fails or closes on what is past its deadline.
  void expire(Clock::time_point now);
  void closeWithError(const std::string& why);

 protected:
  // `transport` names it in messages ("shm connection to rank 1").
  PolledConnection(const char* transport, int peer, const Options& options);

  // Moves frames both ways; true when anything moved. Throws when the connection cannot go on.
  virtual bool advance() = 0;
  // Moves what a post has just made ready.
  virtual void pushPosted() = 0;
  // Answers a ReadyToSend that met its receive with a ClearToSend (or a refusal).
  virtual void grant(const Inbox::Grant& g) = 0;
  // The receiver granted (or refused) an announced send.
  virtual void onClearToSend(const FrameHeader& cts) = 0;
  // A frame of a kind only this transport sends (its completion signals); throws FrameError for
  // any other.
  virtual void onTransportFrame(const FrameHeader& h) = 0;
  // Expires the inbox, the queued sends and the transport's own transfers in flight, in the
  // transport's order; returns why the connection must close.
  virtual std::optional<std::string> expireTransfers(Clock::time_point now) = 0;
  // Fails the transport's own transfers in flight with `why` and lets go of the peer.
  virtual void closeTransfers(const std::string& why) = 0;
  // Runs while the control socket is open; `bytes_waiting`: the peer wrote to it after setup.
  // False when it closed the connection.
  virtual bool keepAlive(bool bytes_waiting) = 0;

  // Handles a frame from the peer: Data lands in its receive (`copy_payload(destination)` copies
  // the payload from wherever the transport holds it), ReadyToSend meets its receive and is
  // granted, ClearToSend goes to onClearToSend, any other kind to onTransportFrame.
  template <typename CopyPayload>
  void dispatchFrame(const FrameHeader& h, CopyPayload&& copy_payload) {
    switch (h.kind) {
      case FrameKind::Data: {
        uint8_t* destination = inbox_.destination(h);
        if (destination && h.payload_bytes) copy_payload(destination);
        inbox_.landed(h);
        return;
      }
      case FrameKind::ReadyToSend:
        if (auto g = inbox_.announce(h)) grant(*g);
        return;
      case FrameKind::ClearToSend: onClearToSend(h); return;
      default: onTransportFrame(h);
    }
  }
  // The ClearToSend header answering `ready_to_send` (same tag, message and size).
  static FrameHeader clearToSend(const FrameHeader& ready_to_send);
  // The send a rendezvous frame answers, taken from `awaiting`; a frame for a message in no such
  // state is malformed (`state` says which state it should be in).
  static RequestPtr takeAwaiting(std::map<uint64_t, RequestPtr>& awaiting, const FrameHeader& h, const char* state);
  // The waiting send a ClearToSend grants; null when the peer refused it (the send then fails,
  // giving `refusal_reason`). Throws FrameError when the sizes disagree.
  RequestPtr takeClearedSend(const FrameHeader& cts, const char* refusal_reason);
  std::string describe() const;

  Socket control_;
  const FrameLimits limits_;
  std::deque<FrameHeader> control_out_;
  std::map<uint64_t, RequestPtr> awaiting_clear_;  // announced sends waiting for ClearToSend

 private:
  const char* const transport_;
};

}  // namespace dicomm
