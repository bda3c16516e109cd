#include "launcher/agent/agent.h"

#include <fcntl.h>
#include <fmt/format.h>
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
#include <utility>

#include "common/bytes.h"
#include "common/errors.h"
#include "common/event_loop.h"
#include "common/heartbeat.h"
#include "common/log.h"
#include "common/signals.h"
#include "launcher/agent/agent_options.h"
#include "launcher/agent/containment.h"
#include "launcher/agent/error_report.h"
#include "launcher/agent/hang_responder.h"
#include "launcher/agent/live_view.h"
#include "launcher/agent/output.h"
#include "launcher/agent/process.h"
#include "launcher/agent/reporting_part.h"
#include "launcher/agent/run_dir.h"
#include "launcher/agent/run_summary.h"
#include "launcher/agent/stacks_service.h"
#include "launcher/agent/supervisor.h"
#include "launcher/agent/warm_workers.h"
#include "launcher/agent/watchdog.h"
#include "launcher/checkpoint/checkpoint_keeper.h"
#include "launcher/health/flight_recorder.h"
#include "launcher/health/heartbeat_channel.h"
#include "launcher/health/progress.h"
#include "launcher/warm/restart_phases.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {
namespace {

// Without a cgroup, how often orphaned descendants are looked for (for the watchdog only: the
// end of a run finds them all regardless).
constexpr int kStrayScanSeconds = 1;
// The loop's tag for the signalfd; the workers' output pipes are tagged with their fd, the
// stacks service's descriptors with tags of its own (StacksService::owns).
constexpr uint64_t kSignalTag = uint64_t{1} << 40;

double unixNow() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6;
}

EventLoop::Clock::duration seconds(double s) {
  return std::chrono::duration_cast<EventLoop::Clock::duration>(std::chrono::duration<double>(s));
}

}  // namespace

struct Agent::Impl {
  struct Worker : WorkerState {
    std::string error_file;
  };

  AgentConfig cfg;
  RendezvousHandler& rdzv;  // every role: each part gets only its own (rendezvous_handler.h)
  Supervisor sup;
  OutputRouter router;
  std::optional<winsize> console_size;  // set when the console is a terminal (live mode)
  std::unique_ptr<RunCgroup> cgroup;    // null where the machine gives no writable cgroup v2
  Watchdog watchdog;
  EventLoop loop;
  int sigfd = -1;
  EventLoop::TimerId shutdown_timer = 0, monitor_timer = 0, stray_timer = 0;
  EventLoop::Clock::time_point shutdown_due{};  // when shutdown_timer fires (while it is set)
  Leftovers leftovers;
  ProgressTracker progress;
  bool status_line = false;
  LiveView view;
  HangWatch hang;
  std::unique_ptr<StacksService> stacks;
  std::unique_ptr<CheckpointKeeper> ckpt;  // set at setUp (off inside when the tier is)
  double first_group_started = 0;          // for cfg.after_start; 0: no group yet
  size_t after_start_done = 0;             // how many of cfg.after_start have run (sorted by time)
  int groups_started = 0;  // names attempt_<n> log dirs: restarts and re-formed rounds alike
  LogBase log_base;        // where run_dir is made
  std::string run_dir;
  WorldAssignment world;
  int attempt = 0;
  HeartbeatChannels heartbeats;  // the current group's, by local rank
  std::vector<Worker> workers;
  std::vector<pid_t> pgids;             // every worker group of the current attempt
  std::vector<int> stream_fds;          // open output pipes of the current attempt
  std::vector<FailureDetail> failures;  // of the current attempt
  std::map<pid_t, FailureDetail> pending_exec_failures;
  std::unique_ptr<WarmWorkers> prewarm;  // null: no --prewarm
  warm::RestartClock restarts;           // the phases of every restart
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
        console_size(terminalSize()),
        cgroup(makeCgroup(cfg)),
        watchdog(cfg.run_id + "-" + std::to_string(getpid()), cgroup ? cgroup->path() : ""),
        leftovers(watchdog),
        status_line(consoleOptions(cfg.options).status_line),
        view(cfg.options, cfg.host, status_line, router, rdzv, rdzv),
        hang(hangOptions(cfg.options), cfg.host) {
    log_base = makeLogBase(cfg.options.log_dir,
                           temporaryLogParent(cfg.base_env, writesOnlySmallFiles(cfg.options)));
    if (log_base.temporary) watchdog.removeOnDeath(log_base.path);
    try {
      setUp();
    } catch (...) {
      // The destructor does not run for a constructor that throws: nothing of ours stays.
      rdzv.setRoundEndedCallback({});
      rdzv.setStacksRequestedCallback({});
      if (status_line) log::setConsoleWrapper({});
      stacks.reset();
      if (sigfd >= 0) close(sigfd);
      removeAfterFailedStart(log_base, run_dir);
      throw;
    }
  }

