#include "launcher/cli/cli.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstring>
#include <functional>
#include <optional>
#include <set>
#include <sstream>

#include "common/parse.h"
#include "common/torchrun_env.h"
#include "launcher/membership/etcd/etcd_config.h"

namespace ddpl::launcher {
namespace {

// The defaults the --help texts below state.
static_assert(defaults::kRdzvPort == 29400, "update launch's --help text for --rdzv-endpoint");

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t");
  auto e = s.find_last_not_of(" \t");
  return b == std::string::npos ? "" : s.substr(b, e - b + 1);
}

std::vector<std::string> split(const std::string& s, char sep) { return splitList(s, sep); }

// A run id names directories (<log-dir>/<run id>), cgroups and keys: it must never climb out of
// the log directory (../../x) or exceed what a file name may hold (issue 33).
void checkRunId(const std::string& flag, const std::string& id) {
  if (id.empty())
    throw UsageError(fmt::format("{}: empty run id: give the job a name such as 'train-42'", flag));
  if (id.size() > kMaxRunIdLength)
    throw UsageError(fmt::format("{}: the run id is {} characters long; at most {} are allowed",
                                 flag, id.size(), kMaxRunIdLength));
  for (unsigned char c : id)
    if (!std::isalnum(c) && std::strchr("._-:@+=", c) == nullptr)
      throw UsageError(fmt::format(
          "{}: '{}' has the character '{}' ({:#04x}); a run id may use letters, digits and "
          "._-:@+= only",
          flag, id.size() > 64 ? id.substr(0, 64) + "..." : id,
          std::isprint(c) ? std::string(1, static_cast<char>(c)) : std::string("?"), c));
  if (id.front() == '.' || id.front() == '-')
    throw UsageError(fmt::format("{}: '{}' starts with '{}'; start a run id with a letter or digit",
                                 flag, id, id.front()));
}

// HOST[:PORT] of --rdzv-endpoint; port 0 is accepted (torchx's single-node jobs pass
// localhost:0, which torchrun reads as "pick a free port"); validateTopology says where it
// cannot work.
int endpointPort(const std::string& flag, const std::string& v) {
  if (v.size() > 2 && v.compare(v.size() - 2, 2, ":0") == 0 &&
      std::count(v.begin(), v.end(), ':') == 1) {
    parseHostPort(flag, v.substr(0, v.size() - 2), kDefaultRdzvPort);
    return 0;
  }
  if (v.size() > 3 && v.compare(v.size() - 3, 3, "]:0") == 0) {
    parseHostPort(flag, v.substr(0, v.size() - 2), kDefaultRdzvPort);
    return 0;
  }
  return parseHostPort(flag, v, kDefaultRdzvPort).port;
}

int parseInt(const std::string& flag, const std::string& v, int min_value,
             int max_value = 1'000'000'000) {
  return static_cast<int>(parseInteger(flag, v, min_value, max_value));
}

double parseSeconds(const std::string& flag, const std::string& v) {
  return parseNumber(flag, v, 0, 1e9);
}

NprocSpec parseNproc(const std::string& flag, const std::string& v) {
  if (v == "gpu") return {NprocKind::kGpu, 0};
  if (v == "cpu") return {NprocKind::kCpu, 0};
  if (v == "auto") return {NprocKind::kAuto, 0};
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

StreamSelection selectionFromCode(const std::string& flag, const std::string& code) {
  int c = -1;
  if (code.size() == 1 && code[0] >= '0' && code[0] <= '3') c = code[0] - '0';
  if (c < 0)
    throw UsageError(fmt::format(
        "{}: '{}' is not a stream code (0 none, 1 stdout, 2 stderr, 3 both)", flag, code));
  return {(c & 1) != 0, (c & 2) != 0};
}

struct Flag {
  std::vector<std::string> names;  // canonical spelling with dashes; first is the main one
  bool takes_value;
  std::string metavar;
  std::string help;
  std::function<void(const std::string& flag, const std::string& value, LaunchOptions&)> apply;
};

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
       "exit_barrier_timeout (seconds), token_file, tls_ca_file",
       [](auto&, auto& v, auto& o) { o.rdzv_conf = parseRdzvConf(v, &o.warnings); }},
      {{"--master-addr"},
       true,
       "ADDR",
       "address of rank 0's store (default 127.0.0.1)",
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
      {{"--log-line-prefix-template"},
       true,
       "TEMPLATE",
       "console prefix of worker lines, as torchrun's TORCHELASTIC_LOG_LINE_PREFIX_TEMPLATE: "
       "${role_name}, ${local_rank}, ${rank} (default '[${role_name}${local_rank}]:')",
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

// torchrun accepts both spellings; we compare in the dashed form.
std::string canonical(const std::string& name) {
  if (name.size() < 3 || name[0] != '-' || name[1] != '-') return name;
  std::string c = name;
  std::replace(c.begin() + 2, c.end(), '_', '-');
  return c;
}

// Exact names first; then, as argparse's allow_abbrev, a prefix that names exactly one flag
// ("--stand" for --standalone). An unknown name gets the nearest flag suggested once.
const Flag* findFlag(const std::string& name) {
  std::string c = canonical(name);
  for (const auto& f : flags())
    for (const auto& n : f.names)
      if (n == c) return &f;
  if (c.rfind("--", 0) != 0 || c.size() < 3) return nullptr;
  std::vector<const Flag*> matches;
  for (const auto& f : flags())
    if (f.names[0].rfind(c, 0) == 0) matches.push_back(&f);
  if (matches.size() == 1) return matches[0];
  if (matches.size() > 1) {
    std::string names;
    for (const Flag* f : matches) names += (names.empty() ? "" : ", ") + f->names[0];
    throw UsageError(fmt::format("ambiguous option '{}' could match {}", name, names));
  }
  return nullptr;
}

UsageError unknownOption(const std::string& name) {
  std::vector<std::string> all;
  for (const auto& f : flags()) all.push_back(f.names[0]);
  all.push_back("--help");
  all.push_back("--version");
  std::string near = closestMatch(canonical(name), all);
  return UsageError(
      fmt::format("unknown option '{}'{} (see launch --help); options go before "
                  "PROGRAM, the program's own options after it",
                  name, near.empty() ? "" : "; did you mean " + near + "?"));
}

// Every value goes through one call, so that a checked-parser error becomes a usage error.
void applyFlag(const Flag& f, const std::string& name, const std::string& value, LaunchOptions& o) {
  try {
    f.apply(name, value, o);
  } catch (const InvalidArgument& e) {
    throw UsageError(e.what());
  }
}

std::string petName(const Flag& f) {
  std::string n = f.names[0].substr(2);
  std::transform(n.begin(), n.end(), n.begin(),
                 [](char ch) { return ch == '-' ? '_' : static_cast<char>(::toupper(ch)); });
  return "PET_" + n;
}

}  // namespace

RdzvConf parseRdzvConf(const std::string& v, std::vector<std::string>* warnings) {
  RdzvConf c;
  auto warn = [&](std::string line) {
    if (warnings) warnings->push_back(std::move(line));
  };
  std::optional<double> keep_alive_interval, keep_alive_attempts;
  if (trim(v).empty()) return c;
  for (const auto& kv : split(v, ',')) {
    auto eq = kv.find('=');
    if (eq == std::string::npos || eq == 0)
      throw UsageError(fmt::format("--rdzv-conf: '{}' is not key=value", kv));
    std::string key = trim(kv.substr(0, eq)), value = trim(kv.substr(eq + 1));
    std::string flag = "--rdzv-conf " + key;
    if (key == "join_timeout" || key == "timeout")
      c.join_timeout_sec = parseSeconds(flag, value);
    else if (key == "last_call_timeout")
      c.last_call_timeout_sec = parseSeconds(flag, value);
    else if (key == "read_timeout")
      c.read_timeout_sec = parseSeconds(flag, value);
    else if (key == "heartbeat_timeout")
      c.heartbeat_timeout_sec = parseSeconds(flag, value);
    else if (key == "exit_barrier_timeout" || key == "close_timeout")
      c.exit_barrier_timeout_sec = parseSeconds(flag, value);
    else if (key == "is_host")
      c.is_host = parseBool(flag, value);
    else if (key == "token_file")
      c.token_file = value;
    else if (key == "tls_ca_file")
      c.tls_ca_file = value;
    // torchrun declares a node dead after keep_alive_interval x keep_alive_max_attempt seconds:
    // our hosting agent's heartbeat window means the same.
    else if (key == "keep_alive_interval")
      keep_alive_interval = parseNumber(flag, value, 0.001, 1e6);
    else if (key == "keep_alive_max_attempt")
      keep_alive_attempts = parseNumber(flag, value, 1, 1e6);
    else if (key == "store_type" || key == "use_libuv")
      warn(
          fmt::format("--rdzv-conf {}={}: has no effect here (launch's store is its own gRPC "
                      "service, not a TCPStore)",
                      key, value));
    else if (isEtcdConfKey(key))
      c.etcd[key] = value;  // checked by the etcd backend; ignored (with a warning) by the others
    else
      warn(fmt::format(
          "--rdzv-conf: unknown key '{}' ignored (known: join_timeout or timeout, "
          "last_call_timeout, read_timeout, close_timeout or exit_barrier_timeout, "
          "heartbeat_timeout, keep_alive_interval, keep_alive_max_attempt, is_host, token_file, "
          "tls_ca_file)",
          key));
  }
  if (keep_alive_interval || keep_alive_attempts)
    c.heartbeat_timeout_sec = keep_alive_interval.value_or(5) * keep_alive_attempts.value_or(3);
  if (c.join_timeout_sec <= 0 || c.read_timeout_sec <= 0 || c.heartbeat_timeout_sec <= 0)
    throw UsageError("--rdzv-conf: join_timeout, read_timeout and heartbeat_timeout must be > 0");
  return c;
}

std::vector<std::string> expandSlurmNodeList(const std::string& list) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < list.size()) {
    // One item: prefix, optionally followed by [ranges], up to a top-level comma.
    size_t j = i;
    std::string prefix;
    while (j < list.size() && list[j] != ',' && list[j] != '[') prefix.push_back(list[j++]);
    if (j < list.size() && list[j] == '[') {
      size_t close = list.find(']', j);
      if (close == std::string::npos)
        throw UsageError("SLURM_JOB_NODELIST: unbalanced '[' in '" + list + "'");
      std::string suffix;
      size_t k = close + 1;
      while (k < list.size() && list[k] != ',') suffix.push_back(list[k++]);
      for (const auto& range : split(list.substr(j + 1, close - j - 1), ',')) {
        auto dash = range.find('-');
        std::string lo = dash == std::string::npos ? range : range.substr(0, dash);
        std::string hi = dash == std::string::npos ? range : range.substr(dash + 1);
        int a = parseInt("SLURM_JOB_NODELIST", lo, 0), b = parseInt("SLURM_JOB_NODELIST", hi, 0);
        // 64-bit counter: n++ past INT_MAX was undefined; and a bound, since a 13-byte list
        // ("x[0-99999999]") would otherwise allocate gigabytes (both found by fuzz_cli).
        constexpr size_t kMaxSlurmNodes = 100000;
        for (int64_t n = a; n <= b; ++n) {
          if (out.size() >= kMaxSlurmNodes)
            throw UsageError(fmt::format("SLURM_JOB_NODELIST: '{}' names more than {} nodes",
                                         list.substr(0, 200), kMaxSlurmNodes));
          std::string num = std::to_string(n);
          if (num.size() < lo.size()) num = std::string(lo.size() - num.size(), '0') + num;
          out.push_back(prefix + num + suffix);
        }
      }
      j = k;
    } else if (!prefix.empty()) {
      out.push_back(prefix);
    }
    i = j + 1;
  }
  return out;
}

