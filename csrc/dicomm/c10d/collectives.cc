#include "collectives.h"

#include <cstring>

namespace dicomm {
namespace {

size_t chunkBegin(size_t count, int chunks, int index) { return count * size_t(index) / size_t(chunks); }

void copyIfDistinct(void* to, const void* from, size_t bytes) {
  if (to != from && bytes) std::memcpy(to, from, bytes);
}

// out = operands[0] op operands[1] op ... in rank order, without extra copies. `accumulator` is
// memory free to overwrite: operands[0]'s own buffer or `out` (when out holds no operand but the
// first). `out` may alias any one operand.
void reduceInRankOrder(void* out, const std::vector<const void*>& operands, void* accumulator, size_t count,
                       size_t element_bytes, const ReduceInto& reduce) {
  const size_t n = operands.size();
  if (n == 1) {
    copyIfDistinct(out, operands[0], count * element_bytes);
    return;
  }
  if (n == 2) {
    reduce(out, operands[0], operands[1], count);
    return;
  }
  reduce(accumulator, operands[0], operands[1], count);
  for (size_t q = 2; q + 1 < n; ++q) reduce(accumulator, accumulator, operands[q], count);
  reduce(out, accumulator, operands[n - 1], count);
}

// inputs[q] holds counts[q] elements for rank q; this rank's output gets counts[rank].
void reduceScatterUneven(CollectiveChannel& channel, Scratch& scratch, const std::vector<const void*>& inputs,
                         const std::vector<size_t>& counts, void* output, size_t element_bytes,
                         const ReduceInto& reduce) {
  const int n = channel.size(), r = channel.rank();
  const size_t mine = counts[size_t(r)] * element_bytes;
  if (n == 1) {
    copyIfDistinct(output, inputs[0], mine);
    return;
  }
  uint8_t* slots = scratch.get(mine * size_t(n));
  std::vector<const void*> operands(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    operands[size_t(q)] = q == r ? inputs[size_t(r)] : slots + mine * size_t(q);
    if (q == r) continue;
    channel.recv(q, 0, slots + mine * size_t(q), mine);
    channel.send(q, 0, inputs[size_t(q)], counts[size_t(q)] * element_bytes);
  }
  channel.waitAll();
  reduceInRankOrder(output, operands, r == 0 ? output : slots, counts[size_t(r)], element_bytes, reduce);
}

}  // namespace

uint8_t* Scratch::get(size_t bytes) {
  if (bytes > bytes_) {
    memory_.reset(new uint8_t[bytes]);
    bytes_ = bytes;
  }
  return memory_.get();
}

CollectiveChannel::CollectiveChannel(Engine& engine, uint64_t tag_base, std::string description)
    : engine_(engine), tag_base_(tag_base), description_(std::move(description)) {}

void CollectiveChannel::send(int peer, uint32_t step, const void* data, size_t bytes) {
  if (bytes == 0) return;
  posted_.push_back({engine_.isend(peer, tag_base_ | step, data, bytes), true, bytes});
}

void CollectiveChannel::recv(int peer, uint32_t step, void* data, size_t bytes) {
  if (bytes == 0) return;
  posted_.push_back({engine_.irecv(peer, tag_base_ | step, data, bytes), false, bytes});
}

void CollectiveChannel::waitAll() {
  std::vector<Posted> posted;
  posted.swap(posted_);
  for (const Posted& p : posted) {
    const char* direction = p.is_send ? "send to" : "recv from";
    size_t moved = 0;
    try {
      moved = p.request->wait();
    } catch (const CommError& e) {
      throw CommError(description_ + ": " + direction + " rank " + std::to_string(p.request->peer()) +
                      " failed: " + e.what());
    }
    if (moved != p.bytes) {
      throw CommError(description_ + ": " + direction + " rank " + std::to_string(p.request->peer()) + " moved " +
                      std::to_string(moved) + " bytes, expected " + std::to_string(p.bytes) +
                      " (ranks called it with different sizes?)");
    }
  }
}

void barrier(CollectiveChannel& channel) {
  const int n = channel.size(), r = channel.rank();
  uint8_t out = 1, in = 0;
  uint32_t round = 0;
  for (int distance = 1; distance < n; distance <<= 1, ++round) {
    channel.send((r + distance) % n, round, &out, 1);
    channel.recv((r - distance + n) % n, round, &in, 1);
    channel.waitAll();
  }
}

void broadcast(CollectiveChannel& channel, void* data, size_t bytes, int root) {
  const int n = channel.size();
  const int relative = (channel.rank() - root + n) % n;
  int mask = 1;
  while (mask < n) {
    if (relative & mask) {
      channel.recv((relative - mask + root) % n, 0, data, bytes);
      channel.waitAll();
      break;
    }
    mask <<= 1;
  }
  for (mask >>= 1; mask > 0; mask >>= 1) {
    if (relative + mask < n) channel.send((relative + mask + root) % n, 0, data, bytes);
  }
  channel.waitAll();
}

void allreduce(CollectiveChannel& channel, Scratch& scratch, void* data, size_t count, size_t element_bytes,
               const ReduceInto& reduce) {
  const int n = channel.size(), r = channel.rank();
  if (n == 1 || count == 0) return;
  auto* bytes = static_cast<uint8_t*>(data);
  const size_t total = count * element_bytes;
  if (total <= kAllreduceWholeBufferBytes || count < size_t(n)) {
    uint8_t* slots = scratch.get(total * size_t(n));
    std::vector<const void*> operands(static_cast<size_t>(n));
    for (int q = 0; q < n; ++q) {
      operands[size_t(q)] = q == r ? data : slots + total * size_t(q);
      if (q == r) continue;
      channel.recv(q, 0, slots + total * size_t(q), total);
      channel.send(q, 0, data, total);
    }
    channel.waitAll();
    reduceInRankOrder(data, operands, r == 0 ? data : slots, count, element_bytes, reduce);
    return;
  }
  std::vector<const void*> chunk(static_cast<size_t>(n));
  std::vector<size_t> chunk_count(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    chunk[size_t(q)] = bytes + chunkBegin(count, n, q) * element_bytes;
    chunk_count[size_t(q)] = chunkBegin(count, n, q + 1) - chunkBegin(count, n, q);
  }
  void* own = bytes + chunkBegin(count, n, r) * element_bytes;
  reduceScatterUneven(channel, scratch, chunk, chunk_count, own, element_bytes, reduce);
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    channel.recv(q, 1, const_cast<void*>(chunk[size_t(q)]), chunk_count[size_t(q)] * element_bytes);
    channel.send(q, 1, own, chunk_count[size_t(r)] * element_bytes);
  }
  channel.waitAll();
}

