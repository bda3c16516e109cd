#include "launcher/mpi/mpi_launch.h"

#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <random>
#include <set>
#include <sstream>

#include "common/defaults.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/torchrun_env.h"
#include "launcher/membership/ports.h"

namespace ddpl::launcher {
namespace {

std::optional<int> parseCount(const std::string& text) {
  try {
    return static_cast<int>(parseInteger("slots", text, 0, 1 << 24));
  } catch (const InvalidArgument&) {
    return std::nullopt;
  }
}

bool isLocalName(const std::string& host) {
  return host == "localhost" || host == "127.0.0.1" || host == "::1" ||
         host == ddpl::log::hostname();
}

// Flags that mean something to an mpirun job; every other one is refused, not ignored.
const std::set<std::string>& mpiFlags() {
  static const std::set<std::string> kFlags = {"--launcher",    "--hostfile",       "--dry-run",
                                               "--mpi-args",    "--nproc-per-node", "--nnodes",
                                               "--master-addr", "--master-port",    "--rdzv-id",
                                               "--module",      "--no-python",      "--log-level"};
  return kFlags;
}

bool setsMapping(const std::vector<std::string>& args) {
  for (const auto& a : args) {
    for (const char* flag :
         {"--map-by", "-map-by", "--npernode", "-npernode", "-N", "--ppr", "-ppr", "--bynode",
          "-bynode", "--byslot", "-byslot", "--rankfile", "-rf"}) {
      if (a == flag || a.rfind(std::string(flag) + "=", 0) == 0) return true;
    }
  }
  return false;
}

constexpr const char* kRanksPerHostEnv = envvar::kMpiRanksPerHost;

// mpirun starts this same binary on every host as the per-rank shim.
std::string launchBinaryPath() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof(buf) - 1);
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

std::string randomRunId() {
  std::random_device rd;
  return fmt::format("{:08x}{:08x}", rd(), rd());
}

}  // namespace

std::vector<HostfileEntry> parseHostfile(const std::string& text, const std::string& file_name) {
  std::vector<HostfileEntry> hosts;
  std::istringstream in(text);
  std::string line;
  int number = 0;
  auto fail = [&](const std::string& why) {
    return UsageError(fmt::format("hostfile {}, line {}: {}", file_name, number, why));
  };
  while (std::getline(in, line)) {
    ++number;
    if (auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
    std::istringstream words(line);
    std::string word;
    HostfileEntry entry;
    entry.line = number;
    while (words >> word) {
      if (entry.host.empty()) {
        if (word.find('=') != std::string::npos)
          throw fail(fmt::format("'{}' where a host name was expected", word));
        entry.host = word;
        continue;
      }
      const auto eq = word.find('=');
      const std::string key = word.substr(0, eq);
      if (eq == std::string::npos || (key != "slots" && key != "max_slots" && key != "max-slots"))
        throw fail(fmt::format("unknown '{}' (expected HOST [slots=N] [max_slots=N])", word));
      const auto value = parseCount(word.substr(eq + 1));
      if (!value || *value < 1)
        throw fail(fmt::format("{} '{}' is not a whole number >= 1", key, word.substr(eq + 1)));
      (key == "slots" ? entry.slots : entry.max_slots) = *value;
    }
    if (entry.host.empty()) continue;
    if (entry.slots && entry.max_slots && *entry.max_slots < *entry.slots)
      throw fail(fmt::format("max_slots={} is below slots={}", *entry.max_slots, *entry.slots));
    for (const auto& earlier : hosts) {
      if (earlier.host == entry.host)
        throw fail(
            fmt::format("host '{}' is listed again (first on line {}): give it one line with "
                        "its total slots",
                        entry.host, earlier.line));
    }
    hosts.push_back(entry);
  }
  if (hosts.empty()) throw UsageError(fmt::format("hostfile {}: no hosts in it", file_name));
  return hosts;
}

std::vector<HostfileEntry> readHostfile(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw UsageError(fmt::format("--hostfile: cannot read '{}': {}", path, std::strerror(errno)));
  std::stringstream text;
  text << in.rdbuf();
  return parseHostfile(text.str(), path);
}

std::vector<std::string> splitShellWords(const std::string& text) {
  std::vector<std::string> words;
  std::string word;
  bool inWord = false;
  char quote = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (quote == '\'') {
      if (c == '\'')
        quote = 0;
      else
        word.push_back(c);
    } else if (quote == '"') {
      if (c == '"') {
        quote = 0;
      } else if (c == '\\' && i + 1 < text.size() && std::strchr("\"\\$`", text[i + 1])) {
        word.push_back(text[++i]);
      } else {
        word.push_back(c);
      }
    } else if (c == '\'' || c == '"') {
      quote = c;
      inWord = true;
    } else if (c == '\\') {
      if (i + 1 < text.size()) word.push_back(text[++i]);
      inWord = true;
    } else if (c == ' ' || c == '\t' || c == '\n') {
      if (inWord) words.push_back(word);
      word.clear();
      inWord = false;
    } else {
      word.push_back(c);
      inWord = true;
    }
  }
  if (quote)
    throw UsageError(fmt::format("--mpi-args: unterminated {} quote in '{}'", quote, text));
  if (inWord) words.push_back(word);
  return words;
}

