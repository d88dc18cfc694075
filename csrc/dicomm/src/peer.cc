#include "dicomm/peer.h"

#include <unistd.h>

#include <fstream>
#include <sstream>

#include "dicomm/frame.h"
#include "dicomm/job_secret.h"
#include "dicomm/request.h"
#include "text_fields.h"

namespace dicomm {
namespace {

std::string readFirstLine(const std::string& path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}

std::string linkTarget(const std::string& path) {
  char buffer[256] = {0};
  const ssize_t n = readlink(path.c_str(), buffer, sizeof(buffer) - 1);
  return n > 0 ? std::string(buffer, size_t(n)) : std::string();
}

}  // namespace

std::string PeerDescriptor::encode() const {
  std::ostringstream out;
  out << "rank=" << rank << "\naddress=" << address << "\nport=" << port << "\nhost_id=" << host_id << "\npid=" << pid
      << "\nibverbs=" << (ibverbs ? 1 : 0) << "\nibverbs_device=" << ibverbs_device << "\n";
  return out.str();
}

PeerDescriptor PeerDescriptor::decode(const std::string& text) {
  const auto fields = parseTextFields(text);
  const std::string what = "peer descriptor in the store";
  PeerDescriptor d;
  d.rank = int(requireInteger<CommError>(fields, "rank", what));
  d.address = requireField<CommError>(fields, "address", what);
  const long long port = requireInteger<CommError>(fields, "port", what);
  if (port <= 0 || port > 65535) throw CommError(what + " has port " + std::to_string(port));
  d.port = uint16_t(port);
  d.host_id = requireField<CommError>(fields, "host_id", what);
  d.pid = requireInteger<CommError>(fields, "pid", what);
  d.ibverbs = requireInteger<CommError>(fields, "ibverbs", what) != 0;
  d.ibverbs_device = requireField<CommError>(fields, "ibverbs_device", what);
  return d;
}

std::string localHostId() {
  char name[256] = {0};
  gethostname(name, sizeof(name) - 1);
  return readFirstLine("/proc/sys/kernel/random/boot_id") + "/" + name + "/" + linkTarget("/proc/self/ns/ipc") + "/" +
         linkTarget("/proc/self/ns/pid");
}

namespace {

constexpr size_t kNonceBytes = 16;
// Each direction's proof is over its own label, so one side's proof never serves as the other's.
constexpr const char* kHelloLabel = "dicomm-hello-v1";
constexpr const char* kReplyLabel = "dicomm-reply-v1";

// Both directions sign every value of the exchange.
std::string handshakeTranscript(const char* label, const Challenge& challenge, const Hello& hello) {
  std::ostringstream out;
  out << label << "\nlistener_rank=" << challenge.rank << "\nlistener_nonce=" << challenge.nonce
      << "\ndialer_rank=" << hello.rank << "\ndialer_nonce=" << hello.nonce
      << "\ntransport=" << transportName(hello.transport) << "\n";
  return out.str();
}

}  // namespace

Challenge Challenge::fresh(int rank) {
  Challenge c;
  c.rank = rank;
  c.nonce = randomHex(kNonceBytes, "a handshake nonce");
  return c;
}

std::string Challenge::encode() const {
  std::ostringstream out;
  out << "rank=" << rank << "\nnonce=" << nonce << "\n";
  return out.str();
}

Challenge Challenge::decode(const std::string& payload) {
  const auto fields = parseTextFields(payload);
  const std::string what = "malformed frame: the listener's challenge";
  Challenge c;
  c.rank = int(requireInteger<FrameError>(fields, "rank", what));
  c.nonce = requireField<FrameError>(fields, "nonce", what);
  return c;
}

Hello Hello::answer(const Challenge& challenge, int rank, TransportKind transport, const std::string& token) {
  Hello h;
  h.rank = rank;
  h.transport = transport;
  h.nonce = randomHex(kNonceBytes, "a handshake nonce");
  h.proof = tokenProof(token, handshakeTranscript(kHelloLabel, challenge, h));
  return h;
}

bool Hello::proves(const std::string& token, const Challenge& challenge) const {
  return sameProof(tokenProof(token, handshakeTranscript(kHelloLabel, challenge, *this)), proof);
}

std::string Hello::listenerProof(const std::string& token, const Challenge& challenge) const {
  return tokenProof(token, handshakeTranscript(kReplyLabel, challenge, *this));
}

std::string Hello::encode() const {
  std::ostringstream out;
  out << "rank=" << rank << "\ntransport=" << transportName(transport) << "\nnonce=" << nonce << "\nproof=" << proof
      << "\n";
  return out.str();
}

Hello Hello::decode(const std::string& payload) {
  const auto fields = parseTextFields(payload);
  const std::string what = "malformed frame: Hello";
  Hello h;
  h.rank = int(requireInteger<FrameError>(fields, "rank", what));
  const std::string& transport = requireField<FrameError>(fields, "transport", what);
  try {
    h.transport = parseTransportName(transport, "Hello transport");
  } catch (const std::invalid_argument& e) {
    throw FrameError(std::string("malformed frame: ") + e.what());
  }
  h.nonce = requireField<FrameError>(fields, "nonce", what);
  h.proof = requireField<FrameError>(fields, "proof", what);
  return h;
}

TransportKind selectTransport(const std::string& preference, const PeerDescriptor& self, const PeerDescriptor& peer) {
  const bool same_host = self.host_id == peer.host_id;
  const std::string pair = "rank " + std::to_string(self.rank) + " -> rank " + std::to_string(peer.rank);
  if (preference == "auto") {
    if (same_host) return TransportKind::Shm;
    if (self.ibverbs && peer.ibverbs) return TransportKind::Ibverbs;
    return TransportKind::Tcp;
  }
  const TransportKind forced = parseTransportName(preference, "transport");
  if (forced == TransportKind::Shm && !same_host) {
    throw CommError("transport shm was requested for " + pair + " but the two ranks are not on the same host");
  }
  if (forced == TransportKind::Ibverbs && !(self.ibverbs && peer.ibverbs)) {
    throw CommError("transport ibverbs was requested for " + pair + " but " +
                    (self.ibverbs ? "the peer has" : "this host has") + " no active RDMA device");
  }
  return forced;
}

}  // namespace dicomm
