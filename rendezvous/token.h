#pragma once
// The control plane's shared secret: how it is read and how it is compared.
#include <string>

namespace ddpl::rdzv {

// Reads a token file; trailing whitespace and newlines are dropped. An unreadable or empty
// file throws ddpl::AuthError naming the path: a configured token that silently turned into
// "no token" would open the server to anyone.
std::string readTokenFile(const std::string& path);

// Compares in time that depends only on the lengths, never on where the bytes differ.
bool constantTimeEquals(const std::string& a, const std::string& b);

}  // namespace ddpl::rdzv
