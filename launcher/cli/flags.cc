#include "launcher/cli/flags.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>

#include "common/parse.h"
#include "launcher/cli/cli.h"
#include "launcher/cli/values.h"
#include "launcher/warm/warm_plan.h"

namespace ddpl::launcher::cli {
namespace {

// The defaults the --help texts below state.
static_assert(defaults::kRdzvPort == 29400, "update launch's --help text for --rdzv-endpoint");

NprocSpec parseNproc(const std::string& flag, const std::string& v) {
  if (v == "gpu") return {NprocKind::kGpu, 0};
  if (v == "cpu") return {NprocKind::kCpu, 0};
  if (v == "auto") return {NprocKind::kAuto, 0};
  if (v == "xpu")  // torchrun 2.10+: one worker per Intel XPU
    throw UsageError(fmt::format(
        "{}=xpu: launch counts NVIDIA GPUs only; give the number of XPUs (e.g. {}=4)", flag, flag));
  try {
    return {NprocKind::kNumber, parseInt(flag, v, 1, kMaxNprocPerNode)};
  } catch (const InvalidArgument& e) {
    throw UsageError(fmt::format("{}: '{}' is not a number from 1 to {}, 'gpu', 'cpu' or 'auto'",
                                 flag, v, kMaxNprocPerNode));
  }
}

void parseNnodes(const std::string& flag, const std::string& v, LaunchOptions& o) {
  auto colon = v.find(':');
  if (colon == std::string::npos) {
    o.nnodes_min = o.nnodes_max = parseInt(flag, v, 1, kMaxNodes);
  } else {
    o.nnodes_min = parseInt(flag, v.substr(0, colon), 1, kMaxNodes);
    o.nnodes_max = parseInt(flag, v.substr(colon + 1), 1, kMaxNodes);
  }
  if (o.nnodes_min > o.nnodes_max)
    throw UsageError(fmt::format("{}: minimum {} is greater than maximum {} in '{}'", flag,
                                 o.nnodes_min, o.nnodes_max, v));
}

}  // namespace

const std::vector<Flag>& flags() {
  static const std::vector<Flag> kFlags = {
      {{"--nnodes"},
       true,
       "N|MIN:MAX",
       "number of nodes, or elastic MIN:MAX (default 1:1)",
       [](auto& f, auto& v, auto& o) { parseNnodes(f, v, o); }},
      {{"--nproc-per-node"},
       true,
       "N|gpu|cpu|auto",
       "workers per node: a number, the GPU count, the CPU count, or GPUs if any else CPUs "
       "(default 1)",
       [](auto& f, auto& v, auto& o) { o.nproc_per_node = parseNproc(f, v); }},
      {{"--standalone"},
       false,
       "",
       "single node with a local rendezvous on a free port",
       [](auto& f, auto& v, auto& o) { o.standalone = parseBool(f, v); }},
      {{"--node-rank"},
       true,
       "N",
       "rank of this node for static rendezvous (default 0)",
       [](auto& f, auto& v, auto& o) { o.node_rank = parseInt(f, v, 0); }},
      {{"--rdzv-backend"},
       true,
       "NAME",
       "static, c10d or ddpl, etcd (default static)",
       [](auto& f, auto& v, auto& o) {
         if (v != "static" && v != "c10d" && v != "ddpl" && v != "etcd" && v != "etcd-v2")
           throw UsageError(fmt::format(
               "{}: '{}' is not supported: use static, c10d/ddpl for our gRPC rendezvous, or etcd",
               f, v));
         // torchrun's two etcd backends speak etcd's v2 API; ours speaks v3 for both names.
         o.rdzv_backend = v == "etcd-v2" ? "etcd" : v;
       }},
      {{"--rdzv-endpoint"},
       true,
       "HOST[:PORT]",
       "rendezvous service address (default port 29400; [IPv6]:PORT)",
       [](auto& f, auto& v, auto& o) {
         // checked here, once; etcd's lists and URLs by the etcd backend
         if (!trim(v).empty() && v.find(',') == std::string::npos &&
             v.find("://") == std::string::npos)
           endpointPort(f, trim(v));
         o.rdzv_endpoint = trim(v);
       }},
      {{"--rdzv-id"},
       true,
       "ID",
       "job id shared by every node (default: random)",
       [](auto& f, auto& v, auto& o) {
         checkRunId(f, v);
         o.rdzv_id = v;
       }},
      {{"--rdzv-conf"},
       true,
       "K=V,...",
       "join_timeout, last_call_timeout, read_timeout, is_host, heartbeat_timeout, "
       "exit_barrier_timeout (seconds), token_file, tls_ca_file, agent_store (0: rank 0 hosts "
       "the job's TCPStore)",
       [](auto&, auto& v, auto& o) { o.rdzv_conf = parseRdzvConf(v, &o.warnings); }},
      {{"--master-addr"},
       true,
       "ADDR",
       "address of the job's TCPStore when rank 0 hosts it (default 127.0.0.1)",
       [](auto& f, auto& v, auto& o) {
         if (v.empty()) throw UsageError(fmt::format("{}: empty address", f));
         o.master_addr = v;
       }},
      {{"--master-port"},
       true,
       "PORT",
       "port of rank 0's store (default: a free port)",
       [](auto& f, auto& v, auto& o) {
         int p = parsePort(f, v, /*allow_zero=*/true);
         if (p == 0)
           o.master_port.reset();
         else
           o.master_port = p;
       }},
      {{"--local-addr"},
       true,
       "ADDR",
       "address this node advertises",
       [](auto&, auto& v, auto& o) { o.local_addr = v; }},
      {{"--max-restarts"},
       true,
       "N",
       "group restarts allowed after a worker fails (default 0)",
       [](auto& f, auto& v, auto& o) { o.max_restarts = parseInt(f, v, 0, 1'000'000); }},
      {{"--hang-timeout"},
       true,
       "SECONDS",
       "a rank making no progress this long is hung: its stacks and every rank's are saved, "
       "the group stops and restarts as for a failure (exit 124 when out of restarts). "
       "Default: automatic for ranks that report steps (DDPL_HEARTBEAT_FD): 10x their slowest "
       "step, at least 600 s; 0 turns detection off. Given, ranks that report no steps count "
       "as hung after this long idle (under 2% of a core, their child processes included, and "
       "no output) while no rank of the node works",
       [](auto& f, auto& v, auto& o) { o.hang_timeout_sec = parseNumber(f, v, 0, 1e7); }},
      {{"--hang-first-timeout"},
       true,
       "SECONDS",
       "a rank with no step yet while others report steps is hung this long after its start "
       "(default 1800: model loading takes time)",
       [](auto& f, auto& v, auto& o) { o.hang_first_timeout_sec = parseNumber(f, v, 1, 1e7); }},
      {{"--hang-finish-timeout"},
       true,
       "SECONDS",
       "a rank that reported its last step (ddplaunch.done(), or its interpreter's exit) is "
       "tearing down, not hung, until this long after it (default 600, or its hang limit if "
       "longer): then it is hung",
       [](auto& f, auto& v, auto& o) { o.hang_finish_timeout_sec = parseNumber(f, v, 1, 1e7); }},
      {{"--monitor-interval"},
       true,
       "SECONDS",
       "how often the workers' heartbeats are read (default 0.1); exits are noticed at once",
       [](auto& f, auto& v, auto& o) { o.monitor_interval_sec = parseNumber(f, v, 0.001, 3600); }},
      {{"--monitor"},
       true,
       "auto|live|log|off",
       "the live view of the ranks (steps/s, slowest rank, CPU%, memory, GPU): auto (default) "
       "keeps a status line at the bottom of a terminal and logs a line every "
       "--monitor-log-interval otherwise; live or log force one; off: neither",
       [](auto& f, auto& v, auto& o) {
         if (v == "auto")
           o.monitor = MonitorMode::kAuto;
         else if (v == "live")
           o.monitor = MonitorMode::kLive;
         else if (v == "log")
           o.monitor = MonitorMode::kLog;
         else if (v == "off")
           o.monitor = MonitorMode::kOff;
         else
           throw UsageError(fmt::format("{}: '{}' is not auto, live, log or off", f, v));
       }},
      {{"--metrics-port"},
       true,
       "PORT",
       "serve Prometheus metrics of this node's ranks on PORT (step, step time, CPU, memory, GPU, "
       "restarts, hangs, stragglers: docs/monitoring.md); 0 picks a free port, logged at start",
       [](auto& f, auto& v, auto& o) { o.metrics_port = parseInt(f, v, 0, 65535); }},
      {{"--metrics-host"},
       true,
       "ADDRESS",
       "the address --metrics-port listens on (default 0.0.0.0: every IPv4 interface)",
       [](auto& f, auto& v, auto& o) { o.metrics_host = parseListenHost(f, v); }},
      {{"--dashboard"},
       false,
       "",
       "serve the job's web page (every rank's state, step time, CPU, memory, GPU, last line; "
       "plots; stacks) on 127.0.0.1 at a free port, or --dashboard=HOST:PORT (beyond loopback "
       "it asks for the job's token)",
       [](auto& f, auto& v, auto& o) {
         if (v == "1" || v.empty()) {
           o.dashboard_port = 0;
           return;
         }
         auto colon = v.rfind(':');
         if (colon == std::string::npos) {
           o.dashboard_port = parseInt(f, v, 0, 65535);
           return;
         }
         if (colon == 0)
           throw UsageError(f + "=" + v + ": no host before ':' (HOST:PORT, e.g. 127.0.0.1:8265)");
         o.dashboard_host = parseListenHost(f, v.substr(0, colon));
         o.dashboard_port = parseInt(f, v.substr(colon + 1), 0, 65535);
       }},
      {{"--monitor-log-interval"},
       true,
       "SECONDS",
       "how often the view is logged when it is not a status line (default 60)",
       [](auto& f, auto& v, auto& o) { o.monitor_log_interval_sec = parseNumber(f, v, 1, 86400); }},
      {{"--shutdown-timeout"},
       true,
       "SECONDS",
       "grace between SIGTERM and SIGKILL when stopping workers (default 30)",
       [](auto& f, auto& v, auto& o) { o.shutdown_timeout_sec = parseSeconds(f, v); }},
      {{"--signals-to-handle"},
       true,
       "SIG,...",
       "signals forwarded to workers (default SIGTERM,SIGINT,SIGHUP,SIGQUIT); TERM, INT, HUP "
       "and QUIT also stop the job, others (e.g. SIGUSR1 for Slurm preemption) are only "
       "forwarded",
       [](auto& f, auto& v, auto& o) {
         o.signals_to_handle.clear();
         for (const auto& s : split(v, ','))
           if (!s.empty()) o.signals_to_handle.push_back(parseSignalName(s, f));
       }},
      {{"--role"},
       true,
       "NAME",
       "role name, used in log prefixes (default 'default')",
       // Empty is accepted, as torchrun does (torchx's dist.ddp passes --role ''): ROLE_NAME=''.
       [](auto&, auto& v, auto& o) { o.role = v; }},
      {{"--checkpoint-memory"},
       true,
       "SIZE|auto",
       "memory per local rank for checkpoints in memory (ddplaunch.checkpoint, the C++ "
       "CheckpointManager): 512M, 4G; auto (default): a quarter of /dev/shm over the local "
       "ranks; 0: off, checkpoints go straight to disk",
       [](auto& f, auto& v, auto& o) {
         if (v == "auto")
           o.checkpoint_memory.reset();
         else
           o.checkpoint_memory = parseSize(f, v);
       }},
      {{"--checkpoint-memory-keep"},
       true,
       "K",
       "committed checkpoints kept in memory per rank (default 1; one more may be being "
       "written)",
       [](auto& f, auto& v, auto& o) { o.checkpoint_memory_keep = parseInt(f, v, 1, 100); }},
      {{"--checkpoint-dir"},
       true,
       "DIR",
       "where checkpoints in memory are persisted when the program names no directory "
       "(DDPL_CHECKPOINT_DIR in the workers)",
       [](auto& f, auto& v, auto& o) {
         if (v.empty()) throw UsageError(fmt::format("{}: empty directory", f));
         o.checkpoint_dir = v;
       }},
      {{"--checkpoint-drain-timeout"},
       true,
       "SECONDS",
       "at the end of the run, how long launch waits for checkpoints still being persisted "
       "(default 120)",
       [](auto& f, auto& v, auto& o) {
         o.checkpoint_drain_timeout_sec = parseNumber(f, v, 0, 1e6);
       }},
      {{"--prewarm"},
       true,
       "MODULES",
       "import these Python modules (e.g. torch) once, in a template process, and fork every "
       "Python worker, first starts and restarts alike, from it: a restart skips the imports. "
       "Falls back to cold starts, saying why, where forking is unsafe (docs/warm-restarts.md)",
       [](auto& f, auto& v, auto& o) { o.prewarm = warm::parseModules(f, v); }},
      {{"--log-dir"},
       true,
       "DIR",
       "keep logs and error files in DIR/<run_id>/attempt_<n>/<local_rank>/",
       [](auto&, auto& v, auto& o) { o.log_dir = v; }},
      {{"--redirects", "-r"},
       true,
       "0-3|R:C,...",
       "send worker streams to log files only: 0 none, 1 stdout, 2 stderr, 3 both",
       [](auto& f, auto& v, auto& o) { o.redirects = parseStreamSpec(f, v); }},
      {{"--tee", "-t"},
       true,
       "0-3|R:C,...",
       "copy worker streams to log files and the console",
       [](auto& f, auto& v, auto& o) { o.tee = parseStreamSpec(f, v); }},
      {{"--local-ranks-filter"},
       true,
       "R,...",
       "show only these local ranks on the console",
       [](auto& f, auto& v, auto& o) {
         o.local_ranks_filter.clear();
         for (const auto& s : split(v, ','))
           if (!s.empty()) o.local_ranks_filter.push_back(parseInt(f, s, 0, kMaxNprocPerNode - 1));
       }},
      {{"--duplicate-stdout-filters"},
       true,
       "S,...",
       "copy the tee'd stdout lines (--tee 1 or 3, ranks --local-ranks-filter shows) that hold "
       "any of these strings, prefixed, to attempt_<n>/filtered_stdout.log in the run's log "
       "directory, every rank in one file; ',,' is a literal comma (as torchrun)",
       [](auto&, auto& v, auto& o) { o.duplicate_stdout_filters = parseFilterList(v); }},
      {{"--duplicate-stderr-filters"},
       true,
       "S,...",
       "the same for tee'd stderr lines (--tee 2 or 3): attempt_<n>/filtered_stderr.log",
       [](auto&, auto& v, auto& o) { o.duplicate_stderr_filters = parseFilterList(v); }},
      {{"--log-line-prefix-template"},
       true,
       "TEMPLATE",
       "console prefix of worker lines, as torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: "
       "${role_name}, ${local_rank}, ${rank}, ${hostname} (default "
       "'[${role_name}${local_rank}]:')",
       [](auto&, auto& v, auto& o) {
         if (!v.empty()) o.log_line_prefix_template = v;
       }},
      {{"--no-prefix"},
       false,
       "",
       "show worker lines on the console without a prefix",
       [](auto& f, auto& v, auto& o) { o.prefix_output = !parseBool(f, v); }},
      {{"--module", "-m"},
       false,
       "",
       "run PROGRAM as a Python module (python -m)",
       [](auto& f, auto& v, auto& o) {
         if (parseBool(f, v)) o.target_kind = TargetKind::kModule;
       }},
      {{"--no-python"},
       false,
       "",
       "exec PROGRAM as given, never under python",
       [](auto& f, auto& v, auto& o) {
         if (parseBool(f, v)) o.target_kind = TargetKind::kNoPython;
       }},
      {{"--start-method"},
       true,
       "spawn|fork|forkserver",
       "accepted for torchrun compatibility: launch always fork+execs each worker as a fresh "
       "process, which is what spawn gives a script",
       [](auto& f, auto& v, auto& o) {
         if (v != "spawn" && v != "fork" && v != "forkserver")
           throw UsageError(fmt::format("{}: '{}' is not spawn, fork or forkserver", f, v));
         o.start_method = v;
       }},
      {{"--event-log-handler"},
       true,
       "null|console",
       "torchrun's event log: null (default) or console (launch's own log already records "
       "every start, failure and restart)",
       [](auto& f, auto& v, auto&) {
         if (v != "null" && v != "console")
           throw UsageError(fmt::format(
               "{}: '{}' is not a handler launch has: use null or console (Python entry points "
               "are not loaded)",
               f, v));
       }},
      {{"--logs-specs"},
       true,
       "NAME",
       "torchrun's LogsSpecs entry point: launch always writes torchrun's default layout "
       "(see --log-dir) and warns that NAME is not loaded",
       [](auto&, auto& v, auto& o) {
         if (!v.empty() && v != "default")
           o.warnings.push_back(fmt::format(
               "--logs-specs={}: custom LogsSpecs entry points are Python classes that launch "
               "does not load; logs use torchrun's default layout under --log-dir",
               v));
       }},
      {{"--numa-binding"},
       true,
       "node|socket|exclusive|core-complex",
       "bind each local rank's CPUs and memory to the NUMA node of its GPU (local rank i uses "
       "GPU i); without GPUs, ranks are spread over the NUMA nodes. socket: the whole socket; "
       "exclusive: a disjoint share of the node's CPUs; core-complex: one L3 cache's CPUs",
       [](auto& f, auto& v, auto& o) {
         if (v == "node")
           o.numa_binding = NumaBinding::kNode;
         else if (v == "socket")
           o.numa_binding = NumaBinding::kSocket;
         else if (v == "exclusive")
           o.numa_binding = NumaBinding::kExclusive;
         else if (v == "core-complex")
           o.numa_binding = NumaBinding::kCoreComplex;
         else
           throw UsageError(
               fmt::format("{}: '{}' is not node, socket, exclusive or core-complex", f, v));
       }},
      {{"--virtual-local-rank"},
       false,
       "",
       "every worker sees LOCAL_RANK=0 and only its own device: CUDA_VISIBLE_DEVICES (and "
       "HIP_VISIBLE_DEVICES when set) narrowed to the local rank's entry of launch's own, or to "
       "the local rank's index when unset (RANK and the rest unchanged)",
       [](auto& f, auto& v, auto& o) { o.virtual_local_rank = parseBool(f, v); }},
      {{"--cgroup"},
       true,
       "auto|off",
       "auto (default): run the workers in a cgroup v2 of their own where the machine allows, "
       "so that nothing they start outlives the run; off: never (orphans are still found as "
       "launch's subreaper children)",
       [](auto& f, auto& v, auto& o) {
         if (v != "auto" && v != "off")
           throw UsageError(fmt::format("{}: '{}' is not auto or off", f, v));
         o.use_cgroup = v == "auto";
       }},
      {{"--run-path"},
       false,
       "",
       "not supported: launch always runs workers as processes",
       [](auto& f, auto&, auto&) {
         throw UsageError(fmt::format(
             "{} is not supported: launch runs every worker as its own process; drop the flag "
             "(a .py PROGRAM already runs under python)",
             f));
       }},
      {{"--launcher"},
       true,
       "native|mpi",
       "native: launch supervises the workers (default); mpi: run the job with OpenMPI's mpirun "
       "(docs/mpi.md)",
       [](auto& f, auto& v, auto& o) {
         if (v != "native" && v != "mpi")
           throw UsageError(fmt::format("{}: '{}' is not native or mpi", f, v));
         o.launcher = v;
       }},
      {{"--hostfile"},
       true,
       "FILE",
       "with --launcher=mpi: hosts and slots, as OpenMPI's hostfile",
       [](auto& f, auto& v, auto& o) {
         if (v.empty()) throw UsageError(fmt::format("{}: empty file name", f));
         o.hostfile = v;
       }},
      {{"--mpi-args"},
       true,
       "\"ARGS\"",
       "with --launcher=mpi: extra mpirun arguments (binding, mapping, -x VAR), split like a shell",
       [](auto&, auto& v, auto& o) { o.mpi_args = v; }},
      {{"--dry-run"},
       false,
       "",
       "with --launcher=mpi: print the mpirun command and exit",
       [](auto& f, auto& v, auto& o) { o.dry_run = parseBool(f, v); }},
      {{"--preflight"},
       true,
       "off|warn|strict",
       "before joining the rendezvous, run the fast checks of `launch doctor` (driver, GPUs, "
       "CUDA_VISIBLE_DEVICES, NCCL/Gloo interfaces, /dev/shm, limits, disk, endpoints): warn "
       "(default) reports problems, strict also stops this node on a failed check, off skips "
       "them. In a multi-node job rank 0 prints every node's findings in one table",
       [](auto& f, auto& v, auto& o) {
         if (v != "off" && v != "warn" && v != "strict")
           throw UsageError(fmt::format("{}: '{}' is not off, warn or strict", f, v));
         o.preflight = v;
       }},
      {{"--print-completion"},
       true,
       "bash|zsh|tcsh",
       "print a shell completion script for launch's options and exit (as torchrun's, which "
       "needs shtab; launch's needs nothing)",
       [](auto& f, auto& v, auto& o) {
         if (v != "bash" && v != "zsh" && v != "tcsh")
           throw UsageError(fmt::format("{}: '{}' is not bash, zsh or tcsh", f, v));
         o.print_completion = v;
       }},
      {{"--log-level"},
       true,
       "LEVEL",
       "launcher log level: debug, info, warn, error (default info)",
       [](auto& f, auto& v, auto& o) {
         static const char* kLevels[] = {"trace", "debug",    "info", "warn",
                                         "error", "critical", "off"};
         if (std::none_of(std::begin(kLevels), std::end(kLevels),
                          [&](const char* l) { return v == l; }))
           throw UsageError(
               fmt::format("{}: '{}' is not one of trace, debug, info, warn, "
                           "error, critical, off",
                           f, v));
         o.log_level = v;
       }},
  };
  return kFlags;
}

const Flag* findFlag(const std::string& name) {
  return flag_table::find(flags(), name, flag_table::Prefixes::kAccept);
}

UsageError unknownOption(const std::string& name) {
  std::vector<std::string> all;
  for (const auto& f : flags()) all.push_back(f.names[0]);
  all.push_back("--help");
  all.push_back("--version");
  std::string near = closestMatch(flag_table::canonical(name), all);
  return UsageError(
      fmt::format("unknown option '{}'{} (see launch --help); options go before "
                  "PROGRAM, the program's own options after it",
                  name, near.empty() ? "" : "; did you mean " + near + "?"));
}

void applyFlag(const Flag& f, const std::string& name, const std::string& value, LaunchOptions& o) {
  flag_table::apply(f, name, value, o);
}

std::string petName(const Flag& f) { return flag_table::envName("PET_", f.names[0]); }

}  // namespace ddpl::launcher::cli
