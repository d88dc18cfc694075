#include "dicomm/frame.h"

#include <cstring>
#include <sstream>

namespace dicomm {
namespace {

template <typename T>
void putLittleEndian(uint8_t* out, T value) {
  for (size_t i = 0; i < sizeof(T); ++i) out[i] = uint8_t(uint64_t(value) >> (8 * i));
}

template <typename T>
T getLittleEndian(const uint8_t* in) {
  uint64_t value = 0;
  for (size_t i = 0; i < sizeof(T); ++i) value |= uint64_t(in[i]) << (8 * i);
  return T(value);
}

bool isKnownKind(uint8_t kind) { return kind >= uint8_t(FrameKind::Hello) && kind <= uint8_t(kLastFrameKind); }

bool kindCarriesPayload(FrameKind kind) {
  return kind == FrameKind::Hello || kind == FrameKind::HelloReply || kind == FrameKind::Data;
}

[[noreturn]] void reject(const std::string& what) { throw FrameError("malformed frame: " + what); }

}  // namespace

const char* frameKindName(FrameKind kind) {
  switch (kind) {
    case FrameKind::Hello: return "Hello";
    case FrameKind::HelloReply: return "HelloReply";
    case FrameKind::Data: return "Data";
    case FrameKind::ReadyToSend: return "ReadyToSend";
    case FrameKind::ClearToSend: return "ClearToSend";
    case FrameKind::Done: return "Done";
    case FrameKind::Credit: return "Credit";
    case FrameKind::Pulled: return "Pulled";
  }
  return "unknown";
}

std::array<uint8_t, kFrameHeaderBytes> encodeFrameHeader(const FrameHeader& h) {
  std::array<uint8_t, kFrameHeaderBytes> out{};
  uint8_t* p = out.data();
  putLittleEndian<uint32_t>(p + 0, kFrameMagic);
  p[4] = kFrameVersion;
  p[5] = uint8_t(h.kind);
  putLittleEndian<uint16_t>(p + 6, h.flags);
  putLittleEndian<uint64_t>(p + 8, h.tag);
  putLittleEndian<uint64_t>(p + 16, h.seq);
  putLittleEndian<uint64_t>(p + 24, h.total_bytes);
  putLittleEndian<uint64_t>(p + 32, h.offset);
  putLittleEndian<uint64_t>(p + 40, h.payload_bytes);
  putLittleEndian<uint64_t>(p + 48, h.remote_address);
  return out;
}

FrameHeader decodeFrameHeader(const uint8_t* p, size_t size, const FrameLimits& limits) {
  if (size < kFrameHeaderBytes) {
    std::ostringstream what;
    what << "header truncated to " << size << " of " << kFrameHeaderBytes << " bytes";
    reject(what.str());
  }
  const uint32_t magic = getLittleEndian<uint32_t>(p);
  if (magic != kFrameMagic) {
    std::ostringstream what;
    what << "bad magic 0x" << std::hex << magic << " (the peer is not speaking DiComm)";
    reject(what.str());
  }
  if (p[4] != kFrameVersion) {
    reject("protocol version " + std::to_string(p[4]) + ", this build speaks " + std::to_string(kFrameVersion));
  }
  if (!isKnownKind(p[5])) reject("unknown kind " + std::to_string(p[5]));

  FrameHeader h;
  h.kind = FrameKind(p[5]);
  h.flags = getLittleEndian<uint16_t>(p + 6);
  h.tag = getLittleEndian<uint64_t>(p + 8);
  h.seq = getLittleEndian<uint64_t>(p + 16);
  h.total_bytes = getLittleEndian<uint64_t>(p + 24);
  h.offset = getLittleEndian<uint64_t>(p + 32);
  h.payload_bytes = getLittleEndian<uint64_t>(p + 40);
  h.remote_address = getLittleEndian<uint64_t>(p + 48);

  const std::string kind = frameKindName(h.kind);
  const bool region_announcement = h.kind == FrameKind::ReadyToSend && (h.flags & kFlagDeviceRegion);
  if (region_announcement && h.payload_bytes != kRegionHandleBytes) {
    reject("device ReadyToSend carries " + std::to_string(h.payload_bytes) + " payload bytes, expected " +
           std::to_string(kRegionHandleBytes));
  }
  if (!kindCarriesPayload(h.kind) && !region_announcement && h.payload_bytes != 0) {
    reject(kind + " frame carries " + std::to_string(h.payload_bytes) + " payload bytes, expected 0");
  }
  if ((h.kind == FrameKind::Hello || h.kind == FrameKind::HelloReply) && h.payload_bytes > kMaxHelloPayloadBytes) {
    reject(kind + " payload of " + std::to_string(h.payload_bytes) + " bytes exceeds " +
           std::to_string(kMaxHelloPayloadBytes));
  }
  if (h.total_bytes > limits.max_message_bytes) {
    reject("message of " + std::to_string(h.total_bytes) + " bytes exceeds the limit of " +
           std::to_string(limits.max_message_bytes) + " (DICOMM_MAX_MESSAGE_BYTES)");
  }
  if (h.kind == FrameKind::Data) {
    if (h.payload_bytes > limits.max_payload_bytes) {
      reject("Data payload of " + std::to_string(h.payload_bytes) + " bytes exceeds the chunk limit of " +
             std::to_string(limits.max_payload_bytes));
    }
    if (h.offset > h.total_bytes || h.payload_bytes > h.total_bytes - h.offset) {
      reject("Data slice [" + std::to_string(h.offset) + ", +" + std::to_string(h.payload_bytes) +
             ") lies outside the " + std::to_string(h.total_bytes) + "-byte message");
    }
  }
  return h;
}

}  // namespace dicomm
