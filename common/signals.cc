#include "common/signals.h"

#include <fmt/format.h>

#include <cstring>

namespace ddpl {

std::string signalName(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  return abbrev ? std::string("SIG") + abbrev : fmt::format("signal {}", signo);
}

std::string describeSignal(int signo) {
  const char* abbrev = sigabbrev_np(signo);
  return abbrev ? fmt::format("signal {} (SIG{})", signo, abbrev) : fmt::format("signal {}", signo);
}

}  // namespace ddpl
