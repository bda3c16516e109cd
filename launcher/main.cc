// `launch`: the torchrun-compatible launcher. Parses everything once here; the libraries below
// get plain options.
#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>

#include "common/errors.h"
#include "common/file_io.h"
#include "common/log.h"
#include "common/parse.h"
#include "common/torchrun_env.h"
#include "ddpl/config.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/numa.h"
#include "launcher/agent/process.h"
#include "launcher/agent/worker_spec.h"
#include "launcher/cli/cli.h"
#include "launcher/doctor/doctor_command.h"
#include "launcher/doctor/manifest.h"
#include "launcher/doctor/preflight.h"
#include "launcher/gpu/gpu.h"
#include "launcher/membership/backends.h"
#include "launcher/mpi/mpi_launch.h"
#include "rendezvous/store/token.h"

using ddpl::kUsageExitCode;
using ddpl::UsageError;
namespace torchrun_env = ddpl::torchrun_env;

namespace {

using namespace ddpl::launcher;

std::string randomRunId() {
  std::random_device rd;
  char buf[17];
  snprintf(buf, sizeof(buf), "%08x%08x", rd(), rd());
  return buf;
}

int usage(const std::string& message) {
  fprintf(stderr, "launch: error: %s\nRun 'launch --help' for the options.\n", message.c_str());
  return kUsageExitCode;
}

int resolveNproc(const NprocSpec& spec, const Environment& env) {
  auto cvd = env.find("CUDA_VISIBLE_DEVICES");
  const char* cvd_value = cvd == env.end() ? nullptr : cvd->second.c_str();
  bool ask_driver = spec.kind == NprocKind::kGpu || spec.kind == NprocKind::kAuto;
  GpuInfo gpus = discoverGpus(cvd_value, ask_driver);
  switch (spec.kind) {
    case NprocKind::kGpu:
      if (gpus.visible == 0)
        throw UsageError("--nproc-per-node=gpu but no GPU is visible (" + gpus.source +
                         (cvd_value ? ", CUDA_VISIBLE_DEVICES='" + std::string(cvd_value) + "'" : "") +
                         "): use a number or 'cpu'");
      return gpus.visible;
    case NprocKind::kCpu:
      return usableCpus();
    case NprocKind::kAuto:
      return gpus.visible > 0 ? gpus.visible : usableCpus();
    case NprocKind::kNumber:
      if (gpus.visible > 0 && spec.number > gpus.visible)
        ddpl::log::warn(
            "{} local ranks but {} visible GPU(s): an NCCL job will fail with 'Duplicate GPU "
            "detected' (NCCL refuses two ranks on one GPU); use --nproc-per-node=gpu for NCCL, "
            "or the gloo backend",
            spec.number, gpus.visible);
      return spec.number;
  }
  return 1;
}

// The interpreter of the environment launch belongs to, as torchrun runs scripts under its own:
// the wheel's entry point names it (DDPL_LAUNCH_PYTHON); a launch installed into a virtual
// environment's bin/ finds it beside itself. Empty: none (python3 from PATH).
std::string environmentPython(const Environment& env) {
  if (auto it = env.find(ddpl::envvar::kLaunchPython); it != env.end() && !it->second.empty())
    return it->second;
  char exe[4096];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof(exe) - 1);
  if (n <= 0) return "";
  std::string dir(exe, static_cast<size_t>(n));
  dir = dir.substr(0, dir.rfind('/'));
  for (const char* name : {"/python3", "/python"})
    if (access((dir + name).c_str(), X_OK) == 0) return dir + name;
  return "";
}

