#include "launcher/agent/agent.h"

#include <fcntl.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <optional>
#include <set>
#include <thread>
#include <utility>

#include "common/bytes.h"
#include "common/errors.h"
#include "common/event_loop.h"
#include "common/heartbeat.h"
#include "common/log.h"
#include "common/signals.h"
#include "common/torchrun_env.h"
#include "launcher/agent/agent_options.h"
#include "launcher/agent/containment.h"
#include "launcher/agent/error_report.h"
#include "launcher/agent/hang_responder.h"
#include "launcher/agent/live_view.h"
#include "launcher/agent/output.h"
#include "launcher/agent/process.h"
#include "launcher/agent/reporting_part.h"
#include "launcher/agent/run_dir.h"
#include "launcher/agent/stacks_service.h"
#include "launcher/agent/supervisor.h"
#include "launcher/agent/watchdog.h"
#include "launcher/checkpoint/memory_tier.h"
#include "launcher/health/flight_recorder.h"
#include "launcher/health/heartbeat_channel.h"
#include "launcher/health/progress.h"
#include "launcher/health/stacks.h"
#include "launcher/warm/restart_phases.h"
#include "launcher/warm/warm_plan.h"
#include "launcher/warm/worker_template.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {
namespace {

// Without a cgroup, how often orphaned descendants are looked for (for the watchdog only: the
// end of a run finds them all regardless).
constexpr int kStrayScanSeconds = 1;
constexpr const char* kReplicaKey = "ckpt-replica";  // a node's checkpoint replica endpoint
// The loop's tag for the signalfd; the workers' output pipes are tagged with their fd, the
// stacks service's descriptors with tags of its own (StacksService::owns).
constexpr uint64_t kSignalTag = uint64_t{1} << 40;
// The warm template: its imports (the first group waits for them, as cold workers would), one
// fork's answer, and how many templates in a row may die before workers start cold for good.
constexpr double kTemplateReadySeconds = 300;
constexpr double kTemplateForkSeconds = 30;
constexpr int kTemplateStartsInARow = 3;

double unixNow() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6;
}

EventLoop::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<EventLoop::Clock::duration>(std::chrono::duration<double>(s));
}

sigset_t signalSet(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : signals) sigaddset(&set, s);
  return set;
}

int openLog(const std::string& path) {
  int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND | O_NOFOLLOW, 0640);
  if (fd < 0) throw Error("cannot open log file '" + path + "': " + strerror(errno));
  return fd;
}

bool lacksTorch(const FailureDetail& d) {
  const std::string needle = "No module named 'torch'";
  if (d.error && d.error->message.find(needle) != std::string::npos) return true;
  return std::any_of(d.stderr_tail.begin(), d.stderr_tail.end(),
                     [&](const std::string& l) { return l.find(needle) != std::string::npos; });
}

}  // namespace

void blockSignals(const std::vector<int>& signals) {
  signal(SIGPIPE, SIG_IGN);
  sigset_t set = signalSet(signals);
  sigprocmask(SIG_BLOCK, &set, nullptr);
}

struct Agent::Impl {
  struct Worker {
    int local_rank = 0;
    int global_rank = 0;
    pid_t pid = -1;
    bool alive = false;
    std::string error_file;
    std::unique_ptr<HeartbeatChannel> heartbeat;  // null: the worker has none
    uint64_t step() const { return heartbeat ? heartbeat->step() : 0; }
    uint64_t waited() const { return heartbeat ? heartbeat->waitedMicros() : 0; }
    WorkerState state() const { return {local_rank, global_rank, pid, alive}; }
  };

  AgentConfig cfg;
  RendezvousHandler& rdzv;
  Supervisor sup;
  OutputRouter router;
  HangDetector hang;
  std::optional<winsize> console_size;  // set when the console is a terminal (live mode)
  std::unique_ptr<RunCgroup> cgroup;    // null where the machine gives no writable cgroup v2
  Watchdog watchdog;
  EventLoop loop;
  int sigfd = -1;
  EventLoop::TimerId shutdown_timer = 0, monitor_timer = 0, stray_timer = 0;
  std::set<pid_t> known_strays;
  ProgressTracker progress;
  bool status_line = false;
  LiveView view;
  HangResponder hang_response;
  std::unique_ptr<StacksService> stacks;
  std::unique_ptr<MemoryTier> ckpt_tier;          // null: checkpoints in memory are off
  std::vector<RankCheckpointStatus> ckpt_status;  // refreshed once a second
  double next_ckpt_status = 0;
  double first_group_started = 0;     // for cfg.after_start; 0: no group yet
  size_t after_start_done = 0;        // how many of cfg.after_start have run (sorted by time)
  std::vector<uint64_t> output_seen;  // bytes of each local rank's output at the last tick
  int groups_started = 0;  // names attempt_<n> log dirs: restarts and re-formed rounds alike
  std::string log_base, run_dir;
  bool temp_base = false;
  WorldAssignment world;
  int attempt = 0;
  std::vector<Worker> workers;
  std::vector<pid_t> pgids;             // every worker group of the current attempt
  std::vector<int> stream_fds;          // open output pipes of the current attempt
  std::vector<FailureDetail> failures;  // of the current attempt
  std::map<pid_t, FailureDetail> pendingExecFailures;
  // Warm workers (--prewarm): the template, the environment it was started with, why workers
  // start cold (each reason said once), and the phases of every restart.
  std::unique_ptr<warm::WorkerTemplate> tmpl;
  Environment tmpl_env;
  std::optional<std::string> warm_off;  // set: no template for the rest of the run
  int tmpl_deaths_in_a_row = 0;
  int templates_started = 0;
  std::set<std::string> cold_reasons_said;
  warm::RestartClock restarts;
  int last_world_size = 0, last_nodes = 0;  // of the last group started (the dashboard)
  bool done = false;
  int exit_code = 0;
  // Reporting parts of the agent's own (reporting_part.h; the live view has its own).
  ReportingPart summary_part{"the end-of-run summary"};
  ReportingPart after_start_part{"a step after the workers' start (the manifest, the preflight)"};

