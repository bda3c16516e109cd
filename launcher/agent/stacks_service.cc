#include "launcher/agent/stacks_service.h"

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <future>
#include <mutex>
#include <thread>
#include <utility>

#include "common/file_io.h"
#include "common/log.h"
#include "launcher/agent/agent.h"
#include "launcher/agent/run_dir.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {
namespace {

constexpr const char* kControlSocket = "control.sock";
// The loop's tags for the control socket and its connections (a connection's adds its fd).
constexpr uint64_t kListenTag = uint64_t{1} << 48;
constexpr uint64_t kConnTag = uint64_t{1} << 49;
// How long the other nodes' answers are awaited: they take their stacks at the same time.
constexpr double kRemoteSeconds = kStackSeconds + 5;
// How often their answers are looked for meanwhile.
constexpr auto kRemotePoll = std::chrono::milliseconds(200);
// A control client that sends nothing in this time is answered as an unknown request.
constexpr auto kRequestWait = std::chrono::seconds(1);

// What the stacks thread is asked to save, and what it gives back.
struct SaveJob {
  std::vector<WorkerState> alive;
  std::map<int, std::string> path_of;  // by local rank
  // A hang's: the ranks' flight recorder sockets, asked while the stacks are taken.
  std::map<int, std::string> recorder_of;
};
struct Saved {
  std::vector<std::string> lines;
  std::map<int, StackSummary> summaries;
  std::string text;  // every rank's whole stack, each cut to kShownStackBytes (the dashboard)
  std::map<int, FlightRecord> recorders;
};
// How long the ranks' flight recorders are awaited, at the same time as their stacks are taken
// (py-spy: 20-600 ms for 4 ranks here): a rank that holds the GIL in native code never answers,
// and the report waits this long for it.
constexpr double kRecorderSeconds = 1.0;
constexpr size_t kShownStackBytes = 64 * 1024;

std::string snapshotDir(const std::string& run_dir) {
  char stamp[32];
  time_t t = time(nullptr);
  strftime(stamp, sizeof(stamp), "%Y%m%d-%H%M%S", localtime(&t));
  std::string dir = run_dir + "/snapshots/" + stamp;
  makePrivateDirs(run_dir, dir);
  return dir;
}

void reply(int conn, const std::string& text) {
  writeAll(conn, text.data(), text.size());
  close(conn);
}

}  // namespace

struct StacksService::Impl {
  Config cfg;
  EventLoop& loop;
  HealthBus& bus;
  StacksGroup group;
  int listen_fd = -1;
  bool watching = false;
  bool shut = false;
  // Control connections waiting for their request, with the timer that gives up on them.
  std::map<int, EventLoop::TimerId> waiting;

  // The stacks thread (started at the first request) and what passes between it and the loop.
  std::thread thread;
  std::mutex mu;
  std::condition_variable cv;
  bool stopping = false;
  std::deque<std::function<void()>> jobs;     // for the thread
  std::deque<std::function<void()>> results;  // for the loop
  std::vector<std::string> evidence;          // files written
  // The other nodes' answers being awaited, each with its poll timer.
  struct Gather {
    int64_t id;
    EventLoop::Clock::time_point deadline;
    std::function<void(std::vector<std::string>)> done;
    EventLoop::TimerId timer = 0;
  };
  std::map<uint64_t, Gather> gathers;
  uint64_t next_gather = 1;
  // This node's stacks saved at its own hang detection (for another node that asks), and the
  // other nodes' hang requests that came while they were being taken.
  int own_hang_attempt = -1;
  std::string own_hang_answer;
  EventLoop::Clock::time_point own_hang_saved{};
  bool hang_in_flight = false;
  std::vector<std::pair<int64_t, std::string>> deferred;

  Impl(Config c, EventLoop& l, HealthBus& b) : cfg(std::move(c)), loop(l), bus(b) {}

  // ---- the stacks thread

  void submit(SaveJob job, std::function<void(Saved)> then) {
    std::lock_guard<std::mutex> lock(mu);
    if (!thread.joinable()) thread = std::thread([this] { work(); });
    jobs.push_back([this, job = std::move(job), then = std::move(then)] {
      Saved saved = save(job);
      std::lock_guard<std::mutex> lock(mu);
      results.push_back([then, saved = std::move(saved)] { then(saved); });
    });
    cv.notify_one();
  }

  void work() {
    std::unique_lock<std::mutex> lock(mu);
    while (true) {
      cv.wait(lock, [&] { return stopping || !jobs.empty(); });
      if (jobs.empty()) return;  // stopping, and nothing left to do
      auto job = std::move(jobs.front());
      jobs.pop_front();
      lock.unlock();
      job();
      loop.post([this] { runResults(); });
      lock.lock();
    }
  }