std::string shellQuote(const std::vector<std::string>& argv) {
  std::string out;
  for (const auto& a : argv) {
    if (!out.empty()) out += ' ';
    const bool plain = !a.empty() && std::all_of(a.begin(), a.end(), [](char c) {
      return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("@%+=:,./_-", c);
    });
    if (plain) {
      out += a;
      continue;
    }
    out += '\'';
    for (char c : a) {
      if (c == '\'')
        out += "'\\''";
      else
        out += c;
    }
    out += '\'';
  }
  return out;
}

std::vector<int> ranksPerHost(const MpiJob& job) {
  std::vector<int> ranks;
  for (const auto& h : job.hosts)
    ranks.push_back(job.nproc_per_node ? *job.nproc_per_node : h.slots.value_or(1));
  return ranks;
}

std::vector<std::string> buildMpirunCommand(const MpiJob& job) {
  const std::vector<int> ranks = ranksPerHost(job);
  int world = 0;
  bool oversubscribe = false;
  std::string hostList;
  for (size_t i = 0; i < job.hosts.size(); ++i) {
    const int slots = job.hosts[i].slots.value_or(ranks[i]);
    oversubscribe = oversubscribe || slots < ranks[i];
    world += ranks[i];
    hostList += (hostList.empty() ? "" : ",") + job.hosts[i].host + ":" + std::to_string(slots);
  }
  const bool ourMapping = job.nproc_per_node && !setsMapping(job.mpi_args);
  std::vector<std::string> argv{job.mpirun};
  if (job.as_root) argv.push_back("--allow-run-as-root");
  if (oversubscribe) argv.push_back("--oversubscribe");
  argv.insert(argv.end(), {"-np", std::to_string(world), "--host", hostList});
  if (ourMapping)
    argv.insert(argv.end(), {"--map-by", fmt::format("ppr:{}:node", *job.nproc_per_node)});
  Environment exported = {
      {torchrun_env::kMasterAddr, job.master_addr},
      {torchrun_env::kMasterPort, std::to_string(job.master_port)},
      {torchrun_env::kWorldSize, std::to_string(world)},
      {torchrun_env::kRoleWorldSize, std::to_string(world)},
      {torchrun_env::kGroupWorldSize, std::to_string(job.hosts.size())},
      {torchrun_env::kRunId, job.run_id},
      {torchrun_env::kRestartCount, "0"},
      {torchrun_env::kMaxRestarts, "0"},
      {torchrun_env::kUseAgentStore, "False"},
  };
  // Every host runs the same number of ranks only under our own mapping.
  if (ourMapping) exported[torchrun_env::kLocalWorldSize] = std::to_string(*job.nproc_per_node);
  // Ranks fill the hosts in order under our mapping and mpirun's default: the shim finds its
  // node's index (GROUP_RANK) from these counts. A mapping of the user's own is not known.
  if (!setsMapping(job.mpi_args)) {
    std::string counts;
    for (int r : ranks) counts += (counts.empty() ? "" : ",") + std::to_string(r);
    exported[kRanksPerHostEnv] = counts;
  }
  for (const auto& [k, v] : job.extra_env) exported[k] = v;
  for (const auto& [k, v] : exported) argv.insert(argv.end(), {"-x", k + "=" + v});
  argv.insert(argv.end(), job.mpi_args.begin(), job.mpi_args.end());
  if (!job.shim.empty()) argv.insert(argv.end(), {job.shim, kMpiRankShimFlag, "--"});
  argv.insert(argv.end(), job.command.begin(), job.command.end());
  return argv;
}

