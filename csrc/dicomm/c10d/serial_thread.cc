#include "serial_thread.h"

namespace dicomm {

SerialThread::SerialThread() : queue_(std::make_shared<Queue>()) {
  thread_ = std::thread([queue = queue_] { run(queue); });
}

SerialThread::~SerialThread() {
  const bool own_thread = std::this_thread::get_id() == thread_.get_id();
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->stopping = true;
    if (own_thread) queue_->jobs.clear();
  }
  queue_->wake.notify_all();
  if (own_thread) {
    thread_.detach();
  } else {
    thread_.join();
  }
}

void SerialThread::push(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(queue_->mutex);
    queue_->jobs.push_back(std::move(job));
  }
  queue_->wake.notify_one();
}

void SerialThread::run(const std::shared_ptr<Queue>& queue) {
  for (;;) {
    std::function<void()> job;
    {
      std::unique_lock<std::mutex> lock(queue->mutex);
      queue->wake.wait(lock, [&] { return queue->stopping || !queue->jobs.empty(); });
      if (queue->jobs.empty()) return;
      job = std::move(queue->jobs.front());
      queue->jobs.pop_front();
    }
    job();
  }
}

}  // namespace dicomm
