// FrameStreamReader: a byte stream, cut anywhere, becomes Data frames delivered through an Inbox; a frame
// that does not belong on an established stream ends it with a FrameError.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <string>
#include <vector>

#include "dicomm/frame_stream.h"
#include "dicomm/inbox.h"
#include "test_support.h"

namespace dicomm::testing {
namespace {

void append(std::vector<uint8_t>& stream, const FrameHeader& header, const std::string& payload = "") {
  const auto bytes = encodeFrameHeader(header);
  stream.insert(stream.end(), bytes.begin(), bytes.end());
  stream.insert(stream.end(), payload.begin(), payload.end());
}

// Hands `stream` to `reader` at most `piece` bytes at a time, as a socket might.
void feed(FrameStreamReader& reader, const std::vector<uint8_t>& stream, size_t piece) {
  size_t fed = 0;
  while (fed < stream.size()) {
    auto [destination, room] = reader.target();
    const size_t n = std::min({room, piece, stream.size() - fed});
    std::memcpy(destination, stream.data() + fed, n);
    reader.advance(n);
    fed += n;
  }
}

TEST(FrameStream, AMessageInTwoFramesCutIntoThreeBytePiecesLandsInItsReceive) {
  Inbox inbox(kPeer, FrameLimits());
  FrameStreamReader reader(inbox, FrameLimits());
  std::vector<uint8_t> buffer(16);
  const RequestPtr recv = hostReceive(/*tag=*/7, buffer);
  inbox.post(recv);
  std::vector<uint8_t> stream;
  append(stream, dataFrame(7, 0, 11, 0, 5), "hello");
  append(stream, dataFrame(7, 0, 11, 5, 6), " world");

  feed(reader, stream, 3);

  ASSERT_TRUE(recv->succeeded()) << recv->error();
  EXPECT_EQ(recv->bytes(), 11u);
  EXPECT_EQ(textOf(buffer, 11), "hello world");
  EXPECT_TRUE(reader.atFrameBoundary());
}

TEST(FrameStream, ReportsTheMessageStillStreamingInBetweenItsFrames) {
  Inbox inbox(kPeer, FrameLimits());
  FrameStreamReader reader(inbox, FrameLimits());
  std::vector<uint8_t> stream;
  append(stream, dataFrame(7, 0, 11, 0, 5), "hello");

  feed(reader, stream, stream.size());

  EXPECT_TRUE(reader.atFrameBoundary());
  EXPECT_EQ(reader.streamingMessageBytes(), 11u);
}

TEST(FrameStream, AControlFrameOnAnEstablishedStreamIsRefused) {
  Inbox inbox(kPeer, FrameLimits());
  FrameStreamReader reader(inbox, FrameLimits());
  FrameHeader hello;
  hello.kind = FrameKind::Hello;
  std::vector<uint8_t> stream;
  append(stream, hello);

  try {
    feed(reader, stream, stream.size());
    FAIL() << "a Hello frame was accepted on an established stream";
  } catch (const FrameError& error) {
    EXPECT_EQ(std::string(error.what()), "malformed frame: unexpected Hello frame on an established stream");
  }
}

TEST(FrameStream, AMalformedHeaderInTheStreamIsRefused) {
  Inbox inbox(kPeer, FrameLimits());
  FrameStreamReader reader(inbox, FrameLimits());
  std::vector<uint8_t> stream;
  append(stream, wholeMessage(7, 0, 3), "abc");
  stream[0] = 'X';

  EXPECT_THROW(feed(reader, stream, 7), FrameError);
}

}  // namespace
}  // namespace dicomm::testing
