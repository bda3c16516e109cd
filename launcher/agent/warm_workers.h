#pragma once
// Warm workers (--prewarm, docs/warm-restarts.md): the agent's part that owns the worker
// template (launcher/warm/worker_template.h) for the whole run. It starts the template at the
// agent's set-up, so that its imports overlap the rendezvous; forks each worker from it where
// launcher/warm/warm_plan.h says the result is what a cold start would give (saying once why a
// worker starts cold); replaces a template that dies or breaks, until kStartsInARow did so in a
// row, after which every worker starts cold for the rest of the run.
//
// Threads: the agent's loop thread only. Its waits there are bounded: the first fork waits for
// the template's imports (kReadySeconds at most: cold workers would spend that importing), each
// fork kForkSeconds. The template is launch's child: the loop reaps it (templatePid() tells it
// apart from workers and strays) and hands its exit to onTemplateExit().
#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "launcher/agent/agent.h"
#include "launcher/agent/process.h"
#include "launcher/agent/watchdog.h"
#include "launcher/warm/worker_template.h"

namespace ddpl::launcher {

class WarmWorkers {
 public:
  // The template's imports (the first group waits for them, as cold workers would), one fork's
  // answer, and how many templates in a row may die before workers start cold for good.
  static constexpr double kReadySeconds = 300;
  static constexpr double kForkSeconds = 30;
  static constexpr int kStartsInARow = 3;

  // For a run with --prewarm (config.options.prewarm not empty); each template's log goes to
  // `run_dir`/template_<n>.log. `on_started` is called after each template started (the
  // watchdog already watches its group): what waited for the workers' forks may load then.
  WarmWorkers(const AgentConfig& config, std::string run_dir, Watchdog& watchdog,
              std::function<void()> on_started);
  WarmWorkers(const WarmWorkers&) = delete;
  WarmWorkers& operator=(const WarmWorkers&) = delete;

  // Starts the template, or says once why every worker starts cold.
  void start();
  // The template's pid, or -1: it is launch's child but neither a worker nor a stray.
  pid_t templatePid() const { return tmpl_ && !tmpl_->dead() ? tmpl_->pid() : -1; }
  // The loop reaped the template. Unless `run_ended`, a new one starts (kStartsInARow limit).
  void onTemplateExit(int wstatus, bool run_ended);
  // One worker forked from the template, or pid -1: the caller starts it cold.
  SpawnedProcess spawn(const std::vector<std::string>& argv, const Environment& env,
                       const SpawnOptions& options);
  // After the first group started, `warm` of its `nproc` workers from the template: one line.
  void sayFirstGroup(int warm, int nproc) const;
  // The end of the run: the template's socket closed and its group SIGKILLed (the loop reaps).
  void stop() { tmpl_.reset(); }

 private:
  void sayColdOnce(const std::string& why);

  const AgentConfig& cfg_;
  std::string run_dir_;
  Watchdog& watchdog_;
  std::function<void()> on_started_;
  std::unique_ptr<warm::WorkerTemplate> tmpl_;
  Environment tmpl_env_;            // the one the template was started with
  std::optional<std::string> off_;  // set: no template for the rest of the run, and why
  int deaths_in_a_row_ = 0;
  int started_ = 0;                          // templates started, for their logs' names
  std::set<std::string> cold_reasons_said_;  // at most 16
};

}  // namespace ddpl::launcher
