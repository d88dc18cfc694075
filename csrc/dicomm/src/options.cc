#include "dicomm/options.h"

#include <arpa/inet.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <stdexcept>

namespace dicomm {
namespace {

const char* env(const char* name) {
  const char* value = std::getenv(name);
  return (value && *value) ? value : nullptr;
}

uint64_t parseCount(const char* name, const char* text) {
  char* end = nullptr;
  const unsigned long long value = std::strtoull(text, &end, 10);
  if (end == text || *end != '\0' || text[0] == '-') {
    throw std::invalid_argument(std::string(name) + "=" + text + " is not a non-negative integer");
  }
  return value;
}

double parseSeconds(const char* name, const char* text) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !(value > 0)) {
    throw std::invalid_argument(std::string(name) + "=" + text + " is not a positive number of seconds");
  }
  return value;
}

bool parseSwitch(const char* name, const char* text) {
  const std::string value = text;
  if (value != "0" && value != "1") throw std::invalid_argument(std::string(name) + "=" + value + " is not 0 or 1");
  return value == "1";
}

double parseNumber(const char* name, const char* text, bool zero_allowed) {
  char* end = nullptr;
  const double value = std::strtod(text, &end);
  if (end == text || *end != '\0' || !std::isfinite(value) || value < 0 || (!zero_allowed && value == 0)) {
    throw std::invalid_argument(std::string(name) + "=" + text + " is not a " +
                                (zero_allowed ? "non-negative" : "positive") + " number");
  }
  return value;
}

}  // namespace

const char* transportName(TransportKind kind) {
  switch (kind) {
    case TransportKind::Tcp: return "tcp";
    case TransportKind::Shm: return "shm";
    case TransportKind::Ibverbs: return "ibverbs";
  }
  return "unknown";
}

TransportKind parseTransportName(const std::string& name, const std::string& what) {
  if (name == "tcp") return TransportKind::Tcp;
  if (name == "shm") return TransportKind::Shm;
  if (name == "ibverbs") return TransportKind::Ibverbs;
  throw std::invalid_argument(what + "='" + name + "' is not one of auto, tcp, shm, ibverbs");
}

Options Options::fromEnvironment() {
  Options o;
  if (auto v = env("DICOMM_TRANSPORT")) o.transport = v;
  if (auto v = env("DICOMM_TIMEOUT_S")) o.timeout_s = parseSeconds("DICOMM_TIMEOUT_S", v);
  if (auto v = env("DICOMM_CONNECT_TIMEOUT_S")) o.connect_timeout_s = parseSeconds("DICOMM_CONNECT_TIMEOUT_S", v);
  if (auto v = env("DICOMM_JOB_TOKEN")) o.token = v;
  if (auto v = env("DICOMM_HELLO_TIMEOUT_S")) o.hello_timeout_s = parseSeconds("DICOMM_HELLO_TIMEOUT_S", v);
  if (auto v = env("DICOMM_UNEXPECTED_BYTES")) o.unexpected_bytes_per_peer = parseCount("DICOMM_UNEXPECTED_BYTES", v);
  if (auto v = env("DICOMM_BIND_ADDR")) o.bind_address = v;
  if (auto v = env("DICOMM_ADVERTISE_ADDR")) o.advertise_address = v;
  if (auto v = env("DICOMM_TCP_CHUNK_BYTES")) o.tcp_chunk_bytes = parseCount("DICOMM_TCP_CHUNK_BYTES", v);
  if (auto v = env("DICOMM_TCP_SOCKET_BUFFER_BYTES")) {
    o.tcp_socket_buffer_bytes = parseCount("DICOMM_TCP_SOCKET_BUFFER_BYTES", v);
  }
  if (auto v = env("DICOMM_TCP_CONGESTION")) o.tcp_congestion = v;
  if (auto v = env("DICOMM_TCP_NOTSENT_LOWAT_BYTES")) {
    o.tcp_notsent_lowat_bytes = parseCount("DICOMM_TCP_NOTSENT_LOWAT_BYTES", v);
  }
  if (auto v = env("DICOMM_SHM_RING_BYTES")) o.shm_ring_bytes = parseCount("DICOMM_SHM_RING_BYTES", v);
  if (auto v = env("DICOMM_SHM_EAGER_BYTES")) o.shm_eager_bytes = parseCount("DICOMM_SHM_EAGER_BYTES", v);
  if (auto v = env("DICOMM_SHM_SPLIT_BYTES")) o.shm_split_bytes = parseCount("DICOMM_SHM_SPLIT_BYTES", v);
  if (auto v = env("DICOMM_SHM_CMA")) o.shm_cross_memory_attach = parseSwitch("DICOMM_SHM_CMA", v);
  if (auto v = env("DICOMM_DEVICE_DIRECT")) o.device_direct = parseSwitch("DICOMM_DEVICE_DIRECT", v);
  if (auto v = env("DICOMM_MAX_MESSAGE_BYTES")) o.max_message_bytes = parseCount("DICOMM_MAX_MESSAGE_BYTES", v);
  if (auto v = env("DICOMM_SPIN_US")) o.spin_wait_us = int64_t(parseCount("DICOMM_SPIN_US", v));
  if (auto v = env("DICOMM_LINK_GBPS")) o.link.bandwidth_bytes_per_s = parseNumber("DICOMM_LINK_GBPS", v, false) * 1e9;
  if (auto v = env("DICOMM_LINK_LATENCY_US")) o.link.latency_s = parseNumber("DICOMM_LINK_LATENCY_US", v, true) * 1e-6;
  return o;
}

