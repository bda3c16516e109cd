#include "launcher/agent/warm_workers.h"

#include <fmt/ranges.h>

#include <algorithm>

#include "common/errors.h"
#include "common/heartbeat.h"
#include "common/log.h"
#include "launcher/agent/supervisor.h"
#include "launcher/agent/worker_spec.h"
#include "launcher/warm/warm_plan.h"

namespace ddpl::launcher {

WarmWorkers::WarmWorkers(const AgentConfig& config, std::string run_dir, Watchdog& watchdog,
                         std::function<void()> on_started)
    : cfg_(config),
      run_dir_(std::move(run_dir)),
      watchdog_(watchdog),
      on_started_(std::move(on_started)) {}

void WarmWorkers::start() {
  if (cfg_.options.prewarm.empty() || off_) return;
  bool binds_memory = std::any_of(cfg_.numa.begin(), cfg_.numa.end(),
                                  [](const NumaPlacement& p) { return !p.mem_nodes.empty(); });
  if (auto why = warm::whyNotWarm(cfg_.command, !cfg_.python_origin.empty(), binds_memory)) {
    off_ = *why;
    log::warn("--prewarm: every worker starts cold: {}", *why);
    return;
  }
  // What every worker gets and the interpreter reads at start (OMP_NUM_THREADS), from a
  // worker's environment as the first group will build it.
  WorldAssignment sample;
  sample.world_size = cfg_.nproc;
  WorkerContext ctx = workerContext(cfg_.options, 0, cfg_.nproc, 0, "");
  tmpl_env_ = warm::templateEnvironment(cfg_.base_env,
                                        buildWorkerEnv(cfg_.base_env, sample, ctx, cfg_.extra_env),
                                        {{kMarkerEnv, watchdog_.marker()}});
  warm::TemplateOptions to;
  to.python = cfg_.command[0];
  to.modules = cfg_.options.prewarm;
  to.envp = toEnvp(tmpl_env_);
  // A new log per template: one that died keeps its own for the reader.
  to.log_path = run_dir_ + "/template_" + std::to_string(started_++) + ".log";
  try {
    tmpl_ = std::make_unique<warm::WorkerTemplate>(std::move(to));
  } catch (const Error& e) {
    off_ = e.what();
    log::warn("--prewarm: every worker starts cold: {}", e.what());
    return;
  }
  watchdog_.watchGroup(tmpl_->pid());
  // Workers are forked by the template, not by launch: what waited for the forks to be done
  // (the embedded store's gRPC libraries) loads now, while the template imports, instead of
  // after the first group's forks, when warm workers would wait for it.
  on_started_();
  log::debug("--prewarm: template pid {} importing {}", tmpl_->pid(),
             fmt::join(cfg_.options.prewarm, ","));
}

void WarmWorkers::onTemplateExit(int wstatus, bool run_ended) {
  ExitStatus st = ExitStatus::fromWaitStatus(wstatus);
  bool was_ready = tmpl_->ready();
  tmpl_->onExited();
  watchdog_.unwatchGroup(tmpl_->pid());
  tmpl_.reset();
  if (run_ended || off_) return;
  if (++deaths_in_a_row_ > kStartsInARow) {
    off_ = fmt::format("{} templates in a row died", kStartsInARow);
    log::warn("--prewarm: the template died ({}); {}: every worker starts cold from now on",
              st.describe(), *off_);
    return;
  }
  log::warn("--prewarm: the template ({}) died: {}; starting a new one",
            was_ready ? "ready" : "importing", st.describe());
  start();
}

void WarmWorkers::sayColdOnce(const std::string& why) {
  if (cold_reasons_said_.size() < 16 && cold_reasons_said_.insert(why).second)
    log::warn("--prewarm: starting cold: {}", why);
}

SpawnedProcess WarmWorkers::spawn(const std::vector<std::string>& argv, const Environment& env,
                                  const SpawnOptions& options) {
  if (!tmpl_ || off_) return {};
  std::string why;
  if (!tmpl_->awaitReady(kReadySeconds, &why)) {
    off_ = why;
    log::warn("--prewarm: every worker starts cold: {}", why);
    tmpl_.reset();  // killed here, reaped by the loop
    return {};
  }
  if (auto diff = warm::startupDifference(tmpl_env_, env)) {
    sayColdOnce("a variable read at start differs (" + *diff + ")");
    return {};
  }
  SpawnedProcess p =
      spawnFromTemplate(*tmpl_, argv, toEnvp(env), kHeartbeatFdEnv, options, kForkSeconds, &why);
  if (p.pid < 0) {
    sayColdOnce(why);
    if (!tmpl_->ready()) {  // it broke (killed here, reaped by the loop)
      tmpl_.reset();
      if (++deaths_in_a_row_ > kStartsInARow) {
        off_ = fmt::format("{} templates in a row failed", kStartsInARow);
        log::warn("--prewarm: {}: every worker starts cold from now on", *off_);
      } else {
        start();  // for the next group; this one's remaining workers start cold
      }
    }
  } else {
    deaths_in_a_row_ = 0;
  }
  return p;
}

void WarmWorkers::sayFirstGroup(int warm, int nproc) const {
  log::info("--prewarm: {} of {} worker(s) forked from the template ({} imported in {:.2f}s)", warm,
            nproc, fmt::join(cfg_.options.prewarm, ","), tmpl_ ? tmpl_->importSeconds() : 0.0);
}

}  // namespace ddpl::launcher
