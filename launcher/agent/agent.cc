#include "launcher/agent/agent.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/timerfd.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <set>
#include <sstream>
#include <thread>
#include <variant>

#include "common/defaults.h"
#include "common/errors.h"
#include "common/heartbeat.h"
#include "common/log.h"
#include "common/signals.h"
#include "common/torchrun_env.h"
#include "launcher/agent/containment.h"
#include "launcher/agent/error_report.h"
#include "launcher/agent/output.h"
#include "launcher/agent/process.h"
#include "launcher/agent/supervisor.h"
#include "launcher/agent/watchdog.h"
#include "launcher/gpu/nvml.h"
#include "launcher/health/job_view.h"
#include "launcher/health/metrics_plugin.h"
#include "launcher/health/progress.h"
#include "launcher/health/stacks.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {
namespace {

// Without a cgroup, how often orphaned descendants are looked for (for the watchdog only: the
// end of a run finds them all regardless).
constexpr int kStrayScanSeconds = 1;
// How long a stack snapshot tool may take per hang (all ranks at once).
constexpr double kStackSeconds = 10;
constexpr const char* kControlSocket = "control.sock";

double unixNow() {
  timeval tv{};
  gettimeofday(&tv, nullptr);
  return static_cast<double>(tv.tv_sec) + tv.tv_usec / 1e6;
}

sigset_t signalSet(const std::vector<int>& signals) {
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGCHLD);
  for (int s : signals) sigaddset(&set, s);
  return set;
}

// Creates the run's directory and returns it. Never an earlier run's logs: a reused run id gets
// a numbered sibling. Created by this mkdir, exclusively and private (0700): a --log-dir may be a
// shared directory, where a name planted in advance (a symlink to somewhere else) must never
// be written through, and the files inside hold the command line and environment (issue 33).
std::string makeRunDir(const std::string& base, const std::string& run_id) {
  for (int k = 0; k < 10000; ++k) {
    fs::path p = fs::path(base) / (k == 0 ? run_id : run_id + "." + std::to_string(k));
    if (mkdir(p.c_str(), 0700) == 0) return p.string();
    if (errno != EEXIST)
      throw Error("cannot create the run directory " + p.string() + ": " + strerror(errno));
  }
  throw Error("cannot create a run directory for run id '" + run_id + "' in " + base +
              ": 10000 names taken");
}

}  // namespace

