// pybind11 bindings: the engine, request handles, the ibverbs probe, and the frame codec
// (exposed so tests can fuzz the exact decoder the transports use).
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <chrono>
#include <deque>
#include <memory>
#include <thread>
#include <vector>

#include "dicomm/device_memory.h"
#include "dicomm/engine.h"
#include "dicomm/frame.h"
#include "dicomm/frame_stream.h"
#include "dicomm/inbox.h"

namespace py = pybind11;
using namespace dicomm;

namespace {

// Calls a Python object's set/get (a torch.distributed Store, or dicomm.FileStore).
class PythonStore : public Store {
 public:
  explicit PythonStore(py::object store) : store_(std::move(store)) {}
  ~PythonStore() override {
    py::gil_scoped_acquire gil;
    store_ = py::object();
  }
  void set(const std::string& key, const std::string& value) override {
    py::gil_scoped_acquire gil;
    store_.attr("set")(key, py::bytes(value));
  }
  std::string get(const std::string& key) override {
    py::gil_scoped_acquire gil;
    py::object value = store_.attr("get")(key);
    if (py::isinstance<py::str>(value)) return value.cast<std::string>();
    return std::string(py::bytes(value));
  }
  // Stores with `check(keys)` (torch.distributed's, dicomm.FileStore) are polled up to `deadline`.
  std::string get(const std::string& key, Clock::time_point deadline) override {
    {
      py::gil_scoped_acquire gil;
      if (!py::hasattr(store_, "check")) return get(key);
    }
    while (true) {
      {
        py::gil_scoped_acquire gil;
        py::list keys;
        keys.append(key);
        if (store_.attr("check")(keys).cast<bool>()) break;
      }
      if (Clock::now() >= deadline) throw storeKeyMissing(key);
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    return get(key);
  }
  std::optional<bool> has(const std::string& key) override {
    py::gil_scoped_acquire gil;
    if (!py::hasattr(store_, "check")) return std::nullopt;
    py::list keys;
    keys.append(key);
    return store_.attr("check")(keys).cast<bool>();
  }

 private:
  py::object store_;
};

// A Python buffer held (and its memory pinned in place) for as long as a request may touch it.
class HeldBuffer {
 public:
  HeldBuffer(const py::object& object, bool writable) {
    const int flags = PyBUF_C_CONTIGUOUS | (writable ? PyBUF_WRITABLE : 0);
    if (PyObject_GetBuffer(object.ptr(), &view_, flags) != 0) {
      PyErr_Clear();
      throw py::type_error(std::string(writable ? "receive" : "send") + " buffer must be a C-contiguous" +
                           (writable ? ", writable" : "") + " buffer-protocol object (bytes" +
                           (writable ? "array" : "") + ", numpy array, ...) or an (address, nbytes) tuple");
    }
    held_ = true;
  }
  ~HeldBuffer() {
    if (held_) {
      py::gil_scoped_acquire gil;
      PyBuffer_Release(&view_);
    }
  }
  void* data() const { return view_.buf; }
  size_t size() const { return size_t(view_.len); }

 private:
  Py_buffer view_{};
  bool held_ = false;
};

struct Target {
  void* data = nullptr;
  size_t size = 0;
  std::shared_ptr<HeldBuffer> held;
};

Target resolveTarget(const py::object& object, bool writable) {
  Target t;
  if (py::isinstance<py::tuple>(object)) {
    auto pair = object.cast<py::tuple>();
    if (pair.size() != 2) throw py::type_error("an (address, nbytes) tuple must have two integers");
    t.data = reinterpret_cast<void*>(pair[0].cast<uintptr_t>());
    t.size = pair[1].cast<size_t>();
    if (!t.data && t.size) throw py::value_error("address 0 with a non-zero size");
    return t;
  }
  t.held = std::make_shared<HeldBuffer>(object, writable);
  t.data = t.held->data();
  t.size = t.held->size();
  return t;
}

class Handle {
 public:
  Handle(RequestPtr request, std::shared_ptr<HeldBuffer> held) : request_(std::move(request)), held_(std::move(held)) {}
  size_t wait(std::optional<double> timeout) {
    py::gil_scoped_release release;
    return request_->wait(timeout ? *timeout : -1.0);
  }
  bool test() {
    py::gil_scoped_release release;
    return request_->test();
  }
  bool done() const { return !request_->isPending(); }
  bool succeeded() const { return request_->succeeded(); }
  size_t nbytes() const { return request_->bytes(); }
  std::string error() const { return request_->error(); }
  int peer() const { return request_->peer(); }
  uint64_t tag() const { return request_->tag(); }

