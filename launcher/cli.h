#pragma once
// torchrun-compatible command-line parsing. Pure: takes argv and the environment as values, so
// it is unit-tested without touching the process.
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "launcher/options.h"

namespace ddpl::launcher {

// A bad flag or value. `launch` prints what() and exits with kUsageExitCode.
class UsageError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

inline constexpr int kUsageExitCode = 2;

struct ParseResult {
  enum class Action { kRun, kHelp, kVersion };
  Action action = Action::kRun;
  LaunchOptions options;
};

// `args` excludes argv[0]. Flags stop at the first positional argument (the program); every
// argument after it belongs to the program. Flags fall back to PET_<NAME> from `env`.
ParseResult parseCommandLine(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& env);

std::string helpText();

// Exposed for tests and for error messages elsewhere.
int parseSignalName(const std::string& name);  // "SIGUSR1", "USR1" or "10"; throws UsageError
std::string signalName(int signo);              // "SIGUSR1"; "signal 77" when unknown
StreamSpec parseStreamSpec(const std::string& flag, const std::string& value);

}  // namespace ddpl::launcher
