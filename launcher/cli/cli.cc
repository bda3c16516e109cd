#include "launcher/cli/cli.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <csignal>
#include <cstring>
#include <set>

#include "common/parse.h"
#include "common/torchrun_env.h"
#include "launcher/cli/flags.h"
#include "launcher/cli/values.h"

namespace ddpl::launcher {
using cli::applyFlag;
using cli::findFlag;
using cli::Flag;
using cli::flags;
using cli::parseInt;
using cli::petName;
using cli::selectionFromCode;
using cli::split;
using cli::trim;
using cli::unknownOption;

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

namespace {

constexpr char kShutdownTimeoutEnv[] = "TORCH_ELASTIC_SHUTDOWN_TIMEOUT";

// torchrun copies only tee'd lines to filtered_std*.log and says nothing when none are; a
// filter that can never match is worth a line. So is an empty filter ("a," or ",b"), which
// matches every line, as in torchrun.
void warnAboutDuplicateFilters(LaunchOptions& o) {
  struct Stream {
    const char* flag;
    const std::vector<std::string>& filters;
    bool StreamSelection::*member;
    const char* codes;
  };
  const Stream streams[] = {
      {"--duplicate-stdout-filters", o.duplicate_stdout_filters, &StreamSelection::stdout_, "1"},
      {"--duplicate-stderr-filters", o.duplicate_stderr_filters, &StreamSelection::stderr_, "2"}};
  for (const auto& s : streams) {
    if (s.filters.empty()) continue;
    bool teed = o.tee.all.*s.member;
    for (const auto& [rank, sel] : o.tee.per_rank) teed = teed || sel.*s.member;
    if (!teed)
      o.warnings.push_back(fmt::format(
          "{}: no local rank tees that stream, so nothing is copied (as in torchrun, only "
          "tee'd lines are): add --tee {} or --tee 3",
          s.flag, s.codes));
    if (std::find(s.filters.begin(), s.filters.end(), "") != s.filters.end())
      o.warnings.push_back(fmt::format(
          "{}: an empty filter (a leading, trailing or lone ',') matches every line, as in "
          "torchrun; write ',,' for a literal comma",
          s.flag));
  }
}

// What the environment sets (torchrun's PET_* variables and the few it reads itself), before
// the command line, which overrides it. A wrong value names the variable: the user never typed
// the flag.
void applyEnvironment(const std::map<std::string, std::string>& env, ParseResult& result) {
  LaunchOptions& o = result.options;
  // torchrun 2.15 reads TORCH_ELASTIC_SHUTDOWN_TIMEOUT when --shutdown-timeout is not given;
  // PET_SHUTDOWN_TIMEOUT and the flag win over it.
  if (auto it = env.find(kShutdownTimeoutEnv); it != env.end() && !it->second.empty()) {
    try {
      applyFlag(*findFlag("--shutdown-timeout"), kShutdownTimeoutEnv, it->second, o);
    } catch (const UsageError& e) {
      throw UsageError(fmt::format("environment variable {}: {}", kShutdownTimeoutEnv, e.what()));
    }
  }
  for (const auto& f : flags()) {
    const std::string var = petName(f);
    auto it = env.find(var);
    if (it == env.end()) continue;
    if (f.names[0] == "--run-path" && !parseBool(var, it->second)) continue;
    // An action, not a setting: torchrun reads no PET_PRINT_COMPLETION either.
    if (f.names[0] == "--print-completion") continue;
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
}

}  // namespace

ParseResult parseCommandLine(const std::vector<std::string>& args,
                             const std::map<std::string, std::string>& env) {
  ParseResult result;
  LaunchOptions& o = result.options;
  std::set<std::string> target_flags;  // --module / --no-python given on the command line

  applyEnvironment(env, result);

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
    // As torchrun's: the script is printed at once, whatever follows (no PROGRAM needed).
    if (f->names[0] == "--print-completion") {
      result.action = ParseResult::Action::kCompletion;
      return result;
    }
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
  warnAboutDuplicateFilters(o);
  if (o.signals_to_handle.empty())
    o.signals_to_handle.assign(std::begin(defaults::kStopSignals),
                               std::end(defaults::kStopSignals));
  if (o.standalone && (o.nnodes_min != 1 || o.nnodes_max != 1))
    throw UsageError(fmt::format("--standalone runs one node, but --nnodes={}:{} was given",
                                 o.nnodes_min, o.nnodes_max));
  validateTopology(o);
  // torchrun's opt-out of the agent-hosted store; --rdzv-conf agent_store wins.
  auto share = env.find(torchrun_env::kDisableSharedStore);
  o.agent_store = o.rdzv_conf.agent_store.value_or(share == env.end() || share->second != "1");
  return result;
}

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
  // Names in 34 columns, the text wrapped at 100 (flag_table::HelpLayout's defaults).
  const flag_table::HelpLayout layout;
  out += flag_table::helpRows(flags(), layout);
  out += flag_table::helpRow("-h, --help", "show this help", layout);
  out += flag_table::helpRow("--version", "print the version", layout);
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
