// Turns a byte stream (a TCP socket) into Data frames delivered through an Inbox. The caller
// reads bytes straight into target(), so payloads land in the user's buffer without a copy.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

#include "dicomm/frame.h"
#include "dicomm/inbox.h"

namespace dicomm {

class FrameStreamReader {
 public:
  FrameStreamReader(Inbox& inbox, FrameLimits limits);

  // Where the next bytes of the stream go, and at most how many to put there.
  std::pair<uint8_t*, size_t> target();
  // `n` bytes (at most target().second) were written at target(). Throws FrameError when the
  // stream is malformed; the reader is then unusable and the connection must close.
  void advance(size_t n);
  // True between frames: a stream that ends here ended cleanly.
  bool atFrameBoundary() const { return header_filled_ == 0 && !in_payload_; }
  // Payload bytes of the current frame still to come (0 between payloads).
  uint64_t payloadLeft() const { return in_payload_ ? frame_.payload_bytes - payload_received_ : 0; }
  // The size of the message whose payload is streaming in (from its first header until its last
  // payload byte, across its frames: the rest of it is on the way); 0 between messages.
  uint64_t streamingMessageBytes() const { return in_payload_ || message_open_ ? frame_.total_bytes : 0; }

 private:
  void beginFrame();
  void endFrame();

  Inbox& inbox_;
  const FrameLimits limits_;
  uint8_t header_bytes_[kFrameHeaderBytes];
  size_t header_filled_ = 0;
  bool in_payload_ = false;
  FrameHeader frame_;
  uint8_t* payload_destination_ = nullptr;  // nullptr: discard
  uint64_t payload_received_ = 0;
  bool message_open_ = false;  // the last frame ended before the end of its message
  std::vector<uint8_t> discard_;
};

}  // namespace dicomm