void reduce(CollectiveChannel& channel, Scratch& scratch, void* data, size_t count, size_t element_bytes,
            const ReduceInto& reduce, int root) {
  const int n = channel.size(), r = channel.rank();
  if (n == 1 || count == 0) return;
  const size_t total = count * element_bytes;
  if (r != root) {
    channel.send(root, 0, data, total);
    channel.waitAll();
    return;
  }
  uint8_t* slots = scratch.get(total * size_t(n));
  std::vector<const void*> operands(static_cast<size_t>(n));
  for (int q = 0; q < n; ++q) {
    operands[size_t(q)] = q == r ? data : slots + total * size_t(q);
    if (q != r) channel.recv(q, 0, slots + total * size_t(q), total);
  }
  channel.waitAll();
  reduceInRankOrder(data, operands, r == 0 ? data : slots, count, element_bytes, reduce);
}

void allgather(CollectiveChannel& channel, const void* input, size_t bytes, const std::vector<void*>& outputs) {
  const int n = channel.size(), r = channel.rank();
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    channel.recv(q, 0, outputs[size_t(q)], bytes);
    channel.send(q, 0, input, bytes);
  }
  copyIfDistinct(outputs[size_t(r)], input, bytes);
  channel.waitAll();
}

void reduceScatter(CollectiveChannel& channel, Scratch& scratch, const std::vector<const void*>& inputs, void* output,
                   size_t count, size_t element_bytes, const ReduceInto& reduce) {
  reduceScatterUneven(channel, scratch, inputs, std::vector<size_t>(size_t(channel.size()), count), output,
                      element_bytes, reduce);
}

void allToAll(CollectiveChannel& channel, const std::vector<ConstBytes>& sends, const std::vector<Bytes>& recvs) {
  const int n = channel.size(), r = channel.rank();
  for (int q = 0; q < n; ++q) {
    if (q == r) continue;
    channel.recv(q, 0, recvs[size_t(q)].data, recvs[size_t(q)].bytes);
    channel.send(q, 0, sends[size_t(q)].data, sends[size_t(q)].bytes);
  }
  if (recvs[size_t(r)].bytes != sends[size_t(r)].bytes) {
    throw CommError("all_to_all: rank " + std::to_string(r) + " sends itself " +
                    std::to_string(sends[size_t(r)].bytes) + " bytes but expects " +
                    std::to_string(recvs[size_t(r)].bytes));
  }
  copyIfDistinct(recvs[size_t(r)].data, sends[size_t(r)].data, sends[size_t(r)].bytes);
  channel.waitAll();
}

void gather(CollectiveChannel& channel, const void* input, size_t bytes, const std::vector<void*>& outputs, int root) {
  const int n = channel.size(), r = channel.rank();
  if (r != root) {
    channel.send(root, 0, input, bytes);
  } else {
    for (int q = 0; q < n; ++q) {
      if (q != r) channel.recv(q, 0, outputs[size_t(q)], bytes);
    }
    copyIfDistinct(outputs[size_t(r)], input, bytes);
  }
  channel.waitAll();
}

void scatter(CollectiveChannel& channel, const std::vector<const void*>& inputs, void* output, size_t bytes, int root) {
  const int n = channel.size(), r = channel.rank();
  if (r != root) {
    channel.recv(root, 0, output, bytes);
  } else {
    for (int q = 0; q < n; ++q) {
      if (q != r) channel.send(q, 0, inputs[size_t(q)], bytes);
    }
    copyIfDistinct(output, inputs[size_t(r)], bytes);
  }
  channel.waitAll();
}

}  // namespace dicomm