  void setUp() {
    if (hangOptions(cfg.options).on()) addFlightRecorderBuffer(cfg.extra_env, cfg.base_env);
    run_dir = makeRunDir(log_base.path, cfg.run_id);
    if (loop.error())
      throw Error(std::string("cannot set up the event loop: ") + strerror(loop.error()));
    StacksService::Config sc = stacksConfig(cfg, run_dir);
    sc.status_line = [this] {
      return fmt::format("node {} ({}): {}", world.group_rank, cfg.host, view.logLine());
    };
    stacks = std::make_unique<StacksService>(std::move(sc), loop, rdzv);
    stacks->openControlSocket();

    sigset_t set = agentSignals(cfg.options.signals_to_handle);
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
    // Checkpoints in memory (docs/checkpoints.md): on unless --checkpoint-memory=0.
    ckpt = std::make_unique<CheckpointKeeper>(checkpointOptions(cfg), rdzv);
    if (ckpt->on()) watchdog.removeOnDeath(ckpt->root());
    // --prewarm: the template starts now, so that its imports overlap the rendezvous.
    if (!cfg.options.prewarm.empty()) {
      prewarm =
          std::make_unique<WarmWorkers>(cfg, run_dir, watchdog, [this] { rdzv.workersStarted(); });
      prewarm->start();
    }
  }

