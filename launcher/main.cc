// `launch`: the torchrun-compatible launcher. Parses everything once here; the libraries below
// get plain options.
#include <sched.h>
#include <unistd.h>

#include <cstdio>
#include <memory>
#include <random>

#include "ddpl/config.h"
#include "common/errors.h"
#include "common/log.h"
#include "launcher/agent.h"
#include "launcher/cli.h"
#include "launcher/embedded_store.h"
#include "launcher/gpu.h"
#include "launcher/local_rendezvous.h"
#include "launcher/process.h"
#include "launcher/worker_spec.h"

extern char** environ;

namespace {

using namespace ddpl::launcher;

Environment currentEnvironment() {
  Environment env;
  for (char** e = environ; *e; ++e) {
    std::string kv(*e);
    auto eq = kv.find('=');
    if (eq != std::string::npos) env[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return env;
}

int cpuCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

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
      return cpuCount();
    case NprocKind::kAuto:
      return gpus.visible > 0 ? gpus.visible : cpuCount();
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

}  // namespace

int main(int argc, char** argv) {
  Environment env = currentEnvironment();
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
  if (parsed.action == ParseResult::Action::kVersion) {
    printf("launch (ddplaunch) %s\n", DDPL_VERSION);
    return 0;
  }
  LaunchOptions& o = parsed.options;
  // Before any thread exists: the handled signals and SIGCHLD arrive through a signalfd.
  blockSignals(o.signals_to_handle);
  ddpl::log::init({"launch", -1, ""}, ddpl::log::parseLevel(o.log_level));

  try {
    AgentConfig cfg;
    cfg.nproc = resolveNproc(o.nproc_per_node, env);
    cfg.command = resolveCommand(o, env);
    cfg.run_id = o.rdzv_id.empty() ? randomRunId() : o.rdzv_id;
    cfg.host = ddpl::log::hostname();
    if (cfg.nproc > 1 && !env.count("OMP_NUM_THREADS"))
      ddpl::log::warn(
          "OMP_NUM_THREADS is not set: setting it to 1 for each of the {} workers so they do "
          "not oversubscribe the CPUs; set it yourself to tune",
          cfg.nproc);
    cfg.base_env = std::move(env);
    cfg.options = o;
    becomeSubreaper();
    // --standalone also hosts our gRPC store for the workers (DDPL_STORE_ADDR and token); plain
    // runs stay exactly like torchrun's static rendezvous.
    std::unique_ptr<EmbeddedStore> store;
    if (o.standalone) store = std::make_unique<EmbeddedStore>("127.0.0.1");
    LocalRendezvous rdzv(cfg.run_id, cfg.nproc, o.master_addr, o.master_port, store.get());
    int code;
    {
      Agent agent(std::move(cfg), rdzv);
      code = agent.run();
    }
    if (store) {
      // Every worker is gone and every log flushed; gRPC's orderly shutdown would only join its
      // thread pools (tens of ms). Nothing is lost by leaving now.
      ddpl::log::logger().flush();
      fflush(stdout);
      fflush(stderr);
      _exit(code);
    }
    return code;
  } catch (const UsageError& e) {
    return usage(e.what());
  } catch (const std::exception& e) {
    ddpl::log::error("{}", e.what());
    return 1;
  }
}
