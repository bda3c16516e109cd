#pragma once
// Address facts shared by the launcher and the rendezvous server, without I/O.
#include <string>

namespace ddpl {

// "localhost", 127.0.0.0/8 or ::1, as written (no name is resolved).
inline bool isLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

}  // namespace ddpl