  Impl(AgentConfig c, RendezvousHandler& r)
      : cfg(std::move(c)),
        rdzv(r),
        sup(Supervisor::Config{cfg.nproc, cfg.options.max_restarts, stopSignals(cfg.options)}),
        router(consoleOptions(cfg.options)),
        hang(hangOptions(cfg.options)),
        console_size(terminalSize()),
        cgroup(makeCgroup(cfg)),
        watchdog(cfg.run_id + "-" + std::to_string(getpid()), cgroup ? cgroup->path() : ""),
        status_line(consoleOptions(cfg.options).status_line),
        view(cfg.options, cfg.host, status_line, router, rdzv),
        hang_response(cfg.host) {
    if (cfg.options.log_dir.empty()) {
      std::string tmpl = (fs::temp_directory_path() / "ddpl-launch-XXXXXX").string();
      if (!mkdtemp(tmpl.data()))
        throw Error(std::string("cannot create a temporary log directory: ") + strerror(errno));
      log_base = tmpl;
      temp_base = true;
      watchdog.removeOnDeath(log_base);
    } else {
      log_base = cfg.options.log_dir;
      std::error_code ec;
      fs::create_directories(log_base, ec);
      if (ec)
        throw InvalidArgument("--log-dir '" + log_base + "' cannot be created: " + ec.message());
    }
    try {
      setUp();
    } catch (...) {
      // The destructor does not run for a constructor that throws: nothing of ours stays.
      rdzv.setRoundEndedCallback({});
      rdzv.setStacksRequestedCallback({});
      if (status_line) log::setConsoleWrapper({});
      stacks.reset();
      if (sigfd >= 0) close(sigfd);
      std::error_code ec;
      if (temp_base)
        fs::remove_all(log_base, ec);
      else if (!run_dir.empty())
        fs::remove_all(run_dir, ec);
      throw;
    }
  }

