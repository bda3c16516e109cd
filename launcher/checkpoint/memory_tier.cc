#include "launcher/checkpoint/memory_tier.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/inotify.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <mutex>
#include <set>
#include <thread>

#include "common/bytes.h"
#include "common/checkpoint_files.h"
#include "common/errors.h"
#include "common/log.h"
#include "launcher/checkpoint/replica.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {

namespace {

// ioprio_set(2) has no glibc wrapper. Idle class: the disk serves the copy only when nobody
// else (the training's data loading) wants it.
constexpr int kIoprioWhoProcess = 1;
constexpr int kIoprioClassShift = 13;
constexpr int kIoprioClassBestEffort = 2;
constexpr int kIoprioClassIdle = 3;

void setThreadPriority(bool background) {
  pid_t tid = static_cast<pid_t>(syscall(SYS_gettid));
  int ioprio = background ? (kIoprioClassIdle << kIoprioClassShift)
                          : (kIoprioClassBestEffort << kIoprioClassShift) | 4;
  syscall(SYS_ioprio_set, kIoprioWhoProcess, tid, ioprio);
  // Lowering the nice value back needs privileges: without them the drain runs at 19, which
  // only matters when something else wants the CPU after the workers are gone.
  setpriority(PRIO_PROCESS, static_cast<id_t>(tid), background ? 19 : 0);
}

double monotonicSeconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

}  // namespace

namespace {

// Roots of launches that died with their watchdog (a whole tree SIGKILLed at once) and held no
// checkpoint: nothing in them to keep. A root with a file in it stays, whoever left it (the
// drain keeps unpersisted checkpoints on purpose); a root whose pid lives stays.
void sweepEmptyStaleRoots(const std::string& base) {
  std::error_code ec;
  for (fs::directory_iterator it(base, ec), end; !ec && it != end; it.increment(ec)) {
    std::string name = it->path().filename().string();
    long pid = 0;
    if (std::sscanf(name.c_str(), "ddpl-ckpt-%ld-", &pid) != 1 || pid <= 0) continue;
    struct stat st {};
    if (lstat(it->path().c_str(), &st) != 0 || !S_ISDIR(st.st_mode) || st.st_uid != geteuid())
      continue;
    if (kill(static_cast<pid_t>(pid), 0) == 0 || errno != ESRCH) continue;
    bool empty = true;
    for (fs::recursive_directory_iterator f(it->path(), ec), fend; !ec && f != fend;
         f.increment(ec))
      if (!f->is_directory(ec) || f->is_symlink(ec)) empty = false;
    if (empty && !ec) fs::remove_all(it->path(), ec);
  }
}

}  // namespace

struct MemoryTier::Impl {
  struct Rank {
    std::string dir;
    int wd = -1;
    bool current = true;      // a rank of the running group on this node
    int64_t newest = -1;      // newest committed step seen
    bool persists = true;     // the newest record's: false for a replicated state of rank > 0
    int64_t persisted = -1;   // newest persisted
    int64_t pending = -1;     // step to persist next; -1: none
    bool urgent = false;      // its worker died: before every other rank
    bool force = false;       // persist even a step committed with persist=false
    int64_t replicated = -1;  // newest step pushed to the successor (or failed to)
    std::string error;
  };

  MemoryTierOptions opt;
  std::string root;
  // Loop thread: whether the watching runs (inotify, the persister), since a worker first wrote;
  // why it could not start; whether a group started before (its workers may have written).
  bool active = false;
  std::string broken;
  bool group_started = false;
  int inotify_fd = -1;
  int wake_fd = -1;
  int root_wd = -1;  // set before the persister starts, constant after
  std::thread thread;
  // The peer copies have a thread of their own: a push to a successor that stopped answering
  // (cut off mid-push) waits up to its timeout, and on the persister's thread that wait held
  // every persistence behind it: the chaos soak saw a node persist nothing for 36 s, and the
  // job resume 111 steps back.
  std::thread replicator;
  mutable std::mutex mu;
  std::condition_variable idle_cv;
  std::condition_variable replicate_cv;  // a commit to copy, a new successor, or stopping
  // The push in flight's socket (-1: none), shut down to abandon it at a new round or the end.
  std::mutex push_mu;
  int push_fd = -1;               // guarded by push_mu
  std::set<int64_t> wanted;       // the running group's ranks on this node
  std::map<int64_t, Rank> ranks;  // those with a directory, since the watching started
  std::map<int, int64_t> wd_rank;
  bool stopping = false;
  bool draining = false;
  bool busy = false;
  bool keep_root = false;  // drain left checkpoints that are not on disk
  std::unique_ptr<ReplicaServer> replica_server;
  std::optional<ReplicaEndpoint> successor;  // the node that keeps this node's replicas
  std::function<std::optional<ReplicaEndpoint>()> lookup;  // finds it; empty: one node
  double next_lookup = 0;
  log::Limiter failure_lines{std::chrono::seconds(30)};

