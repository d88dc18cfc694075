// The wire header every DiComm frame starts with, and its validating codec.
// Every transport that moves frames (tcp stream, shm ring, ibverbs control messages) decodes
// headers through decodeFrameHeader, so a malformed peer is caught in one place.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>

namespace dicomm {

constexpr uint32_t kFrameMagic = 0x4d434944;  // "DICM" read as little-endian bytes
constexpr uint8_t kFrameVersion = 1;
constexpr size_t kFrameHeaderBytes = 56;
constexpr size_t kMaxHelloPayloadBytes = 4096;

enum class FrameKind : uint8_t {
  Hello = 1,        // connection setup: job token, rank, chosen transport (payload)
  HelloReply = 2,   // setup answer: flags say accepted or refused, payload says why
  Data = 3,         // a slice [offset, offset + payload_bytes) of message `seq`
  ReadyToSend = 4,  // rendezvous: sender announces message `seq` of total_bytes
  ClearToSend = 5,  // rendezvous: receiver grants remote_address/remote_key for `seq`
  Done = 6,         // rendezvous: sender finished writing message `seq`
  Credit = 7,       // ibverbs: receiver returns `offset` receive slots to the sender
  Pulled = 8,       // shm rendezvous: receiver finished reading its share of message `seq`
};
constexpr FrameKind kLastFrameKind = FrameKind::Pulled;

constexpr uint16_t kFlagRefused = 1;       // HelloReply: setup refused; ClearToSend: receive refused;
                                           // Done/Pulled: that side's copy failed
constexpr uint16_t kFlagDeviceRegion = 2;  // ReadyToSend: the payload is the device region handle of
                                           // the message (device-direct); Pulled: answers such a one
constexpr size_t kRegionHandleBytes = 64;

struct FrameHeader {
  FrameKind kind = FrameKind::Data;
  uint16_t flags = 0;
  uint64_t tag = 0;
  uint64_t seq = 0;
  uint64_t total_bytes = 0;
  uint64_t offset = 0;
  uint64_t payload_bytes = 0;
  uint64_t remote_address = 0;
};

struct FrameLimits {
  uint64_t max_message_bytes = uint64_t(1) << 40;
  uint64_t max_payload_bytes = uint64_t(64) << 20;
  // Bytes of messages from one peer that may wait for a receive nobody has posted yet.
  uint64_t max_unexpected_bytes = uint64_t(512) << 20;
};

class FrameError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

std::array<uint8_t, kFrameHeaderBytes> encodeFrameHeader(const FrameHeader& header);

// Throws FrameError naming the first field that is wrong; never reads past `size` bytes.
FrameHeader decodeFrameHeader(const uint8_t* bytes, size_t size, const FrameLimits& limits);

const char* frameKindName(FrameKind kind);

}  // namespace dicomm
