#include "dicomm/frame_stream.h"

#include <algorithm>

namespace dicomm {
namespace {
constexpr size_t kDiscardBytes = size_t(64) << 10;
}

FrameStreamReader::FrameStreamReader(Inbox& inbox, FrameLimits limits) : inbox_(inbox), limits_(limits) {}

std::pair<uint8_t*, size_t> FrameStreamReader::target() {
  if (!in_payload_) return {header_bytes_ + header_filled_, kFrameHeaderBytes - header_filled_};
  const uint64_t left = frame_.payload_bytes - payload_received_;
  if (payload_destination_) return {payload_destination_ + payload_received_, size_t(left)};
  if (discard_.empty()) discard_.resize(kDiscardBytes);
  return {discard_.data(), size_t(std::min<uint64_t>(left, kDiscardBytes))};
}

void FrameStreamReader::advance(size_t n) {
  if (!in_payload_) {
    header_filled_ += n;
    if (header_filled_ == kFrameHeaderBytes) beginFrame();
    return;
  }
  payload_received_ += n;
  if (payload_received_ == frame_.payload_bytes) endFrame();
}

void FrameStreamReader::beginFrame() {
  header_filled_ = 0;
  frame_ = decodeFrameHeader(header_bytes_, kFrameHeaderBytes, limits_);
  if (frame_.kind != FrameKind::Data) {
    throw FrameError(std::string("malformed frame: unexpected ") + frameKindName(frame_.kind) +
                     " frame on an established stream");
  }
  payload_destination_ = inbox_.destination(frame_);
  payload_received_ = 0;
  in_payload_ = true;
  if (frame_.payload_bytes == 0) endFrame();
}

void FrameStreamReader::endFrame() {
  in_payload_ = false;
  message_open_ = frame_.offset + frame_.payload_bytes < frame_.total_bytes;
  inbox_.landed(frame_);
}

}  // namespace dicomm