  void wake() {
    uint64_t one = 1;
    if (wake_fd >= 0) (void)!write(wake_fd, &one, sizeof(one));
  }

  // Whether some worker made a rank directory in the root (the first write's doing).
  bool anyRankDir() const {
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
      if (ckpt::parseRankDirName(it->path().filename().string()) && it->is_directory(ec) &&
          !it->is_symlink(ec))
        return true;
    return false;
  }

  // Loop thread: whether the tier watches; it starts when a worker has written.
  bool watching() {
    if (active) return true;
    if (!broken.empty() || !anyRankDir()) return false;
    try {
      startWatching();
    } catch (const std::exception& e) {
      broken = e.what();
      log::warn("checkpoints in memory will not be persisted: {}; they stay in {}", broken, root);
      return false;
    }
    return true;
  }

  void startWatching() {
    ckpt::makePrivateDir(root);  // a worker made it: of this user, private, no symlink
    inotify_fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    wake_fd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (inotify_fd >= 0 && wake_fd >= 0)
      root_wd = inotify_add_watch(inotify_fd, root.c_str(),
                                  IN_CREATE | IN_MOVED_TO | IN_ONLYDIR | IN_DONT_FOLLOW);
    if (inotify_fd < 0 || wake_fd < 0 || root_wd < 0) {
      int e = errno;
      if (inotify_fd >= 0) close(inotify_fd);
      if (wake_fd >= 0) close(wake_fd);
      inotify_fd = wake_fd = root_wd = -1;
      throw Error("cannot watch the checkpoint memory root " + root + ": " + strerror(e) +
                  " (fs.inotify.max_user_instances or max_user_watches?)");
    }
    active = true;
    adoptAll();
    thread = std::thread([this] { run(); });
    pthread_setname_np(thread.native_handle(), "ckpt-persister");  // top and /proc say whose
    replicator = std::thread([this] { replicateLoop(); });
    pthread_setname_np(replicator.native_handle(), "ckpt-replicator");
  }

