#pragma once
// The control plane's shared secret: how it is read and how it is compared.
#include <optional>
#include <string>

#include "common/environment.h"

namespace ddpl::rdzv {

// Reads a token file; trailing whitespace and newlines are dropped. An unreadable or empty
// file throws ddpl::AuthError naming the path: a configured token that silently turned into
// "no token" would open the server to anyone.
std::string readTokenFile(const std::string& path);

// The rendezvous token from the environment, for `launch` and `rdzv-server` alike: DDPL_RDZV_TOKEN
// (common/defaults.h). The old name rdzv-server read, DDPL_STORE_TOKEN, is accepted when
// DDPL_RDZV_TOKEN is absent, with a warning naming both; it is ignored where DDPL_STORE_ADDR is
// also set, because there it is the worker token another launch gave this process (a launch or
// server started from inside a worker), not a secret meant for this program, and when it is empty
// (which meant "no token" to rdzv-server before). DDPL_RDZV_TOKEN set but empty throws
// InvalidArgument: a configured token that silently became "no token" would open the server to
// anyone. `program` names the caller in messages.
struct EnvironmentToken {
  std::optional<std::string> token;  // none: no token configured
  std::string warning;               // non-empty: log it once
};
EnvironmentToken rdzvTokenFromEnvironment(const Environment& env, const std::string& program);

// Compares in time that depends only on the lengths, never on where the bytes differ.
bool constantTimeEquals(const std::string& a, const std::string& b);

}  // namespace ddpl::rdzv
