// A thread that runs jobs one at a time, in the order they were pushed (the backend's collective
// queue and its future completion). Torch-free.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace dicomm {

// One thread running jobs in the order they were pushed. Its queue outlives the object while the
// thread runs, so a job may drop the last reference to whatever owns it.
class SerialThread {
 public:
  SerialThread();
  // Runs the queued jobs, then stops; called from its own thread, it drops them instead.
  ~SerialThread();
  void push(std::function<void()> job);

 private:
  struct Queue {
    std::mutex mutex;
    std::condition_variable wake;
    std::deque<std::function<void()>> jobs;
    bool stopping = false;
  };
  static void run(const std::shared_ptr<Queue>& queue);
  std::shared_ptr<Queue> queue_;
  std::thread thread_;
};

}  // namespace dicomm