  // Stops both threads (mu not held).
  void joinThreads() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    wake();
    replicate_cv.notify_all();
    abandonPush();
    if (thread.joinable()) thread.join();
    if (replicator.joinable()) replicator.join();
  }

  // The push in flight, if any, fails now (its peer may be gone: it would wait out its timeout).
  void abandonPush() {
    std::lock_guard<std::mutex> lock(push_mu);
    if (push_fd >= 0) shutdown(push_fd, SHUT_RDWR);
  }

  // A rank directory its worker made: watched from now on, then read for what was committed
  // before the watch. Either thread; once per directory.
  void adopt(int64_t rank) {
    std::string dir = root + "/" + ckpt::rankDirName(rank);
    {
      std::lock_guard<std::mutex> lock(mu);
      if (ranks.count(rank)) return;
      int wd = inotify_add_watch(inotify_fd, dir.c_str(),
                                 IN_MOVED_TO | IN_CREATE | IN_ONLYDIR | IN_DONT_FOLLOW);
      if (wd < 0) {
        if (errno != ENOENT && errno != ENOTDIR)
          log::warn("cannot watch {}: {} (fs.inotify.max_user_watches?)", dir, strerror(errno));
        return;
      }
      Rank& r = ranks[rank];
      r.dir = dir;
      r.wd = wd;
      r.current = wanted.count(rank) > 0;
      wd_rank[wd] = rank;
    }
    scanRank(rank);
    std::lock_guard<std::mutex> lock(mu);
    auto it = ranks.find(rank);
    // A rank this node no longer runs (its worker wrote before the group changed): persisted,
    // then its directory goes.
    if (it != ranks.end() && !it->second.current) persistNewest(it->second, rank, false);
  }

  void adoptAll() {
    std::vector<int64_t> found;
    std::error_code ec;
    for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec))
      if (auto rank = ckpt::parseRankDirName(it->path().filename().string()))
        found.push_back(*rank);
    for (int64_t rank : found) adopt(rank);
  }

  // The record of rank's step-<step> when it is committed and valid, else none.
  std::optional<ckpt::CommitRecord> record(int64_t rank, int64_t step, const std::string& dir) {
    return ckpt::readCommitted(dir + "/" + ckpt::stepDirName(step), step, rank);
  }

  static bool persistable(const ckpt::CommitRecord& r) {
    return !r.durable_path.empty() && (!r.replicated || r.rank == 0);
  }

  // Called with mu held: a commit of `step` seen for `rank`.
  void noteCommit(Rank& r, const ckpt::CommitRecord& rec) {
    if (rec.step >= r.newest) r.persists = persistable(rec);
    r.newest = std::max(r.newest, rec.step);
    if (rec.persist && persistable(rec) && rec.step > r.persisted)
      r.pending = std::max(r.pending, rec.step);
  }

  void scanRank(int64_t rank) {
    std::string dir;
    {
      std::lock_guard<std::mutex> lock(mu);
      auto it = ranks.find(rank);
      if (it == ranks.end()) return;
      dir = it->second.dir;
    }
    auto steps = ckpt::listCommitted(dir, rank);
    std::lock_guard<std::mutex> lock(mu);
    auto it = ranks.find(rank);
    if (it == ranks.end()) return;
    for (const auto& s : steps) noteCommit(it->second, s.record);
  }

  void readEvents() {
    alignas(inotify_event) char buf[16384];
    for (;;) {
      ssize_t n = read(inotify_fd, buf, sizeof(buf));
      if (n <= 0) return;
      for (char* p = buf; p < buf + n;) {
        auto* ev = reinterpret_cast<inotify_event*>(p);
        p += sizeof(inotify_event) + ev->len;
        if (ev->mask & IN_Q_OVERFLOW) {
          adoptAll();
          std::vector<int64_t> all;
          {
            std::lock_guard<std::mutex> lock(mu);
            for (const auto& [rank, _] : ranks) all.push_back(rank);
          }
          for (int64_t rank : all) scanRank(rank);
          continue;
        }
        if (ev->len == 0 || !(ev->mask & IN_ISDIR)) continue;
        if (ev->wd == root_wd) {
          if (auto rank = ckpt::parseRankDirName(ev->name)) adopt(*rank);
          continue;
        }
        auto step = ckpt::parseStepDirName(ev->name);
        if (!step) continue;
        int64_t rank;
        std::string dir;
        {
          std::lock_guard<std::mutex> lock(mu);
          auto w = wd_rank.find(ev->wd);
          if (w == wd_rank.end()) continue;
          rank = w->second;
          dir = ranks[rank].dir;
        }
        auto rec = record(rank, *step, dir);
        if (!rec) continue;  // removed again already, or not ours to read
        std::lock_guard<std::mutex> lock(mu);
        auto it = ranks.find(rank);
        if (it != ranks.end()) noteCommit(it->second, *rec);
      }
    }
  }

  // With mu held: the next rank to persist, urgent ones first, then the lowest rank.
  std::map<int64_t, Rank>::iterator nextJob() {
    auto best = ranks.end();
    for (auto it = ranks.begin(); it != ranks.end(); ++it) {
      if (it->second.pending < 0) continue;
      if (best == ranks.end() || (it->second.urgent && !best->second.urgent)) best = it;
    }
    return best;
  }

  void persist(int64_t rank, const std::string& dir, int64_t step, bool force, bool urgent) {
    std::string error;
    uint64_t bytes = 0;
    std::string where;
    double t0 = monotonicSeconds();
    try {
      auto rec = record(rank, step, dir);
      if (!rec) return;  // trimmed by its writer meanwhile: a newer one is pending
      if ((!rec->persist && !force) || !persistable(*rec)) return;
      where = rec->durable_path;
      bytes = ckpt::persistStep(dir + "/" + ckpt::stepDirName(step), *rec, /*move=*/false);
      ckpt::retireDurable(ckpt::durableRoot(*rec), rank, rec->keep);
    } catch (const std::exception& e) {
      error = e.what();
    }
    double took = monotonicSeconds() - t0;
    std::lock_guard<std::mutex> lock(mu);
    auto it = ranks.find(rank);
    if (it == ranks.end()) return;
    Rank& r = it->second;
    if (error.empty()) {
      if (!where.empty()) r.persisted = std::max(r.persisted, step);
      r.error.clear();
      if (!where.empty()) {
        if (urgent || draining)
          log::info("checkpoint step {} of rank {} persisted to {} ({} in {:.2f}s)", step, rank,
                    where, humanBytes(static_cast<int64_t>(bytes)), took);
        else
          log::debug("checkpoint step {} of rank {} persisted to {} ({} in {:.2f}s)", step, rank,
                     where, humanBytes(static_cast<int64_t>(bytes)), took);
      }
    } else {
      r.error = error;
      int64_t held = 0;
      if (failure_lines.admit(&held))
        log::warn(
            "cannot persist checkpoint step {} of rank {}: {}; it stays in memory, training "
            "goes on{}",
            step, rank, error, held ? fmt::format(" ({} more such failures not shown)", held) : "");
    }
  }

  // With mu held: a rank whose newest committed step the successor has not had yet. Its
  // worker's memory is the one to lose with this node, so every commit counts, persisted or not.
  std::map<int64_t, Rank>::iterator nextReplication() {
    if ((!successor && !lookup) || draining) return ranks.end();
    for (auto it = ranks.begin(); it != ranks.end(); ++it)
      if (it->second.current && it->second.newest > it->second.replicated) return it;
    return ranks.end();
  }

  void replicate(int64_t rank, const std::string& dir, int64_t step, const ReplicaEndpoint& to) {
    std::string error;
    double t0 = monotonicSeconds();
    auto rec = record(rank, step, dir);
    if (!rec) return;  // trimmed meanwhile: the newer one is next
    try {
      pushStep(to, dir + "/" + ckpt::stepDirName(step), *rec, 60, [this](int fd) {
        std::lock_guard<std::mutex> lock(push_mu);
        push_fd = fd;
      });
    } catch (const std::exception& e) {
      error = e.what();
    }
    int64_t held = 0;
    if (!error.empty() && failure_lines.admit(&held))
      log::warn(
          "cannot copy checkpoint step {} of rank {} to the peer {}: {}; it stays in this "
          "node's memory{}",
          step, rank, to.describe(), error,
          held ? fmt::format(" ({} more such failures not shown)", held) : "");
    else if (error.empty())
      log::debug("checkpoint step {} of rank {} copied to the peer {} in {:.2f}s", step, rank,
                 to.describe(), monotonicSeconds() - t0);
  }

  void run() {
    setThreadPriority(true);
    sweepEmptyStaleRoots(opt.base);
    bool background = true;
    for (;;) {
      bool have_job;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) return;
        if (draining && background) {
          setThreadPriority(false);
          background = false;
        }
        have_job = nextJob() != ranks.end();
        if (!have_job) {
          retireStale();
          busy = false;
          idle_cv.notify_all();
        }
      }
      pollfd fds[2] = {{inotify_fd, POLLIN, 0}, {wake_fd, POLLIN, 0}};
      if (poll(fds, 2, have_job ? 0 : -1) < 0 && errno != EINTR) return;
      if (fds[1].revents & POLLIN) {
        uint64_t v;
        (void)!read(wake_fd, &v, sizeof(v));
      }
      readEvents();
      replicate_cv.notify_all();  // a commit read now may be the successor's to have
      int64_t rank, step;
      std::string dir;
      bool force, urgent;
      {
        std::lock_guard<std::mutex> lock(mu);
        if (stopping) return;
        auto job = nextJob();
        if (job == ranks.end()) continue;
        rank = job->first;
        step = job->second.pending;
        dir = job->second.dir;
        force = job->second.force;
        urgent = job->second.urgent;
        job->second.pending = -1;
        job->second.urgent = job->second.force = false;
        busy = true;
      }
      persist(rank, dir, step, force, urgent);
    }
  }

  // The replicator's loop: each rank's newest commit to the successor, one push at a time (a
  // newer commit replaces an older one not yet sent).
  void replicateLoop() {
    setThreadPriority(true);
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      replicate_cv.wait_for(lock, std::chrono::milliseconds(200),
                            [&] { return stopping || nextReplication() != ranks.end(); });
      if (stopping) return;
      auto rep = nextReplication();
      if (rep == ranks.end()) continue;
      if (!successor) {
        // Not known yet: ask the store (outside the lock), at most every 2 s.
        double now = monotonicSeconds();
        if (now < next_lookup) {
          replicate_cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return stopping; });
          continue;
        }
        next_lookup = now + 2;
        auto find = lookup;
        lock.unlock();
        std::optional<ReplicaEndpoint> found;
        try {
          found = find();
        } catch (const std::exception& e) {
          log::debug("checkpoint replicas: the next node's endpoint: {}", e.what());
        }
        lock.lock();
        if (found && !successor) successor = found;
        continue;
      }
      int64_t rank = rep->first, step = rep->second.newest;
      std::string dir = rep->second.dir;
      rep->second.replicated = step;
      ReplicaEndpoint to = *successor;
      lock.unlock();
      replicate(rank, dir, step, to);
      lock.lock();
    }
  }

  // With mu held, nothing pending: the directories of ranks that left this node go.
  void retireStale() {
    for (auto it = ranks.begin(); it != ranks.end();) {
      if (it->second.current) {
        ++it;
        continue;
      }
      inotify_rm_watch(inotify_fd, it->second.wd);
      wd_rank.erase(it->second.wd);
      std::error_code ec;
      fs::remove_all(it->second.dir, ec);
      it = ranks.erase(it);
    }
  }

  // With mu held: the newest committed step of a rank to be persisted next, whatever its
  // persist flag said (its worker is gone).
  void persistNewest(Rank& r, int64_t rank, bool urgent) {
    auto steps = ckpt::listCommitted(r.dir, rank);
    if (steps.empty()) return;
    const auto& newest = steps.front();
    r.newest = std::max(r.newest, newest.step);
    if (newest.step > r.persisted && persistable(newest.record)) {
      r.pending = newest.step;
      r.force = true;
      r.urgent = r.urgent || urgent;
    }
  }
};