std::string applySlurmDefaults(LaunchOptions& o, const std::vector<std::string>& given,
                               const std::map<std::string, std::string>& env) {
  auto get = [&](const char* k) {
    auto it = env.find(k);
    return it == env.end() ? std::string() : it->second;
  };
  std::string job = get("SLURM_JOB_ID"), nnodes = get("SLURM_NNODES"),
              nodelist = get("SLURM_JOB_NODELIST");
  if (job.empty() || nnodes.empty() || nodelist.empty()) return "";
  int n = parseInt("SLURM_NNODES", nnodes, 1);
  if (n < 2) return "";
  auto was_given = [&](const char* flag) {
    return std::find(given.begin(), given.end(), flag) != given.end();
  };
  // The user spelled out a rendezvous or node count: they configured it themselves.
  if (was_given("--nnodes") || was_given("--rdzv-endpoint") || was_given("--rdzv-backend") ||
      was_given("--node-rank") || was_given("--master-addr"))
    return "";
  auto nodes = expandSlurmNodeList(nodelist);
  if (nodes.empty()) return "";
  o.nnodes_min = o.nnodes_max = n;
  o.rdzv_backend = "c10d";
  o.rdzv_endpoint = nodes.front() + ":" + std::to_string(kDefaultRdzvPort);
  if (!was_given("--rdzv-id")) o.rdzv_id = "slurm-" + job;
  return fmt::format("Slurm job {}: {} nodes, rendezvous on {} (first node of the allocation)", job,
                     n, o.rdzv_endpoint);
}