 private:
  RequestPtr request_;
  std::shared_ptr<HeldBuffer> held_;
};

class PyEngine {
 public:
  ~PyEngine() {
    // Background threads may need the GIL (Python copy hooks) before they can be joined.
    py::gil_scoped_release release;
    engine_.reset();
  }
  PyEngine(py::object store, int rank, int world_size, const Options& options) : store_(std::move(store)) {
    py::gil_scoped_release release;
    engine_ = std::make_unique<Engine>(store_, rank, world_size, options);
  }
  Handle isend(const py::object& buffer, int peer, uint64_t tag, bool device) {
    Target t = resolveTarget(buffer, false);
    py::gil_scoped_release release;
    return Handle(engine_->isend(peer, tag, t.data, t.size, device ? Memory::Device : Memory::Host), std::move(t.held));
  }
  Handle irecv(const py::object& buffer, int peer, uint64_t tag, bool device) {
    Target t = resolveTarget(buffer, true);
    py::gil_scoped_release release;
    return Handle(engine_->irecv(peer, tag, t.data, t.size, device ? Memory::Device : Memory::Host), std::move(t.held));
  }
  // Python callables (dst_address, src_address, nbytes); they run with the GIL taken.
  void setCopyHooks(py::function to_host, py::function from_host) {
    auto call = [](const std::shared_ptr<py::function>& f, void* dst, const void* src, size_t n) {
      py::gil_scoped_acquire gil;
      try {
        (*f)(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), n);
      } catch (py::error_already_set& e) {
        throw CommError(std::string("copy hook failed: ") + e.what());
      }
    };
    auto keep = [](py::function f) {
      return std::shared_ptr<py::function>(new py::function(std::move(f)), [](py::function* p) {
        py::gil_scoped_acquire gil;
        delete p;
      });
    };
    auto to = keep(std::move(to_host));
    auto from = keep(std::move(from_host));
    CopyHooks hooks;
    hooks.to_host = [call, to](void* host, const void* device, size_t n) { call(to, host, device, n); };
    hooks.from_host = [call, from](void* device, const void* host, size_t n) { call(from, device, host, n); };
    engine_->setCopyHooks(std::move(hooks));
  }
  std::string transport(int peer) const { return transportName(engine_->transportOf(peer)); }
  bool deviceDirect(int peer) const { return engine_->deviceDirect(peer); }
  LinkShape link(int peer) const { return engine_->linkOf(peer); }
  std::vector<std::string> notes() const { return engine_->notes(); }
  void close() {
    py::gil_scoped_release release;
    engine_->close();
  }
  int rank() const { return engine_->rank(); }
  int worldSize() const { return engine_->worldSize(); }

 private:
  PythonStore store_;
  std::unique_ptr<Engine> engine_;
};

py::dict headerToDict(const FrameHeader& h) {
  py::dict d;
  d["kind"] = frameKindName(h.kind);
  d["flags"] = h.flags;
  d["tag"] = h.tag;
  d["seq"] = h.seq;
  d["total_bytes"] = h.total_bytes;
  d["offset"] = h.offset;
  d["payload_bytes"] = h.payload_bytes;
  d["remote_address"] = h.remote_address;
  return d;
}

FrameKind kindFromName(const std::string& name) {
  for (uint8_t k = uint8_t(FrameKind::Hello); k <= uint8_t(kLastFrameKind); ++k) {
    if (name == frameKindName(FrameKind(k))) return FrameKind(k);
  }
  throw py::value_error("unknown frame kind '" + name + "'");
}

// The tcp receive path (FrameStreamReader + Inbox) without a socket, for fuzzing.
class StreamDecoder {
 public:
  explicit StreamDecoder(uint64_t max_message_bytes)
      : inbox_(1, limits(max_message_bytes)), reader_(inbox_, limits(max_message_bytes)) {}
  size_t postRecv(uint64_t tag, size_t capacity) {
    buffers_.emplace_back(capacity);
    requests_.push_back(
        std::make_shared<Request>(Direction::Recv, 1, tag, buffers_.back().data(), capacity, Clock::time_point::max()));
    inbox_.post(requests_.back());
    return requests_.size() - 1;
  }
  // Feeds bytes as a socket would deliver them; returns how many were consumed before an error.
  void feed(const py::bytes& data) {
    if (broken_) throw FrameError("decoder already closed after: " + failure_);
    std::string bytes = data;
    size_t used = 0;
    try {
      while (used < bytes.size()) {
        auto [where, size] = reader_.target();
        const size_t n = std::min(size, bytes.size() - used);
        std::memcpy(where, bytes.data() + used, n);
        used += n;
        reader_.advance(n);
      }
    } catch (const FrameError& e) {
      broken_ = true;
      failure_ = e.what();
      inbox_.failAll(failure_);
      throw;
    }
  }
  py::dict result(size_t index) const {
    if (index >= requests_.size()) throw py::index_error("no such receive");
    const auto& r = requests_[index];
    py::dict d;
    d["done"] = !r->isPending();
    d["ok"] = r->succeeded();
    d["nbytes"] = r->bytes();
    d["error"] = r->error();
    d["data"] = py::bytes(reinterpret_cast<const char*>(buffers_[index].data()), r->succeeded() ? r->bytes() : 0);
    return d;
  }
  size_t stored() const { return inbox_.storedCount(); }
  uint64_t streamingMessageBytes() const { return reader_.streamingMessageBytes(); }