std::string MemoryTier::startReplicas(const std::string& advertised_host, int nproc) {
  Impl& m = *impl_;
  if (!m.replica_server) {
    ckpt::makePrivateDir(m.root);
    // Its predecessor's ranks, about as many as this node's; one more step each while one is
    // being received.
    uint64_t total = m.opt.budget_per_rank * static_cast<uint64_t>(std::max(nproc, 1)) *
                     static_cast<uint64_t>(m.opt.keep + 1);
    m.replica_server = std::make_unique<ReplicaServer>(m.root + "/replicas", m.opt.budget_per_rank,
                                                       total, m.opt.keep);
  }
  return encodeEndpoint({advertised_host, m.replica_server->port(), m.replica_server->secret()});
}

void MemoryTier::setSuccessorLookup(std::function<std::optional<ReplicaEndpoint>()> lookup) {
  Impl& m = *impl_;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.successor.reset();  // the last round's may be gone
    m.lookup = std::move(lookup);
    m.next_lookup = 0;
    for (auto& [rank, r] : m.ranks) r.replicated = -1;
  }
  m.abandonPush();  // to the last round's successor, which may be the node that left
  m.replicate_cv.notify_all();
}

namespace {

// The newest committed step of `rank` for a world of `world_size` in `rank_dir`; -1: none.
int64_t newestStep(const std::string& rank_dir, int64_t rank, int64_t world_size) {
  int64_t newest = -1;
  for (const auto& s : ckpt::listCommitted(rank_dir, rank))
    if (s.record.world_size == world_size) newest = std::max(newest, s.step);
  return newest;
}

}  // namespace