int parseSignalName(const std::string& raw, const std::string& source) {
  std::string s = trim(raw);
  std::transform(s.begin(), s.end(), s.begin(), ::toupper);
  auto refuse = [&](const std::string& why) {
    return UsageError(fmt::format(
        "{}: '{}' {} (use names such as SIGTERM, SIGUSR1, or numbers 1..{}; SIGKILL and SIGSTOP "
        "cannot be caught)",
        source, raw, why, NSIG - 1));
  };
  if (!s.empty() && std::all_of(s.begin(), s.end(), ::isdigit)) {
    int64_t n;
    try {
      n = parseInteger(source, s, 1, NSIG - 1);
    } catch (const InvalidArgument&) {
      throw refuse("is not a signal number");
    }
    if (n == SIGKILL || n == SIGSTOP) throw refuse("cannot be forwarded");
    return static_cast<int>(n);
  }
  if (s.rfind("SIG", 0) != 0) s = "SIG" + s;
  static const std::pair<const char*, int> kSignals[] = {
      {"SIGTERM", SIGTERM}, {"SIGINT", SIGINT},    {"SIGHUP", SIGHUP},   {"SIGQUIT", SIGQUIT},
      {"SIGUSR1", SIGUSR1}, {"SIGUSR2", SIGUSR2},  {"SIGCONT", SIGCONT}, {"SIGALRM", SIGALRM},
      {"SIGXCPU", SIGXCPU}, {"SIGWINCH", SIGWINCH}};
  for (const auto& [name, num] : kSignals)
    if (s == name) return num;
  throw refuse("is not a signal that can be forwarded");
}