Environment torchrunEnvFromMpi(const Environment& env, const std::string& error_dir) {
  auto need = [&](const char* name, int64_t min) {
    auto it = env.find(name);
    if (it == env.end())
      throw UsageError(
          fmt::format("{} is not set: {} runs only as a rank started by OpenMPI's "
                      "mpirun (launch --launcher=mpi)",
                      name, kMpiRankShimFlag));
    return parseInteger(name, it->second, min, 1 << 24);
  };
  const int64_t rank = need("OMPI_COMM_WORLD_RANK", 0);
  const int64_t local_rank = need("OMPI_COMM_WORLD_LOCAL_RANK", 0);
  const int64_t local_size = need("OMPI_COMM_WORLD_LOCAL_SIZE", 1);
  Environment out = env;
  auto setDefault = [&](const char* k, const std::string& v) { out.emplace(k, v); };
  setDefault(torchrun_env::kRank, std::to_string(rank));
  setDefault(torchrun_env::kLocalRank, std::to_string(local_rank));
  setDefault(torchrun_env::kRoleRank, std::to_string(rank));
  setDefault(torchrun_env::kLocalWorldSize, std::to_string(local_size));
  setDefault(torchrun_env::kRoleName, "default");
  // The worker library would take RANK and WORLD_SIZE for a torchrun launch and bootstrap
  // through MASTER_ADDR's TCPStore; under mpirun it bootstraps through MPI, as before the shim.
  setDefault(envvar::kBootstrap, "mpi");
  if (auto it = env.find(kRanksPerHostEnv);
      it != env.end() && !env.count(torchrun_env::kGroupRank)) {
    int64_t begin = 0, group = 0;
    for (const auto& count : splitList(it->second, ',')) {
      int64_t n = parseInteger(kRanksPerHostEnv, count, 0, 1 << 24);
      if (rank < begin + n) {
        out[torchrun_env::kGroupRank] = std::to_string(group);
        break;
      }
      begin += n;
      ++group;
    }
    if (!out.count(torchrun_env::kGroupRank))
      throw UsageError(
          fmt::format("{}={} has no place for rank {}", kRanksPerHostEnv, it->second, rank));
  }
  if (!env.count(torchrun_env::kErrorFile))
    out[torchrun_env::kErrorFile] = fmt::format("{}/{}/error.json", error_dir, rank);
  return out;
}

