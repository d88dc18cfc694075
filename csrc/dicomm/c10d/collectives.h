// Collective communication built only from the engine's point-to-point messages, on raw host
// buffers. Knows nothing of torch: element types enter as a size and a reduction callback.
// Every function is called by all ranks of the group in the same order with matching arguments.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "dicomm/engine.h"

namespace dicomm {

// out = a op b, elementwise over `count` elements; out may be a or b.
using ReduceInto = std::function<void(void* out, const void* a, const void* b, size_t count)>;

// Reusable host memory for received operands; collectives of one group run one at a time.
class Scratch {
 public:
  uint8_t* get(size_t bytes);

 private:
  std::unique_ptr<uint8_t[]> memory_;
  size_t bytes_ = 0;
};

// The messages of one collective call: a tag space of its own, and errors that name the call.
class CollectiveChannel {
 public:
  CollectiveChannel(Engine& engine, uint64_t tag_base, std::string description);
  int rank() const { return engine_.rank(); }
  int size() const { return engine_.worldSize(); }

  // Post without blocking; zero-byte transfers are skipped on both sides.
  void send(int peer, uint32_t step, const void* data, size_t bytes);
  void recv(int peer, uint32_t step, void* data, size_t bytes);
  // Waits for everything posted so far. Throws CommError "<description>: recv from rank P: why".
  void waitAll();

 private:
  struct Posted {
    RequestPtr request;
    bool is_send;
    size_t bytes;
  };
  Engine& engine_;
  const uint64_t tag_base_;
  const std::string description_;
  std::vector<Posted> posted_;
};

void barrier(CollectiveChannel& channel);
// Binomial tree from `root`.
void broadcast(CollectiveChannel& channel, void* data, size_t bytes, int root);
// Reduce-scatter then all-gather, each one round of concurrent messages; small buffers are sent
// whole to every rank. Each element is reduced in rank order, so all ranks get identical bits.
void allreduce(CollectiveChannel& channel, Scratch& scratch, void* data, size_t count, size_t element_bytes,
               const ReduceInto& reduce);
// Rank `root` ends with the reduction (in rank order) in `data`; other ranks' data is unchanged.
void reduce(CollectiveChannel& channel, Scratch& scratch, void* data, size_t count, size_t element_bytes,
            const ReduceInto& reduce, int root);
// outputs[q] (bytes each) receives rank q's input; outputs[rank] may alias input.
void allgather(CollectiveChannel& channel, const void* input, size_t bytes, const std::vector<void*>& outputs);
// inputs[q] (count elements each) is this rank's contribution to rank q's output.
void reduceScatter(CollectiveChannel& channel, Scratch& scratch, const std::vector<const void*>& inputs, void* output,
                   size_t count, size_t element_bytes, const ReduceInto& reduce);
// sends[q] goes to rank q and arrives in its recvs[rank]; sizes must agree pairwise.
struct ConstBytes {
  const void* data;
  size_t bytes;
};
struct Bytes {
  void* data;
  size_t bytes;
};
void allToAll(CollectiveChannel& channel, const std::vector<ConstBytes>& sends, const std::vector<Bytes>& recvs);
// outputs (root only) as allgather's.
void gather(CollectiveChannel& channel, const void* input, size_t bytes, const std::vector<void*>& outputs, int root);
// inputs (root only): inputs[q] goes to rank q.
void scatter(CollectiveChannel& channel, const std::vector<const void*>& inputs, void* output, size_t bytes, int root);

// Below this many bytes allreduce sends whole buffers (one round) instead of reduce-scatter + all-gather.
constexpr size_t kAllreduceWholeBufferBytes = size_t(64) << 10;

}  // namespace dicomm