  void setUp() {
    if (hangDetectionOn()) addFlightRecorderBuffer(cfg.extra_env, cfg.base_env);  // all workers
    run_dir = makeRunDir(log_base, cfg.run_id);
    if (loop.error())
      throw Error(std::string("cannot set up the event loop: ") + strerror(loop.error()));
    // launch added the interpreter, or the command names one (`launch --no-python python3 x.py`).
    StacksService::Config sc;
    sc.run_dir = run_dir;
    sc.host = cfg.host;
    sc.python = !cfg.python_origin.empty() || runsPython(cfg.command);
    sc.interpreter = cfg.command[0];
    auto path = cfg.base_env.find("PATH");
    sc.path_env = path == cfg.base_env.end() ? "" : path->second;
    sc.hang_timeout_sec = hangOptions(cfg.options).soonestLimitSec();
    sc.status_line = [this] {
      return fmt::format("node {} ({}): {}", world.group_rank, cfg.host, view.logLine());
    };
    stacks = std::make_unique<StacksService>(std::move(sc), loop, rdzv);
    stacks->openControlSocket();

    sigset_t set = signalSet(cfg.options.signals_to_handle);
    sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    if (sigfd < 0 || !loop.add(sigfd, EPOLLIN, kSignalTag))
      throw Error(std::string("cannot set up the event loop: ") + strerror(errno));
    // Reads the workers' heartbeats every --monitor-interval, for the end-of-run summary.
    auto every = seconds(std::max(cfg.options.monitor_interval_sec, 0.01));
    monitor_timer = loop.addTimer(EventLoop::Clock::now() + every, every, [this] {
      if (!done) onMonitorTick();
    });
    // Without a cgroup: a periodic look for orphaned descendants (our subreaper children), so
    // that the watchdog knows them should launch be SIGKILLed.
    if (!cgroup) {
      auto scan = std::chrono::seconds(kStrayScanSeconds);
      stray_timer = loop.addTimer(EventLoop::Clock::now() + scan, scan, [this] {
        if (!done) onStrayScan();
      });
    }
    // Launch's own log lines go above the status line, not through it.
    if (status_line)
      log::setConsoleWrapper(
          [this](const std::function<void()>& write) { router.aroundConsoleWrite(write); });
    std::sort(cfg.after_start.begin(), cfg.after_start.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    // Rendezvous answers, round ends and the other nodes' requests arrive on other threads;
    // the loop takes them in order.
    rdzv.setRoundEndedCallback([this](int64_t round, std::string reason) {
      loop.post([this, round, reason = std::move(reason)] { onRoundEnded(round, reason); });
    });
    rdzv.setStacksRequestedCallback([this](int64_t id, std::string why) {
      loop.post([this, id, why = std::move(why)]() mutable {
        if (!done) stacks->onRemoteRequest(id, std::move(why));
      });
    });
    view.startMetrics();
    view.startDashboard(run_dir, cfg.run_id);
    startCheckpointTier();
    startTemplate();
  }

  // --prewarm: the template starts now, so that its imports overlap the rendezvous.
  void startTemplate() {
    if (cfg.options.prewarm.empty() || warm_off) return;
    bool binds_memory = std::any_of(cfg.numa.begin(), cfg.numa.end(),
                                    [](const NumaPlacement& p) { return !p.mem_nodes.empty(); });
    if (auto why = warm::whyNotWarm(cfg.command, !cfg.python_origin.empty(), binds_memory)) {
      warm_off = *why;
      log::warn("--prewarm: every worker starts cold: {}", *why);
      return;
    }
    // What every worker gets and the interpreter reads at start (OMP_NUM_THREADS), from a
    // worker's environment as the first group will build it.
    WorldAssignment sample;
    sample.world_size = cfg.nproc;
    WorkerContext ctx = workerContext(cfg.options, 0, cfg.nproc, 0, "");
    tmpl_env = warm::templateEnvironment(cfg.base_env,
                                         buildWorkerEnv(cfg.base_env, sample, ctx, cfg.extra_env),
                                         {{kMarkerEnv, watchdog.marker()}});
    warm::TemplateOptions to;
    to.python = cfg.command[0];
    to.modules = cfg.options.prewarm;
    to.envp = toEnvp(tmpl_env);
    // A new log per template: one that died keeps its own for the reader.
    to.log_path = run_dir + "/template_" + std::to_string(templates_started++) + ".log";
    try {
      tmpl = std::make_unique<warm::WorkerTemplate>(std::move(to));
    } catch (const Error& e) {
      warm_off = e.what();
      log::warn("--prewarm: every worker starts cold: {}", e.what());
      return;
    }
    watchdog.watchGroup(tmpl->pid());
    // Workers are forked by the template, not by launch: what waited for the forks to be done
    // (the embedded store's gRPC libraries) loads now, while the template imports, instead of
    // after the first group's forks, when warm workers would wait for it.
    rdzv.workersStarted();
    log::debug("--prewarm: template pid {} importing {}", tmpl->pid(),
               fmt::join(cfg.options.prewarm, ","));
  }

  // The template's pid, or -1: it is our child but neither a worker nor a stray.
  pid_t templatePid() const { return tmpl && !tmpl->dead() ? tmpl->pid() : -1; }

  void onTemplateExit(int wstatus) {
    ExitStatus st = ExitStatus::fromWaitStatus(wstatus);
    bool was_ready = tmpl->ready();
    tmpl->onExited();
    watchdog.unwatchGroup(tmpl->pid());
    tmpl.reset();
    if (done || warm_off) return;
    if (++tmpl_deaths_in_a_row > kTemplateStartsInARow) {
      warm_off = fmt::format("{} templates in a row died", kTemplateStartsInARow);
      log::warn("--prewarm: the template died ({}); {}: every worker starts cold from now on",
                st.describe(), *warm_off);
      return;
    }
    log::warn("--prewarm: the template ({}) died: {}; starting a new one",
              was_ready ? "ready" : "importing", st.describe());
    startTemplate();
  }

  void sayColdOnce(const std::string& why) {
    if (cold_reasons_said.size() < 16 && cold_reasons_said.insert(why).second)
      log::warn("--prewarm: starting cold: {}", why);
  }

  // One worker from the template, or pid -1 (it starts cold).
  SpawnedProcess spawnWarm(const std::vector<std::string>& argv, const Environment& env,
                           const SpawnOptions& so) {
    if (!tmpl || warm_off) return {};
    std::string why;
    if (!tmpl->awaitReady(kTemplateReadySeconds, &why)) {
      warm_off = why;
      log::warn("--prewarm: every worker starts cold: {}", why);
      tmpl.reset();  // killed here, reaped by the loop
      return {};
    }
    if (auto diff = warm::startupDifference(tmpl_env, env)) {
      sayColdOnce("a variable read at start differs (" + *diff + ")");
      return {};
    }
    SpawnedProcess p = spawnFromTemplate(*tmpl, argv, toEnvp(env), kHeartbeatFdEnv, so,
                                         kTemplateForkSeconds, &why);
    if (p.pid < 0) {
      sayColdOnce(why);
      if (!tmpl->ready()) {  // it broke (killed here, reaped by the loop)
        tmpl.reset();
        if (++tmpl_deaths_in_a_row > kTemplateStartsInARow) {
          warm_off = fmt::format("{} templates in a row failed", kTemplateStartsInARow);
          log::warn("--prewarm: {}: every worker starts cold from now on", *warm_off);
        } else {
          startTemplate();  // for the next group; this one's remaining workers start cold
        }
      }
    } else {
      tmpl_deaths_in_a_row = 0;
    }
    return p;
  }

  // Checkpoints in memory (docs/checkpoints.md): on unless --checkpoint-memory=0. An automatic
  // budget that cannot be had (no /dev/shm) turns the tier off with a warning; an explicit
  // one is an error.
  void startCheckpointTier() {
    const auto& o = cfg.options;
    const std::string base = "/dev/shm";
    uint64_t budget =
        o.checkpoint_memory ? *o.checkpoint_memory : MemoryTier::autoBudget(base, cfg.nproc);
    if (budget == 0) {
      if (!o.checkpoint_memory) log::warn("checkpoints in memory are off: {} is not usable", base);
      return;
    }
    MemoryTierOptions mo;
    mo.budget_per_rank = budget;
    mo.keep = o.checkpoint_memory_keep;
    mo.base = base;
    if (!o.checkpoint_dir.empty()) mo.durable_dir = fs::absolute(o.checkpoint_dir).string();
    try {
      ckpt_tier = std::make_unique<MemoryTier>(mo);
    } catch (const Error& e) {
      if (o.checkpoint_memory) throw;
      log::warn("checkpoints in memory are off: {}", e.what());
      return;
    }
    watchdog.removeOnDeath(ckpt_tier->root());
    log::debug("checkpoints in memory: {} per rank in {}", humanBytes(static_cast<int64_t>(budget)),
               ckpt_tier->root());
  }

  void onRendezvousDone(std::optional<WorldAssignment> w, const std::string& error) {
    if (done) return;
    if (w) {
      world = *w;
      restarts.onFormed(unixNow());
      stacks->setGroup(stacksGroup());
      execute(sup.onRendezvousComplete(world.restart_count));
    } else {
      log::error("rendezvous failed: {}", error);
      execute(sup.onRendezvousFailed());
    }
  }

  void onRoundEnded(int64_t round, const std::string& reason) {
    if (done || round != world.round || sup.phase() != Phase::kRunning) return;  // stale
    log::warn("round {} ended: {}; stopping workers to re-form the group", round, reason);
    restarts.onFailure(unixNow());
    execute(sup.onMembershipChange());
    // Fenced: the workers must be gone before the service can form a round without this node,
    // sooner than the usual grace allows.
    auto within = rdzv.fencedStopWithin(round);
    if (within && *within < cfg.options.shutdown_timeout_sec && shutdown_timer) {
      loop.cancelTimer(shutdown_timer);
      shutdown_timer =
          loop.addTimer(EventLoop::Clock::now() + seconds(std::max(*within, 0.001)), [this] {
            shutdown_timer = 0;
            if (!done) execute(sup.onShutdownTimeout());
          });
      log::warn("fencing: workers still running in {:.1f}s get SIGKILL", *within);
    }
  }

  ~Impl() {
    rdzv.setStacksRequestedCallback({});
    if (status_line) {
      log::setConsoleWrapper({});
      router.setStatus("");
    }
    closeHeartbeats();
    done = true;         // what the stacks thread still hands back changes nothing now
    stacks->shutdown();  // waits for its thread (a no-op after finish())
    std::vector<std::string> evidence = stacks->evidence();
    stacks.reset();  // removes the control socket
    if (sigfd >= 0) close(sigfd);
    if (temp_base) {
      std::error_code ec;
      if (evidence.empty())
        fs::remove_all(log_base, ec);
      else
        keepOnlyEvidence(log_base, run_dir, evidence);
    }
  }

  std::vector<WorkerState> workerStates() const {
    std::vector<WorkerState> out;
    for (const auto& w : workers) out.push_back(w.state());
    return out;
  }
  StacksGroup stacksGroup() const {
    return StacksGroup{attempt, attemptDir(), world.group_rank, workerStates()};
  }

  // Our children that are not workers or the watchdog: descendants orphaned to us.
  std::vector<pid_t> strayChildren() const {
    std::vector<pid_t> out;
    for (pid_t p : childrenOf(getpid())) {
      if (p == watchdog.pid() || p == templatePid()) continue;
      bool worker = std::any_of(workers.begin(), workers.end(),
                                [&](const Worker& w) { return w.pid == p && w.alive; });
      if (!worker) out.push_back(p);
    }
    return out;
  }

  void onStrayScan() {
    // Strays descend from workers: none before the first group starts. The scan reads every
    // process's /proc stat; 1024 agents waiting on one machine for their rendezvous each did
    // it every second, and with some 2,000 processes that took most of both cores (issue 14's
    // 1024-agent benchmark: 58% system time, load 100, etcd starved).
    if (workers.empty()) return;
    for (pid_t p : strayChildren()) {
      if (!known_strays.insert(p).second) continue;
      if (auto start = processStartTime(p)) watchdog.watchStray(p, start);
    }
  }

  void closeHeartbeats() {
    for (auto& w : workers) w.heartbeat.reset();
  }

  void onMonitorTick() {
    double now = unixNow();
    if (ckpt_tier) ckpt_tier->tick();  // starts watching once a worker wrote a checkpoint
    if (ckpt_tier && now >= next_ckpt_status) {
      ckpt_status = ckpt_tier->status();
      next_ckpt_status = now + 1;
    }
    std::vector<RankReading> readings;
    for (const auto& w : workers) {
      if (w.alive) progress.onStep(w.local_rank, w.step(), now, w.waited());
      readings.push_back({w.state(), w.step(), w.waited(), checkpointBytes(w.global_rank)});
    }
    view.maybeUpdate(readings, progress, now);  // also publishes the node's status for the job
    if (restarts.awaitingFirstStep() && !workers.empty()) {
      std::vector<uint64_t> steps;
      uint64_t restore_us = 0;
      for (const auto& w : workers) {
        steps.push_back(w.step());
        if (w.heartbeat) restore_us = std::max<uint64_t>(restore_us, w.heartbeat->restoreMicros());
      }
      if (auto r = restarts.onSteps(now, steps, static_cast<double>(restore_us) / 1e6))
        log::info("restart {}: {}", r->restart, r->describe());
    }
    runAfterStartHooks(now);
    view.reportStragglers(progress, now);
    if (view.stacksAsked())
      stacks->takeSnapshot([this](std::string text) {
        if (!done) view.setStacks("on demand", text, unixNow());
      });
    // While a hang's stacks are being taken, the group is about to stop: no second response.
    if (!hangDetectionOn() || sup.phase() != Phase::kRunning || hang_response.busy()) return;
    // CPU time counts only for ranks without steps, and only when a limit was given.
    bool want_cpu = cfg.options.hang_timeout_sec.has_value();
    for (const auto& w : workers) {
      if (!w.alive) continue;
      uint64_t bytes = router.bytesFrom(w.local_rank);
      bool wrote = bytes != output_seen[w.local_rank];
      output_seen[w.local_rank] = bytes;
      hang.observe(w.local_rank, w.step(), want_cpu ? processTreeCpuSeconds(w.pid) : 0, wrote, now);
      if (w.heartbeat && w.heartbeat->finishedStepping()) hang.onFinished(w.local_rank, now);
    }
    auto hangs = hang.check(now);
    if (!hangs.empty()) onHangs(hangs, now);
  }

  // Ranks made no progress past their limits: every node's stacks are saved (off this thread),
  // the hung ones and the likely culprit named, then the group stopped as for a failure.
  void onHangs(const std::vector<Hang>& hangs, double now) {
    restarts.onFailure(now);
    for (const auto& h : hangs) {
      view.markHung(h.local_rank);
      view.dashboardEvent("hang", fmt::format("local rank {} hung: {}", h.local_rank, h.why), now);
    }
    std::string why = hang_response.begin(hangs, now, workerStates(), attemptDir(),
                                          world.group_rank, progress, view.metrics());
    const int hung_attempt = attempt;
    stacks->takeHangStacks(
        why,
        [this](const HangStacks& h) {
          if (done) return;
          hang_response.onStacksSaved(h);
          view.setStacks("hang", h.text, unixNow());
        },
        [this, hung_attempt](HangStacks h) {
          if (done) return;
          auto found = hang_response.finish(h);
          if (hung_attempt != attempt) return;  // the group ended meanwhile
          for (auto& d : found) {
            int local_rank = d.exit.local_rank, pid = d.exit.pid;
            double when = d.exit.unix_time;
            failures.push_back(std::move(d));
            execute(sup.onWorkerHung(local_rank, pid, when));
          }
        });
  }

  std::optional<int64_t> checkpointBytes(int global_rank) const {
    for (const auto& s : ckpt_status)
      if (s.rank == global_rank && s.committed_bytes + s.partial_bytes > 0)
        return static_cast<int64_t>(s.committed_bytes + s.partial_bytes);
    return std::nullopt;
  }

  // Several nodes: this node's replica endpoint goes to the job's store (written by the
  // rendezvous's health thread: the loop never waits on the store for it) and the persister
  // thread looks up the next node's to send this node's commits there. A node that joins a
  // running job (a round after the first, or a restart) with nothing in memory for its ranks
  // (a replacement) fetches their newest steps from the peers before its workers start: there
  // the loop waits, 10 s at most for the peers' endpoints and 60 s per fetch.
  void startReplicas(const std::vector<int64_t>& ranks) {
    const std::string host = cfg.options.local_addr.empty() ? cfg.host : cfg.options.local_addr;
    try {
      rdzv.publishNodeValue(kReplicaKey, ckpt_tier->startReplicas(host, cfg.nproc));
    } catch (const std::exception& e) {
      log::warn("checkpoint replicas off for this round: {}", e.what());
      return;
    }
    const int next = (world.group_rank + 1) % world.group_world_size;
    ckpt_tier->setSuccessorLookup([this, next]() -> std::optional<ReplicaEndpoint> {
      if (auto v = rdzv.nodeValue(kReplicaKey, next)) return parseEndpoint(*v);
      return std::nullopt;
    });
    if ((world.round == 0 && world.restart_count == 0) ||
        !ckpt_tier->missing(ranks, world.world_size))
      return;
    std::vector<ReplicaEndpoint> peers;
    std::vector<bool> found(static_cast<size_t>(world.group_world_size), false);
    found[static_cast<size_t>(world.group_rank)] = true;
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(10);
    while (std::find(found.begin(), found.end(), false) != found.end() &&
           std::chrono::steady_clock::now() < deadline) {
      for (int n = 0; n < world.group_world_size; ++n) {
        if (found[static_cast<size_t>(n)]) continue;
        try {
          if (auto v = rdzv.nodeValue(kReplicaKey, n))
            if (auto e = parseEndpoint(*v)) {
              peers.push_back(*e);
              found[static_cast<size_t>(n)] = true;
            }
        } catch (const std::exception& e) {
          log::debug("checkpoint replica endpoint of node {}: {}", n, e.what());
        }
      }
      if (std::find(found.begin(), found.end(), false) != found.end())
        std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    for (const auto& line : ckpt_tier->pullMissing(ranks, world.world_size, peers, 60))
      log::info("{}", line);
  }

  // One line per run: what each rank holds in memory and what reached the disk.
  void printCheckpointSummary() {
    if (!ckpt_tier) return;
    std::vector<std::string> parts;
    for (const auto& s : ckpt_tier->status()) {
      if (s.newest_step < 0 && s.committed_bytes == 0) continue;
      std::string p =
          fmt::format("rank {} {} (step {}", s.rank,
                      humanBytes(static_cast<int64_t>(s.committed_bytes)), s.newest_step);
      if (!s.persists)
        p += ", rank 0's copy persists)";
      else
        p += s.persisted_step >= 0 ? fmt::format(", on disk {})", s.persisted_step)
                                   : ", not on disk)";
      if (!s.error.empty()) p += ": " + s.error;
      parts.push_back(std::move(p));
    }
    if (!parts.empty())
      log::info("checkpoints in memory (budget {} per rank): {}",
                humanBytes(static_cast<int64_t>(ckpt_tier->budgetPerRank())),
                fmt::join(parts, "; "));
  }

  void printSummary() {
    for (const auto& s : progress.newStragglers())  // judged once more on the final steps
      log::warn("straggler on {}: {}", cfg.host, s.describe());
    restarts.onGroupEnded();
    if (!restarts.completed().empty())
      log::info("where each restart's time went (from the failure to every rank's first step):{}",
                restarts.summary());
    if (progress.ranks().empty() || !log::logger().should_log(spdlog::level::info)) return;
    int threads = 0;
    auto omp = cfg.base_env.find(torchrun_env::kOmpNumThreads);
    if (omp != cfg.base_env.end())
      threads = std::atoi(omp->second.c_str());
    else if (cfg.nproc > 1)
      threads = 1;  // what launch sets
    std::string table = progress.summary(unixNow(), usableCpus(), threads);
    log::info("per-rank summary of attempt {}:\n{}", attempt, table);
    if (view.hasDashboard())
      view.setSummary(fmt::format("per-rank summary of attempt {}:\n{}{}", attempt, table,
                                  restarts.completed().empty()
                                      ? ""
                                      : "\nwhere each restart's time went:" + restarts.summary()),
                      unixNow());
  }

  // Everything but the workers themselves that the run started: SIGKILLed wherever it went.
  // Between attempts only the finished attempt's cgroup is killed (the next starts in a new one).
  void killLeftovers(bool whole_run) {
    if (cgroup) {
      if (whole_run)
        cgroup->killAll();
      else
        cgroup->killAttempt();
    }
    killMarkedProcesses(watchdog.marker(), templatePid());
    for (pid_t p : strayChildren()) kill(p, SIGKILL);
  }

  bool hangDetectionOn() const {
    return !cfg.options.hang_timeout_sec || *cfg.options.hang_timeout_sec > 0;
  }

  void removeStream(int fd) {
    loop.remove(fd);
    router.remove(fd);
    stream_fds.erase(std::remove(stream_fds.begin(), stream_fds.end(), fd), stream_fds.end());
  }

  std::string attemptDir() const { return run_dir + "/attempt_" + std::to_string(attempt); }
  std::string rankDir(int local_rank) const {
    return attemptDir() + "/" + std::to_string(local_rank);
  }

  // Kills whatever the previous attempt left: grandchildren in the workers' groups, and any
  // process carrying our marker that escaped them.
  void sweepAttempt() {
    if (pgids.empty()) return;  // nothing started yet
    for (pid_t g : pgids) {
      kill(-g, SIGKILL);
      watchdog.unwatchGroup(g);
    }
    killLeftovers(/*whole_run=*/false);
    known_strays.clear();
    pgids.clear();
    for (int fd : std::vector<int>(stream_fds)) {
      router.drain(fd);
      removeStream(fd);
    }
  }

  void startGroup() {
    closeHeartbeats();
    attempt = groups_started++;
    failures.clear();
    router.clearTails();
    log::info(
        "attempt {}: starting {} worker(s), ranks {}..{} of world size {}, MASTER_ADDR:PORT {}:{}",
        attempt, cfg.nproc, world.rank_offset, world.rank_offset + cfg.nproc - 1, world.world_size,
        world.master_addr, world.master_port);
    workers.clear();
    workers.resize(static_cast<size_t>(cfg.nproc));
    progress.start(cfg.nproc, world.rank_offset, unixNow());
    if (view.hasDashboard() && attempt > 0 &&
        (world.world_size != last_world_size || world.group_world_size != last_nodes))
      view.dashboardEvent(
          "membership",
          fmt::format("round {}: {} node(s), world size {} (was {} and {})", world.round,
                      world.group_world_size, world.world_size, last_nodes, last_world_size),
          unixNow());
    last_world_size = world.world_size;
    last_nodes = world.group_world_size;
    view.startAttempt(attempt, world.world_size, unixNow(), world.group_world_size,
                      world.group_rank, world.restart_count);
    if (first_group_started == 0) first_group_started = unixNow();
    hang.start(cfg.nproc, unixNow());
    output_seen.assign(static_cast<size_t>(cfg.nproc), 0);
    std::map<std::string, std::string> ckpt_env;
    if (ckpt_tier) {
      std::vector<int64_t> ranks;
      for (int lr = 0; lr < cfg.nproc; ++lr) ranks.push_back(world.rank_offset + lr);
      ckpt_env = ckpt_tier->startGroup(ranks);
      if (world.group_world_size > 1) startReplicas(ranks);
    }
    makePrivateDirs(run_dir, attemptDir());
    router.openDuplicateFiles(attemptDir());  // --duplicate-std*-filters: one file per attempt
    std::vector<SpawnedProcess> spawned;
    int warm_count = 0, cold_count = 0;
    for (int lr = 0; lr < cfg.nproc; ++lr) {
      std::string dir = rankDir(lr);
      makePrivateDirs(run_dir, dir);
      Worker& w = workers[lr];
      w.local_rank = lr;
      w.global_rank = world.rank_offset + lr;
      w.error_file = dir + "/error.json";
      WorkerContext ctx =
          workerContext(cfg.options, lr, cfg.nproc, world.restart_count, w.error_file);
      Environment extra = cfg.extra_env;
      for (const auto& [k, v] : world.worker_env) extra[k] = v;
      for (const auto& [k, v] : ckpt_env) extra[k] = v;
      extra[kMarkerEnv] = watchdog.marker();
      if (hangDetectionOn()) addFlightRecorderSocket(extra, dir);  // for a hang's report
      w.heartbeat = HeartbeatChannel::open();
      if (w.heartbeat) extra[kHeartbeatFdEnv] = std::to_string(w.heartbeat->fd());
      auto env = buildWorkerEnv(cfg.base_env, world, ctx, extra);
      StreamSelection redirect = cfg.options.redirects.forRank(lr);
      StreamSelection tee = cfg.options.tee.forRank(lr);
      const auto& filter = cfg.options.local_ranks_filter;
      bool shown = filter.empty() || std::find(filter.begin(), filter.end(), lr) != filter.end();
      bool out_console = shown && !(redirect.stdout_ && !tee.stdout_);
      bool err_console = shown && !(redirect.stderr_ && !tee.stderr_);

      SpawnOptions so;
      so.cgroup_dir_fd = cgroup ? cgroup->dirFd() : -1;
      so.cgroup_procs_fd = cgroup ? cgroup->procsFd() : -1;
      so.inherit_fd = w.heartbeat ? w.heartbeat->fd() : -1;
      if (lr < static_cast<int>(cfg.numa.size())) {
        so.cpus = cfg.numa[lr].cpus;
        so.mem_nodes = cfg.numa[lr].mem_nodes;
      }
      // On a terminal console, the streams that reach it are terminals too (progress bars,
      // colours and line buffering behave as under torchrun); narrower by the prefix.
      if (console_size) {
        so.stdout_terminal = out_console;
        so.stderr_terminal = err_console;
        std::string prefix = cfg.options.prefix_output
                                 ? expandPrefix(cfg.options.log_line_prefix_template,
                                                cfg.options.role, lr, w.global_rank)
                                 : "";
        so.columns = static_cast<unsigned short>(
            std::max<int>(20, console_size->ws_col - static_cast<int>(prefix.size())));
        so.rows = console_size->ws_row;
      }
      auto argv = substituteLocalRank(cfg.command, lr);
      SpawnedProcess p = spawnWarm(argv, env, so);
      if (p.pid > 0) {
        ++warm_count;
      } else {
        p = spawnProcess(argv, toEnvp(env), so);
        ++cold_count;
      }
      w.pid = p.pid;
      w.alive = true;
      pgids.push_back(p.pid);
      watchdog.watchGroup(p.pid);

      StreamRoute out{lr, w.global_rank, StreamKind::kStdout, out_console, -1};
      StreamRoute err{lr, w.global_rank, StreamKind::kStderr, err_console, -1};
      if (redirect.stdout_ || tee.stdout_) out.file_fd = openLog(dir + "/stdout.log");
      if (redirect.stderr_ || tee.stderr_) err.file_fd = openLog(dir + "/stderr.log");
      router.add(p.stdout_fd, out);
      router.add(p.stderr_fd, err);
      loop.add(p.stdout_fd, EPOLLIN, static_cast<uint64_t>(p.stdout_fd));
      loop.add(p.stderr_fd, EPOLLIN, static_cast<uint64_t>(p.stderr_fd));
      stream_fds.push_back(p.stdout_fd);
      stream_fds.push_back(p.stderr_fd);
      spawned.push_back(p);
    }
    stacks->setGroup(stacksGroup());
    // All forks first, then wait for the execs: the workers start in parallel.
    for (int lr = 0; lr < cfg.nproc; ++lr) {
      int e = awaitExec(spawned[lr]);
      if (e != 0) {
        std::string msg = "cannot execute '" + cfg.command[0] + "': " + strerror(e);
        log::error("local rank {}: {}", lr, msg);
        FailureDetail d;
        d.error = ErrorFileContents{msg, "", ""};
        pendingExecFailures[workers[lr].pid] = d;
      }
    }
    restarts.onStarted(unixNow(), warm_count, cold_count);
    if (warm_count > 0 && attempt == 0)
      log::info("--prewarm: {} of {} worker(s) forked from the template ({} imported in {:.2f}s)",
                warm_count, cfg.nproc, fmt::join(cfg.options.prewarm, ","),
                tmpl ? tmpl->importSeconds() : 0.0);
    rdzv.workersStarted();
    runAfterStartHooks(unixNow());  // those due at once (the manifest, a deferred preflight)
  }

  void runAfterStartHooks(double now) {
    while (first_group_started > 0 && after_start_done < cfg.after_start.size() &&
           now - first_group_started >= cfg.after_start[after_start_done].first)
      after_start_part.contain(cfg.after_start[after_start_done++].second);
  }

  const FailureDetail* rootDetail() const {
    const WorkerExit* root = sup.rootCause();
    for (const auto& f : failures)
      if (root && f.exit.pid == root->pid) return &f;
    return nullptr;
  }

  // One paragraph for the other nodes' reports.
  std::string failureSummary() const {
    const FailureDetail* d = rootDetail();
    if (!d) return "a worker group failed on " + cfg.host;
    std::string s = "host " + cfg.host + ", rank " + std::to_string(d->global_rank) +
                    " (local rank " + std::to_string(d->exit.local_rank) + ", pid " +
                    std::to_string(d->exit.pid) + "): " + d->exit.status.describe();
    if (d->error)
      s += ": " + d->error->message;
    else if (!d->stderr_tail.empty())
      s += "; last stderr line: " + d->stderr_tail.back();
    return s;
  }

  void killGroups(int sig) {
    for (pid_t g : pgids) {
      kill(-g, sig);
      // A stopped worker (SIGSTOP, a debugger) takes the signal only once continued: without
      // this it would wait out the whole --shutdown-timeout for SIGKILL.
      if (sig != SIGKILL) kill(-g, SIGCONT);
    }
  }

  void execute(const std::vector<Action>& actions) {
    for (const auto& a : actions) {
      switch (a.kind) {
        case Action::Kind::kStartRendezvous:
          view.setJobState("restarting", unixNow());
          sweepAttempt();
          rdzv.startRendezvous([this](std::optional<WorldAssignment> w, std::string error) {
            loop.post(
                [this, w = std::move(w), error = std::move(error)] { onRendezvousDone(w, error); });
          });
          break;
        case Action::Kind::kStartGroup:
          if (a.value > 0 && groups_started > 0) {
            log::warn("restarting the worker group: restart {} of {}", a.value,
                      cfg.options.max_restarts);
            view.dashboardEvent(
                "restart",
                fmt::format("restart {} of {}{}", a.value, cfg.options.max_restarts,
                            failures.empty() ? ""
                                             : fmt::format(": rank {} {}", failures[0].global_rank,
                                                           failures[0].exit.status.describe())),
                unixNow());
            view.countRestart();
          }
          startGroup();
          break;
        case Action::Kind::kRecordFailure: {
          if (!rdzv.roundStillCurrent()) {
            log::warn(
                "the worker group failed after this node's round {} had ended (evicted "
                "while stopped or unreachable?): re-joining as a newcomer; this uses no "
                "restart",
                world.round);
            execute(sup.onFailureOutlivedRound());
            break;
          }
          int count;
          try {
            count = rdzv.recordFailure(failureSummary());
          } catch (const std::exception& e) {
            log::error("cannot publish this node's failure to the job ({}): giving up", e.what());
            count = cfg.options.max_restarts + 1;
          }
          execute(sup.onFailureRecorded(count));
          break;
        }
        case Action::Kind::kTerminateAll:
          log::info("stopping {} worker(s) with {} (SIGKILL after {}s)", sup.liveWorkers(),
                    signalName(a.value), cfg.options.shutdown_timeout_sec);
          killGroups(a.value);
          break;
        case Action::Kind::kKillAll:
          log::warn("{} worker(s) still running: sending SIGKILL", sup.liveWorkers());
          killGroups(SIGKILL);
          break;
        case Action::Kind::kForwardSignal:
          log::info("forwarding {} to the workers", signalName(a.value));
          for (const auto& w : workers)
            if (w.alive) kill(-w.pid, a.value);
          break;
        case Action::Kind::kArmShutdownTimer: {
          if (shutdown_timer) loop.cancelTimer(shutdown_timer);
          auto t = seconds(std::max(cfg.options.shutdown_timeout_sec, 0.001));
          shutdown_timer = loop.addTimer(EventLoop::Clock::now() + t, [this] {
            shutdown_timer = 0;
            if (!done) execute(sup.onShutdownTimeout());
          });
          break;
        }
        case Action::Kind::kExit:
          done = true;
          exit_code = a.value;
          break;
      }
    }
  }

  void onChildExit(pid_t pid, int wstatus, const rusage& usage) {
    if (pid == templatePid()) return onTemplateExit(wstatus);
    auto it = std::find_if(workers.begin(), workers.end(),
                           [&](const Worker& w) { return w.pid == pid && w.alive; });
    if (it == workers.end()) return;  // a reparented grandchild or the watchdog: just reaped
    Worker& w = *it;
    w.alive = false;
    double exit_time = unixNow();
    progress.onStep(w.local_rank, w.step(), exit_time, w.waited());
    auto seconds = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
    progress.onExit(w.local_rank, exit_time, seconds(usage.ru_utime) + seconds(usage.ru_stime),
                    usage.ru_maxrss);
    hang.onExit(w.local_rank);
    if (ckpt_tier) ckpt_tier->onWorkerExit(w.global_rank, pid);
    // Output written before exit is shown before the exit is acted on.
    for (int fd : std::vector<int>(stream_fds)) router.drain(fd);
    ExitStatus st = ExitStatus::fromWaitStatus(wstatus);
    double now = unixNow();
    bool stopping = sup.phase() == Phase::kStopping;
    view.markExited(w.local_rank, st.shellCode());
    if (!st.success() && !stopping)
      view.dashboardEvent(
          "exit",
          fmt::format("rank {} (local rank {}) {}", w.global_rank, w.local_rank, st.describe()),
          now);
    if (!st.success()) {
      FailureDetail d;
      auto pending = pendingExecFailures.find(pid);
      if (pending != pendingExecFailures.end())
        d = pending->second;
      else
        d.error = readErrorFile(w.error_file);
      d.exit = WorkerExit{w.local_rank, pid, st, now, stopping};
      d.global_rank = w.global_rank;
      d.host = cfg.host;
      d.error_file = w.error_file;
      d.error_file_kept = !temp_base;
      d.stderr_tail = router.stderrTail(w.local_rank);
      failures.push_back(std::move(d));
      if (!stopping) {
        log::error("worker rank {} (local rank {}, pid {}) failed: {}", w.global_rank, w.local_rank,
                   pid, st.describe());
        restarts.onFailure(exit_time);
      }
    }
    if (std::none_of(workers.begin(), workers.end(), [](const Worker& x) { return x.alive; }))
      restarts.onStopped(now);
    stacks->setGroup(stacksGroup());
    execute(sup.onWorkerExit(w.local_rank, pid, st, now));
  }

  void onSignalFd() {
    signalfd_siginfo si{};
    while (read(sigfd, &si, sizeof(si)) == sizeof(si)) {
      int signo = static_cast<int>(si.ssi_signo);
      if (signo == SIGCHLD) {
        int wstatus;
        pid_t pid;
        rusage usage{};
        while ((pid = wait4(-1, &wstatus, WNOHANG, &usage)) > 0) onChildExit(pid, wstatus, usage);
      } else {
        log::warn("received {}", signalName(signo));
        auto actions = sup.onSignal(signo);
        // Stopping running workers for good: leave first (no join is in flight then).
        if (sup.stopReason() == StopReason::kSignal &&
            std::any_of(actions.begin(), actions.end(),
                        [](const Action& a) { return a.kind == Action::Kind::kTerminateAll; }))
          rdzv.leaveEarly();
        execute(actions);
      }
    }
  }

  int run() {
    execute(sup.start());
    epoll_event events[64];
    while (!done) {
      // Timers (the shutdown grace period, the monitor tick, the stray scan) and what other
      // threads posted run inside wait().
      int n = loop.wait(events, 64, -1);
      if (n < 0) throw Error(std::string("epoll_wait: ") + strerror(errno));
      for (int i = 0; i < n && !done; ++i) {
        uint64_t tag = events[i].data.u64;
        if (tag == kSignalTag) {
          onSignalFd();
        } else if (stacks->owns(tag)) {
          stacks->onEvent(tag);
        } else if (!router.onReadable(static_cast<int>(tag))) {
          removeStream(static_cast<int>(tag));
        }
      }
    }
    finish();
    sayWhatIsKept();
    return exit_code;
  }

  void finish() {
    tmpl.reset();  // its socket closed and its group SIGKILLed; reaped below
    for (pid_t g : pgids) kill(-g, SIGKILL);
    pgids.clear();
    for (int fd : std::vector<int>(stream_fds)) {
      router.drain(fd);
      removeStream(fd);
    }
    // Disarm the timers: none of them has anything left to do, and the reaping wait below
    // must not run them.
    for (auto* t : {&shutdown_timer, &monitor_timer, &stray_timer})
      if (*t) loop.cancelTimer(std::exchange(*t, 0));
    // Answers what waits for stacks (the workers are gone: their tools end at once).
    stacks->shutdown();
    watchdog.release();
    // Reap everything we were given as subreaper. While anything is left, it is killed: a
    // process that escaped the worker groups (setsid) and its environment (no marker) is in
    // the run's cgroup, or became our child when its parent died. Bounded: all of it is
    // SIGKILLed, again on every round as double forks hand us new orphans.
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
    while (true) {
      int wstatus;
      pid_t pid = waitpid(-1, &wstatus, WNOHANG);
      if (pid > 0) continue;
      if (pid < 0) break;  // ECHILD: nothing left
      killLeftovers(/*whole_run=*/true);
      auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
          deadline - std::chrono::steady_clock::now());
      if (left.count() <= 0) {
        log::warn("some processes did not exit within 5s of SIGKILL (stuck in the kernel?)");
        break;
      }
      epoll_event ev;
      // Woken by SIGCHLD on sigfd; the short cap covers orphans handed to us without one.
      loop.wait(&ev, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
      signalfd_siginfo si;
      while (read(sigfd, &si, sizeof(si)) == sizeof(si)) {
      }
    }
    if (cgroup) {
      // Launches killed whole (SIGKILL to launch, workers and watchdog at once) leave their
      // cgroups; nothing else ever removes them. Here, when this run's work is done, so the
      // scan costs its start nothing.
      const std::string own = fs::path(cgroup->path()).filename().string();
      cgroup.reset();
      if (int n = removeStaleRunCgroups(own))
        log::info("removed {} stale run cgroup(s) of launches that were killed", n);
    }
    router.setStatus("");  // the summary replaces it
    view.setJobState(exit_code == 0 ? "finished" : "failed", unixNow());
    summary_part.contain([&] { printSummary(); });
    if (ckpt_tier) {
      std::string line = ckpt_tier->drain(cfg.options.checkpoint_drain_timeout_sec);
      summary_part.contain([&] { printCheckpointSummary(); });
      if (line.find("not persisted") != std::string::npos)
        log::warn("{}", line);
      else if (!line.empty())
        log::info("{}", line);
    }
    if (view.hasDashboard()) {
      // The page's last state: the summary, and the failure report when there is one.
      if (const FailureDetail* root = exit_code != 0 ? rootDetail() : nullptr)
        summary_part.contain([&] {
          view.addToSummary("\n" + formatFailureReport(cfg.options.program, failures, *root),
                            unixNow());
        });
      view.finishDashboard();
    }
    bool job_ok = rdzv.finish(exit_code == 0);
    if (sup.stopReason() == StopReason::kSignal) {
      log::warn("stopped by {}: exit code {}", signalName(sup.stopSignal()), exit_code);
      return;
    }
    if (sup.stopReason() == StopReason::kJobFailedElsewhere || (exit_code == 0 && !job_ok)) {
      std::string cause = rdzv.jobFailure();
      log::error("the job failed on another node; root cause: {}",
                 cause.empty() ? "<not published>" : cause);
      if (exit_code == 0) exit_code = 1;
      return;
    }
    if (exit_code == 0 || sup.stopReason() == StopReason::kRendezvousFailed) return;
    const FailureDetail* root_detail = rootDetail();
    if (!root_detail) return;
    summary_part.contain([&] {
      std::string report = formatFailureReport(cfg.options.program, failures, *root_detail);
      writeAll(STDERR_FILENO, report.data(), report.size());
    });
    if (!cfg.python_origin.empty() && lacksTorch(*root_detail))
      log::error(
          "the workers ran under {}, which cannot import torch: set PYTHON_EXEC to the "
          "interpreter that has it, or run the launch installed in that environment",
          cfg.python_origin);
    if (!temp_base) log::info("logs and error files are in {}", run_dir);
  }

  // Said last, so that it is the line a user sees: where the files a report named stay.
  void sayWhatIsKept() {
    if (temp_base && !stacks->evidence().empty())
      log::warn(
          "the stacks saved during this run are kept in {} (private to you; remove it when "
          "done)",
          log_base);
  }
};

Agent::Agent(AgentConfig config, RendezvousHandler& rendezvous)
    : impl_(std::make_unique<Impl>(std::move(config), rendezvous)) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }
const std::string& Agent::runLogDir() const { return impl_->run_dir; }

}  // namespace ddpl::launcher
