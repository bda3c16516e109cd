#include "rendezvous/store/token.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "common/defaults.h"
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

EnvironmentToken rdzvTokenFromEnvironment(const Environment& env, const std::string& program) {
  const auto value = [&](const char* name) -> const std::string* {
    auto it = env.find(name);
    return it == env.end() ? nullptr : &it->second;
  };
  const std::string* current = value(envvar::kRdzvToken);
  const std::string* legacy = value(envvar::kLegacyRdzvToken);
  EnvironmentToken out;
  if (current) {
    if (current->empty())
      throw InvalidArgument(
          fmt::format("{} is set but empty: unset it or give a token", envvar::kRdzvToken));
    out.token = *current;
    if (legacy && !legacy->empty() && *legacy != *current && !value(envvar::kStoreAddr)) {
      out.warning =
          fmt::format("{}: {} and {} are both set and differ; using {} ({} is the old name)",
                      program, envvar::kRdzvToken, envvar::kLegacyRdzvToken, envvar::kRdzvToken,
                      envvar::kLegacyRdzvToken);
    }
    return out;
  }
  // An empty old name meant "no token" to rdzv-server before, and launch never read it: keep that.
  if (!legacy || legacy->empty() || value(envvar::kStoreAddr)) return out;
  out.token = *legacy;
  out.warning = fmt::format(
      "{}: the rendezvous token comes from {}, the old name; set {} instead (the one name launch "
      "and "
      "rdzv-server both read; {} is what launch sets for each worker)",
      program, envvar::kLegacyRdzvToken, envvar::kRdzvToken, envvar::kStoreToken);
  return out;
}

}  // namespace ddpl::rdzv
