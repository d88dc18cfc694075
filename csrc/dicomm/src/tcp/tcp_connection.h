// One peer over a TCP socket: messages leave as Data frames of at most tcp_chunk_bytes, written
// with writev straight from the user's buffer; arriving payloads are read straight into the
// matched receive buffer. All socket I/O is non-blocking. The transport's epoll thread drives it,
// except while a thread waits for one of its receives: that thread then reads the socket itself
// (the epoll thread stops watching it for input), so arriving bytes wake only the thread that
// wants them instead of the epoll thread and then, through the request, the waiter; while a
// message of at most 2 MiB streams in, that thread reads on without sleeping for at most the
// spin window.
#pragma once

#include <memory>
#include <mutex>
#include <string>

#include "dicomm/frame_stream.h"
#include "queued_connection.h"

namespace dicomm {

struct TcpOutgoing {
  RequestPtr request;
  uint64_t seq = 0;
  uint64_t offset = 0;  // payload bytes of the message already handed to the kernel
  uint8_t header[kFrameHeaderBytes];
  size_t header_sent = kFrameHeaderBytes;  // == size: no frame in progress
  uint64_t frame_payload = 0;
  uint64_t frame_payload_sent = 0;
  bool started = false;
};

class TcpConnection : public QueuedConnection<TcpOutgoing>, public std::enable_shared_from_this<TcpConnection> {
 public:
  TcpConnection(int peer, Socket socket, int epoll_fd, const Options& options);
  ~TcpConnection() override;

  void postSend(const RequestPtr& send) override;
  void postRecv(const RequestPtr& recv) override;

  int fd() const { return socket_.fd(); }
  void onReadable();
  void onWritable();
  void expire(Clock::time_point now);
  void closeWithError(const std::string& why);
  // The waiting thread reads the socket until `request` finishes or `until` passes; returns at
  // once when another thread already reads it in this way or the connection closed.
  void readWhileWaiting(const Request& request, Clock::time_point until);

 private:
  // Writes as much as the socket takes; arms EPOLLOUT when it cannot take everything.
  void flushLocked();
  bool writeFrontLocked();  // true when the front message left completely
  void setWantWriteLocked(bool want);
  void watchLocked();  // tells epoll what the epoll thread handles now
  void readAvailableLocked();
  void setReadThresholdLocked();  // before the reading thread sleeps
  void closeLocked(const std::string& why);
  std::string describe() const;

  Socket socket_;
  const int epoll_fd_;
  const size_t chunk_bytes_;
  const size_t largest_read_threshold_;       // an eighth of the socket buffer; 0 with kernel autotuning
  const Clock::duration stream_spin_window_;  // how long a waiter reads a streaming message without sleeping
  std::mutex mu_;
  FrameStreamReader reader_;
  bool want_write_ = false;
  bool waiter_reads_ = false;  // a waiting thread reads the socket; the epoll thread leaves input alone
  std::shared_ptr<Progress> waiter_progress_;
  int read_threshold_ = 1;
};

}  // namespace dicomm