  // On the stacks thread: saves every running worker's stack, each in the file its job names,
  // and describes each rank in one line: "rank R (local rank L, pid P): <innermost frame>".
  Saved save(const SaveJob& job) {
    std::vector<std::pair<int, pid_t>> alive;
    std::map<int, int> global_rank;
    for (const auto& w : job.alive) {
      alive.emplace_back(w.local_rank, w.pid);
      global_rank[w.local_rank] = w.global_rank;
    }
    auto tools = findStackTools(cfg.python ? cfg.interpreter : "", cfg.path_env);
    Saved out;
    // A stopped rank cannot answer: not asked (it would cost the whole wait).
    std::map<int, std::string> ask;
    for (const auto& [lr, path] : job.recorder_of) {
      auto w = std::find_if(job.alive.begin(), job.alive.end(),
                            [lr = lr](const WorkerState& x) { return x.local_rank == lr; });
      if (w != job.alive.end() && !processStopped(w->pid))
        ask[lr] = path;
      else
        out.recorders[lr].error = "stopped: it cannot answer";
    }
    auto recorders =
        std::async(std::launch::async, [ask] { return askFlightRecorders(ask, kRecorderSeconds); });
    for (const auto& s : snapshotStacks(alive, cfg.python, tools, kStackSeconds)) {
      const std::string& path = job.path_of.at(s.local_rank);
      {
        std::lock_guard<std::mutex> lock(mu);
        evidence.push_back(path);
      }
      std::ofstream(path) << "# " << (s.tool.empty() ? "no tool" : s.tool) << "\n" << s.text;
      auto st = summarizeStack(s.text, s.pid);
      st.stopped = s.stopped;
      if (cfg.python) markProgramFrames(st, scriptDirOf(s.pid));
      out.lines.push_back(fmt::format("rank {} (local rank {}, pid {}){}: {}",
                                      global_rank[s.local_rank], s.local_rank, s.pid,
                                      st.in_collective ? "" : " outside any collective",
                                      st.innermost.empty() ? "<no frames>" : st.innermost[0]));
      out.text += fmt::format(
          "== rank {} (local rank {}, pid {}), by {}, saved in {}\n{}{}\n",
          global_rank[s.local_rank], s.local_rank, s.pid, s.tool.empty() ? "no tool" : s.tool, path,
          s.text.substr(0, kShownStackBytes), s.text.size() > kShownStackBytes ? "\n[cut]" : "");
      out.summaries[s.local_rank] = std::move(st);
    }
    for (auto& [lr, r] : recorders.get()) out.recorders[lr] = std::move(r);
    return out;
  }