StreamSpec parseStreamSpec(const std::string& flag, const std::string& value) {
  StreamSpec spec;
  std::string v = trim(value);
  if (v.find(':') == std::string::npos) {
    spec.all = selectionFromCode(flag, v);
    return spec;
  }
  for (const auto& part : split(v, ',')) {
    auto colon = part.find(':');
    if (colon == std::string::npos)
      throw UsageError(fmt::format("{}: '{}' is not LOCAL_RANK:CODE", flag, part));
    int rank = parseInt(flag, part.substr(0, colon), 0, kMaxNprocPerNode - 1);
    spec.per_rank[rank] = selectionFromCode(flag, part.substr(colon + 1));
  }
  return spec;
}

void validateTopology(LaunchOptions& o) {
  if (o.elastic() && !o.rdzv_endpoint.empty() && o.rdzv_endpoint.find(',') == std::string::npos &&
      o.rdzv_endpoint.find("://") == std::string::npos &&
      endpointPort("--rdzv-endpoint", o.rdzv_endpoint) == 0) {
    // torchrun binds a free port for HOST:0; only a job of one node can use it, as no other
    // node could learn the port. That job is --standalone's: its own rendezvous, a free port.
    if (o.rdzv_backend == "etcd")
      throw UsageError(
          fmt::format("--rdzv-endpoint {}: port 0 picks a free port, which only "
                      "works for c10d on one node; give etcd's port",
                      o.rdzv_endpoint));
    if (o.nnodes_max != 1)
      throw UsageError(fmt::format(
          "--rdzv-endpoint {}: port 0 picks a free port on this node, which the other nodes of "
          "--nnodes={}:{} could not find; give a fixed port (default {})",
          o.rdzv_endpoint, o.nnodes_min, o.nnodes_max, kDefaultRdzvPort));
    o.rdzv_backend = "static";
    o.rdzv_endpoint.clear();
    o.standalone = true;
  }
  if (!o.rdzv_id.empty()) checkRunId("--rdzv-id", o.rdzv_id);  // also one Slurm's defaults made
  if (o.elastic()) {
    if (o.rdzv_endpoint.empty())
      throw UsageError(
          fmt::format("--rdzv-backend={} needs --rdzv-endpoint HOST[:PORT] (the node "
                      "that hosts the rendezvous, or an rdzv-server)",
                      o.rdzv_backend));
    if (o.standalone)
      throw UsageError(
          "--standalone picks its own rendezvous: drop --rdzv-backend/--rdzv-endpoint");
    return;
  }
  if (!o.rdzv_endpoint.empty() && !o.standalone)
    throw UsageError(
        "--rdzv-endpoint is for --rdzv-backend=c10d (or ddpl); the static backend "
        "uses --master-addr/--master-port");
  if (o.nnodes_min != o.nnodes_max)
    throw UsageError(
        fmt::format("--nnodes={}:{} is elastic: add --rdzv-backend=c10d "
                    "--rdzv-endpoint HOST[:PORT] (static jobs have a fixed size)",
                    o.nnodes_min, o.nnodes_max));
  if (o.node_rank >= o.nnodes_max)
    throw UsageError(fmt::format("--node-rank={} but the job has {} node(s): node ranks are 0..{}",
                                 o.node_rank, o.nnodes_max, o.nnodes_max - 1));
}

