// The key-value store rendezvous talks to. Python passes any object with set/get (every
// torch.distributed Store qualifies), so the core never links torch.
#pragma once

#include <optional>
#include <string>

#include "dicomm/request.h"

namespace dicomm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists; the store applies its own timeout and throws on expiry.
  virtual std::string get(const std::string& key) = 0;
  // Blocks until the key exists or `deadline` passes (then throws CommError naming the key). A store
  // that cannot wait with a deadline applies its own timeout instead.
  virtual std::string get(const std::string& key, Clock::time_point deadline) {
    (void)deadline;
    return get(key);
  }
  // Whether `key` is set now, without waiting; nullopt from a store that cannot answer that (setup
  // then only learns of a peer's failure through its own timeout).
  virtual std::optional<bool> has(const std::string& key) {
    (void)key;
    return std::nullopt;
  }
};

// The error of a key still missing at the deadline.
inline CommError storeKeyMissing(const std::string& key) {
  return CommError("store key '" + key +
                   "' was not set within the connect timeout (its rank never started, "
                   "or it belongs to another job)");
}

}  // namespace dicomm
