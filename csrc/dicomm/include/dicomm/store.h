// The key-value store rendezvous talks to. Python passes any object with set/get (every
// torch.distributed Store qualifies), so the core never links torch.
#pragma once

#include <string>

namespace dicomm {

class Store {
 public:
  virtual ~Store() = default;
  virtual void set(const std::string& key, const std::string& value) = 0;
  // Blocks until the key exists; the store applies its own timeout and throws on expiry.
  virtual std::string get(const std::string& key) = 0;
};

}  // namespace dicomm