void Options::validate() const {
  auto checkTransport = [](const std::string& name, const std::string& what) {
    if (name != "auto") parseTransportName(name, what);
  };
  checkTransport(transport, "transport");
  for (auto& [peer, name] : peer_transport) checkTransport(name, "transport for peer " + std::to_string(peer));
  if (spin_wait_us < -1 || spin_wait_us > 10'000'000) {
    throw std::invalid_argument("spin wait must be -1 (auto) or in [0, 10000000] us, got " +
                                std::to_string(spin_wait_us));
  }
  if (!(timeout_s > 0)) throw std::invalid_argument("timeout must be positive, got " + std::to_string(timeout_s));
  if (!(connect_timeout_s > 0)) {
    throw std::invalid_argument("connect timeout must be positive, got " + std::to_string(connect_timeout_s));
  }
  in_addr parsed{};
  if (!bind_address.empty() && inet_pton(AF_INET, bind_address.c_str(), &parsed) != 1) {
    throw std::invalid_argument("bind address '" + bind_address + "' is not an IPv4 address (DICOMM_BIND_ADDR)");
  }
  if (!(hello_timeout_s > 0)) {
    throw std::invalid_argument("hello timeout must be positive, got " + std::to_string(hello_timeout_s));
  }
  if (tcp_chunk_bytes < 4096 || tcp_chunk_bytes > kMaxChunkBytes) {
    throw std::invalid_argument("tcp chunk size must lie in [4 KiB, 256 MiB], got " + std::to_string(tcp_chunk_bytes));
  }
  if (tcp_socket_buffer_bytes > (size_t(1) << 30)) {
    throw std::invalid_argument("tcp socket buffer size must be at most 1 GiB, got " +
                                std::to_string(tcp_socket_buffer_bytes));
  }
  if (tcp_notsent_lowat_bytes > (size_t(1) << 30)) {
    throw std::invalid_argument("tcp not-sent low-water mark must be at most 1 GiB, got " +
                                std::to_string(tcp_notsent_lowat_bytes));
  }
  const bool congestion_name_ok =
      tcp_congestion.size() < 16 && std::all_of(tcp_congestion.begin(), tcp_congestion.end(), [](char ch) {
        return std::isalnum(static_cast<unsigned char>(ch)) || ch == '_' || ch == '-';
      });
  if (!congestion_name_ok) {
    throw std::invalid_argument("tcp congestion control '" + tcp_congestion +
                                "' is not a kernel algorithm name (DICOMM_TCP_CONGESTION; e.g. reno, cubic, bbr)");
  }
  if (shm_ring_bytes < (size_t(64) << 10) || (shm_ring_bytes & (shm_ring_bytes - 1)) != 0 ||
      shm_ring_bytes > (size_t(1) << 30)) {
    throw std::invalid_argument("shm ring size must be a power of two in [64 KiB, 1 GiB], got " +
                                std::to_string(shm_ring_bytes));
  }
  link.validate("link");
  for (auto& [peer, shape] : peer_links) shape.validate("link to peer " + std::to_string(peer));
  if (shm_eager_bytes > shm_ring_bytes / 4) {
    throw std::invalid_argument("shm eager size " + std::to_string(shm_eager_bytes) +
                                " exceeds a quarter of the ring (" + std::to_string(shm_ring_bytes) + ")");
  }
}

std::string Options::transportFor(int peer) const {
  auto found = peer_transport.find(peer);
  return found == peer_transport.end() ? transport : found->second;
}

LinkShape Options::linkFor(int peer) const {
  auto found = peer_links.find(peer);
  return found == peer_links.end() ? link : found->second;
}

std::chrono::microseconds Options::activeWaitWindow() const {
  constexpr std::chrono::microseconds kSpinWhenCoresSuffice{5000};
  if (spin_wait_us >= 0) return std::chrono::microseconds(spin_wait_us);
  const char* local_ranks = env("LOCAL_WORLD_SIZE");
  if (!local_ranks) return kSpinWhenCoresSuffice;
  cpu_set_t cores;
  if (sched_getaffinity(0, sizeof(cores), &cores) != 0) return kSpinWhenCoresSuffice;
  const long ranks = std::strtol(local_ranks, nullptr, 10);
  return ranks > CPU_COUNT(&cores) ? std::chrono::microseconds(0) : kSpinWhenCoresSuffice;
}

FrameLimits Options::frameLimits() const {
  FrameLimits limits;
  limits.max_message_bytes = max_message_bytes;
  limits.max_payload_bytes = kMaxChunkBytes;
  limits.max_unexpected_bytes = unexpected_bytes_per_peer;
  return limits;
}

}  // namespace dicomm
