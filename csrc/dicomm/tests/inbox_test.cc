// Inbox: one connection's matching of arriving messages with posted receives. An Inbox serves one peer (the
// connection's); within it a message matches the receives of its tag in posting order, messages that arrive
// first wait in arrival order, and unposted eager bytes are bounded per peer.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "dicomm/inbox.h"
#include "test_support.h"

namespace dicomm::testing {
namespace {

// Delivers one eager Data frame as a transport does: asks where its payload goes, puts it there, reports it.
// Returns whether the payload had somewhere to go (false: the inbox discarded it).
bool arrive(Inbox& inbox, const FrameHeader& frame, const std::string& payload) {
  uint8_t* destination = inbox.destination(frame);
  if (destination) std::memcpy(destination, payload.data(), payload.size());
  inbox.landed(frame);
  return destination != nullptr;
}

void arriveWhole(Inbox& inbox, uint64_t tag, uint64_t seq, const std::string& text) {
  arrive(inbox, wholeMessage(tag, seq, text.size()), text);
}

std::string frameErrorOf(Inbox& inbox, const FrameHeader& frame, const std::string& payload) {
  try {
    arrive(inbox, frame, payload);
  } catch (const FrameError& error) {
    return error.what();
  }
  return "";
}

FrameHeader readyToSend(uint64_t tag, uint64_t seq, uint64_t total_bytes) {
  FrameHeader header;
  header.kind = FrameKind::ReadyToSend;
  header.tag = tag;
  header.seq = seq;
  header.total_bytes = total_bytes;
  return header;
}

TEST(Inbox, AnArrivingMessageGoesToThePostedReceiveOfItsTag) {
  Inbox inbox(kPeer, FrameLimits());
  std::vector<uint8_t> other_buffer(8), buffer(8);
  const RequestPtr other_tag = hostReceive(/*tag=*/1, other_buffer);
  const RequestPtr recv = hostReceive(/*tag=*/2, buffer);
  inbox.post(other_tag);
  inbox.post(recv);

  arriveWhole(inbox, /*tag=*/3, /*seq=*/0, "three");  // no receive of tag 3: it waits
  arriveWhole(inbox, /*tag=*/2, /*seq=*/1, "two");

  ASSERT_TRUE(recv->succeeded()) << recv->error();
  EXPECT_EQ(recv->bytes(), 3u);
  EXPECT_EQ(textOf(buffer, 3), "two");
  EXPECT_TRUE(other_tag->isPending());
  EXPECT_EQ(inbox.postedCount(), 1u);
  EXPECT_EQ(inbox.storedCount(), 1u);
}

TEST(Inbox, ReceivesOfOneTagAreMatchedInPostingOrder) {
  Inbox inbox(kPeer, FrameLimits());
  std::vector<uint8_t> first_buffer(8), second_buffer(8);
  const RequestPtr first = hostReceive(5, first_buffer);
  const RequestPtr second = hostReceive(5, second_buffer);
  inbox.post(first);
  inbox.post(second);

  arriveWhole(inbox, 5, 0, "one");
  arriveWhole(inbox, 5, 1, "two");

  EXPECT_EQ(textOf(first_buffer, first->bytes()), "one");
  EXPECT_EQ(textOf(second_buffer, second->bytes()), "two");
}

TEST(Inbox, UnmatchedArrivalsWaitAndAreReceivedInArrivalOrder) {
  Inbox inbox(kPeer, FrameLimits());
  arriveWhole(inbox, 5, 0, "first");
  arriveWhole(inbox, 6, 1, "other tag");
  arriveWhole(inbox, 5, 2, "second");
  EXPECT_EQ(inbox.storedCount(), 3u);

  std::vector<uint8_t> first_buffer(16), second_buffer(16);
  const RequestPtr first = hostReceive(5, first_buffer);
  const RequestPtr second = hostReceive(5, second_buffer);
  inbox.post(first);
  inbox.post(second);

  ASSERT_TRUE(first->succeeded() && second->succeeded());
  EXPECT_EQ(textOf(first_buffer, first->bytes()), "first");
  EXPECT_EQ(textOf(second_buffer, second->bytes()), "second");
  EXPECT_EQ(inbox.storedCount(), 1u);  // the tag-6 message still waits for its receive
}

TEST(Inbox, AReceivePostedWhileItsMessageArrivesTakesTheRestStraightIntoItsBuffer) {
  Inbox inbox(kPeer, FrameLimits());
  arrive(inbox, dataFrame(5, 0, 11, 0, 5), "hello");
  std::vector<uint8_t> buffer(16);
  const RequestPtr recv = hostReceive(5, buffer);
  inbox.post(recv);
  EXPECT_TRUE(recv->isPending());

  const FrameHeader rest = dataFrame(5, 0, 11, 5, 6);
  uint8_t* destination = inbox.destination(rest);
  ASSERT_EQ(destination, buffer.data() + 5);  // no copy through the inbox's storage
  std::memcpy(destination, " world", 6);
  inbox.landed(rest);

  ASSERT_TRUE(recv->succeeded()) << recv->error();
  EXPECT_EQ(textOf(buffer, recv->bytes()), "hello world");
}

TEST(Inbox, AnUnpostedMessagePastThePeersBudgetIsRefused) {
  FrameLimits limits;
  limits.max_unexpected_bytes = 100;
  Inbox inbox(kPeer, limits);
  arriveWhole(inbox, 5, 0, std::string(60, 'a'));

  const std::string why = frameErrorOf(inbox, wholeMessage(5, 1, 41), std::string(41, 'b'));

  EXPECT_EQ(why,
            "rank 3 sent a 41-byte message on tag 5 with 60 bytes already waiting for receives nobody posted:"
            " past the budget of 100 bytes per peer (DICOMM_UNEXPECTED_BYTES)");
}

TEST(Inbox, TheBudgetCountsOnlyMessagesNobodyHasPostedFor) {
  FrameLimits limits;
  limits.max_unexpected_bytes = 100;
  Inbox inbox(kPeer, limits);
  std::vector<uint8_t> big_buffer(200);
  inbox.post(hostReceive(5, big_buffer));
  arriveWhole(inbox, 5, 0, std::string(200, 'a'));  // posted: no budget needed
  arriveWhole(inbox, 5, 1, std::string(60, 'b'));   // unposted: 60 of 100
  std::vector<uint8_t> buffer(60);
  inbox.post(hostReceive(5, buffer));  // frees its 60 bytes

  EXPECT_EQ(frameErrorOf(inbox, wholeMessage(5, 2, 100), std::string(100, 'c')), "");
}

TEST(Inbox, AMessageLargerThanItsReceiveFailsTheReceiveAndIsDiscarded) {
  Inbox inbox(kPeer, FrameLimits());
  std::vector<uint8_t> buffer(4);
  const RequestPtr recv = hostReceive(5, buffer);
  inbox.post(recv);

  const bool landed = arrive(inbox, wholeMessage(5, 0, 5), "12345");

  EXPECT_FALSE(landed);
  ASSERT_FALSE(recv->isPending());
  EXPECT_EQ(recv->error(), "message of 5 bytes from rank 3 (tag 5) does not fit the 4-byte receive buffer");
  EXPECT_EQ(inbox.storedCount(), 0u);
}

TEST(Inbox, AMessageOutOfSequenceIsRefused) {
  Inbox inbox(kPeer, FrameLimits());
  arriveWhole(inbox, 5, 0, "a");

  EXPECT_EQ(frameErrorOf(inbox, wholeMessage(5, 2, 1), "c"),
            "malformed frame: message sequence 2 from rank 3, expected 1");
}

TEST(Inbox, ASliceThatDoesNotContinueItsMessageIsRefused) {
  Inbox inbox(kPeer, FrameLimits());
  arrive(inbox, dataFrame(5, 0, 10, 0, 4), "abcd");

  EXPECT_EQ(frameErrorOf(inbox, dataFrame(5, 0, 10, 6, 4), "ghij"),
            "malformed frame: Data slice at offset 6 of message 0 does not continue the message in progress");
}

TEST(Inbox, ARendezvousAnnouncementIsGrantedToThePostedReceiveOfItsTag) {
  Inbox inbox(kPeer, FrameLimits());
  std::vector<uint8_t> buffer(64);
  const RequestPtr recv = hostReceive(5, buffer);
  EXPECT_FALSE(inbox.post(recv).has_value());

  const auto grant = inbox.announce(readyToSend(5, 0, 64));

  ASSERT_TRUE(grant.has_value());
  EXPECT_EQ(grant->recv, recv);
  EXPECT_EQ(grant->announcement.seq, 0u);
  EXPECT_TRUE(grant->fits);
}

TEST(Inbox, AnUnpostedAnnouncementWaitsAndIsGrantedWhenItsReceiveIsPosted) {
  Inbox inbox(kPeer, FrameLimits());
  EXPECT_FALSE(inbox.announce(readyToSend(5, 0, 128)).has_value());
  std::vector<uint8_t> buffer(64);
  const RequestPtr recv = hostReceive(5, buffer);

  const auto grant = inbox.post(recv);

  ASSERT_TRUE(grant.has_value());
  EXPECT_EQ(grant->announcement.total_bytes, 128u);
  EXPECT_FALSE(grant->fits);  // 128 bytes do not fit 64: the transport refuses it
  EXPECT_FALSE(recv->isPending());
}

TEST(Inbox, FailAllFailsPostedReceivesAndKeepsMessagesThatArrivedWhole) {
  Inbox inbox(kPeer, FrameLimits());
  std::vector<uint8_t> posted_buffer(8);
  const RequestPtr posted = hostReceive(1, posted_buffer);
  inbox.post(posted);
  arriveWhole(inbox, 5, 0, "kept");

  inbox.failAll("connection closed");

  EXPECT_EQ(posted->error(), "connection closed");
  std::vector<uint8_t> buffer(8);
  const RequestPtr late = hostReceive(5, buffer);
  EXPECT_TRUE(inbox.postFromArrived(late));
  EXPECT_EQ(textOf(buffer, late->bytes()), "kept");
}

TEST(Inbox, AReceivePastItsDeadlineFailsNamingThePeerAndTag) {
  Inbox inbox(kPeer, FrameLimits());
  std::vector<uint8_t> buffer(8);
  const RequestPtr recv = hostReceive(5, buffer);
  inbox.post(recv);

  EXPECT_FALSE(inbox.expire(Clock::now()).has_value());
  EXPECT_TRUE(recv->isPending());
  EXPECT_FALSE(inbox.expire(recv->deadline()).has_value());

  EXPECT_EQ(recv->error(), "timed out waiting for a message from rank 3 (tag 5)");
  EXPECT_EQ(inbox.postedCount(), 0u);
}

}  // namespace
}  // namespace dicomm::testing