  // The template's pid, or -1: it is our child but neither a worker nor a stray.
  pid_t templatePid() const { return prewarm ? prewarm->templatePid() : -1; }

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
    if (done || round != world.round) return;  // stale
    if (sup.phase() == Phase::kRunning) {
      log::warn("round {} ended: {}; stopping workers to re-form the group", round, reason);
      restarts.onFailure(unixNow(), "round ended: " + reason);
      execute(sup.onMembershipChange());
    } else {
      log::warn("round {} ended: {}; its workers were already stopping", round, reason);
    }
    // A stop already under way (a hang found first, a failure) keeps its course, but not its
    // grace: a cut node whose hang limit fired before its fence gave its workers the whole
    // --shutdown-timeout after SIGTERM, and a worker blocked in a collective with a SIGTERM
    // handler outlived the window after which the service forms a round without this node.
    enforceFence(round);
  }

  // Fenced: the workers must be gone before the service can form a round without this node,
  // sooner than the usual grace allows.
  void enforceFence(int64_t round) {
    auto within = rdzv.fencedStopWithin(round);
    if (!within || sup.phase() != Phase::kStopping || sup.liveWorkers() == 0) return;
    auto by = EventLoop::Clock::now() + seconds(std::max(*within, 0.001));
    if (shutdown_timer && shutdown_due <= by) return;  // the SIGKILL comes sooner already
    armShutdownTimer(*within);
    log::warn("fencing: workers still running in {:.1f}s get SIGKILL", *within);
  }

  ~Impl() {
    rdzv.setStacksRequestedCallback({});
    if (status_line) {
      log::setConsoleWrapper({});
      router.setStatus("");
    }
    heartbeats.closeAll();
    done = true;         // what the stacks thread still hands back changes nothing now
    stacks->shutdown();  // waits for its thread (a no-op after finish())
    std::vector<std::string> evidence = stacks->evidence();
    stacks.reset();  // removes the control socket
    if (sigfd >= 0) close(sigfd);
    removeTemporaryBase(log_base, run_dir, evidence);
  }

  std::vector<WorkerState> workerStates() const {
    std::vector<WorkerState> out;
    for (const auto& w : workers) out.push_back(w);
    return out;
  }
  StacksGroup stacksGroup() const {
    return StacksGroup{attempt, attemptDir(), world.group_rank, workerStates()};
  }

  // Not strays: the live workers and the template.
  std::vector<pid_t> ours() const {
    std::vector<pid_t> out;
    for (const auto& w : workers)
      if (w.alive) out.push_back(w.pid);
    if (templatePid() > 0) out.push_back(templatePid());
    return out;
  }

  void onStrayScan() {
    // Strays descend from workers: none before the first group starts. The scan reads every
    // process's /proc stat; 1024 agents waiting on one machine for their rendezvous each did
    // it every second, and with some 2,000 processes that took most of both cores (issue 14's
    // 1024-agent benchmark: 58% system time, load 100, etcd starved).
    if (!workers.empty()) leftovers.scan(ours());
  }

  void onMonitorTick() {
    double now = unixNow();
    ckpt->tick(now);
    std::vector<RankReading> readings;
    for (const auto& w : workers) {
      uint64_t step = heartbeats.step(w.local_rank), waited = heartbeats.waitedMicros(w.local_rank);
      if (w.alive) progress.onStep(w.local_rank, step, now, waited);
      readings.push_back({w, step, waited, ckpt->bytesOf(w.global_rank)});
    }
    view.maybeUpdate(readings, progress, now);  // also publishes the node's status for the job
    if (!workers.empty()) {
      double restore = static_cast<double>(heartbeats.longestRestoreMicros()) / 1e6;
      if (auto r = restarts.onReadings(now, rankSteps(heartbeats, workerStates()), restore))
        log::info("restart {}: {}", r->restart, r->describe());
      if (restarts.takeChanged())
        view.setIncidents(incidentText(restarts, now, web::DashboardModel::kMaxIncidentRows), now);
    }
    runAfterStartHooks(now);
    view.reportStragglers(progress, now);
    if (view.stacksAsked())
      stacks->takeSnapshot([this](std::string text) {
        if (!done) view.setStacks("on demand", text, unixNow());
      });
    if (sup.phase() != Phase::kRunning || !hang.watching()) return;
    std::vector<HangWatch::Sample> live;
    for (const auto& w : workers)
      if (w.alive)
        live.push_back({w.local_rank, w.pid, heartbeats.step(w.local_rank),
                        router.bytesFrom(w.local_rank), heartbeats.finishedStepping(w.local_rank)});
    auto hangs = hang.check(live, now);
    if (!hangs.empty()) onHangs(hangs, now);
  }

  // Ranks made no progress past their limits: every node's stacks are saved (off this thread),
  // the hung ones and the likely culprit named, then the group stopped as for a failure.
  void onHangs(const std::vector<Hang>& hangs, double now) {
    restarts.onFailure(now, hangCause(hangs, world.rank_offset));
    for (const auto& h : hangs) {
      view.markHung(h.local_rank);
      view.dashboardEvent("hang", fmt::format("local rank {} hung: {}", h.local_rank, h.why), now);
    }
    HangWatch::Hooks hooks;
    hooks.ended = [this] { return done; };
    hooks.saved = [this](const std::string& text) { view.setStacks("hang", text, unixNow()); };
    hooks.found = [this, hung_attempt = attempt](std::vector<FailureDetail> found) {
      if (hung_attempt != attempt) return;  // the group ended meanwhile
      for (auto& d : found) {
        int local_rank = d.exit.local_rank, pid = d.exit.pid;
        double when = d.exit.unix_time;
        failures.push_back(std::move(d));
        execute(sup.onWorkerHung(local_rank, pid, when));
      }
    };
    hang.respond(hangs, now, workerStates(), attemptDir(), world.group_rank, progress,
                 view.metrics(), *stacks, std::move(hooks));
  }

  // Everything but the workers themselves that the run started: SIGKILLed wherever it went.
  void killLeftovers(bool whole_run) {
    leftovers.kill(cgroup.get(), whole_run, templatePid(), ours());
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
    leftovers.forget();
    pgids.clear();
    for (int fd : std::vector<int>(stream_fds)) {
      router.drain(fd);
      removeStream(fd);
    }
  }

  // The supervisor's kStartGroup: a new attempt's workers, in the world the rendezvous gave.
  void startGroup() {
    beginAttempt();
    std::map<std::string, std::string> ckpt_env = ckpt->startGroup(world, world.restart_count);
    makePrivateDirs(run_dir, attemptDir());
    router.openDuplicateFiles(attemptDir());  // --duplicate-std*-filters: one file per attempt
    std::vector<SpawnedProcess> spawned;
    int warm_count = 0;
    for (int lr = 0; lr < cfg.nproc; ++lr) {
      bool forked = false;  // from the warm template
      spawned.push_back(startWorker(lr, ckpt_env, &forked));
      warm_count += forked;
    }
    stacks->setGroup(stacksGroup());
    awaitExecs(spawned);
    restarts.onStarted(unixNow(), warm_count, cfg.nproc - warm_count);
    if (warm_count > 0 && attempt == 0) prewarm->sayFirstGroup(warm_count, cfg.nproc);
    rdzv.workersStarted();
    runAfterStartHooks(unixNow());  // those due at once (the manifest, a deferred preflight)
  }

  // The new attempt's records, its log line, and what watches it (progress, hangs, the view).
  void beginAttempt() {
    heartbeats.startGroup(cfg.nproc);
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
    view.startAttempt(attempt, world.round, world.world_size, unixNow(), world.group_world_size,
                      world.group_rank, world.restart_count);
    if (first_group_started == 0) first_group_started = unixNow();
    hang.startGroup(cfg.nproc, unixNow());
  }

  // Local rank `lr`'s worker: forked from the warm template where it can be, else started cold;
  // watched, and its streams routed. Its exec is awaited with the others' (awaitExecs).
  SpawnedProcess startWorker(int lr, const std::map<std::string, std::string>& ckpt_env,
                             bool* forked) {
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
    if (hangOptions(cfg.options).on()) addFlightRecorderSocket(extra, dir);  // for a hang's report
    const HeartbeatChannel* heartbeat = heartbeats.open(lr);
    if (heartbeat) extra[kHeartbeatFdEnv] = std::to_string(heartbeat->fd());
    auto env = buildWorkerEnv(cfg.base_env, world, ctx, extra);
    RankStreams streams = rankStreams(cfg.options, lr);
    SpawnOptions so = workerSpawnOptions(cfg, lr, w.global_rank, streams, cgroup.get(),
                                         heartbeat ? heartbeat->fd() : -1, console_size);
    auto argv = substituteLocalRank(cfg.command, lr);
    SpawnedProcess p = prewarm ? prewarm->spawn(argv, env, so) : SpawnedProcess{};
    *forked = p.pid > 0;
    if (!*forked) p = spawnProcess(argv, toEnvp(env), so);
    w.pid = p.pid;
    w.alive = true;
    pgids.push_back(p.pid);
    watchdog.watchGroup(p.pid);
    routeOutput(w, p, dir, streams);
    return p;
  }

  void routeOutput(const Worker& w, const SpawnedProcess& p, const std::string& dir,
                   const RankStreams& streams) {
    StreamRoute out{w.local_rank, w.global_rank, StreamKind::kStdout, streams.out_console, -1};
    StreamRoute err{w.local_rank, w.global_rank, StreamKind::kStderr, streams.err_console, -1};
    if (streams.outFile()) out.file_fd = openRankLog(dir + "/stdout.log");
    if (streams.errFile()) err.file_fd = openRankLog(dir + "/stderr.log");
    router.add(p.stdout_fd, out);
    router.add(p.stderr_fd, err);
    loop.add(p.stdout_fd, EPOLLIN, static_cast<uint64_t>(p.stdout_fd));
    loop.add(p.stderr_fd, EPOLLIN, static_cast<uint64_t>(p.stderr_fd));
    stream_fds.push_back(p.stdout_fd);
    stream_fds.push_back(p.stderr_fd);
  }

  // All forks first, then the execs awaited: the workers start in parallel. A failed exec is
  // the worker's failure when it exits.
  void awaitExecs(std::vector<SpawnedProcess>& spawned) {
    for (int lr = 0; lr < cfg.nproc; ++lr) {
      int e = awaitExec(spawned[lr]);
      if (e != 0) {
        std::string msg = "cannot execute '" + cfg.command[0] + "': " + strerror(e);
        log::error("local rank {}: {}", lr, msg);
        FailureDetail d;
        d.error = ErrorFileContents{msg, "", ""};
        pending_exec_failures[workers[lr].pid] = d;
      }
    }
  }

  void runAfterStartHooks(double now) {
    while (first_group_started > 0 && after_start_done < cfg.after_start.size() &&
           now - first_group_started >= cfg.after_start[after_start_done].first)
      after_start_part.contain(cfg.after_start[after_start_done++].second);
  }

  const FailureDetail* rootDetail() const {
    return launcher::rootDetail(sup.rootCause(), failures);
  }

  void killGroups(int sig) {
    for (pid_t g : pgids) {
      kill(-g, sig);
      // A stopped worker (SIGSTOP, a debugger) takes the signal only once continued: without
      // this it would wait out the whole --shutdown-timeout for SIGKILL.
      if (sig != SIGKILL) kill(-g, SIGCONT);
    }
  }

  // Carries out the supervisor's decisions, in order.
  void execute(const std::vector<Action>& actions) {
    for (const auto& a : actions) {
      switch (a.kind) {
        case Action::Kind::kStartRendezvous:
          startRendezvous();
          break;
        case Action::Kind::kStartGroup:
          if (a.value > 0 && groups_started > 0) announceRestart(a.value);
          startGroup();
          break;
        case Action::Kind::kRecordFailure:
          recordFailure();
          break;
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
        case Action::Kind::kArmShutdownTimer:
          armShutdownTimer(cfg.options.shutdown_timeout_sec);
          break;
        case Action::Kind::kExit:
          done = true;
          exit_code = a.value;
          break;
      }
    }
  }

  void startRendezvous() {
    view.setJobState("restarting", unixNow());
    sweepAttempt();
    rdzv.startRendezvous([this](std::optional<WorldAssignment> w, std::string error) {
      loop.post([this, w = std::move(w), error = std::move(error)] { onRendezvousDone(w, error); });
    });
  }

  void announceRestart(int restart) {
    log::warn("restarting the worker group: restart {} of {}", restart, cfg.options.max_restarts);
    view.dashboardEvent(
        "restart",
        fmt::format("restart {} of {}{}", restart, cfg.options.max_restarts,
                    failures.empty() ? ""
                                     : fmt::format(": rank {} {}", failures[0].global_rank,
                                                   failures[0].exit.status.describe())),
        unixNow());
    view.countRestart();
  }

  // The group failed: the job learns it (its restart budget is the job's), unless this node's
  // round ended meanwhile.
  void recordFailure() {
    if (!rdzv.roundStillCurrent()) {
      log::warn(
          "the worker group failed after this node's round {} had ended (evicted "
          "while stopped or unreachable?): re-joining as a newcomer; this uses no "
          "restart",
          world.round);
      return execute(sup.onFailureOutlivedRound());
    }
    int count;
    try {
      count = rdzv.recordFailure(failureSummary(rootDetail(), cfg.host));
    } catch (const std::exception& e) {
      log::error("cannot publish this node's failure to the job ({}): giving up", e.what());
      count = cfg.options.max_restarts + 1;
    }
    execute(sup.onFailureRecorded(count));
  }

  // Workers still running after `sec` get SIGKILL (the supervisor's onShutdownTimeout).
  void armShutdownTimer(double sec) {
    if (shutdown_timer) loop.cancelTimer(shutdown_timer);
    shutdown_due = EventLoop::Clock::now() + seconds(std::max(sec, 0.001));
    shutdown_timer = loop.addTimer(shutdown_due, [this] {
      shutdown_timer = 0;
      if (!done) execute(sup.onShutdownTimeout());
    });
  }

  void onChildExit(pid_t pid, int wstatus, const rusage& usage) {
    if (pid == templatePid()) return prewarm->onTemplateExit(wstatus, /*run_ended=*/done);
    auto it = std::find_if(workers.begin(), workers.end(),
                           [&](const Worker& w) { return w.pid == pid && w.alive; });
    if (it == workers.end()) return;  // a reparented grandchild or the watchdog: just reaped
    Worker& w = *it;
    w.alive = false;
    double exit_time = unixNow();
    progress.onStep(w.local_rank, heartbeats.step(w.local_rank), exit_time,
                    heartbeats.waitedMicros(w.local_rank));
    auto seconds = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
    progress.onExit(w.local_rank, exit_time, seconds(usage.ru_utime) + seconds(usage.ru_stime),
                    usage.ru_maxrss);
    hang.onExit(w.local_rank);
    ckpt->onWorkerExit(w.global_rank, pid);
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
      auto pending = pending_exec_failures.find(pid);
      failures.push_back(
          workerFailure(WorkerExit{w.local_rank, pid, st, now, stopping}, w.global_rank, cfg.host,
                        w.error_file, !log_base.temporary, router.stderrTail(w.local_rank),
                        pending != pending_exec_failures.end() ? &pending->second : nullptr));
      if (!stopping) {
        log::error("worker rank {} (local rank {}, pid {}) failed: {}", w.global_rank, w.local_rank,
                   pid, st.describe());
        restarts.onFailure(exit_time, fmt::format("rank {} (local rank {}) {}", w.global_rank,
                                                  w.local_rank, st.describe()));
      }
    }
    if (std::none_of(workers.begin(), workers.end(), [](const Worker& x) { return x.alive; })) {
      // The failed group's last steps, all written now.
      restarts.onReadings(now, rankSteps(heartbeats, workerStates()));
      restarts.onStopped(now);
      // When a fenced node's workers were gone is what the fence promises (and what the chaos
      // soak checks), so it has a line of its own.
      if (stopping) log::info("every worker of attempt {} has exited", attempt);
    }
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

  // The run's end: nothing of it left running, then what it did said, then the job's outcome.
  void finish() {
    stopEverything();
    reapEverything();
    // Here, when this run's work is done, so that the scan costs its start nothing.
    if (cgroup) retireRunCgroup(std::move(cgroup));
    summarize();
    reportOutcome(rdzv.finish(exit_code == 0));
  }

  void stopEverything() {
    if (prewarm) prewarm->stop();  // its socket closed and its group SIGKILLed; reaped below
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
  }

  // Reaps every child; woken by SIGCHLD on sigfd (the short cap of each wait covers orphans
  // handed to us without one).
  void reapEverything() {
    leftovers.reapAll(cgroup.get(), templatePid(), ours(), [this](int ms) {
      epoll_event ev;
      loop.wait(&ev, 1, ms);
      signalfd_siginfo si;
      while (read(sigfd, &si, sizeof(si)) == sizeof(si)) {
      }
    });
  }

  // The end-of-run summary (run_summary.h), the checkpoints', and the dashboard's last state.
  void summarize() {
    router.setStatus("");  // the summary replaces it
    view.setJobState(exit_code == 0 ? "finished" : "failed", unixNow());
    summary_part.contain([&] {
      std::string text = logRunSummary(progress, restarts, cfg.host, attempt,
                                       workerThreads(cfg.base_env, cfg.nproc), unixNow());
      if (view.hasDashboard() && !text.empty()) view.setSummary(text, unixNow());
      view.setIncidents(incidentText(restarts, unixNow(), web::DashboardModel::kMaxIncidentRows),
                        unixNow());
    });
    if (ckpt->on()) {
      std::string line = ckpt->drain();
      summary_part.contain([&] { ckpt->logSummary(); });
      CheckpointKeeper::logDrained(line);
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
  }

  // Why the run ended, and where to look: the failure report of this node's root cause, or
  // the job's (another node's), or the signal that stopped it.
  void reportOutcome(bool job_ok) {
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
    hintAtMissingTorch(*root_detail, cfg.python_origin);
    if (!log_base.temporary) log::info("logs and error files are in {}", run_dir);
  }

  // Said last, so that it is the line a user sees: where the files a report named stay.
  void sayWhatIsKept() {
    if (log_base.temporary && !stacks->evidence().empty())
      log::warn(
          "the stacks saved during this run are kept in {} (private to you; remove it when "
          "done)",
          log_base.path);
  }
};

Agent::Agent(AgentConfig config, RendezvousHandler& rendezvous)
    : impl_(std::make_unique<Impl>(std::move(config), rendezvous)) {}
Agent::~Agent() = default;
int Agent::run() { return impl_->run(); }
const std::string& Agent::runLogDir() const { return impl_->run_dir; }

}  // namespace ddpl::launcher