bool MemoryTier::missing(const std::vector<int64_t>& ranks, int64_t world_size) const {
  for (int64_t rank : ranks)
    if (newestStep(impl_->root + "/" + ckpt::rankDirName(rank), rank, world_size) < 0) return true;
  return false;
}

std::vector<std::string> MemoryTier::pullNewer(const std::vector<int64_t>& ranks,
                                               int64_t world_size,
                                               const std::vector<ReplicaEndpoint>& peers,
                                               double timeout_sec) {
  Impl& m = *impl_;
  std::vector<std::string> lines;
  for (int64_t rank : ranks) {
    std::string dir = m.root + "/" + ckpt::rankDirName(rank);
    const int64_t mine = newestStep(dir, rank, world_size);
    // The newest step any peer holds for this rank, when it is newer than this node's.
    int64_t best = mine;
    const ReplicaEndpoint* from = nullptr;
    for (const auto& p : peers) {
      try {
        for (int64_t s : listSteps(p, rank, world_size, timeout_sec))
          if (s > best) best = s, from = &p;
      } catch (const std::exception& e) {
        lines.push_back(
            fmt::format("rank {}: cannot ask the peer {}: {}", rank, p.describe(), e.what()));
      }
    }
    if (!from) continue;
    std::string had = mine < 0 ? std::string("none here") : fmt::format("step {} here", mine);
    double t0 = monotonicSeconds();
    try {
      uint64_t bytes = fetchStep(*from, rank, best, dir, timeout_sec);
      lines.push_back(
          fmt::format("rank {}: checkpoint step {} copied from the replica on {} ({} in "
                      "{:.2f}s; {})",
                      rank, best, from->describe(), humanBytes(static_cast<int64_t>(bytes)),
                      monotonicSeconds() - t0, had));
      std::lock_guard<std::mutex> lock(m.mu);
      auto it = m.ranks.find(rank);
      if (it != m.ranks.end()) it->second.newest = std::max(it->second.newest, best);
    } catch (const std::exception& e) {
      lines.push_back(fmt::format("rank {}: cannot copy step {} from the peer {} ({}): {}", rank,
                                  best, from->describe(), had, e.what()));
    }
  }
  return lines;
}

