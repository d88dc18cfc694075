#include "dicomm/job_secret.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <sys/random.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "dicomm/request.h"

namespace dicomm {
namespace {

std::string toHex(const unsigned char* bytes, size_t n) {
  static const char* hex = "0123456789abcdef";
  std::string text;
  text.reserve(2 * n);
  for (size_t i = 0; i < n; ++i) {
    text += hex[bytes[i] >> 4];
    text += hex[bytes[i] & 15];
  }
  return text;
}

void fillRandom(unsigned char* bytes, size_t n, const std::string& what) {
  size_t filled = 0;
  while (filled < n) {
    const ssize_t got = getrandom(bytes + filled, n - filled, 0);
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string reason = got < 0 ? std::strerror(errno) : "no bytes";
      throw CommError("cannot draw " + what + " (getrandom: " + reason + ")");
    }
    filled += size_t(got);
  }
}

}  // namespace

std::string randomHex(size_t bytes, const std::string& what) {
  std::vector<unsigned char> drawn(bytes);
  fillRandom(drawn.data(), bytes, what);
  return toHex(drawn.data(), bytes);
}

uint64_t randomWord(const std::string& what) {
  uint64_t word = 0;
  fillRandom(reinterpret_cast<unsigned char*>(&word), sizeof(word), what);
  return word;
}

std::string tokenProof(const std::string& token, const std::string& message) {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (!HMAC(EVP_sha256(), token.data(), int(token.size()), reinterpret_cast<const unsigned char*>(message.data()),
            message.size(), digest, &length)) {
    throw CommError("HMAC-SHA256 of the handshake failed (OpenSSL)");
  }
  return toHex(digest, length);
}

bool sameProof(const std::string& expected, const std::string& presented) {
  return expected.size() == presented.size() && CRYPTO_memcmp(expected.data(), presented.data(), expected.size()) == 0;
}

}  // namespace dicomm
