#pragma once
// Everything `launch` was asked to do, parsed once in main (launcher/cli/cli.h) from the command
// line and PET_* environment variables. Plain data with defaults, as torchrun's flags.
#include <chrono>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/defaults.h"

namespace ddpl::launcher {

inline constexpr int kDefaultMasterPort = defaults::kMasterPort;
inline constexpr int kDefaultRdzvPort = defaults::kRdzvPort;
inline constexpr double kDefaultShutdownTimeoutSec = defaults::kShutdownTimeout.count();
inline constexpr double kDefaultMonitorIntervalSec = 0.1;

// The live view: a status line on a terminal (kLive), a periodic log line (kLog), or the one
// that fits the console (kAuto).
enum class MonitorMode { kAuto, kLive, kLog, kOff };
// Sanity bounds: far above any real machine or job, far below what would exhaust memory.
inline constexpr int kMaxNprocPerNode = 1024;
inline constexpr int kMaxNodes = 65536;
// A run id names a directory and a cgroup (with a pid and a suffix added): well below NAME_MAX.
inline constexpr size_t kMaxRunIdLength = 128;

// Which of a worker's streams go to files (redirect: files only; tee: files and console).
struct StreamSelection {
  bool stdout_ = false;
  bool stderr_ = false;
};

// torchrun's -r/-t value: one selection for every local rank, or one per local rank.
struct StreamSpec {
  StreamSelection all;
  std::map<int, StreamSelection> per_rank;
  StreamSelection forRank(int local_rank) const {
    auto it = per_rank.find(local_rank);
    return it == per_rank.end() ? all : it->second;
  }
};

enum class NprocKind { kNumber, kGpu, kCpu, kAuto };

struct NprocSpec {
  NprocKind kind = NprocKind::kNumber;
  int number = 1;
};

enum class TargetKind {
  kAuto,      // an executable runs directly, anything else under python
  kModule,    // -m: python -m MODULE
  kNoPython,  // --no-python: exec as given
};

// Typed --rdzv-conf (torchrun's keys plus ours), validated by the parser.
struct RdzvConf {
  double join_timeout_sec = defaults::kJoinTimeout.count();
  double last_call_timeout_sec = defaults::kLastCallTimeout.count();
  double read_timeout_sec = 60;
  double heartbeat_timeout_sec =
      defaults::kHeartbeatWindow.count();  // when this agent hosts the service
  double exit_barrier_timeout_sec = 300;
  std::optional<bool> is_host;      // unset: host when the endpoint names this machine
  std::optional<bool> agent_store;  // unset: on unless TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1
  std::string token_file;
  std::string tls_ca_file;
  // Keys only the etcd backend reads, as given (launcher/membership/etcd/etcd_config.h checks
  // their values).
  std::map<std::string, std::string> etcd;
};

// --numa-binding (torchrun 2.9's modes): which CPUs and memory each local rank is bound to.
enum class NumaBinding { kNone, kNode, kSocket, kExclusive, kCoreComplex };

struct LaunchOptions {
  // Topology.
  int nnodes_min = 1;
  int nnodes_max = 1;
  NprocSpec nproc_per_node;
  int node_rank = 0;
  bool standalone = false;

  // Rendezvous (single node uses the local handler; multi-node comes with the gRPC service).
  std::string rdzv_backend = "static";
  std::string rdzv_endpoint;
  std::string rdzv_id;  // empty: a random id is generated
  RdzvConf rdzv_conf;
  std::string master_addr = "127.0.0.1";
  std::string rdzv_token;  // read once in main from --rdzv-conf token_file or DDPL_RDZV_TOKEN
  std::optional<int> master_port;  // unset: a free port is picked per attempt
  std::string local_addr;
  // The agent hosts the job's TCPStore (TORCHELASTIC_USE_AGENT_STORE=True), as torchrun's
  // does: --rdzv-conf agent_store, else off when TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1.
  bool agent_store = true;