MpiJob planMpiJob(const LaunchOptions& o, const Environment& env, std::optional<int> nproc,
                  const std::vector<std::string>& given_flags) {
  for (const auto& flag : given_flags) {
    if (!mpiFlags().count(flag))
      throw UsageError(fmt::format(
          "{} does not apply to --launcher=mpi: mpirun starts, places and stops the ranks once (no "
          "rendezvous, restarts or log redirection; pass mpirun's own flags with --mpi-args)",
          flag));
  }
  MpiJob job;
  if (auto it = env.find(envvar::kMpirun); it != env.end() && !it->second.empty())
    job.mpirun = it->second;
  job.hosts = o.hostfile.empty()
                  ? std::vector<HostfileEntry>{{"localhost", std::nullopt, std::nullopt, 0}}
                  : readHostfile(o.hostfile);
  job.nproc_per_node = nproc;
  if (std::count(given_flags.begin(), given_flags.end(), "--nnodes") &&
      (o.nnodes_min != o.nnodes_max || o.nnodes_max != static_cast<int>(job.hosts.size())))
    throw UsageError(
        fmt::format("--nnodes={}:{} but {} lists {} host(s): with --launcher=mpi the "
                    "hostfile decides; drop --nnodes",
                    o.nnodes_min, o.nnodes_max,
                    o.hostfile.empty() ? "the default (this host)" : o.hostfile, job.hosts.size()));
  const std::vector<int> ranks = ranksPerHost(job);
  for (size_t i = 0; i < job.hosts.size(); ++i) {
    const auto& h = job.hosts[i];
    if (h.max_slots && ranks[i] > *h.max_slots)
      throw UsageError(
          fmt::format("hostfile {}, line {}: host '{}' has max_slots={} but would run {} ranks",
                      o.hostfile, h.line, h.host, *h.max_slots, ranks[i]));
  }
  job.as_root = ::geteuid() == 0;
  job.mpi_args = splitShellWords(o.mpi_args);
  job.command = resolveCommand(o, env);
  job.shim = launchBinaryPath();
  for (const auto& arg : job.command) {
    if (arg.find("${local_rank}") != std::string::npos)
      throw UsageError(
          "${local_rank} cannot be substituted under --launcher=mpi (mpirun starts every "
          "rank with the same arguments): read OMPI_COMM_WORLD_LOCAL_RANK in the program");
  }
  job.run_id = o.rdzv_id.empty() ? randomRunId() : o.rdzv_id;
  // Rank 0 runs on the first host (our mapping and mpirun's default fill hosts in order).
  const std::string& first = job.hosts.front().host;
  const bool firstIsHere = isLocalName(first);
  if (std::count(given_flags.begin(), given_flags.end(), "--master-addr")) {
    job.master_addr = o.master_addr;
  } else if (firstIsHere) {
    job.master_addr = job.hosts.size() == 1 ? "127.0.0.1" : ddpl::log::hostname();
  } else {
    job.master_addr = first;
  }
  // A free port when rank 0 runs here; elsewhere we cannot know, and torchrun's default it is.
  job.master_port = o.master_port ? *o.master_port
                                  : (firstIsHere ? pickFreePort("127.0.0.1") : kDefaultMasterPort);
  int local_max = *std::max_element(ranks.begin(), ranks.end());
  if (!env.count(torchrun_env::kOmpNumThreads) && local_max > 1)
    job.extra_env[torchrun_env::kOmpNumThreads] = "1";
  return job;
}

int runMpiLaunch(const LaunchOptions& o, const Environment& env, std::optional<int> nproc,
                 const std::vector<std::string>& given_flags) {
  const MpiJob job = planMpiJob(o, env, nproc, given_flags);
  const std::vector<std::string> argv = buildMpirunCommand(job);
  if (o.dry_run) {
    std::printf("%s\n", shellQuote(argv).c_str());
    return 0;
  }
  std::fprintf(stderr, "launch: %s\n", shellQuote(argv).c_str());
  std::fflush(stdout);
  std::fflush(stderr);
  // mpirun becomes this process: it receives our signals and its exit status is the job's.
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  ::execvp(args[0], args.data());
  std::fprintf(
      stderr,
      "launch: error: cannot run '%s': %s (install OpenMPI, or name mpirun in DDPL_MPIRUN)\n",
      job.mpirun.c_str(), std::strerror(errno));
  return 127;
}

}  // namespace ddpl::launcher