ParseResult parseCommandLine(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& env) {
  ParseResult result;
  LaunchOptions& o = result.options;
  std::set<std::string> target_flags;  // --module / --no-python given on the command line

  // Environment first, so that the command line overrides it. A wrong value names the
  // variable: the user never typed the flag.
  for (const auto& f : flags()) {
    const std::string var = petName(f);
    auto it = env.find(var);
    if (it == env.end()) continue;
    if (f.names[0] == "--run-path" && !parseBool(var, it->second)) continue;
    try {
      applyFlag(f, f.names[0], it->second, o);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("environment variable {}='{}' (read as {}): {}", var, it->second,
                                   f.names[0], e.what()));
    }
    result.given_flags.push_back(f.names[0]);
  }
  // torchrun's logging level comes from LOGLEVEL (Python names); --log-level wins.
  if (auto it = env.find("LOGLEVEL"); it != env.end() && !it->second.empty()) {
    std::string l = it->second;
    std::transform(l.begin(), l.end(), l.begin(), ::tolower);
    if (l == "warning") l = "warn";
    if (l == "fatal") l = "critical";
    if (l == "notset") l = "trace";
    const Flag* level = findFlag("--log-level");
    try {
      applyFlag(*level, "--log-level", l, o);
    } catch (const UsageError&) {
      throw UsageError(fmt::format(
          "environment variable LOGLEVEL='{}' is not DEBUG, INFO, WARNING, ERROR or CRITICAL",
          it->second));
    }
  }
  if (auto it = env.find(torchrun_env::kLogLinePrefixTemplate);
      it != env.end() && !it->second.empty())
    o.log_line_prefix_template = it->second;

  size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& a = args[i];
    if (a == "--") {
      ++i;
      break;
    }
    if (a.empty() || a[0] != '-' || a == "-") break;  // the program
    if (a == "-h" || a == "--help") {
      result.action = ParseResult::Action::kHelp;
      return result;
    }
    if (a == "--version") {
      result.action = ParseResult::Action::kVersion;
      return result;
    }
    std::string name = a, value;
    bool has_inline = false;
    if (auto eq = a.find('='); eq != std::string::npos && a.rfind("--", 0) == 0) {
      name = a.substr(0, eq);
      value = a.substr(eq + 1);
      has_inline = true;
    } else if (a.size() > 2 && a[0] == '-' && a[1] != '-') {
      // Short flags with an attached value: -r3, -t1.
      name = a.substr(0, 2);
      value = a.substr(2);
      has_inline = true;
    }
    const Flag* f = findFlag(name);
    if (!f) throw unknownOption(name);
    if (f->takes_value) {
      if (!has_inline) {
        if (i + 1 >= args.size())
          throw UsageError(fmt::format("{} needs a value ({})", name, f->metavar));
        value = args[++i];
      }
      applyFlag(*f, name, value, o);
    } else {
      applyFlag(*f, name, has_inline ? value : "1", o);
    }
    if (f->names[0] == "--module" || f->names[0] == "--no-python") target_flags.insert(f->names[0]);
    result.given_flags.push_back(f->names[0]);
  }
  if (target_flags.size() > 1)
    throw UsageError(
        "-m/--module and --no-python contradict each other: -m runs PROGRAM as a "
        "Python module, --no-python execs it without Python; keep one");
  if (i >= args.size())
    throw UsageError("missing PROGRAM: usage is launch [options] PROGRAM [ARGS...]");
  o.program = args[i];
  o.program_args.assign(args.begin() + static_cast<long>(i) + 1, args.end());

  if (o.launcher != "mpi" && (!o.hostfile.empty() || !o.mpi_args.empty() || o.dry_run))
    throw UsageError("--hostfile, --mpi-args and --dry-run go with --launcher=mpi");
  if (o.signals_to_handle.empty())
    o.signals_to_handle.assign(std::begin(defaults::kStopSignals),
                               std::end(defaults::kStopSignals));
  if (o.standalone && (o.nnodes_min != 1 || o.nnodes_max != 1))
    throw UsageError(fmt::format("--standalone runs one node, but --nnodes={}:{} was given",
                                 o.nnodes_min, o.nnodes_max));
  validateTopology(o);
  return result;
}

