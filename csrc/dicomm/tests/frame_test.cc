// decodeFrameHeader: a good header decodes to the fields it was encoded from; a malformed one is refused
// with a FrameError naming the first wrong field, before anything trusts its lengths.
#include <gtest/gtest.h>

#include <array>
#include <cstring>
#include <memory>
#include <string>

#include "dicomm/frame.h"
#include "test_support.h"

namespace dicomm::testing {
namespace {

using HeaderBytes = std::array<uint8_t, kFrameHeaderBytes>;

// The FrameError decodeFrameHeader throws for `bytes` ("" when it accepts them).
std::string refusal(const uint8_t* bytes, size_t size, const FrameLimits& limits = FrameLimits()) {
  try {
    decodeFrameHeader(bytes, size, limits);
  } catch (const FrameError& error) {
    return error.what();
  }
  return "";
}

std::string refusal(const FrameHeader& header, const FrameLimits& limits = FrameLimits()) {
  const HeaderBytes bytes = encodeFrameHeader(header);
  return refusal(bytes.data(), bytes.size(), limits);
}

bool mentions(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

TEST(FrameHeader, AGoodDataFrameDecodesToTheFieldsItWasEncodedFrom) {
  FrameHeader sent = dataFrame(/*tag=*/0x0102030405060708, /*seq=*/41, /*total_bytes=*/1000, /*offset=*/200,
                               /*payload_bytes=*/300);
  sent.flags = 0x8001;
  sent.remote_address = 0xfedcba9876543210;
  const HeaderBytes bytes = encodeFrameHeader(sent);

  const FrameHeader got = decodeFrameHeader(bytes.data(), bytes.size(), FrameLimits());

  EXPECT_EQ(got.kind, FrameKind::Data);
  EXPECT_EQ(got.flags, sent.flags);
  EXPECT_EQ(got.tag, sent.tag);
  EXPECT_EQ(got.seq, sent.seq);
  EXPECT_EQ(got.total_bytes, sent.total_bytes);
  EXPECT_EQ(got.offset, sent.offset);
  EXPECT_EQ(got.payload_bytes, sent.payload_bytes);
  EXPECT_EQ(got.remote_address, sent.remote_address);
}

TEST(FrameHeader, IsLittleEndianAfterTheMagicAndVersion) {
  const HeaderBytes bytes = encodeFrameHeader(wholeMessage(/*tag=*/0x0a0b, /*seq=*/0, /*total_bytes=*/0));
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 4), "DICM");
  EXPECT_EQ(bytes[4], kFrameVersion);
  EXPECT_EQ(bytes[5], uint8_t(FrameKind::Data));
  EXPECT_EQ(bytes[8], 0x0b);
  EXPECT_EQ(bytes[9], 0x0a);
}

TEST(FrameHeader, AForgedMessageLengthOverTheLimitIsRefused) {
  FrameLimits limits;
  limits.max_message_bytes = 1 << 20;
  EXPECT_EQ(refusal(wholeMessage(1, 0, limits.max_message_bytes), limits), "");

  const std::string why = refusal(dataFrame(1, 0, limits.max_message_bytes + 1, 0, 0), limits);

  EXPECT_TRUE(mentions(why, "message of 1048577 bytes exceeds the limit of 1048576")) << why;
}

TEST(FrameHeader, ADataPayloadOverTheChunkLimitIsRefused) {
  FrameLimits limits;
  limits.max_payload_bytes = 4096;
  EXPECT_EQ(refusal(wholeMessage(1, 0, 4096), limits), "");

  const std::string why = refusal(wholeMessage(1, 0, 4097), limits);

  EXPECT_TRUE(mentions(why, "Data payload of 4097 bytes exceeds the chunk limit of 4096")) << why;
}

TEST(FrameHeader, ADataSliceReachingPastItsMessageIsRefused) {
  EXPECT_EQ(refusal(dataFrame(1, 0, 100, 60, 40)), "");

  EXPECT_TRUE(mentions(refusal(dataFrame(1, 0, 100, 60, 41)), "lies outside the 100-byte message"));
  EXPECT_TRUE(mentions(refusal(dataFrame(1, 0, 100, 101, 0)), "lies outside the 100-byte message"));
  // An offset + length that wraps around 2^64 must not pass for a slice inside the message.
  FrameLimits no_chunk_limit;
  no_chunk_limit.max_payload_bytes = ~uint64_t(0);
  EXPECT_TRUE(mentions(refusal(dataFrame(1, 0, 100, 60, ~uint64_t(0) - 10), no_chunk_limit), "lies outside"));
}

TEST(FrameHeader, ATruncatedHeaderIsRefusedWithoutReadingPastIt) {
  const HeaderBytes whole = encodeFrameHeader(wholeMessage(1, 0, 8));
  // Exactly kFrameHeaderBytes - 1 bytes on the heap, so a sanitizer would see a read past the end.
  auto truncated = std::make_unique<uint8_t[]>(kFrameHeaderBytes - 1);
  std::memcpy(truncated.get(), whole.data(), kFrameHeaderBytes - 1);

  const std::string why = refusal(truncated.get(), kFrameHeaderBytes - 1);

  EXPECT_TRUE(mentions(why, "header truncated to 55 of 56 bytes")) << why;
  EXPECT_TRUE(mentions(refusal(whole.data(), 0), "header truncated to 0 of 56 bytes"));
}

TEST(FrameHeader, ABadMagicIsRefused) {
  HeaderBytes bytes = encodeFrameHeader(wholeMessage(1, 0, 8));
  std::memcpy(bytes.data(), "HTTP", 4);

  const std::string why = refusal(bytes.data(), bytes.size());

  EXPECT_TRUE(mentions(why, "bad magic 0x50545448 (the peer is not speaking DiComm)")) << why;
}

TEST(FrameHeader, AnotherProtocolVersionIsRefused) {
  HeaderBytes bytes = encodeFrameHeader(wholeMessage(1, 0, 8));
  bytes[4] = kFrameVersion + 1;

  const std::string why = refusal(bytes.data(), bytes.size());

  EXPECT_TRUE(mentions(why, "protocol version 2, this build speaks 1")) << why;
}

TEST(FrameHeader, AnUnknownKindIsRefused) {
  HeaderBytes bytes = encodeFrameHeader(wholeMessage(1, 0, 8));
  bytes[5] = uint8_t(kLastFrameKind) + 1;
  EXPECT_TRUE(mentions(refusal(bytes.data(), bytes.size()), "unknown kind 9"));
  bytes[5] = 0;
  EXPECT_TRUE(mentions(refusal(bytes.data(), bytes.size()), "unknown kind 0"));
}

TEST(FrameHeader, AKindWithoutPayloadCarryingPayloadBytesIsRefused) {
  FrameHeader done;
  done.kind = FrameKind::Done;
  EXPECT_EQ(refusal(done), "");
  done.payload_bytes = 1;

  EXPECT_TRUE(mentions(refusal(done), "Done frame carries 1 payload bytes, expected 0"));
}

TEST(FrameHeader, AHelloPayloadOverItsLimitIsRefused) {
  FrameHeader hello;
  hello.kind = FrameKind::Hello;
  hello.payload_bytes = kMaxHelloPayloadBytes;
  EXPECT_EQ(refusal(hello), "");
  hello.payload_bytes = kMaxHelloPayloadBytes + 1;

  EXPECT_TRUE(mentions(refusal(hello), "Hello payload of 4097 bytes exceeds 4096"));
}

TEST(FrameHeader, ADeviceAnnouncementCarriesExactlyOneRegionHandle) {
  FrameHeader ready;
  ready.kind = FrameKind::ReadyToSend;
  ready.flags = kFlagDeviceRegion;
  ready.payload_bytes = kRegionHandleBytes;
  EXPECT_EQ(refusal(ready), "");
  ready.payload_bytes = kRegionHandleBytes - 1;

  EXPECT_TRUE(mentions(refusal(ready), "device ReadyToSend carries 63 payload bytes, expected 64"));
}

}  // namespace
}  // namespace dicomm::testing