  void runResults() {
    while (true) {
      std::function<void()> next;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (results.empty()) return;
        next = std::move(results.front());
        results.pop_front();
      }
      next();
    }
  }

  SaveJob jobFor(const std::function<std::string(int)>& path_of) const {
    SaveJob job;
    for (const auto& w : group.workers) {
      if (!w.alive) continue;
      job.alive.push_back(w);
      job.path_of[w.local_rank] = path_of(w.local_rank);
    }
    return job;
  }

  // ---- the other nodes' answers, awaited with the loop's timers

  void gather(int64_t id, std::function<void(std::vector<std::string>)> done) {
    if (id <= 0) {
      done({});
      return;
    }
    auto deadline =
        EventLoop::Clock::now() + std::chrono::duration_cast<EventLoop::Clock::duration>(
                                      std::chrono::duration<double>(kRemoteSeconds));
    uint64_t key = next_gather++;
    gathers.emplace(key, Gather{id, deadline, std::move(done)});
    pollGather(key);
  }

  void pollGather(uint64_t key) {
    auto it = gathers.find(key);
    if (it == gathers.end()) return;
    Gather& g = it->second;
    auto got = bus.stacksAnswers(g.id);
    bool over = shut || EventLoop::Clock::now() >= g.deadline;
    if (!got.missing.empty() && !over) {
      g.timer =
          loop.addTimer(EventLoop::Clock::now() + kRemotePoll, [this, key] { pollGather(key); });
      return;
    }
    for (int node : got.missing)
      got.answers.push_back(
          shut && EventLoop::Clock::now() < g.deadline
              ? fmt::format("node {}: no answer before the run ended", node)
              : fmt::format("node {}: no answer within {:.0f}s", node, kRemoteSeconds));
    auto done = std::move(g.done);
    gathers.erase(it);
    done(std::move(got.answers));
  }

  // ---- requests

  void onStacksRequest(int conn) {
    if (std::none_of(group.workers.begin(), group.workers.end(),
                     [](const WorkerState& w) { return w.alive; })) {
      reply(conn, "error: no worker is running now\n");
      return;
    }
    int64_t remote = bus.requestStacks(
        fmt::format("snapshot asked on node {} ({})", group.group_rank, cfg.host));
    std::string dir = snapshotDir(cfg.run_dir);
    auto job = jobFor([&](int lr) { return dir + "/" + std::to_string(lr) + ".txt"; });
    submit(std::move(job), [this, conn, dir, remote](Saved saved) {
      std::string text = "ok " + dir + "\n";
      for (const auto& l : saved.lines) text += l + "\n";
      log::info("stacks of {} worker(s) saved in {} (asked through the control socket)",
                saved.lines.size(), dir);
      gather(remote, [conn, text](std::vector<std::string> answers) mutable {
        for (const auto& a : answers) text += a + "\n";
        reply(conn, text);
      });
    });
  }

  void takeSnapshot(std::function<void(std::string)> done) {
    if (std::none_of(group.workers.begin(), group.workers.end(),
                     [](const WorkerState& w) { return w.alive; })) {
      done("no worker is running now");
      return;
    }
    int64_t remote = bus.requestStacks(fmt::format(
        "snapshot asked on node {} ({}) from the dashboard", group.group_rank, cfg.host));
    std::string dir = snapshotDir(cfg.run_dir);
    auto job = jobFor([&](int lr) { return dir + "/" + std::to_string(lr) + ".txt"; });
    submit(std::move(job), [this, dir, remote, done](Saved saved) {
      log::info("stacks of {} worker(s) saved in {} (asked from the dashboard)", saved.lines.size(),
                dir);
      gather(remote, [done, text = std::move(saved.text)](std::vector<std::string> answers) {
        std::string all = text;
        for (const auto& a : answers) all += "== " + a + "\n";
        done(std::move(all));
      });
    });
  }

  void onRemoteRequest(int64_t id, std::string why) {
    bool hang = why.rfind("hang", 0) == 0;
    // Ranks here wait in the same collective, so this node usually finds the hang at the same
    // moment: while its own stacks are being saved, the request waits for them.
    if (hang && hang_in_flight) {
      deferred.emplace_back(id, std::move(why));
      return;
    }
    log::warn("another node asks for every worker's stack ({})", why);
    // Found here as well and saved already (its workers may be stopping now): say so. Also
    // when this node's group has restarted since: a request relayed through the rendezvous
    // can arrive after that (0.8 s after it once), and the new workers' stacks (still
    // importing torch) would answer for the hung ones. The new group starts after this
    // node's hang stacks were saved and is found hung a hang timeout after its start at the
    // soonest (the nodes of a job share their hang limits): a request within that long of the
    // save is about the hang that was saved.
    const bool own_hang_recent =
        cfg.hang_timeout_sec > 0 && EventLoop::Clock::now() - own_hang_saved <
                                        std::chrono::duration<double>(cfg.hang_timeout_sec);
    if (hang && !own_hang_answer.empty() &&
        (own_hang_attempt == group.attempt || own_hang_recent)) {
      bus.answerStacks(id, own_hang_answer);
      return;
    }
    std::string dir = hang ? "" : snapshotDir(cfg.run_dir);
    std::string attempt_dir = group.attempt_dir;
    auto job = jobFor([&](int lr) {
      return hang ? attempt_dir + "/" + std::to_string(lr) + "/stacks.txt"
                  : dir + "/" + std::to_string(lr) + ".txt";
    });
    std::string where = hang ? attempt_dir + "/<local rank>/stacks.txt" : dir;
    std::string node = fmt::format("node {} ({})", group.group_rank, cfg.host);
    submit(std::move(job), [this, id, where, node](Saved saved) {
      std::string answer = fmt::format(
          "{}: {}", node,
          saved.lines.empty() ? "no worker running"
                              : fmt::format("{} stack(s) saved in {}", saved.lines.size(), where));
      for (const auto& l : saved.lines) answer += "\n  " + l;
      bus.answerStacks(id, answer);
      log::info("{}", answer);
    });
  }

  void takeHangStacks(const std::string& why, std::function<void(const HangStacks&)> on_saved,
                      std::function<void(HangStacks)> done) {
    // The other nodes save theirs at the same time, before anything is stopped here.
    int64_t remote = bus.requestStacks(why);
    hang_in_flight = true;
    const int attempt = group.attempt;
    const std::string attempt_dir = group.attempt_dir;
    const std::string node = fmt::format("node {} ({})", group.group_rank, cfg.host);
    auto job =
        jobFor([&](int lr) { return attempt_dir + "/" + std::to_string(lr) + "/stacks.txt"; });
    for (const auto& [lr, path] : job.path_of)
      job.recorder_of[lr] = flightRecorderSocket(attempt_dir + "/" + std::to_string(lr));
    submit(std::move(job), [=](Saved saved) {
      own_hang_attempt = attempt;
      own_hang_saved = EventLoop::Clock::now();
      own_hang_answer = fmt::format("{}: found the hang itself; {} stack(s) saved in {}", node,
                                    saved.lines.size(), attempt_dir + "/<local rank>/stacks.txt");
      for (const auto& l : saved.lines) own_hang_answer += "\n  " + l;
      hang_in_flight = false;
      HangStacks h{
          attempt, std::move(saved.lines), std::move(saved.summaries), {}, std::move(saved.text)};
      h.recorders = std::move(saved.recorders);
      on_saved(h);
      for (auto& [id, why] : std::exchange(deferred, {})) onRemoteRequest(id, std::move(why));
      gather(remote, [h = std::move(h), done](std::vector<std::string> answers) mutable {
        h.remote = std::move(answers);
        done(std::move(h));
      });
    });
  }

  // ---- the control socket

  void onControlEvent(uint64_t tag) {
    if (tag == kListenTag) {
      int c = accept4(listen_fd, nullptr, nullptr, SOCK_CLOEXEC);
      if (c < 0) return;
      loop.add(c, EPOLLIN, kConnTag | static_cast<uint64_t>(c));
      waiting[c] =
          loop.addTimer(EventLoop::Clock::now() + kRequestWait, [this, c] { onRequest(c, ""); });
      return;
    }
    int c = static_cast<int>(tag & ~kConnTag);
    char buf[64] = {0};
    ssize_t n = read(c, buf, sizeof(buf) - 1);
    onRequest(c, n > 0 ? std::string(buf, static_cast<size_t>(n)) : "");
  }

  // One request per connection: "stacks\n" (answered with where the snapshot went and each
  // rank's innermost frame) or "status\n"; anything else, or nothing within a second, is
  // refused.
  void onRequest(int c, const std::string& request) {
    auto it = waiting.find(c);
    if (it == waiting.end()) return;
    loop.cancelTimer(it->second);
    waiting.erase(it);
    loop.remove(c);
    if (request.rfind("stacks", 0) == 0) {
      onStacksRequest(c);
    } else if (request.rfind("status", 0) == 0) {
      std::string text = "ok\n" + cfg.status_line() + "\n";
      for (const auto& line : bus.otherNodesStatus()) text += line + "\n";
      reply(c, text);
    } else {
      reply(c, "error: unknown request (launch stacks|status RUN_DIR send 'stacks' or 'status')\n");
    }
  }

  void shutdown() {
    if (shut) return;
    shut = true;
    if (watching) loop.remove(listen_fd);
    watching = false;
    for (auto& [c, timer] : waiting) {
      loop.cancelTimer(timer);
      loop.remove(c);
      close(c);
    }
    waiting.clear();
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_one();
    if (thread.joinable()) thread.join();
    runResults();
    while (!gathers.empty()) {
      auto key = gathers.begin()->first;
      loop.cancelTimer(gathers.begin()->second.timer);
      pollGather(key);
    }
  }
};