int controlRequest(const std::string& run_dir, const std::string& what) {
  std::string path = run_dir + "/" + kControlSocket;
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  if (path.size() >= sizeof(addr.sun_path)) {
    fprintf(stderr, "launch %s: '%s' is too long a path for a socket\n", what.c_str(),
            path.c_str());
    return 1;
  }
  memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    fprintf(stderr,
            "launch %s: no running launch answers at %s (%s): give the run directory "
            "launch printed at start, while its job runs\n",
            what.c_str(), path.c_str(), strerror(errno));
    if (fd >= 0) close(fd);
    return 1;
  }
  std::string request = what + "\n";
  writeAll(fd, request.data(), request.size());
  std::string reply;
  char buf[4096];
  pollfd p{fd, POLLIN, 0};
  // A snapshot takes at most kStackSeconds here, then as long again waiting for the other
  // nodes' (they take theirs at the same time); a little more for the files.
  while (poll(&p, 1, static_cast<int>(2 * kStackSeconds * 1000) + 10000) == 1) {
    ssize_t n = read(fd, buf, sizeof(buf));
    if (n <= 0) break;
    reply.append(buf, static_cast<size_t>(n));
  }
  close(fd);
  fputs(reply.c_str(), stdout);
  return reply.rfind("ok", 0) == 0 ? 0 : 1;
}

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
    int heartbeat_fd = -1;  // memfd the worker writes its step to (common/heartbeat.h)
    const volatile uint64_t* heartbeat = nullptr;  // launch's read-only mapping of it
  };

  AgentConfig cfg;
  RendezvousHandler& rdzv;
  Supervisor sup;
  OutputRouter router;
  std::optional<winsize> console_size;  // set when the console is a terminal (live mode)
  std::unique_ptr<RunCgroup> cgroup;    // null where the machine gives no writable cgroup v2
  Watchdog watchdog;
  int epfd = -1, sigfd = -1, timerfd = -1, wakefd = -1;
  // Without a cgroup: a periodic look for orphaned descendants (our subreaper children), so
  // that the watchdog knows them should launch be SIGKILLed.
  int strayfd = -1;
  std::set<pid_t> known_strays;
  // Reads the workers' heartbeats every --monitor-interval, for the end-of-run summary.
  int monitorfd = -1;
  // `launch stacks RUN_DIR` connects here (RUN_DIR/control.sock) for a snapshot of every
  // worker's stack while the job runs on.
  int controlfd = -1;
  ProgressTracker progress;
  // This node's stacks saved at its own hang detection (for another node that asks).
  int own_hang_attempt = -1;
  std::string own_hang_answer;
  // The live view (--monitor): a status line kept at the bottom of a terminal, or a log line
  // every --monitor-log-interval.
  JobView view;
  std::unique_ptr<MetricsEndpoint> metrics;  // --metrics-port
  // GPU figures: NVML is loaded at the first view update (off the start-up path); null when
  // the machine has no driver.
  std::unique_ptr<Nvml> nvml;
  bool nvml_tried = false;
  bool status_line = false, view_log = false;
  double next_view = 0, next_view_log = 0;
  double first_group_started = 0;  // for cfg.after_start; 0: no group yet
  size_t after_start_done = 0;     // how many of cfg.after_start have run (sorted by time)
  double next_straggler_check = 0;
  HangDetector hang;
  std::vector<uint64_t> output_seen;  // bytes of each local rank's output at the last tick
  // Rendezvous answers and round ends arrive on other threads; the loop takes them from here.
  struct RdzvDone {
    std::optional<WorldAssignment> world;
    std::string error;
  };
  struct RoundEnd {
    int64_t round;
    std::string reason;
  };
  struct StacksRequest {  // from another node, through the rendezvous service
    int64_t id;
    std::string why;
  };
  using InboxEvent = std::variant<RdzvDone, RoundEnd, StacksRequest>;
  std::mutex inbox_mu;
  std::vector<InboxEvent> inbox;
  int groups_started = 0;  // names attempt_<n> log dirs: restarts and re-formed rounds alike
  std::string log_base, run_dir;
  bool temp_base = false;
  std::vector<std::string> evidence;  // files and folders a report pointed at (kept at exit)
  WorldAssignment world;
  int attempt = 0;
  std::vector<Worker> workers;
  std::vector<pid_t> pgids;             // every worker group of the current attempt
  std::vector<int> stream_fds;          // open output pipes of the current attempt
  std::vector<FailureDetail> failures;  // of the current attempt
  bool done = false;
  int exit_code = 0;

  Impl(AgentConfig c, RendezvousHandler& r)
      : cfg(std::move(c)),
        rdzv(r),
        sup(Supervisor::Config{cfg.nproc, cfg.options.max_restarts, stopSignals(cfg.options)}),
        router(consoleOptions(cfg.options)),
        hang(hangOptions(cfg.options)),
        console_size(terminalSize()),
        cgroup(makeCgroup(cfg)),
        watchdog(cfg.run_id + "-" + std::to_string(getpid()), cgroup ? cgroup->path() : "") {
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
      for (int fd : {epfd, sigfd, timerfd, wakefd, strayfd, monitorfd, controlfd})
        if (fd >= 0) close(fd);
      std::error_code ec;
      if (temp_base)
        fs::remove_all(log_base, ec);
      else if (!run_dir.empty())
        fs::remove_all(run_dir, ec);
      throw;
    }
  }

  void setUp() {
    run_dir = makeRunDir(log_base, cfg.run_id);
    openControlSocket();

    epfd = epoll_create1(EPOLL_CLOEXEC);
    sigset_t set = signalSet(cfg.options.signals_to_handle);
    sigfd = signalfd(-1, &set, SFD_CLOEXEC | SFD_NONBLOCK);
    timerfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    wakefd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (epfd < 0 || sigfd < 0 || timerfd < 0 || wakefd < 0)
      throw Error(std::string("cannot set up the event loop: ") + strerror(errno));
    addFd(sigfd);
    addFd(timerfd);
    addFd(wakefd);
    if (controlfd >= 0) addFd(controlfd);
    monitorfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    if (monitorfd >= 0) {
      itimerspec every{};
      double t = std::max(cfg.options.monitor_interval_sec, 0.01);
      every.it_interval.tv_sec = static_cast<time_t>(t);
      every.it_interval.tv_nsec =
          static_cast<long>((t - static_cast<double>(every.it_interval.tv_sec)) * 1e9);
      every.it_value = every.it_interval;
      timerfd_settime(monitorfd, 0, &every, nullptr);
      addFd(monitorfd);
    }
    if (!cgroup) {
      strayfd = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
      if (strayfd >= 0) {
        itimerspec every{};
        every.it_interval.tv_sec = every.it_value.tv_sec = kStrayScanSeconds;
        timerfd_settime(strayfd, 0, &every, nullptr);
        addFd(strayfd);
      }
    }
    MonitorMode mode = cfg.options.monitor;
    status_line = consoleOptions(cfg.options).status_line;
    view_log = mode == MonitorMode::kLog || (mode == MonitorMode::kAuto && !status_line);
    // Launch's own log lines go above the status line, not through it.
    if (status_line)
      log::setConsoleWrapper(
          [this](const std::function<void()>& write) { router.aroundConsoleWrite(write); });
    std::sort(cfg.after_start.begin(), cfg.after_start.end(),
              [](const auto& a, const auto& b) { return a.first < b.first; });
    rdzv.setRoundEndedCallback([this](int64_t round, std::string reason) {
      post(RoundEnd{round, std::move(reason)});
    });
    rdzv.setStacksRequestedCallback([this](int64_t id, std::string why) {
      post(StacksRequest{id, std::move(why)});
    });
    if (cfg.options.metrics_port) {
      MetricsOptions mo;
      mo.host = cfg.options.metrics_host;
      mo.port = *cfg.options.metrics_port;
      mo.node = cfg.host;
      metrics = startMetricsEndpoint(mo);
      const bool v6 = mo.host.find(':') != std::string::npos;
      log::info("metrics of this node's ranks on http://{}{}{}:{}/metrics", v6 ? "[" : "", mo.host,
                v6 ? "]" : "", metrics->port());
    }
  }

  template <typename E>
  void post(E event) {
    {
      std::lock_guard<std::mutex> lock(inbox_mu);
      inbox.emplace_back(std::move(event));
    }
    uint64_t one = 1;
    ssize_t ignored = write(wakefd, &one, sizeof(one));
    (void)ignored;
  }

  void onWake() {
    uint64_t n;
    ssize_t ignored = read(wakefd, &n, sizeof(n));
    (void)ignored;
    std::vector<InboxEvent> events;
    {
      std::lock_guard<std::mutex> lock(inbox_mu);
      events.swap(inbox);
    }
    for (auto& e : events) {
      if (done) return;
      if (auto* d = std::get_if<RdzvDone>(&e)) {
        if (d->world) {
          world = *d->world;
          execute(sup.onRendezvousComplete(world.restart_count));
        } else {
          log::error("rendezvous failed: {}", d->error);
          execute(sup.onRendezvousFailed());
        }
      } else if (auto* r = std::get_if<RoundEnd>(&e)) {
        if (r->round != world.round || sup.phase() != Phase::kRunning) continue;  // stale
        log::warn("round {} ended: {}; stopping workers to re-form the group", r->round, r->reason);
        execute(sup.onMembershipChange());
      } else if (auto* q = std::get_if<StacksRequest>(&e)) {
        answerStacksRequest(q->id, q->why);
      }
    }
  }

  ~Impl() {
    rdzv.setStacksRequestedCallback({});
    if (status_line) {
      log::setConsoleWrapper({});
      router.setStatus("");
    }
    closeHeartbeats();
    for (int fd : {epfd, sigfd, timerfd, wakefd, strayfd, monitorfd, controlfd})
      if (fd >= 0) close(fd);
    if (controlfd >= 0) unlink((run_dir + "/" + kControlSocket).c_str());
    if (temp_base) {
      std::error_code ec;
      if (evidence.empty())
        fs::remove_all(log_base, ec);
      else
        keepOnlyEvidence();
    }
  }

  // A run without --log-dir removes its directory at exit, except what a report or an answer
  // pointed the user at (saved stacks, and the manifest that says what ran): deleting the
  // evidence of a hang as the user goes to read it helps nobody (issue 33).
  void keepOnlyEvidence() {
    std::error_code ec;
    std::vector<fs::path> doomed;
    for (fs::recursive_directory_iterator it(log_base, ec), end; !ec && it != end;
         it.increment(ec)) {
      if (it->is_directory(ec) && !it->is_symlink(ec)) continue;
      std::string p = it->path().string();
      bool keep = p == run_dir + "/manifest.json" ||
                  std::any_of(evidence.begin(), evidence.end(), [&](const std::string& e) {
                    return p == e || p.rfind(e + "/", 0) == 0;
                  });
      if (!keep) doomed.push_back(it->path());
    }
    for (const auto& p : doomed) fs::remove(p, ec);
    // Directories left empty go too, deepest first.
    std::vector<fs::path> dirs;
    for (fs::recursive_directory_iterator it(log_base, ec), end; !ec && it != end; it.increment(ec))
      if (it->is_directory(ec) && !it->is_symlink(ec)) dirs.push_back(it->path());
    std::sort(dirs.begin(), dirs.end(), [](const fs::path& a, const fs::path& b) {
      return a.string().size() > b.string().size();
    });
    for (const auto& d : dirs) fs::remove(d, ec);  // removes only an empty one
  }

  static std::unique_ptr<RunCgroup> makeCgroup(const AgentConfig& c) {
    if (!c.options.use_cgroup) return nullptr;
    std::string name = kRunCgroupPrefix + c.run_id + "-" + std::to_string(getpid());
    for (char& ch : name)
      if (!isalnum(static_cast<unsigned char>(ch)) && ch != '-' && ch != '_' && ch != '.') ch = '_';
    std::string why;
    auto cg = RunCgroup::create(name, &why);
    if (cg)
      log::debug("workers run in cgroup {}: nothing they start can outlive the run", cg->path());
    else
      log::debug(
          "no cgroup for this run ({}): processes that leave their group and their "
          "environment are found as launch's orphaned children instead",
          why);
    return cg;
  }

  // Our children that are not workers or the watchdog: descendants orphaned to us.
  std::vector<pid_t> strayChildren() const {
    std::vector<pid_t> out;
    for (pid_t p : childrenOf(getpid())) {
      if (p == watchdog.pid()) continue;
      bool worker = std::any_of(workers.begin(), workers.end(),
                                [&](const Worker& w) { return w.pid == p && w.alive; });
      if (!worker) out.push_back(p);
    }
    return out;
  }

  void onStrayScan() {
    uint64_t expirations;
    ssize_t ignored = read(strayfd, &expirations, sizeof(expirations));
    (void)ignored;
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

  // A memfd per worker for its step count, mapped read-only here. Without one (memfd refused)
  // the worker simply gets no DDPL_HEARTBEAT_FD. Its size is sealed before the worker sees it:
  // a worker that shrank the file would make our next read of the mapping a SIGBUS, killing
  // launch (issue 33). Without sealing (a kernel that refuses it) there is no channel at all.
  void openHeartbeat(Worker& w) {
    int fd = memfd_create("ddpl-heartbeat", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) return;
    void* map = MAP_FAILED;
    if (ftruncate(fd, kHeartbeatBytes) == 0 &&
        fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) == 0)
      map = mmap(nullptr, kHeartbeatBytes, PROT_READ, MAP_SHARED, fd, 0);
    if (map == MAP_FAILED) {
      close(fd);
      return;
    }
    w.heartbeat_fd = fd;
    w.heartbeat = static_cast<const volatile uint64_t*>(map);
  }

  void closeHeartbeats() {
    for (auto& w : workers) {
      if (w.heartbeat) munmap(const_cast<uint64_t*>(w.heartbeat), kHeartbeatBytes);
      if (w.heartbeat_fd >= 0) close(w.heartbeat_fd);
      w.heartbeat = nullptr;
      w.heartbeat_fd = -1;
    }
  }

  // Little-endian on disk and in memory alike on the machines we run on (x86-64, AArch64).
  static uint64_t stepOf(const Worker& w) {
    return w.heartbeat ? w.heartbeat[kHeartbeatStepOffset / sizeof(uint64_t)] : 0;
  }
  static uint64_t waitedOf(const Worker& w) {
    return w.heartbeat ? w.heartbeat[kHeartbeatWaitOffset / sizeof(uint64_t)] : 0;
  }

  void onMonitorTick() {
    uint64_t expirations;
    ssize_t ignored = read(monitorfd, &expirations, sizeof(expirations));
    (void)ignored;
    double now = unixNow();
    for (const auto& w : workers)
      if (w.alive) progress.onStep(w.local_rank, stepOf(w), now, waitedOf(w));
    if (now >= next_view) updateView(now);  // also publishes the node's status for the job
    runAfterStartHooks(now);
    if (now >= next_straggler_check) {
      next_straggler_check = now + 1;
      for (const auto& s : progress.newStragglers()) {
        log::warn("straggler on {}: {}", cfg.host, s.describe());
        if (metrics) metrics->onStraggler(s.global_rank, s.local_rank);
      }
    }
    if (!hangDetectionOn() || sup.phase() != Phase::kRunning) return;
    // CPU time counts only for ranks without steps, and only when a limit was given.
    bool want_cpu = cfg.options.hang_timeout_sec.has_value();
    for (const auto& w : workers) {
      if (!w.alive) continue;
      uint64_t bytes = router.bytesFrom(w.local_rank);
      bool wrote = bytes != output_seen[w.local_rank];
      output_seen[w.local_rank] = bytes;
      hang.observe(w.local_rank, stepOf(w), want_cpu ? processTreeCpuSeconds(w.pid) : 0, wrote,
                   now);
    }
    auto hangs = hang.check(now);
    if (!hangs.empty()) onHangs(hangs, now);
  }

  void openControlSocket() {
    std::string path = run_dir + "/" + kControlSocket;
    sockaddr_un addr{};
    addr.sun_family = AF_UNIX;
    std::error_code ec;
    fs::create_directories(run_dir, ec);
    if (ec || path.size() >= sizeof(addr.sun_path)) {
      log::debug("no control socket ({}): launch stacks is not available for this run",
                 ec ? ec.message() : "path too long: " + path);
      return;
    }
    memcpy(addr.sun_path, path.c_str(), path.size() + 1);
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0 || bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0 ||
        listen(fd, 4) != 0) {
      log::debug("no control socket at {}: {}", path, strerror(errno));
      if (fd >= 0) close(fd);
      return;
    }
    controlfd = fd;
    log::info("run directory {} (`launch stacks {}` saves every worker's stack while it runs)",
              run_dir, run_dir);
  }

  // One request per connection: "stacks\n". Answered with where the snapshot went and each
  // rank's innermost frame; anything else is refused. Bounded: a client that sends nothing in
  // a second is dropped.
  void onControl() {
    int c = accept4(controlfd, nullptr, nullptr, SOCK_CLOEXEC);
    if (c < 0) return;
    pollfd p{c, POLLIN, 0};
    char buf[64] = {0};
    ssize_t n = poll(&p, 1, 1000) == 1 ? read(c, buf, sizeof(buf) - 1) : -1;
    std::string reply, request = n > 0 ? std::string(buf, static_cast<size_t>(n)) : "";
    if (request.rfind("stacks", 0) == 0) {
      reply = snapshotForUser();
    } else if (request.rfind("status", 0) == 0) {
      reply =
          "ok\n" + fmt::format("node {} ({}): {}\n", world.group_rank, cfg.host, view.logLine());
      for (const auto& line : rdzv.otherNodesStatus()) reply += line + "\n";
    } else {
      reply = "error: unknown request (launch stacks|status RUN_DIR send 'stacks' or 'status')\n";
    }
    writeAll(c, reply.data(), reply.size());
    close(c);
  }

  std::string snapshotDir() {
    char stamp[32];
    time_t t = time(nullptr);
    strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", localtime(&t));
    std::string dir = run_dir + "/snapshots/" + stamp;
    makePrivateDirs(run_dir, dir);
    return dir;
  }

  // Saves every running worker's stack, each in the file `path_of(local_rank)` names, and
  // describes each rank in one line: "rank R (local rank L, pid P): <innermost frame>".
  std::vector<std::string> saveStacks(const std::function<std::string(int)>& path_of,
                                      std::map<int, StackSummary>* summaries = nullptr) {
    std::vector<std::string> lines;
    for (const auto& s : snapshotWorkers()) {
      std::string path = path_of(s.local_rank);
      evidence.push_back(path);
      std::ofstream(path) << "# " << (s.tool.empty() ? "no tool" : s.tool) << "\n" << s.text;
      auto st = summarizeStack(s.text, s.pid);
      lines.push_back(fmt::format("rank {} (local rank {}, pid {}){}: {}",
                                  workers[s.local_rank].global_rank, s.local_rank, s.pid,
                                  st.in_collective ? "" : " outside any collective",
                                  st.innermost.empty() ? "<no frames>" : st.innermost[0]));
      if (summaries) (*summaries)[s.local_rank] = std::move(st);
    }
    return lines;
  }

  // Another node asked (a hang there, or `launch stacks` on it): save this node's stacks
  // where a hang's or a snapshot's go here, and answer with where and what.
  void answerStacksRequest(int64_t id, const std::string& why) {
    bool hang = why.rfind("hang", 0) == 0;
    log::warn("another node asks for every worker's stack ({})", why);
    // Ranks here wait in the same collective, so this node usually finds the hang at the same
    // moment and has saved its stacks already (its workers may be stopping now): say so.
    if (hang && own_hang_attempt == attempt && !own_hang_answer.empty()) {
      rdzv.answerStacks(id, own_hang_answer);
      return;
    }
    std::string dir = hang ? "" : snapshotDir();
    auto lines = saveStacks([&](int lr) {
      return hang ? rankDir(lr) + "/stacks.txt" : dir + "/" + std::to_string(lr) + ".txt";
    });
    std::string answer = fmt::format(
        "node {} ({}): {}", world.group_rank, cfg.host,
        lines.empty() ? "no worker running"
                      : fmt::format("{} stack(s) saved in {}", lines.size(),
                                    hang ? attemptDir() + "/<local rank>/stacks.txt" : dir));
    for (const auto& l : lines) answer += "\n  " + l;
    rdzv.answerStacks(id, answer);
    log::info("{}", answer);
  }

  // The other nodes' answers to request `id`, waiting for them (bounded) while answering
  // their own requests: nodes whose ranks wait in one collective find a hang at the same
  // moment and ask each other.
  std::vector<std::string> gatherRemoteStacks(int64_t id) {
    if (id <= 0) return {};
    const double limit = kStackSeconds + 5;
    auto deadline =
        std::chrono::steady_clock::now() +
        std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::duration<double>(limit));
    RendezvousHandler::StacksAnswers got;
    while (true) {
      answerPendingStacksRequests();
      got = rdzv.stacksAnswers(id);
      if (got.missing.empty() || std::chrono::steady_clock::now() >= deadline) break;
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
    }
    for (int node : got.missing)
      got.answers.push_back(fmt::format("node {}: no answer within {:.0f}s", node, limit));
    return got.answers;
  }

  void answerPendingStacksRequests() {
    std::vector<StacksRequest> requests;
    {
      std::lock_guard<std::mutex> lock(inbox_mu);
      for (auto it = inbox.begin(); it != inbox.end();) {
        if (auto* q = std::get_if<StacksRequest>(&*it)) {
          requests.push_back(std::move(*q));
          it = inbox.erase(it);
        } else {
          ++it;
        }
      }
    }
    for (const auto& q : requests) answerStacksRequest(q.id, q.why);
  }

  std::string snapshotForUser() {
    if (std::none_of(workers.begin(), workers.end(), [](const Worker& w) { return w.alive; }))
      return "error: no worker is running now\n";
    int64_t remote = rdzv.requestStacks(
        fmt::format("snapshot asked on node {} ({})", world.group_rank, cfg.host));
    std::string dir = snapshotDir();
    auto lines = saveStacks([&](int lr) { return dir + "/" + std::to_string(lr) + ".txt"; });
    std::string reply = "ok " + dir + "\n";
    for (const auto& l : lines) reply += l + "\n";
    log::info("stacks of {} worker(s) saved in {} (asked through the control socket)", lines.size(),
              dir);
    for (const auto& a : gatherRemoteStacks(remote)) reply += a + "\n";
    return reply;
  }

  // The stacks of every running worker, taken at once (py-spy for Python workers).
  std::vector<StackSnapshot> snapshotWorkers() const {
    std::vector<std::pair<int, pid_t>> alive;
    for (const auto& w : workers)
      if (w.alive) alive.emplace_back(w.local_rank, w.pid);
    // launch added the interpreter, or the command names one (`launch --no-python python3 x.py`).
    bool python = !cfg.python_origin.empty() || runsPython(cfg.command);
    auto path = cfg.base_env.find("PATH");
    auto tools = findStackTools(python ? cfg.command[0] : "",
                                path == cfg.base_env.end() ? "" : path->second);
    return snapshotStacks(alive, python, tools, kStackSeconds);
  }

  // Ranks made no progress past their limits: save every rank's stacks, name the hung ones and
  // the likely culprit (a rank not inside a collective while the others wait in one), then
  // stop the group as for a failure.
  void onHangs(const std::vector<Hang>& hangs, double now) {
    for (const auto& h : hangs) {
      log::error("rank {} (local rank {}) is hung: {}", workers[h.local_rank].global_rank,
                 h.local_rank, h.why);
      if (metrics) metrics->onHang(workers[h.local_rank].global_rank, h.local_rank);
    }
    std::string steps;
    for (const auto& r : progress.ranks())
      steps += fmt::format("{}rank {}: {}", steps.empty() ? "" : ", ", r.global_rank,
                           r.first_beat ? "step " + std::to_string(r.step) : "no step reported");
    log::error("last step of each rank: {}", steps);

    // The other nodes save theirs at the same time, before anything is stopped here.
    std::string names;
    for (const auto& h : hangs)
      names += (names.empty() ? "" : ", ") + std::to_string(workers[h.local_rank].global_rank);
    int64_t remote = rdzv.requestStacks(
        fmt::format("hang: rank(s) {} on node {} ({})", names, world.group_rank, cfg.host));
    std::map<int, StackSummary> summary;
    auto lines = saveStacks([&](int lr) { return rankDir(lr) + "/stacks.txt"; }, &summary);
    own_hang_attempt = attempt;
    own_hang_answer = fmt::format("node {} ({}): found the hang itself; {} stack(s) saved in {}",
                                  world.group_rank, cfg.host, lines.size(),
                                  attemptDir() + "/<local rank>/stacks.txt");
    for (const auto& l : lines) own_hang_answer += "\n  " + l;
    std::vector<int> outside;
    for (const auto& [lr, st] : summary)
      if (!st.in_collective && !st.innermost.empty()) outside.push_back(lr);
    if (!outside.empty() && outside.size() < summary.size()) {
      std::string names;
      for (int lr : outside)
        names += (names.empty() ? "" : ", ") + std::to_string(workers[lr].global_rank);
      log::error(
          "likely culprit: rank(s) {} (not inside a collective while the others wait in "
          "one)",
          names);
    }
    for (const auto& [lr, st] : summary) {
      std::string frames;
      for (const auto& f : st.innermost) frames += "\n    " + f;
      log::error("rank {} stack ({}), innermost first:{}", workers[lr].global_rank,
                 rankDir(lr) + "/stacks.txt", frames.empty() ? " <none>" : frames);
    }
    for (const auto& a : gatherRemoteStacks(remote)) log::error("stacks on another node: {}", a);
    // The likely culprits first: the first one recorded is the report's root cause.
    std::vector<Hang> ordered = hangs;
    std::stable_partition(ordered.begin(), ordered.end(), [&](const Hang& h) {
      return std::find(outside.begin(), outside.end(), h.local_rank) != outside.end();
    });
    for (const auto& h : ordered) {
      Worker& w = workers[h.local_rank];
      FailureDetail d;
      std::string frames;
      for (const auto& f : summary[h.local_rank].innermost) frames += f + "\n";
      d.error = ErrorFileContents{"hung: " + h.why, frames, fmt::format("{:.0f}", now)};
      d.exit = WorkerExit{w.local_rank, w.pid, ExitStatus{false, kHangExitCode, true}, now, false};
      d.global_rank = w.global_rank;
      d.host = cfg.host;
      d.error_file = rankDir(h.local_rank) + "/stacks.txt";
      failures.push_back(std::move(d));
      execute(sup.onWorkerHung(w.local_rank, w.pid, now));
    }
  }

  // Samples every rank for the live view and shows it: twice a second at most, whatever
  // --monitor-interval is (reading /proc for every rank is not free on a 64-rank node).
  void updateView(double now) {
    next_view = now + std::max(0.5, cfg.options.monitor_interval_sec);
    std::vector<RankUsage> usage;
    usage.reserve(workers.size());
    for (const auto& w : workers) {
      RankUsage u;
      u.local_rank = w.local_rank;
      u.global_rank = w.global_rank;
      u.alive = w.alive;
      u.step = stepOf(w);
      u.waited_us = waitedOf(w);
      if (w.alive) {
        u.cpu_seconds = processCpuSeconds(w.pid);
        u.rss_bytes = processRssBytes(w.pid);
      }
      usage.push_back(std::move(u));
    }
    addGpuFigures(usage);
    for (const auto& u : usage)
      if (u.gpu_util_percent || u.gpu_memory_bytes)
        progress.onGpu(u.local_rank, u.gpu_util_percent, u.gpu_memory_bytes);
    std::vector<RankMetrics> rank_metrics;
    if (metrics) rank_metrics = rankMetrics(usage);
    view.sample(std::move(usage), now);
    if (metrics) {
      JobFigures f = view.figures();
      for (size_t i = 0; i < rank_metrics.size() && i < f.cpu_percent.size(); ++i)
        rank_metrics[i].cpu_percent = f.cpu_percent[i];
      metrics->update(rank_metrics);
    }
    const std::string line = view.logLine();  // the node's status, for the job and the log
    rdzv.publishStatus(line);
    if (status_line) router.setStatus(view.statusLine(SIZE_MAX));
    if (view_log && now >= next_view_log) {
      if (next_view_log > 0) log::info("ranks: {}", line);
      next_view_log = now + cfg.options.monitor_log_interval_sec;
    }
  }

  // Each rank's GPU: the devices where NVML sees its process hold memory (utilisation is per
  // device: the one where it holds the most). A rank NVML does not list (no GPU, another pid
  // namespace) has none.
  void addGpuFigures(std::vector<RankUsage>& usage) {
    if (!nvml_tried) {
      nvml_tried = true;
      std::string why;
      nvml = Nvml::load(kDefaultNvmlLibrary, &why);
      if (!nvml) log::debug("no GPU figures: {}", why);
    }
    if (!nvml) return;
    try {
      std::map<pid_t, std::pair<int64_t, int>> held;  // pid -> (bytes in all, busiest device)
      std::map<pid_t, int64_t> most;
      std::vector<std::optional<unsigned>> util(static_cast<size_t>(nvml->deviceCount()));
      for (int d = 0; d < nvml->deviceCount(); ++d) {
        util[static_cast<size_t>(d)] = nvml->sample(d).utilization_percent;
        auto procs = nvml->processMemory(d);
        if (!procs) continue;
        for (const auto& [pid, bytes] : *procs) {
          auto& h = held[pid];
          h.first += static_cast<int64_t>(bytes);
          if (static_cast<int64_t>(bytes) > most[pid]) {
            most[pid] = static_cast<int64_t>(bytes);
            h.second = d;
          }
        }
      }
      for (auto& u : usage) {
        const Worker& w = workers[static_cast<size_t>(u.local_rank)];
        auto it = held.find(w.pid);
        if (!w.alive || it == held.end()) continue;
        u.gpu_memory_bytes = it->second.first;
        if (auto pct = util[static_cast<size_t>(it->second.second)]) u.gpu_util_percent = *pct;
      }
    } catch (const std::exception& e) {
      log::warn("GPU figures stop: {}", e.what());  // a GPU fell off the bus: say it once
      nvml.reset();
    }
  }

  std::vector<RankMetrics> rankMetrics(const std::vector<RankUsage>& usage) const {
    std::vector<RankMetrics> out;
    for (const auto& u : usage) {
      RankMetrics m;
      m.rank = u.global_rank;
      m.local_rank = u.local_rank;
      m.alive = u.alive;
      m.step = u.step;
      if (static_cast<size_t>(u.local_rank) < progress.ranks().size())
        m.step_seconds = progress.ranks()[static_cast<size_t>(u.local_rank)].meanStepSeconds();
      if (u.rss_bytes >= 0) m.rss_bytes = u.rss_bytes;
      m.gpu_util_percent = u.gpu_util_percent;
      m.gpu_memory_bytes = u.gpu_memory_bytes;
      out.push_back(m);
    }
    return out;
  }

  void printSummary() {
    for (const auto& s : progress.newStragglers())  // judged once more on the final steps
      log::warn("straggler on {}: {}", cfg.host, s.describe());
    if (progress.ranks().empty() || !log::logger().should_log(spdlog::level::info)) return;
    int threads = 0;
    auto omp = cfg.base_env.find(torchrun_env::kOmpNumThreads);
    if (omp != cfg.base_env.end())
      threads = std::atoi(omp->second.c_str());
    else if (cfg.nproc > 1)
      threads = 1;  // what launch sets
    log::info("per-rank summary of attempt {}:\n{}", attempt,
              progress.summary(unixNow(), usableCpus(), threads));
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
    killMarkedProcesses(watchdog.marker());
    for (pid_t p : strayChildren()) kill(p, SIGKILL);
  }

  static std::optional<winsize> terminalSize() {
    winsize ws{};
    if (!isatty(STDOUT_FILENO) || !isatty(STDERR_FILENO)) return std::nullopt;
    if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &ws) != 0 || ws.ws_col == 0) ws = {24, 80, 0, 0};
    return ws;
  }

  static HangOptions hangOptions(const LaunchOptions& o) {
    HangOptions h;
    h.timeout_sec = o.hang_timeout_sec;
    h.first_step_timeout_sec = o.hang_first_timeout_sec;
    return h;
  }
  bool hangDetectionOn() const {
    return !cfg.options.hang_timeout_sec || *cfg.options.hang_timeout_sec > 0;
  }

  static ConsoleOptions consoleOptions(const LaunchOptions& o) {
    ConsoleOptions c;
    c.out = STDOUT_FILENO;
    c.err = STDERR_FILENO;
    c.role = o.role;
    c.prefix_template = o.log_line_prefix_template;
    c.prefix = o.prefix_output;
    c.live = isatty(STDOUT_FILENO) && isatty(STDERR_FILENO);
    c.status_line = o.monitor == MonitorMode::kLive || (o.monitor == MonitorMode::kAuto && c.live);
    return c;
  }

  static std::vector<int> stopSignals(const LaunchOptions& o) {
    std::vector<int> out;
    for (int s : o.signals_to_handle)
      if (std::find(std::begin(defaults::kStopSignals), std::end(defaults::kStopSignals), s) !=
          std::end(defaults::kStopSignals))
        out.push_back(s);
    return out;
  }

  void addFd(int fd) {
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = fd;
    epoll_ctl(epfd, EPOLL_CTL_ADD, fd, &ev);
  }

  void removeStream(int fd) {
    epoll_ctl(epfd, EPOLL_CTL_DEL, fd, nullptr);
    router.remove(fd);
    stream_fds.erase(std::remove(stream_fds.begin(), stream_fds.end(), fd), stream_fds.end());
  }

  std::string attemptDir() const { return run_dir + "/attempt_" + std::to_string(attempt); }
  std::string rankDir(int local_rank) const {
    return attemptDir() + "/" + std::to_string(local_rank);
  }

  // The folders from `base` (the run directory) down to `dir`, none readable by others: they
  // hold logs and error files, which may show the environment (issue 33).
  static void makePrivateDirs(const std::string& base, const std::string& dir) {
    fs::path p = base;
    for (const auto& part : fs::path(dir).lexically_relative(base)) {
      p /= part;
      if (mkdir(p.c_str(), 0750) != 0 && errno != EEXIST)
        throw Error("cannot create " + p.string() + ": " + strerror(errno));
    }
  }

  int openLog(const std::string& path) {
    int fd =
        open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND | O_NOFOLLOW, 0640);
    if (fd < 0) throw Error("cannot open log file '" + path + "': " + strerror(errno));
    return fd;
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
    workers.assign(static_cast<size_t>(cfg.nproc), Worker{});
    progress.start(cfg.nproc, world.rank_offset, unixNow());
    view.start(unixNow());
    if (first_group_started == 0) first_group_started = unixNow();
    if (metrics) metrics->setJob({attempt, world.world_size, cfg.options.max_restarts});
    hang.start(cfg.nproc, unixNow());
    output_seen.assign(static_cast<size_t>(cfg.nproc), 0);
    std::vector<SpawnedProcess> spawned;
    for (int lr = 0; lr < cfg.nproc; ++lr) {
      std::string dir = rankDir(lr);
      makePrivateDirs(run_dir, dir);
      Worker& w = workers[lr];
      w.local_rank = lr;
      w.global_rank = world.rank_offset + lr;
      w.error_file = dir + "/error.json";
      WorkerContext ctx{
          lr,          cfg.nproc, world.restart_count, cfg.options.max_restarts, cfg.options.role,
          w.error_file};
      Environment extra = cfg.extra_env;
      for (const auto& [k, v] : world.worker_env) extra[k] = v;
      extra[kMarkerEnv] = watchdog.marker();
      openHeartbeat(w);
      if (w.heartbeat_fd >= 0) extra[kHeartbeatFdEnv] = std::to_string(w.heartbeat_fd);
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
      so.inherit_fd = w.heartbeat_fd;
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
      SpawnedProcess p = spawnProcess(substituteLocalRank(cfg.command, lr), toEnvp(env), so);
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
      addFd(p.stdout_fd);
      addFd(p.stderr_fd);
      stream_fds.push_back(p.stdout_fd);
      stream_fds.push_back(p.stderr_fd);
      spawned.push_back(p);
    }
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
    rdzv.workersStarted();
    runAfterStartHooks(unixNow());  // those due at once (the manifest, a deferred preflight)
  }

  void runAfterStartHooks(double now) {
    while (first_group_started > 0 && after_start_done < cfg.after_start.size() &&
           now - first_group_started >= cfg.after_start[after_start_done].first)
      cfg.after_start[after_start_done++].second();
  }
  std::map<pid_t, FailureDetail> pendingExecFailures;

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
    for (pid_t g : pgids) kill(-g, sig);
  }

  void execute(const std::vector<Action>& actions) {
    for (const auto& a : actions) {
      switch (a.kind) {
        case Action::Kind::kStartRendezvous:
          sweepAttempt();
          rdzv.startRendezvous([this](std::optional<WorldAssignment> w, std::string error) {
            post(RdzvDone{std::move(w), std::move(error)});
          });
          break;
        case Action::Kind::kStartGroup:
          if (a.value > 0 && groups_started > 0) {
            log::warn("restarting the worker group: restart {} of {}", a.value,
                      cfg.options.max_restarts);
            if (metrics) metrics->onRestart();
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
          itimerspec its{};
          double t = std::max(cfg.options.shutdown_timeout_sec, 0.001);
          its.it_value.tv_sec = static_cast<time_t>(t);
          its.it_value.tv_nsec =
              static_cast<long>((t - static_cast<double>(its.it_value.tv_sec)) * 1e9);
          timerfd_settime(timerfd, 0, &its, nullptr);
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
    auto it = std::find_if(workers.begin(), workers.end(),
                           [&](const Worker& w) { return w.pid == pid && w.alive; });
    if (it == workers.end()) return;  // a reparented grandchild or the watchdog: just reaped
    Worker& w = *it;
    w.alive = false;
    double exit_time = unixNow();
    progress.onStep(w.local_rank, stepOf(w), exit_time, waitedOf(w));
    auto seconds = [](const timeval& tv) { return tv.tv_sec + tv.tv_usec / 1e6; };
    progress.onExit(w.local_rank, exit_time, seconds(usage.ru_utime) + seconds(usage.ru_stime),
                    usage.ru_maxrss);
    hang.onExit(w.local_rank);
    // Output written before exit is shown before the exit is acted on.
    for (int fd : std::vector<int>(stream_fds)) router.drain(fd);
    ExitStatus st = ExitStatus::fromWaitStatus(wstatus);
    double now = unixNow();
    bool stopping = sup.phase() == Phase::kStopping;
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
      if (!stopping)
        log::error("worker rank {} (local rank {}, pid {}) failed: {}", w.global_rank, w.local_rank,
                   pid, st.describe());
    }
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
      int n = epoll_wait(epfd, events, 64, -1);
      if (n < 0) {
        if (errno == EINTR) continue;
        throw Error(std::string("epoll_wait: ") + strerror(errno));
      }
      for (int i = 0; i < n && !done; ++i) {
        int fd = events[i].data.fd;
        if (fd == sigfd) {
          onSignalFd();
        } else if (fd == wakefd) {
          onWake();
        } else if (fd == strayfd) {
          onStrayScan();
        } else if (fd == monitorfd) {
          onMonitorTick();
        } else if (fd == controlfd) {
          onControl();
        } else if (fd == timerfd) {
          uint64_t expirations;
          ssize_t ignored = read(timerfd, &expirations, sizeof(expirations));
          (void)ignored;
          execute(sup.onShutdownTimeout());
        } else if (!router.onReadable(fd)) {
          removeStream(fd);
        }
      }
    }
    finish();
    sayWhatIsKept();
    return exit_code;
  }

  static bool lacksTorch(const FailureDetail& d) {
    const std::string needle = "No module named 'torch'";
    if (d.error && d.error->message.find(needle) != std::string::npos) return true;
    return std::any_of(d.stderr_tail.begin(), d.stderr_tail.end(),
                       [&](const std::string& l) { return l.find(needle) != std::string::npos; });
  }

  void finish() {
    for (pid_t g : pgids) kill(-g, SIGKILL);
    pgids.clear();
    for (int fd : std::vector<int>(stream_fds)) {
      router.drain(fd);
      removeStream(fd);
    }
    // Disarm (and drain) the timers: a readable one would keep the reaping wait below spinning.
    itimerspec off{};
    for (int fd : {timerfd, strayfd, monitorfd}) {
      if (fd < 0) continue;
      timerfd_settime(fd, 0, &off, nullptr);
      uint64_t expirations;
      ssize_t ignored = read(fd, &expirations, sizeof(expirations));
      (void)ignored;
    }
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
      epoll_wait(epfd, &ev, 1, static_cast<int>(std::min<int64_t>(left.count(), 50)));
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
    printSummary();
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
    std::string report = formatFailureReport(cfg.options.program, failures, *root_detail);
    writeAll(STDERR_FILENO, report.data(), report.size());
    if (!cfg.python_origin.empty() && lacksTorch(*root_detail))
      log::error(
          "the workers ran under {}, which cannot import torch: set PYTHON_EXEC to the "
          "interpreter that has it, or run the launch installed in that environment",
          cfg.python_origin);
    if (!temp_base) log::info("logs and error files are in {}", run_dir);
  }

  // Said last, so that it is the line a user sees: where the files a report named stay.
  void sayWhatIsKept() {
    if (temp_base && !evidence.empty())
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