namespace {
// Word-wraps `text` for a column starting at `indent`, lines at most `width` wide.
std::string wrap(const std::string& text, size_t indent, size_t width) {
  std::string out, line;
  std::istringstream words(text);
  std::string w;
  while (words >> w) {
    if (!line.empty() && indent + line.size() + 1 + w.size() > width) {
      out += line + "\n" + std::string(indent, ' ');
      line.clear();
    }
    line += (line.empty() ? "" : " ") + w;
  }
  return out + line + "\n";
}
}  // namespace

std::string helpText() {
  std::string out =
      "usage: launch [options] PROGRAM [ARGS...]\n\n"
      "Start one worker process per GPU or CPU slot with torchrun's environment (RANK,\n"
      "LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT, ...), supervise them, restart the\n"
      "group on failure and report the root cause. PROGRAM: an executable runs directly; a\n"
      "Python file runs under PYTHON_EXEC or python3 (with -u); -m runs a module.\n"
      "${local_rank} in ARGS is replaced per worker. Every option also accepts the\n"
      "underscore spelling (--nproc_per_node) and falls back to PET_<NAME> from the\n"
      "environment (PET_NPROC_PER_NODE=4); the command line wins.\n\noptions:\n";
  for (const auto& f : flags()) {
    std::string names;
    for (auto it = f.names.rbegin(); it != f.names.rend(); ++it)
      names += (names.empty() ? "" : ", ") + *it;
    if (f.takes_value) names += " " + f.metavar;
    out += fmt::format("  {:<34} {}", names, wrap(f.help, 37, 100));
  }
  out += fmt::format("  {:<34} {}\n", "-h, --help", "show this help");
  out += fmt::format("  {:<34} {}\n", "--version", "print the version");
  out +=
      "\nexit status: 0 when every worker succeeds; otherwise the root-cause worker's exit\n"
      "code (128+N when it died of signal N), 124 when a hung rank ended the job\n"
      "(--hang-timeout), 128+N when launch itself was stopped by signal N, and 2 for bad\n"
      "options.\n\nexample:\n"
      "  launch --standalone --nproc-per-node=4 train.py --epochs 10\n"
      "\nother commands:\n"
      "  launch doctor [--json] [--python PATH] [PROGRAM]   check this machine for a job\n"
      "                                                     (launch doctor --help)\n"
      "  launch manifest-diff A B     what differs between two runs' manifest.json (each run\n"
      "                               writes one beside its logs: <log-dir>/<run_id>/)\n"
      "  launch status|stacks RUN_DIR  ask a running job for its status or its stacks\n";
  return out;
}

}  // namespace ddpl::launcher