// Each rank under --launcher=mpi: torchrun's per-rank variables from OpenMPI's, then exec.
int runMpiRankShim(int argc, char** argv, const Environment& env) {
  int first = 2;
  if (first < argc && std::string(argv[first]) == "--") ++first;
  if (first >= argc) return usage(std::string(kMpiRankShimFlag) + " needs -- PROGRAM [ARGS...]");
  Environment out;
  try {
    auto run_id = env.find(torchrun_env::kRunId);
    std::string tmp = env.count("TMPDIR") ? env.at("TMPDIR") : "/tmp";
    // One directory for the node's ranks, at a name known in advance: it must be ours and
    // private, never one another user planted (a symlink elsewhere). Otherwise this rank's own.
    std::string dir = tmp + "/ddpl-mpi-" + (run_id == env.end() ? "run" : run_id->second) + "-" +
                      std::to_string(geteuid());
    try {
      ddpl::ensurePrivateDirectory(dir);
    } catch (const std::exception& e) {
      std::string own = tmp + "/ddpl-mpi-XXXXXX";
      if (!mkdtemp(own.data())) throw;
      fprintf(stderr, "launch: warning: %s; this rank's error file goes to %s\n", e.what(),
              own.c_str());
      dir = own;
    }
    out = torchrunEnvFromMpi(env, dir);
    std::error_code ec;
    std::filesystem::create_directories(
        std::filesystem::path(out.at(torchrun_env::kErrorFile)).parent_path(), ec);
  } catch (const std::exception& e) {
    return usage(e.what());
  }
  std::vector<std::string> envp = toEnvp(out);
  std::vector<char*> cenv, cargv;
  for (auto& e : envp) cenv.push_back(e.data());
  cenv.push_back(nullptr);
  for (int i = first; i < argc; ++i) cargv.push_back(argv[i]);
  cargv.push_back(nullptr);
  execve(cargv[0], cargv.data(), cenv.data());
  fprintf(stderr, "launch: error: cannot execute '%s': %s\n", cargv[0], strerror(errno));
  return 127;
}

// `launch stacks|status|doctor|manifest-diff ...` and the helper modes launch starts itself
// with; nothing: a launch of a program.
std::optional<int> runSubcommand(int argc, char** argv, const Environment& env) {
  if (argc >= 2 && std::string(argv[1]) == kMpiRankShimFlag) return runMpiRankShim(argc, argv, env);
  if (argc == 4 && std::string(argv[1]) == kManifestProbeFlag) return runManifestProbe(argv[2], argv[3]);
  if (argc == 4 && std::string(argv[1]) == "manifest-diff") return runManifestDiff(argv[2], argv[3]);
  // `launch stacks|status RUN_DIR`; a program of that name still runs when no such directory
  // exists.
  if (argc == 3 && (std::string(argv[1]) == "stacks" || std::string(argv[1]) == "status") &&
      std::filesystem::is_directory(argv[2]))
    return controlRequest(argv[2], argv[1]);
  // `launch doctor`: a program of that name runs as `launch ./doctor` or `launch -- doctor`.
  if (argc >= 2 && std::string(argv[1]) == "doctor")
    return runDoctorCommand(std::vector<std::string>(argv + 2, argv + argc), env,
                            environmentPython(env));
  return std::nullopt;
}

// --launcher=mpi (launcher/mpi/mpi_launch.h): exec mpirun (or print its command); nothing of
// the native launch applies.
int launchUnderMpi(const ParseResult& parsed, const Environment& env) {
  try {
    const auto& g = parsed.given_flags;
    const bool nproc_given = std::find(g.begin(), g.end(), "--nproc-per-node") != g.end();
    std::optional<int> nproc;
    if (nproc_given) nproc = resolveNproc(parsed.options.nproc_per_node, env);
    return runMpiLaunch(parsed.options, env, nproc, g);
  } catch (const std::exception& e) {
    return usage(e.what());
  }
}