  // Supervision.
  int max_restarts = 0;
  double monitor_interval_sec = kDefaultMonitorIntervalSec;  // how often heartbeats are read
  MonitorMode monitor = MonitorMode::kAuto;
  double monitor_log_interval_sec = 60;
  std::optional<int> metrics_port;  // --metrics-port: the Prometheus endpoint
  std::string metrics_host = "0.0.0.0";
  // --dashboard[=HOST:PORT]: the job's web page (web/dashboard.h); loopback
  // unless told otherwise.
  std::optional<int> dashboard_port;
  std::string dashboard_host = "127.0.0.1";
  // Hang detection (launcher/health/progress.h HangOptions): unset, automatic for ranks that report
  // steps; 0, off; otherwise the limit for every rank.
  std::optional<double> hang_timeout_sec;
  double hang_first_timeout_sec = 1800;
  double hang_finish_timeout_sec = 600;  // a rank past its last step: its teardown's limit
  double shutdown_timeout_sec = kDefaultShutdownTimeoutSec;
  std::vector<int> signals_to_handle;  // filled with SIGTERM,SIGINT,SIGHUP,SIGQUIT by default
  std::string role = "default";

  // Logs.
  std::string log_dir;  // empty: a temporary directory, removed at exit
  StreamSpec redirects;
  StreamSpec tee;
  std::vector<int> local_ranks_filter;  // empty: show every local rank on the console
  std::string log_level = "info";
  // torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: ${role_name}, ${local_rank}, ${rank}.
  std::string log_line_prefix_template = "[${role_name}${local_rank}]:";
  bool prefix_output = true;  // --no-prefix: worker lines reach the console as written
  // torchrun's --duplicate-stdout-filters/--duplicate-stderr-filters: tee'd lines holding any
  // of these strings are copied to attempt_<n>/filtered_stdout.log (filtered_stderr.log).
  // Empty: no such file.
  std::vector<std::string> duplicate_stdout_filters;
  std::vector<std::string> duplicate_stderr_filters;

  // Checkpoints in memory (launcher/checkpoint/memory_tier.h, docs/checkpoints.md).
  // Bytes of memory per local rank: unset, automatic (a quarter of /dev/shm over the local
  // ranks); 0, the tier is off.
  std::optional<uint64_t> checkpoint_memory;
  int checkpoint_memory_keep = 1;             // committed checkpoints kept in memory per rank
  std::string checkpoint_dir;                 // the durable directory when the program names none
  double checkpoint_drain_timeout_sec = 120;  // at exit: the wait for persistence in progress

  // Warm workers (launcher/warm/, docs/warm-restarts.md): the modules a template process imports
  // once; Python workers are forked from it. Empty: every worker starts cold.
  std::vector<std::string> prewarm;

  // Placement.
  NumaBinding numa_binding = NumaBinding::kNone;
  std::string start_method = "spawn";  // accepted; every worker is a fork+exec'd process
  // torchrun's --virtual-local-rank: every worker sees LOCAL_RANK=0 and only its own device
  // (CUDA_VISIBLE_DEVICES narrowed to the local rank's entry).
  bool virtual_local_rank = false;
  bool use_cgroup = true;  // --cgroup=off: never put the run in a cgroup of its own

  bool elastic() const { return rdzv_backend != "static"; }

  // --launcher=mpi (launcher/mpi/mpi_launch.h): mpirun starts the ranks, launch only builds its
  // command.
  std::string launcher = "native";  // native | mpi
  std::string hostfile;             // empty: this host only
  std::string mpi_args;             // passed through to mpirun, split like a shell
  bool dry_run = false;             // print the mpirun command and exit 0

  // --preflight (launcher/doctor/preflight.h): the fast doctor checks before joining the
  // rendezvous. off | warn (report, run anyway) | strict (a failed check stops this node before any
  // worker starts).
  std::string preflight = "warn";

  // --print-completion SHELL: print the completion script (cli.h completionScript) and exit.
  std::string print_completion;

  // What the parser accepted but the user should hear about (keys without effect here, unknown
  // --rdzv-conf keys): main logs them once logging is up.
  std::vector<std::string> warnings;

  // What to run.
  // The interpreter for a .py PROGRAM and -m when PYTHON_EXEC is unset: main sets it to the
  // one of the environment launch was installed in (as torchrun runs scripts under its own
  // interpreter); empty: python3 from PATH.
  std::string python;
  TargetKind target_kind = TargetKind::kAuto;
  std::string program;
  std::vector<std::string> program_args;
};

}  // namespace ddpl::launcher
