#pragma once
// torchrun-compatible command-line parsing. Pure: takes argv and the environment as values, so
// it is unit-tested without touching the process.
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "common/errors.h"
#include "common/signals.h"
#include "launcher/cli/options.h"

namespace ddpl::launcher {

struct ParseResult {
  // kCompletion: print completionScript(options.print_completion) and exit.
  enum class Action { kRun, kHelp, kVersion, kCompletion };
  Action action = Action::kRun;
  LaunchOptions options;
  std::vector<std::string> given_flags;  // canonical names set by the command line or PET_*
};

// `args` excludes argv[0]. Flags stop at the first positional argument (the program); every
// argument after it belongs to the program. Flags fall back to PET_<NAME> from `env`.
ParseResult parseCommandLine(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& env);

std::string helpText();

// A completion script for launch's options in `shell` (bash, zsh or tcsh), made from the flag
// table as torchrun's --print-completion makes its own from its parser.
std::string completionScript(const std::string& shell);

// Exposed for tests and for error messages elsewhere.
// "SIGUSR1", "USR1" or "10"; throws UsageError naming `source` (the flag or variable).
int parseSignalName(const std::string& name, const std::string& source = "--signals-to-handle");
StreamSpec parseStreamSpec(const std::string& flag, const std::string& value);
// torchrun's keys are mapped where they mean something here; keys without effect here and
// unknown keys are accepted with a line added to `warnings` (when given).
RdzvConf parseRdzvConf(const std::string& value, std::vector<std::string>* warnings = nullptr);

// Throws UsageError for inconsistent --nnodes/--node-rank/--rdzv-* combinations and for a run
// id that cannot name a directory. A one-node c10d job on HOST:0 (torchx) becomes --standalone,
// which is what torchrun makes of it: its own rendezvous on a free port.
void validateTopology(LaunchOptions& options);

// Expands Slurm's compressed node lists: "n[1-3,7],gpu05" -> n1 n2 n3 n7 gpu05.
std::vector<std::string> expandSlurmNodeList(const std::string& list);

// Inside a Slurm allocation of several nodes, fills what `srun launch PROGRAM` leaves out:
// nodes, rendezvous on the allocation's first node, run id from the job id. Flags the user
// gave (or PET_ variables) win. Returns a line for the log, or "" when nothing was applied.
std::string applySlurmDefaults(LaunchOptions& options, const std::vector<std::string>& given_flags,
                               const std::map<std::string, std::string>& env);

}  // namespace ddpl::launcher
