#pragma once
// `launch --launcher=mpi`: start the job with OpenMPI's mpirun instead of our own supervisor.
// launch only builds the command and execs mpirun (never links MPI); each rank then bootstraps
// through MPI (worker/mpi_env.h). Pure parts (hostfile, command) are unit-tested in
// tests/unit/mpi_launch_test.cc; docs/mpi.md is the user's guide.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/agent/worker_spec.h"
#include "launcher/cli/options.h"

namespace ddpl::launcher {

// One line of an OpenMPI hostfile: "HOST [slots=N] [max_slots=M]", '#' starts a comment.
struct HostfileEntry {
  std::string host;
  std::optional<int> slots;
  std::optional<int> max_slots;
  int line = 0;  // 1-based line in the file
};

// Throws UsageError "hostfile FILE, line N: ..." for an unknown token, a bad number, a host
// listed twice, max_slots below slots, or a file without hosts.
std::vector<HostfileEntry> parseHostfile(const std::string& text, const std::string& file_name);
std::vector<HostfileEntry> readHostfile(const std::string& path);

// --mpi-args "..." split like a shell would: blanks separate words; '...' and "..." quote;
// a backslash escapes the next character. Throws UsageError on an unterminated quote.
std::vector<std::string> splitShellWords(const std::string& text);
// The argv as one line a POSIX shell reads back into the same words (for --dry-run).
std::string shellQuote(const std::vector<std::string>& argv);

// Everything the mpirun command depends on, resolved.
struct MpiJob {
  std::string mpirun = "mpirun";
  std::vector<HostfileEntry> hosts;   // at least one
  std::optional<int> nproc_per_node;  // unset: each host runs its slots (1 when not given)
  bool as_root = false;               // adds --allow-run-as-root
  std::string master_addr;
  int master_port = kDefaultMasterPort;
  std::string run_id;
  std::vector<std::string> mpi_args;  // passed through after ours
  Environment extra_env;              // exported as well (OMP_NUM_THREADS when we set it)
  std::vector<std::string> command;   // the program and its arguments
  // This launch binary: each rank runs `SHIM --mpi-rank-shim -- PROGRAM ARGS`, which sets
  // torchrun's per-rank variables from OpenMPI's and execs the program. Empty: no shim.
  std::string shim;
};

inline constexpr const char* kMpiRankShimFlag = "--mpi-rank-shim";

// The ranks each host gets, in hostfile order.
std::vector<int> ranksPerHost(const MpiJob& job);

// mpirun [--allow-run-as-root] [--oversubscribe] -np W --host h1:s1,... [--map-by ppr:N:node]
//   -x MASTER_ADDR=... -x MASTER_PORT=... -x WORLD_SIZE=... ... [mpi_args] PROGRAM ARGS
// --oversubscribe when a host has fewer slots than ranks; --map-by only when mpi_args set no
// mapping of their own. The per-job torchrun variables are exported to every rank with -x;
// per-rank ones (RANK, LOCAL_RANK) are OpenMPI's OMPI_COMM_WORLD_RANK/_LOCAL_RANK.
std::vector<std::string> buildMpirunCommand(const MpiJob& job);

// Inside a rank (the shim): torchrun's per-rank variables from OpenMPI's OMPI_COMM_WORLD_*:
// RANK, LOCAL_RANK, ROLE_RANK, LOCAL_WORLD_SIZE, GROUP_RANK (from the ranks per host that
// launch exported, when the placement is known), ROLE_NAME and TORCHELASTIC_ERROR_FILE (under
// `error_dir`/<rank>/ when not set). Variables already set are kept. Throws UsageError naming
// a missing or malformed variable.
Environment torchrunEnvFromMpi(const Environment& env, const std::string& error_dir);

// Checks the options that apply to --launcher=mpi, reads the hostfile, resolves the program and
// the rendezvous address. `nproc` is --nproc-per-node resolved, or unset when not given.
// Throws UsageError.
MpiJob planMpiJob(const LaunchOptions& options, const Environment& env, std::optional<int> nproc,
                  const std::vector<std::string>& given_flags);

// --dry-run: prints the command and returns 0. Otherwise execs mpirun (its exit status is the
// job's); returns only on failure, with a message on stderr and exit code 127.
int runMpiLaunch(const LaunchOptions& options, const Environment& env, std::optional<int> nproc,
                 const std::vector<std::string>& given_flags);

}  // namespace ddpl::launcher
