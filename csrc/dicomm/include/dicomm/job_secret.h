// Secrets of a job: random draws from the kernel that fail loudly instead of weakly, and proofs
// that a party holds the job token (HMAC-SHA256 from OpenSSL's libcrypto) without sending it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace dicomm {

// `bytes` random bytes from getrandom(2) as lowercase hex; a failed or short draw throws
// CommError "cannot draw <what> (getrandom: <reason>)", never returns weaker randomness.
std::string randomHex(size_t bytes, const std::string& what);

// A random 64-bit word from the same checked source.
uint64_t randomWord(const std::string& what);

// HMAC-SHA256(key = token, message) as lowercase hex.
std::string tokenProof(const std::string& token, const std::string& message);

// Whether two proofs are equal, in time that does not depend on where they differ.
bool sameProof(const std::string& expected, const std::string& presented);

}  // namespace dicomm
