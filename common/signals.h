#pragma once
// Signal names, written once for every program (the CLI's messages, the supervisor's exit
// descriptions, the agent's log lines).
#include <string>

namespace ddpl {

// "SIGUSR1"; "signal 77" for a number the C library has no name for.
std::string signalName(int signo);

// "signal 9 (SIGKILL)"; "signal 77" without a name: how a worker's exit by signal is described.
std::string describeSignal(int signo);

}  // namespace ddpl
