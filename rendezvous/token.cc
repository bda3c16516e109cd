#include "rendezvous/token.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/errors.h"

namespace ddpl::rdzv {

std::string readTokenFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw AuthError(fmt::format("cannot read token file {}: {}", path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw AuthError(fmt::format("cannot read token file {}", path));
  std::string token = ss.str();
  while (!token.empty() && (token.back() == '\n' || token.back() == '\r' || token.back() == ' ' ||
                            token.back() == '\t'))
    token.pop_back();
  if (token.empty()) throw AuthError(fmt::format("token file {} is empty", path));
  return token;
}

bool constantTimeEquals(const std::string& a, const std::string& b) {
  // Walk the longer input in full so that the time does not reveal a matching prefix.
  size_t n = std::max(a.size(), b.size());
  volatile unsigned char diff = static_cast<unsigned char>(a.size() != b.size());
  for (size_t i = 0; i < n; ++i) {
    unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff = diff | static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace ddpl::rdzv