// What the parser cannot know alone: Slurm's defaults, the topology's rules and the token.
// Returns Slurm's note for the log (logging is not up yet); throws UsageError and what reading
// the token file throws.
std::string completeOptions(LaunchOptions& o, const ParseResult& parsed, const Environment& env) {
  std::string slurm_note = applySlurmDefaults(o, parsed.given_flags, env);
  validateTopology(o);
  if (!o.rdzv_conf.token_file.empty()) {
    o.rdzv_token = ddpl::rdzv::readTokenFile(o.rdzv_conf.token_file);
  } else {
    const auto from_env = ddpl::rdzv::rdzvTokenFromEnvironment(env, "launch");
    // Logging is not up yet; the warning goes where a usage error would.
    if (!from_env.warning.empty())
      std::fprintf(stderr, "launch: warning: %s\n", from_env.warning.c_str());
    if (from_env.token) o.rdzv_token = *from_env.token;
  }
  return slurm_note;
}

// --numa-binding: one plan per local rank, from the GPUs CUDA_VISIBLE_DEVICES names.
std::vector<NumaPlacement> planNuma(const LaunchOptions& o, const Environment& env, int nproc) {
  std::vector<int> gpu_indices;
  if (auto cvd = env.find("CUDA_VISIBLE_DEVICES"); cvd != env.end()) {
    for (const auto& item : ddpl::splitList(cvd->second, ',')) {
      try {
        gpu_indices.push_back(
            static_cast<int>(ddpl::parseInteger("CUDA_VISIBLE_DEVICES", item, 0, 4095)));
      } catch (const ddpl::InvalidArgument&) {
        break;  // UUIDs or MIG names: rank i is taken to use physical GPU i
      }
    }
  }
  std::string why;
  auto numa = planNumaBinding(o.numa_binding, nproc, "/sys", gpu_indices, &why);
  if (numa.empty()) ddpl::log::warn("--numa-binding: not binding ({})", why);
  for (size_t lr = 0; lr < numa.size(); ++lr)
    ddpl::log::info("--numa-binding: local rank {} on CPUs {}, memory of NUMA node(s) {}", lr,
                    formatCpuList(numa[lr].cpus), formatCpuList(numa[lr].mem_nodes));
  return numa;
}

// The agent's settings that come from the options and the machine (the run id may be set in
// `o` here). Logs what it decided for the user.
AgentConfig agentConfig(LaunchOptions& o, const Environment& env) {
  AgentConfig cfg;
  cfg.nproc = resolveNproc(o.nproc_per_node, env);
  if (o.virtual_local_rank) checkVirtualDevices(env, cfg.nproc);
  cfg.command = resolveCommand(o, env);
  if (cfg.command.size() > 1 && cfg.command[1] == "-u") {  // runs under Python
    std::string origin;
    if (pythonFor(o, env, &origin) == cfg.command[0]) {
      cfg.python_origin = origin;
      ddpl::log::debug("Python: {}", origin);
    }
  }
  if (o.rdzv_id.empty() && o.nnodes_max > 1) {
    // Every node must name the same run; torchrun's default is the literal "none".
    o.rdzv_id = "none";
    ddpl::log::warn(
        "no --rdzv-id for a multi-node job: using 'none'; give every job its own id "
        "so that two jobs on one rendezvous never mix");
  }
  cfg.run_id = o.rdzv_id.empty() ? randomRunId() : o.rdzv_id;
  cfg.host = ddpl::log::hostname();
  if (cfg.nproc > 1 && !env.count(torchrun_env::kOmpNumThreads))
    ddpl::log::warn(
        "OMP_NUM_THREADS is not set: setting it to 1 for each of the {} workers so they do "
        "not oversubscribe the CPUs; set it yourself to tune",
        cfg.nproc);
  if (o.numa_binding != NumaBinding::kNone) cfg.numa = planNuma(o, env, cfg.nproc);
  return cfg;
}

struct PreflightOutcome {
  std::vector<Finding> findings;
  std::vector<std::string> problems;  // the findings that are not ok, one line each
  bool fatal = false;                 // a failed check under --preflight=strict
};