uint64_t MemoryTier::autoBudget(const std::string& base, int nproc) {
  struct statvfs sv {};
  if (statvfs(base.c_str(), &sv) != 0 || nproc < 1) return 0;
  uint64_t size = static_cast<uint64_t>(sv.f_blocks) * sv.f_frsize;
  return size / 4 / static_cast<uint64_t>(nproc);
}

MemoryTier::MemoryTier(MemoryTierOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.opt = std::move(options);
  if (access(m.opt.base.c_str(), W_OK | X_OK) != 0)
    throw Error("cannot create the checkpoint memory root in " + m.opt.base + ": " +
                strerror(errno) + " (--checkpoint-memory=0 turns checkpoints in memory off)");
  // The workers make the root under this name, which only they (by their environment) know
  // before it exists; makePrivateDir refuses one another user made first. The pid in the name
  // tells a later launch whose root it was (sweepEmptyStaleRoots).
  static const char kChars[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789";
  unsigned char raw[12];
  if (getrandom(raw, sizeof(raw), 0) != static_cast<ssize_t>(sizeof(raw)))
    throw Error(std::string("cannot name the checkpoint memory root: getrandom: ") +
                strerror(errno));
  m.root = m.opt.base + "/ddpl-ckpt-" + std::to_string(getpid()) + "-";
  for (unsigned char b : raw) m.root.push_back(kChars[b % (sizeof(kChars) - 1)]);
}

MemoryTier::~MemoryTier() {
  Impl& m = *impl_;
  m.replica_server.reset();
  if (m.active) {
    m.joinThreads();
    close(m.inotify_fd);
    close(m.wake_fd);
  }
  std::error_code ec;
  if (!m.keep_root) fs::remove_all(m.root, ec);  // none, where no worker wrote
}

const std::string& MemoryTier::root() const { return impl_->root; }
uint64_t MemoryTier::budgetPerRank() const { return impl_->opt.budget_per_rank; }

std::map<std::string, std::string> MemoryTier::startGroup(
    const std::vector<int64_t>& global_ranks) {
  Impl& m = *impl_;
  // The last group's workers may have written since the last tick: what they left is known
  // before their ranks change. Before the first group no worker ran.
  if (m.group_started) m.watching();
  m.group_started = true;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    m.wanted = std::set<int64_t>(global_ranks.begin(), global_ranks.end());
    for (auto& [rank, r] : m.ranks) {
      bool now = m.wanted.count(rank) > 0;
      if (r.current && !now) m.persistNewest(r, rank, /*urgent=*/false);
      r.current = now;
    }
  }
  m.wake();
  std::map<std::string, std::string> env;
  env[ckpt::kMemoryEnv] = m.root;
  env[ckpt::kBudgetEnv] = std::to_string(m.opt.budget_per_rank);
  env[ckpt::kKeepEnv] = std::to_string(m.opt.keep);
  if (!m.opt.durable_dir.empty()) env[ckpt::kDirEnv] = m.opt.durable_dir;
  return env;
}