 private:
  static FrameLimits limits(uint64_t max_message_bytes) {
    FrameLimits l;
    l.max_message_bytes = max_message_bytes;
    l.max_payload_bytes = kMaxChunkBytes;
    return l;
  }
  Inbox inbox_;
  FrameStreamReader reader_;
  std::deque<std::vector<uint8_t>> buffers_;
  std::vector<RequestPtr> requests_;
  bool broken_ = false;
  std::string failure_;
};

}  // namespace

PYBIND11_MODULE(_dicomm_core, m) {
  m.doc() = "DiComm C++ core: engine, transports (tcp, shm, ibverbs) and frame codec";

  static py::exception<CommError> comm_error(m, "CommError", PyExc_RuntimeError);
  static py::exception<FrameError> frame_error(m, "FrameError", PyExc_ValueError);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const WaitTimeout& e) {
      PyErr_SetString(PyExc_TimeoutError, e.what());
    } catch (const FrameError& e) {
      PyErr_SetString(frame_error.ptr(), e.what());
    } catch (const CommError& e) {
      PyErr_SetString(comm_error.ptr(), e.what());
    }
  });

  py::class_<LinkShape>(m, "LinkShape")
      .def(py::init<>())
      .def(py::init([](double bandwidth_bytes_per_s, double latency_s) {
             return LinkShape{bandwidth_bytes_per_s, latency_s};
           }),
           py::arg("bandwidth_bytes_per_s"), py::arg("latency_s"))
      .def_readwrite("bandwidth_bytes_per_s", &LinkShape::bandwidth_bytes_per_s)
      .def_readwrite("latency_s", &LinkShape::latency_s)
      .def_property_readonly("shaped", &LinkShape::shaped);

  m.def(
      "arrival_times",
      [](const LinkShape& shape, const std::vector<std::pair<double, size_t>>& posts) {
        ArrivalClock clock(shape);
        std::vector<double> arrivals;
        for (const auto& [posted_s, bytes] : posts) {
          const Clock::time_point posted(
              std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(posted_s)));
          arrivals.push_back(std::chrono::duration<double>(clock.arrival(posted, bytes).time_since_epoch()).count());
        }
        return arrivals;
      },
      py::arg("shape"), py::arg("posts"),
      "The shaping layer's arrival rule: for (posted at s, bytes) messages in order, when each arrives (s).");

  py::class_<Options>(m, "Options")
      .def(py::init<>())
      .def_static("from_environment", &Options::fromEnvironment)
      .def_readwrite("token", &Options::token)
      .def_readwrite("store_prefix", &Options::store_prefix)
      .def_readwrite("transport", &Options::transport)
      .def_readwrite("peer_transport", &Options::peer_transport)
      .def_readwrite("timeout_s", &Options::timeout_s)
      .def_readwrite("connect_timeout_s", &Options::connect_timeout_s)
      .def_readwrite("bind_address", &Options::bind_address)
      .def_readwrite("advertise_address", &Options::advertise_address)
      .def_readwrite("hello_timeout_s", &Options::hello_timeout_s)
      .def_readwrite("unexpected_bytes_per_peer", &Options::unexpected_bytes_per_peer)
      .def_readwrite("tcp_chunk_bytes", &Options::tcp_chunk_bytes)
      .def_readwrite("tcp_socket_buffer_bytes", &Options::tcp_socket_buffer_bytes)
      .def_readwrite("tcp_congestion", &Options::tcp_congestion)
      .def_readwrite("tcp_notsent_lowat_bytes", &Options::tcp_notsent_lowat_bytes)
      .def_readwrite("shm_ring_bytes", &Options::shm_ring_bytes)
      .def_readwrite("shm_eager_bytes", &Options::shm_eager_bytes)
      .def_readwrite("shm_split_bytes", &Options::shm_split_bytes)
      .def_readwrite("shm_cross_memory_attach", &Options::shm_cross_memory_attach)
      .def_readwrite("max_message_bytes", &Options::max_message_bytes)
      .def_readwrite("device_direct", &Options::device_direct)
      .def_readwrite("spin_wait_us", &Options::spin_wait_us)
      .def("active_wait_window_us", [](const Options& o) { return o.activeWaitWindow().count(); })
      .def(
          "set_device_memory",
          [](Options& o, const std::map<std::string, uintptr_t>& functions) {
            o.device_memory = DeviceMemory::fromAddresses(functions);
          },
          py::arg("functions"), "Device memory functions by name (h2.core.devices.device_memory(...)).")
      .def_readwrite("link", &Options::link)
      .def_readwrite("peer_links", &Options::peer_links)
      .def("validate", &Options::validate);

  py::class_<Handle>(m, "Handle")
      .def("wait", &Handle::wait, py::arg("timeout") = py::none(),
           "Block until done; returns bytes moved. Raises CommError on failure, TimeoutError on timeout.")
      .def("test", &Handle::test)
      .def_property_readonly("done", &Handle::done)
      .def_property_readonly("succeeded", &Handle::succeeded)
      .def_property_readonly("nbytes", &Handle::nbytes)
      .def_property_readonly("error", &Handle::error)
      .def_property_readonly("peer", &Handle::peer)
      .def_property_readonly("tag", &Handle::tag);

  py::class_<PyEngine>(m, "Engine")
      .def(py::init<py::object, int, int, const Options&>(), py::arg("store"), py::arg("rank"), py::arg("world_size"),
           py::arg("options"))
      .def("isend", &PyEngine::isend, py::arg("buffer"), py::arg("peer"), py::arg("tag") = 0, py::arg("device") = false)
      .def("irecv", &PyEngine::irecv, py::arg("buffer"), py::arg("peer"), py::arg("tag") = 0, py::arg("device") = false)
      .def("set_copy_hooks", &PyEngine::setCopyHooks, py::arg("to_host"), py::arg("from_host"))
      .def("transport", &PyEngine::transport)
      .def("device_direct", &PyEngine::deviceDirect)
      .def("link", &PyEngine::link)
      .def("notes", &PyEngine::notes)
      .def("close", &PyEngine::close)
      .def_property_readonly("rank", &PyEngine::rank)
      .def_property_readonly("world_size", &PyEngine::worldSize);

  m.def("live_requests", &Request::liveCount, "Requests alive in this process (leak checks).");

  m.def("probe_ibverbs", [] {
    const IbverbsProbe p = probeIbverbs();
    py::dict d;
    d["compiled"] = p.compiled;
    d["available"] = p.available;
    d["device"] = p.device;
    d["message"] = p.message;
    return d;
  });

  m.attr("FRAME_HEADER_BYTES") = kFrameHeaderBytes;
  m.def(
      "encode_frame_header",
      [](const std::string& kind, uint16_t flags, uint64_t tag, uint64_t seq, uint64_t total_bytes, uint64_t offset,
         uint64_t payload_bytes, uint64_t remote_address) {
        FrameHeader h;
        h.kind = kindFromName(kind);
        h.flags = flags;
        h.tag = tag;
        h.seq = seq;
        h.total_bytes = total_bytes;
        h.offset = offset;
        h.payload_bytes = payload_bytes;
        h.remote_address = remote_address;
        const auto bytes = encodeFrameHeader(h);
        return py::bytes(reinterpret_cast<const char*>(bytes.data()), bytes.size());
      },
      py::arg("kind"), py::arg("flags") = 0, py::arg("tag") = 0, py::arg("seq") = 0, py::arg("total_bytes") = 0,
      py::arg("offset") = 0, py::arg("payload_bytes") = 0, py::arg("remote_address") = 0);
  m.def(
      "decode_frame_header",
      [](const py::bytes& data, uint64_t max_message_bytes) {
        std::string bytes = data;
        FrameLimits limits;
        limits.max_message_bytes = max_message_bytes;
        limits.max_payload_bytes = kMaxChunkBytes;
        return headerToDict(decodeFrameHeader(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), limits));
      },
      py::arg("data"), py::arg("max_message_bytes") = uint64_t(1) << 40);
  m.def(
      "encode_hello",
      [](int rank, const std::string& token, const std::string& transport, const py::bytes& challenge) {
        return py::bytes(
            Hello::answer(Challenge::decode(challenge), rank, parseTransportName(transport, "transport"), token)
                .encode());
      },
      py::arg("rank"), py::arg("token"), py::arg("transport"), py::arg("challenge"),
      "The payload of a dialer's Hello answering a listener's challenge payload, proving `token`.");

  py::class_<StreamDecoder>(m, "StreamDecoder")
      .def(py::init<uint64_t>(), py::arg("max_message_bytes") = uint64_t(1) << 40)
      .def("post_recv", &StreamDecoder::postRecv, py::arg("tag"), py::arg("capacity"))
      .def("feed", &StreamDecoder::feed)
      .def("result", &StreamDecoder::result)
      .def_property_readonly("stored", &StreamDecoder::stored)
      .def_property_readonly("streaming_message_bytes", &StreamDecoder::streamingMessageBytes);
}
