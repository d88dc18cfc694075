// A single-producer single-consumer ring of frames in shared memory. The producer is the peer
// process, so the consumer treats every shared word as untrusted: positions and headers are
// checked before any byte is copied.
#pragma once

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "dicomm/frame.h"

namespace dicomm {

struct alignas(64) RingControl {
  alignas(64) std::atomic<uint64_t> head;       // bytes ever written (producer)
  alignas(64) std::atomic<uint64_t> tail;       // bytes ever consumed (consumer)
  alignas(64) std::atomic<uint64_t> cma_probe;  // the peer writes here to test cross-memory attach
};

constexpr size_t kRingDataOffset = 4096;

inline size_t ringSegmentBytes(size_t capacity) { return kRingDataOffset + capacity; }

inline uint64_t frameFootprint(uint64_t payload_bytes) {
  return kFrameHeaderBytes + ((payload_bytes + 7) & ~uint64_t(7));
}

class Ring {
 public:
  Ring() = default;
  Ring(void* segment, size_t capacity)
      : control_(static_cast<RingControl*>(segment)),
        data_(static_cast<uint8_t*>(segment) + kRingDataOffset),
        capacity_(capacity) {}

  RingControl* control() const { return control_; }
  size_t capacity() const { return capacity_; }
  // The largest payload one frame may carry, so a frame always fits an empty ring.
  size_t maxPayload() const { return capacity_ / 4; }

  // Producer: appends header + payload if the ring has room; false when it is too full.
  bool push(const FrameHeader& header, const uint8_t* payload) {
    const uint64_t need = frameFootprint(header.payload_bytes);
    const uint64_t head = control_->head.load(std::memory_order_relaxed);
    const uint64_t tail = control_->tail.load(std::memory_order_acquire);
    if (head - tail > capacity_ || capacity_ - (head - tail) < need) return false;
    const auto bytes = encodeFrameHeader(header);
    copyIn(head, bytes.data(), bytes.size());
    if (header.payload_bytes) copyIn(head + kFrameHeaderBytes, payload, header.payload_bytes);
    control_->head.store(head + need, std::memory_order_seq_cst);
    return true;
  }

  // Consumer: bytes published by the producer and not yet consumed. A value above the capacity
  // means the shared control words are corrupt.
  uint64_t readable(uint64_t* tail_out) const {
    const uint64_t tail = control_->tail.load(std::memory_order_relaxed);
    const uint64_t head = control_->head.load(std::memory_order_acquire);
    *tail_out = tail;
    return head - tail;
  }
  void copyOut(uint64_t position, uint8_t* out, size_t size) const {
    const size_t start = size_t(position & (capacity_ - 1));
    const size_t first = std::min(size, capacity_ - start);
    std::memcpy(out, data_ + start, first);
    if (first < size) std::memcpy(out + first, data_, size - first);
  }
  void consume(uint64_t tail, uint64_t bytes) { control_->tail.store(tail + bytes, std::memory_order_release); }

 private:
  void copyIn(uint64_t position, const uint8_t* in, size_t size) {
    if (size == 0 || in == nullptr) return;
    const size_t start = size_t(position & (capacity_ - 1));
    const size_t first = std::min(size, capacity_ - start);
    std::memcpy(data_ + start, in, first);
    if (first < size) std::memcpy(data_, in + first, size - first);
  }

  RingControl* control_ = nullptr;
  uint8_t* data_ = nullptr;
  size_t capacity_ = 0;
};

}  // namespace dicomm
