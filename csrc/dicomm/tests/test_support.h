// What the DiComm unit tests share: frame headers and receives built in one line each.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "dicomm/frame.h"
#include "dicomm/request.h"

namespace dicomm::testing {

constexpr int kPeer = 3;

inline FrameHeader dataFrame(uint64_t tag, uint64_t seq, uint64_t total_bytes, uint64_t offset,
                             uint64_t payload_bytes) {
  FrameHeader header;
  header.kind = FrameKind::Data;
  header.tag = tag;
  header.seq = seq;
  header.total_bytes = total_bytes;
  header.offset = offset;
  header.payload_bytes = payload_bytes;
  return header;
}

// A one-frame message carrying all of its bytes.
inline FrameHeader wholeMessage(uint64_t tag, uint64_t seq, uint64_t total_bytes) {
  return dataFrame(tag, seq, total_bytes, 0, total_bytes);
}

// A host receive of `buffer.size()` bytes on `tag` from kPeer, due an hour from now.
inline RequestPtr hostReceive(uint64_t tag, std::vector<uint8_t>& buffer) {
  return std::make_shared<Request>(Direction::Recv, kPeer, tag, buffer.data(), buffer.size(),
                                   Clock::now() + std::chrono::hours(1));
}

inline std::vector<uint8_t> bytesOf(const std::string& text) { return std::vector<uint8_t>(text.begin(), text.end()); }

inline std::string textOf(const std::vector<uint8_t>& bytes, size_t count) {
  return std::string(bytes.begin(), bytes.begin() + long(count));
}

}  // namespace dicomm::testing
