#include "launcher/agent/worker_spec.h"

#include <fmt/format.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <sstream>

#include "common/defaults.h"
#include "common/errors.h"
#include "common/signals.h"
#include "common/torchrun_env.h"
#include "rendezvous/state/round_rules.h"

namespace ddpl::launcher {
namespace {

bool isExecutableFile(const std::string& path) {
  struct stat st {};
  return stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode) && access(path.c_str(), X_OK) == 0;
}

// execvp's lookup, done up front so that a typo is one clear error instead of N failed workers.
std::string findInPath(const std::string& name, const Environment& env) {
  if (name.find('/') != std::string::npos) return isExecutableFile(name) ? name : "";
  auto it = env.find("PATH");
  std::string path = it == env.end() ? "/usr/local/bin:/usr/bin:/bin" : it->second;
  std::stringstream in(path);
  std::string dir;
  while (std::getline(in, dir, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (isExecutableFile(candidate)) return candidate;
  }
  return "";
}

}  // namespace

std::string pythonFor(const LaunchOptions& o, const Environment& env, std::string* origin) {
  auto it = env.find("PYTHON_EXEC");
  bool from_env = it != env.end() && !it->second.empty();
  std::string py = from_env ? it->second : !o.python.empty() ? o.python : "python3";
  std::string why = from_env ? "from PYTHON_EXEC"
                    : !o.python.empty()
                        ? "the interpreter of the environment launch is installed in"
                        : "python3 from PATH";
  std::string found = findInPath(py, env);
  if (found.empty())
    throw UsageError(fmt::format(
        "cannot find the Python interpreter '{}' ({}): install python3, put it on PATH, or set "
        "PYTHON_EXEC; use --no-python to run PROGRAM as an executable",
        py, why));
  if (origin) *origin = found + " (" + why + ")";
  return found;
}

namespace {

bool endsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::vector<std::string> resolveCommand(const LaunchOptions& o, const Environment& env) {
  std::vector<std::string> cmd;
  const std::string& prog = o.program;
  switch (o.target_kind) {
    case TargetKind::kModule:
      cmd = {pythonFor(o, env), "-u", "-m", prog};
      break;
    case TargetKind::kNoPython: {
      std::string found = findInPath(prog, env);
      if (found.empty())
        throw UsageError(fmt::format("PROGRAM '{}' {} (--no-python runs it as an executable)", prog,
                                     prog.find('/') != std::string::npos
                                         ? "is not an executable file"
                                         : "was not found on PATH"));
      cmd = {found};
      break;
    }
    case TargetKind::kAuto: {
      struct stat st {};
      bool exists = stat(prog.c_str(), &st) == 0;
      if (exists && S_ISDIR(st.st_mode))
        throw UsageError(fmt::format("PROGRAM '{}' is a directory, not a program or script", prog));
      if (endsWith(prog, ".py")) {
        if (!exists) {
          // get_current_dir_name() mallocs its answer (and may return null).
          std::unique_ptr<char, decltype(&free)> cwd(get_current_dir_name(), &free);
          throw UsageError(fmt::format("PROGRAM '{}': no such file (relative to {})", prog,
                                       cwd ? cwd.get() : "the current directory"));
        }
        cmd = {pythonFor(o, env), "-u", prog};
      } else if (exists && isExecutableFile(prog)) {
        cmd = {prog.find('/') == std::string::npos ? "./" + prog : prog};
      } else if (exists) {
        // A readable file that is not executable: torchrun's default is to run it under python.
        cmd = {pythonFor(o, env), "-u", prog};
      } else {
        std::string found = findInPath(prog, env);
        if (found.empty())
          throw UsageError(fmt::format(
              "PROGRAM '{}' is neither a file here nor an executable on PATH; use -m for a "
              "Python module",
              prog));
        cmd = {found};
      }
      break;
    }
  }
  cmd.insert(cmd.end(), o.program_args.begin(), o.program_args.end());
  return cmd;
}

std::vector<std::string> substituteLocalRank(const std::vector<std::string>& command,
                                             int local_rank) {
  static const std::string kToken = "${local_rank}";
  std::vector<std::string> out = command;
  std::string value = std::to_string(local_rank);
  for (size_t i = 1; i < out.size(); ++i) {
    std::string& a = out[i];
    for (size_t pos = a.find(kToken); pos != std::string::npos;
         pos = a.find(kToken, pos + value.size()))
      a.replace(pos, kToken.size(), value);
  }
  return out;
}

WorkerContext workerContext(const LaunchOptions& o, int local_rank, int local_world_size,
                            int restart_count, std::string error_file) {
  WorkerContext c;
  c.local_rank = local_rank;
  c.local_world_size = local_world_size;
  c.restart_count = restart_count;
  c.max_restarts = o.max_restarts;
  c.role = o.role;
  c.error_file = std::move(error_file);
  c.virtual_local_rank = o.virtual_local_rank;
  for (int s : o.signals_to_handle)
    c.signals_to_handle += (c.signals_to_handle.empty() ? "" : ",") + signalName(s);
  return c;
}

std::string virtualDevice(const Environment& base, int local_rank) {
  const char* var = nullptr;
  auto hip = base.find(torchrun_env::kHipVisibleDevices);
  auto cuda = base.find(torchrun_env::kCudaVisibleDevices);
  if (hip != base.end() && !hip->second.empty())
    var = torchrun_env::kHipVisibleDevices;
  else if (cuda != base.end())  // set but empty too: torchrun reads it as one empty entry
    var = torchrun_env::kCudaVisibleDevices;
  else
    return std::to_string(local_rank);
  const std::string& list = base.at(var);
  // Python's str.split(","): every comma separates, empty entries included.
  std::vector<std::string> entries(1);
  for (char ch : list) {
    if (ch == ',')
      entries.emplace_back();
    else
      entries.back().push_back(ch);
  }
  if (local_rank < 0 || static_cast<size_t>(local_rank) >= entries.size())
    throw UsageError(fmt::format(
        "--virtual-local-rank: {}='{}' names {} device(s), none for local rank {}: list one "
        "device per local rank, lower --nproc-per-node, or unset {} (then local rank i gets "
        "device i)",
        var, list, entries.size(), local_rank, var));
  const std::string& e = entries[static_cast<size_t>(local_rank)];
  auto b = e.find_first_not_of(" \t\n\r\f\v");
  auto end = e.find_last_not_of(" \t\n\r\f\v");
  return b == std::string::npos ? "" : e.substr(b, end - b + 1);
}

void checkVirtualDevices(const Environment& base, int nproc) {
  for (int lr = 0; lr < nproc; ++lr) virtualDevice(base, lr);
}

Environment buildWorkerEnv(const Environment& base, const WorldAssignment& w,
                           const WorkerContext& c, const Environment& extra) {
  Environment env = base;
  int rank = static_cast<int>(rdzv::round_rules::globalRank(w.rank_offset, c.local_rank));
  auto put = [&](const char* k, const std::string& v) { env[k] = v; };
  auto num = [&](const char* k, int v) { env[k] = std::to_string(v); };
  num(torchrun_env::kLocalRank, c.local_rank);
  num(torchrun_env::kRank, rank);
  num(torchrun_env::kGroupRank, w.group_rank);
  num(torchrun_env::kRoleRank, rank);
  num(torchrun_env::kLocalWorldSize, c.local_world_size);
  num(torchrun_env::kWorldSize, w.world_size);
  num(torchrun_env::kGroupWorldSize, w.group_world_size);
  num(torchrun_env::kRoleWorldSize, w.world_size);
  put(torchrun_env::kRoleName, c.role);
  put(torchrun_env::kMasterAddr, w.master_addr);
  num(torchrun_env::kMasterPort, w.master_port);
  num(torchrun_env::kRestartCount, c.restart_count);
  num(torchrun_env::kMaxRestarts, c.max_restarts);
  put(torchrun_env::kRunId, w.run_id);
  put(torchrun_env::kUseAgentStore, w.agent_store ? "True" : "False");
  put(torchrun_env::kErrorFile, c.error_file);
  env[envvar::kRound] = std::to_string(w.round);
  env[envvar::kRoundEpoch] = std::to_string(w.epoch_ms);
  // Same defaults as torchrun: the user's own value wins.
  if (!base.count(torchrun_env::kNcclAsyncErrorHandling))
    put(torchrun_env::kNcclAsyncErrorHandling, "1");
  if (!base.count(torchrun_env::kOmpNumThreads) && c.local_world_size > 1)
    put(torchrun_env::kOmpNumThreads, "1");
  if (!c.signals_to_handle.empty()) put(torchrun_env::kSignalsToHandle, c.signals_to_handle);
  if (c.virtual_local_rank) {
    // torchrun's virtual mode: device 0 of each worker is its own local rank's device.
    std::string device = virtualDevice(base, c.local_rank);
    put(torchrun_env::kLocalRank, "0");
    put(torchrun_env::kCudaVisibleDevices, device);
    if (auto hip = base.find(torchrun_env::kHipVisibleDevices);
        hip != base.end() && !hip->second.empty())
      put(torchrun_env::kHipVisibleDevices, device);
  }
  for (const auto& [k, v] : extra) env[k] = v;
  return env;
}

std::vector<std::string> toEnvp(const Environment& env) {
  std::vector<std::string> out;
  out.reserve(env.size());
  for (const auto& [k, v] : env) out.push_back(k + "=" + v);
  return out;
}

RankStreams rankStreams(const LaunchOptions& options, int local_rank) {
  RankStreams r{options.redirects.forRank(local_rank), options.tee.forRank(local_rank)};
  const auto& filter = options.local_ranks_filter;
  bool shown =
      filter.empty() || std::find(filter.begin(), filter.end(), local_rank) != filter.end();
  r.out_console = shown && !(r.redirect.stdout_ && !r.tee.stdout_);
  r.err_console = shown && !(r.redirect.stderr_ && !r.tee.stderr_);
  return r;
}

}  // namespace ddpl::launcher