// Before the rendezvous: a node that cannot run the job says so before anyone waits on it.
// One node under --preflight=warn has no one to tell and nothing to stop: its checks (NVML,
// the network's names, limits) run once its workers are started, off their start-up path.
PreflightOutcome preflightBeforeJoining(const LaunchOptions& o, const Environment& env,
                                        AgentConfig& cfg) {
  PreflightOutcome out;
  const bool preflight_after_start = o.preflight == "warn" && !o.elastic();
  if (preflight_after_start) {
    cfg.after_start.emplace_back(0.0, [o, env, nproc = cfg.nproc, host = cfg.host] {
      for (const auto& p : preflightProblems(host, runPreflight(o, env, nproc)))
        ddpl::log::warn("preflight: {}", p);
    });
  } else if (o.preflight != "off") {
    out.findings = runPreflight(o, env, cfg.nproc);
    out.problems = preflightProblems(cfg.host, out.findings);
    out.fatal = o.preflight == "strict" && anyFailed(out.findings);
    for (const auto& p : out.problems)
      if (out.fatal && p.rfind("fail", 0) == 0)
        ddpl::log::error("preflight: {}", p);
      else
        ddpl::log::warn("preflight: {}", p);
  }
  return out;
}

// Several nodes: every node's findings reach group rank 0's job-wide table, a stopped node's
// too. False: this node stops here (--preflight=strict), and the others have been told.
bool sharePreflight(const LaunchOptions& o, const std::string& host, const PreflightOutcome& pre,
                    Membership& membership) {
  if (o.preflight != "off") {
    int failed = 0, warned = 0;
    for (const auto& f : pre.findings) {
      failed += f.verdict == Verdict::kFail;
      warned += f.verdict == Verdict::kWarn;
    }
    std::string report =
        fmt::format("{} (launch pid {}): {} check(s), {} warning(s), {} failure(s){}", host,
                    getpid(), pre.findings.size(), warned, failed,
                    pre.fatal ? "; STOPPED before joining (--preflight=strict)" : "");
    for (const auto& p : pre.problems) report += "\n" + p;
    membership.publishPreflight(report);
  }
  if (!pre.fatal) return true;
  ddpl::log::error(
      "preflight: a failed check on {} and --preflight=strict: not joining "
      "(launch doctor gives the full report)",
      host);
  // The other nodes learn it now, with the failed checks, instead of waiting out the
  // join timeout for a node that will not come (issue 33).
  std::string failed;
  for (const auto& p : pre.problems)
    if (p.rfind("fail", 0) == 0) failed += (failed.empty() ? "" : "; ") + p;
  membership.stopBeforeJoining(
      fmt::format("preflight on {} failed (--preflight=strict): {}", host, failed));
  return false;
}

// Runs the job. The manifest goes beside the logs in the run directory launch created for
// itself (private, never a shared name in /tmp: issue 33), once the workers are started:
// nothing in it is needed before. Without --log-dir that directory goes at exit unless a
// report points into it, and the manifest with it. Its slow facts come a few seconds into the
// job.
int runAgent(AgentConfig cfg, RendezvousHandler& rdzv, const ManifestFacts& manifest) {
  std::string run_dir, manifest_path;
  cfg.after_start.emplace_back(0.0, [&] {
    try {
      writeManifest(manifest, run_dir + "/manifest.json");
      manifest_path = run_dir + "/manifest.json";
    } catch (const std::exception& e) {
      ddpl::log::warn("no run manifest: {}", e.what());
    }
  });
  cfg.after_start.emplace_back(3.0, [&manifest_path] {
    if (!manifest_path.empty())
      startManifestProbe(manifest_path, "/proc/self/exe", kDefaultNvmlLibrary);
  });
  Agent agent(std::move(cfg), rdzv);
  run_dir = agent.runLogDir();
  return agent.run();
}