StacksService::StacksService(Config config, EventLoop& loop, HealthBus& bus)
    : impl_(std::make_unique<Impl>(std::move(config), loop, bus)) {}

StacksService::~StacksService() {
  impl_->shutdown();
  if (impl_->listen_fd >= 0) {
    close(impl_->listen_fd);
    unlink((impl_->cfg.run_dir + "/" + kControlSocket).c_str());
  }
}

void StacksService::openControlSocket() {
  const std::string& run_dir = impl_->cfg.run_dir;
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
  impl_->listen_fd = fd;
  impl_->watching = impl_->loop.add(fd, EPOLLIN, kListenTag);
  log::info("run directory {} (`launch stacks {}` saves every worker's stack while it runs)",
            run_dir, run_dir);
}

bool StacksService::owns(uint64_t tag) const { return tag == kListenTag || (tag & kConnTag); }
void StacksService::onEvent(uint64_t tag) { impl_->onControlEvent(tag); }
void StacksService::setGroup(StacksGroup group) { impl_->group = std::move(group); }
void StacksService::takeSnapshot(std::function<void(std::string)> done) {
  impl_->takeSnapshot(std::move(done));
}
void StacksService::onRemoteRequest(int64_t id, std::string why) {
  impl_->onRemoteRequest(id, std::move(why));
}
void StacksService::takeHangStacks(const std::string& why,
                                   std::function<void(const HangStacks&)> saved,
                                   std::function<void(HangStacks)> done) {
  impl_->takeHangStacks(why, std::move(saved), std::move(done));
}
std::vector<std::string> StacksService::evidence() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->evidence;
}
void StacksService::shutdown() { impl_->shutdown(); }

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

}  // namespace ddpl::launcher