void MemoryTier::tick() { impl_->watching(); }

void MemoryTier::onWorkerExit(int64_t global_rank, pid_t pid) {
  Impl& m = *impl_;
  if (!m.watching()) return;  // no worker wrote (or drain says where it stays)
  m.adopt(global_rank);       // made since the persister last looked
  std::string dir;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.ranks.find(global_rank);
    if (it == m.ranks.end()) return;
    dir = it->second.dir;
  }
  // A half-written step is never offered and never persisted: gone with its writer.
  ckpt::removePartials(dir, static_cast<long>(pid));
  {
    std::lock_guard<std::mutex> lock(m.mu);
    auto it = m.ranks.find(global_rank);
    if (it != m.ranks.end()) m.persistNewest(it->second, global_rank, /*urgent=*/true);
  }
  m.wake();
}

std::vector<RankCheckpointStatus> MemoryTier::status() const {
  const Impl& m = *impl_;
  std::vector<RankCheckpointStatus> out;
  {
    std::lock_guard<std::mutex> lock(m.mu);
    for (const auto& [rank, r] : m.ranks) {
      if (!r.current) continue;
      RankCheckpointStatus s;
      s.rank = rank;
      s.newest_step = r.newest;
      s.persisted_step = r.persisted;
      s.persists = r.persists;
      s.error = r.error;
      out.push_back(s);
    }
  }
  for (auto& s : out) {
    auto u = ckpt::rankUsage(m.root + "/" + ckpt::rankDirName(s.rank));
    s.committed_bytes = u.committed;
    s.partial_bytes = u.partial;
  }
  return out;
}

std::string MemoryTier::drain(double timeout_sec) {
  Impl& m = *impl_;
  if (!m.watching()) {
    if (m.broken.empty()) return "";  // no worker wrote: nothing to wait for
    m.keep_root = true;
    return fmt::format(
        "checkpoints not persisted: {}; kept in memory at {} (remove it when copied)", m.broken,
        m.root);
  }
  m.adoptAll();  // rank directories made since the persister last looked
  std::unique_lock<std::mutex> lock(m.mu);
  m.draining = true;
  for (auto& [rank, r] : m.ranks) m.persistNewest(r, rank, /*urgent=*/false);
  bool any = m.nextJob() != m.ranks.end();
  if (!any) return "";
  double t0 = monotonicSeconds();
  m.busy = true;
  lock.unlock();
  m.wake();
  lock.lock();
  bool finished = m.idle_cv.wait_for(lock, std::chrono::duration<double>(timeout_sec),
                                     [&] { return !m.busy && m.nextJob() == m.ranks.end(); });
  auto notPersisted = [&] {  // with mu held
    std::vector<std::string> left;
    for (const auto& [rank, r] : m.ranks) {
      auto steps = ckpt::listCommitted(r.dir, rank);
      if (steps.empty() || !Impl::persistable(steps.front().record) ||
          steps.front().step <= r.persisted)
        continue;
      left.push_back(fmt::format("rank {} step {}{}", rank, steps.front().step,
                                 r.error.empty() ? "" : " (" + r.error + ")"));
    }
    return left;
  };
  std::vector<std::string> left = notPersisted();
  if (!left.empty()) {
    // The persist in flight cannot be cut short: the threads end once it has, and what is
    // said is what the disk then has.
    lock.unlock();
    m.joinThreads();
    lock.lock();
    left = notPersisted();
  }
  if (left.empty())
    return fmt::format("checkpoints in memory persisted at exit in {:.2f}s",
                       monotonicSeconds() - t0);
  // What is not on disk is not deleted: the root stays for the user to copy from.
  lock.unlock();
  std::string kept = m.root;
  m.keep_root = true;
  std::string why = finished ? "" : fmt::format(" within {:.0f}s", timeout_sec);
  return fmt::format(
      "checkpoints not persisted{}: {}; kept in memory at {} (remove it when copied)", why,
      fmt::join(left, ", "), kept);
}

}  // namespace ddpl::launcher