// Every worker is gone and every log flushed; gRPC's orderly shutdown would only join its
// thread pools (tens of ms). Nothing is lost by leaving now.
[[noreturn]] void exitNow(int code) {
  ddpl::log::logger().flush();
  fflush(stdout);
  fflush(stderr);
  _exit(code);
}

}  // namespace

int main(int argc, char** argv) {
  Environment env = ddpl::processEnvironment();  // the workers' base: without what follows
  // gRPC 1.51 (Debian's) handles a client channel's connection events only while a call polls
  // the channel, or on its backup poller, every 5 s by default: a restarted rendezvous server
  // (or a returning etcd member) was found 5-15 s late, one poll for the connect and one for
  // the server's settings, and under load past the read timeout. A poll every 100 ms costs
  // nothing measurable; a value the user set wins. Before any channel exists: gRPC reads it once.
  setenv("GRPC_CLIENT_CHANNEL_BACKUP_POLL_INTERVAL_MS", "100", /*overwrite=*/0);
  if (auto code = runSubcommand(argc, argv, env)) return *code;
  ParseResult parsed;
  try {
    parsed = parseCommandLine(std::vector<std::string>(argv + 1, argv + argc), env);
  } catch (const UsageError& e) {
    return usage(e.what());
  }
  if (parsed.action == ParseResult::Action::kHelp) {
    fputs(helpText().c_str(), stdout);
    return 0;
  }
  if (parsed.action == ParseResult::Action::kCompletion) {
    fputs(completionScript(parsed.options.print_completion).c_str(), stdout);
    return 0;
  }
  if (parsed.action == ParseResult::Action::kVersion) {
    printf("launch (ddplaunch) %s\n", DDPL_VERSION);
    return 0;
  }
  LaunchOptions& o = parsed.options;
  o.python = environmentPython(env);
  if (o.launcher == "mpi") return launchUnderMpi(parsed, env);
  std::string slurm_note;
  try {
    slurm_note = completeOptions(o, parsed, env);
  } catch (const UsageError& e) {
    return usage(e.what());
  } catch (const std::exception& e) {
    return usage(e.what());
  }
  // Before any thread exists: the handled signals and SIGCHLD arrive through a signalfd.
  blockSignals(o.signals_to_handle);
  ddpl::log::init({"launch", -1, ""}, ddpl::log::parseLevel(o.log_level));
  if (!slurm_note.empty()) ddpl::log::info("{}", slurm_note);
  for (const auto& w : o.warnings) ddpl::log::warn("{}", w);

  try {
    AgentConfig cfg = agentConfig(o, env);
    PreflightOutcome pre = preflightBeforeJoining(o, env, cfg);
    if (pre.fatal && !o.elastic()) {
      ddpl::log::error(
          "preflight: a failed check on {} and --preflight=strict: not starting "
          "(launch doctor gives the full report)",
          cfg.host);
      return 1;
    }
    ManifestFacts manifest{DDPL_VERSION, std::vector<std::string>(argv, argv + argc), o, env,
                           cfg.run_id, cfg.host, cfg.nproc, usableCpus(),
                           std::filesystem::current_path().string(),
                           cfg.command.size() > 1 && cfg.command[1] == "-u" ? cfg.command[0] : ""};
    cfg.base_env = std::move(env);
    cfg.options = o;
    becomeSubreaper();
    MembershipBackend backend = makeMembership({o, cfg.base_env, cfg.run_id, cfg.nproc, cfg.host});
    // Several nodes, c10d or etcd.
    if (o.elastic() && !sharePreflight(o, cfg.host, pre, *backend.rdzv)) return 1;
    int code = runAgent(std::move(cfg), *backend.rdzv, manifest);
    if (backend.store || o.elastic()) exitNow(code);
    return code;
  } catch (const UsageError& e) {
    return usage(e.what());
  } catch (const std::exception& e) {
    ddpl::log::error("{}", e.what());
    return 1;
  }
}
