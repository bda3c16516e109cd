#include "common/checkpoint_files.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <set>

#include "common/errors.h"
#include "common/file_io.h"

namespace ddpl::ckpt {

namespace {

std::string errnoText(int e) {
  return std::string(strerror(e)) + " (errno " + std::to_string(e) + ")";
}

[[noreturn]] void fail(const std::string& what, const std::string& path, int e) {
  throw Error("cannot " + what + " " + path + ": " + errnoText(e));
}

struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd(const Fd&) = delete;
  ~Fd() {
    if (fd >= 0) close(fd);
  }
};

bool readSmallFile(const std::string& path, size_t limit, std::string& out, std::string* why) {
  int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
  if (fd < 0) {
    if (why) *why = path + ": " + errnoText(errno);
    return false;
  }
  Fd guard(fd);
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) > limit) {
    if (why) *why = path + ": not a regular file of at most " + std::to_string(limit) + " bytes";
    return false;
  }
  out.resize(static_cast<size_t>(st.st_size));
  size_t got = 0;
  while (got < out.size()) {
    ssize_t n = pread(fd, out.data() + got, out.size() - got, static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (why) *why = path + ": short read";
      return false;
    }
    got += static_cast<size_t>(n);
  }
  return true;
}

// Every listed file a regular file (not through a symlink) of its size.
bool filesPresent(const std::string& dir, const CommitRecord& r, std::string* why) {
  for (const auto& f : r.files) {
    struct stat st {};
    std::string p = dir + "/" + f.path;
    if (lstat(p.c_str(), &st) != 0 || !S_ISREG(st.st_mode)) {
      if (why) *why = p + ": missing or not a regular file";
      return false;
    }
    if (static_cast<uint64_t>(st.st_size) != f.size) {
      if (why)
        *why = p + ": " + std::to_string(st.st_size) + " bytes, the record says " +
               std::to_string(f.size);
      return false;
    }
  }
  return true;
}

// Plain POSIX below, no std::filesystem: the worker library links LibTorch, whose shared
// library exports a std::filesystem of its own that calls through a null pointer from ours
// (remove_all crashed, LibTorch 2.9.1 wheel).
struct Entry {
  std::string name;
  bool dir = false;   // a real directory, not a symlink to one
  bool file = false;  // a regular file
  uint64_t size = 0;
};

std::vector<Entry> listDir(const std::string& dir) {
  std::vector<Entry> out;
  DIR* d = opendir(dir.c_str());
  if (!d) return out;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (name == "." || name == "..") continue;
    struct stat st {};
    if (fstatat(dirfd(d), e->d_name, &st, AT_SYMLINK_NOFOLLOW) != 0) continue;
    out.push_back(
        {name, S_ISDIR(st.st_mode), S_ISREG(st.st_mode), static_cast<uint64_t>(st.st_size)});
  }
  closedir(d);
  return out;
}

uint64_t treeBytes(const std::string& dir) {
  uint64_t sum = 0;
  for (const auto& e : listDir(dir)) {
    if (e.dir) sum += treeBytes(dir + "/" + e.name);
    if (e.file) sum += e.size;
  }
  return sum;
}

// Never follows a symlink; a vanished entry is no failure.
void removeTree(const std::string& p) {
  struct stat st {};
  if (lstat(p.c_str(), &st) != 0) return;
  if (S_ISDIR(st.st_mode)) {
    for (const auto& e : listDir(p)) removeTree(p + "/" + e.name);
    rmdir(p.c_str());
  } else {
    unlink(p.c_str());
  }
}

std::string parentOf(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
}

std::string baseName(const std::string& path) {
  auto slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

void syncDirectory(const std::string& dir) {
  int fd = open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  fsync(fd);
  close(fd);
}

double unixNow() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void makeDirs(const std::string& dir) {
  struct stat st {};
  if (dir.empty() || stat(dir.c_str(), &st) == 0) {
    if (!dir.empty() && !S_ISDIR(st.st_mode)) fail("create", dir, ENOTDIR);
    return;
  }
  std::string parent = parentOf(dir);
  if (parent != dir) makeDirs(parent);
  // Private, as every writer of the format makes them (docs/checkpoints.md): the files are 0600.
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) fail("create", dir, errno);
}

}  // namespace

FenceGuard::FenceGuard(const std::string& dir, const FenceToken& mine, const std::string& what,
                       double timeout_sec) {
  if (!mine.known()) return;
  makeDirs(dir);
  std::string path = dir + "/" + kFenceName;
  // A shared directory: no symlink followed, private to the job's user.
  int fd = open(path.c_str(), O_RDWR | O_CREAT | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (fd < 0) fail("open", path, errno);
  auto give_up = [&](const std::string& msg) {
    close(fd);
    throw Error(msg);
  };
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode))
    give_up("cannot use " + path + ": not a regular file");
  auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeout_sec);
  while (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    if (errno == ENOLCK || errno == EOPNOTSUPP) break;  // no locks here: checked, unordered
    if (errno != EWOULDBLOCK && errno != EINTR)
      give_up("cannot lock " + path + ": " + errnoText(errno));
    if (std::chrono::steady_clock::now() >= deadline)
      give_up("cannot lock " + path + " within " + std::to_string(static_cast<int>(timeout_sec)) +
              "s: another writer holds it (" + what + ")");
    usleep(10000);
  }
  std::string text(kMaxFenceBytes + 1, '\0');
  ssize_t n = pread(fd, text.data(), text.size(), 0);
  text.resize(n > 0 ? static_cast<size_t>(n) : 0);
  std::optional<FenceToken> newest = decodeFence(text);
  if (newest && fenceRefuses(*newest, mine)) {
    close(fd);
    throw StaleRoundError(what + " refused: this process belongs to " + describeFence(mine) +
                          ", but " + describeFence(*newest) + " has committed to " + dir +
                          " since. Its group is stale (its node lost the rendezvous and the job " +
                          "re-formed without it): this process should stop.");
  }
  if (!newest || newest->run_id != mine.run_id || newest->epoch != mine.epoch ||
      newest->round != mine.round) {
    std::string out = encodeFence(mine);
    if (ftruncate(fd, 0) != 0 ||
        pwrite(fd, out.data(), out.size(), 0) != static_cast<ssize_t>(out.size()) || fsync(fd) != 0)
      give_up("cannot write " + path + ": " + errnoText(errno));
  }
  fd_ = fd;
}

FenceGuard::~FenceGuard() {
  if (fd_ >= 0) close(fd_);  // releases the lock
}

std::optional<CommitRecord> readCommitted(const std::string& step_dir, int64_t step, int64_t rank,
                                          std::string* why) {
  std::string text;
  if (!readSmallFile(step_dir + "/" + kRecordName, kMaxRecordBytes, text, why)) return std::nullopt;
  CommitRecord r;
  try {
    r = decodeRecord(text);
  } catch (const Error& e) {
    if (why) *why = step_dir + ": " + e.what();
    return std::nullopt;
  }
  if (r.step != step || r.rank != rank) {
    if (why)
      *why = step_dir + ": the record is for step " + std::to_string(r.step) + " of rank " +
             std::to_string(r.rank);
    return std::nullopt;
  }
  if (!filesPresent(step_dir, r, why)) return std::nullopt;
  return r;
}

std::vector<StoredStep> listCommitted(const std::string& rank_dir, int64_t rank) {
  std::vector<StoredStep> out;
  for (const auto& e : listDir(rank_dir)) {
    auto step = parseStepDirName(e.name);
    if (!step || !e.dir) continue;
    std::string dir = rank_dir + "/" + e.name;
    if (auto r = readCommitted(dir, *step, rank)) out.push_back({*step, dir, std::move(*r)});
  }
  std::sort(out.begin(), out.end(),
            [](const StoredStep& a, const StoredStep& b) { return a.step > b.step; });
  return out;
}

RankUsage rankUsage(const std::string& rank_dir) {
  RankUsage u;
  for (const auto& e : listDir(rank_dir)) {
    if (!e.dir) continue;
    if (parseStepDirName(e.name))
      u.committed += treeBytes(rank_dir + "/" + e.name);
    else if (parsePartialDirName(e.name))
      u.partial += treeBytes(rank_dir + "/" + e.name);
  }
  return u;
}

void removePartials(const std::string& rank_dir, long pid) {
  for (const auto& e : listDir(rank_dir)) {
    auto p = parsePartialDirName(e.name);
    if (p && (pid == 0 || p->pid == pid)) removeTree(rank_dir + "/" + e.name);
  }
}

void makePrivateDir(const std::string& dir) {
  if (mkdir(dir.c_str(), 0700) != 0 && errno != EEXIST) fail("create", dir, errno);
  struct stat st {};
  if (lstat(dir.c_str(), &st) != 0) fail("inspect", dir, errno);
  if (!S_ISDIR(st.st_mode) || st.st_uid != geteuid() || (st.st_mode & 077) != 0) {
    char mode[8];
    snprintf(mode, sizeof(mode), "%04o", static_cast<unsigned>(st.st_mode & 07777));
    throw Error("refusing to keep checkpoints in " + dir + ": it is " +
                (S_ISLNK(st.st_mode)   ? "a symlink"
                 : S_ISDIR(st.st_mode) ? "a directory"
                                       : "not a directory") +
                " of uid " + std::to_string(st.st_uid) + " with mode " + mode + ", not a 0700 " +
                "directory of uid " + std::to_string(geteuid()));
  }
}

std::string makeRankDir(const std::string& root, int64_t rank) {
  makePrivateDir(root);
  std::string dir = root + "/" + rankDirName(rank);
  makePrivateDir(dir);
  return dir;
}

std::string beginStep(const std::string& rank_dir, int64_t step) {
  removePartials(rank_dir, static_cast<long>(getpid()));
  std::string dir = rank_dir + "/" + partialDirName(step, static_cast<long>(getpid()));
  if (mkdir(dir.c_str(), 0700) != 0) fail("create", dir, errno);
  return dir;
}

std::string commitStep(const std::string& rank_dir, const std::string& partial,
                       CommitRecord& record) {
  record.files.clear();
  record.bytes = 0;
  // Depth-first over the partial directory; `rel` is the path below it.
  std::vector<std::string> pending{""};
  while (!pending.empty()) {
    std::string rel_dir = pending.back();
    pending.pop_back();
    std::string abs_dir = rel_dir.empty() ? partial : partial + "/" + rel_dir;
    for (const auto& e : listDir(abs_dir)) {
      std::string rel = rel_dir.empty() ? e.name : rel_dir + "/" + e.name;
      if (e.dir) {
        pending.push_back(rel);
        continue;
      }
      if (!e.file)
        throw InvalidArgument("cannot commit checkpoint step " + std::to_string(record.step) +
                              ": " + abs_dir + "/" + e.name +
                              " is not a regular file (symlinks and devices are refused)");
      if (rel == kRecordName) continue;
      if (record.files.size() >= kMaxFiles)
        throw InvalidArgument("cannot commit checkpoint step " + std::to_string(record.step) +
                              ": more than " + std::to_string(kMaxFiles) + " files");
      record.files.push_back({rel, e.size});
      record.bytes += e.size;
    }
  }
  std::sort(record.files.begin(), record.files.end(),
            [](const FileEntry& a, const FileEntry& b) { return a.path < b.path; });
  record.time = unixNow();
  // Memory is not durable: no fsync (the rename alone orders it for readers on this machine).
  writeFileAtomically(partial + "/" + kRecordName, encodeRecord(record),
                      AtomicWriteOptions{0600, false});
  std::string target = rank_dir + "/" + stepDirName(record.step);
  std::optional<FenceGuard> fence;
  try {
    fence.emplace(rank_dir, record.writer,
                  "checkpoint step " + std::to_string(record.step) + " of rank " +
                      std::to_string(record.rank));
  } catch (const StaleRoundError&) {
    removeTree(partial);  // nothing of a stale round stays behind
    throw;
  }
  if (rename(partial.c_str(), target.c_str()) != 0) {
    if (errno != ENOTEMPTY && errno != EEXIST) fail("commit", target, errno);
    // An earlier attempt committed this step: moved aside first, so the name never points at
    // a mixture of the two.
    std::string aside =
        rank_dir + "/replaced-" + std::to_string(record.step) + "-" + std::to_string(getpid());
    removeTree(aside);
    if (rename(target.c_str(), aside.c_str()) != 0) fail("replace", target, errno);
    if (rename(partial.c_str(), target.c_str()) != 0) fail("commit", target, errno);
    removeTree(aside);
  }
  return target;
}

void trimCommitted(const std::string& rank_dir, int64_t keep, int64_t just_committed) {
  std::vector<std::pair<int64_t, std::string>> steps;
  for (const auto& e : listDir(rank_dir))
    if (auto s = parseStepDirName(e.name)) steps.emplace_back(*s, rank_dir + "/" + e.name);
  std::sort(steps.begin(), steps.end(),
            [](const auto& a, const auto& b) { return a.first > b.first; });
  for (size_t i = static_cast<size_t>(std::max<int64_t>(keep, 1)); i < steps.size(); ++i)
    if (steps[i].first != just_committed) removeTree(steps[i].second);
}

std::string durableRoot(const CommitRecord& r) {
  if (baseName(r.durable_path) == stepDirName(r.step)) return parentOf(r.durable_path);
  return r.durable_path;
}

uint64_t persistStep(const std::string& step_dir, const CommitRecord& r, bool move) {
  if (r.durable_path.empty()) return 0;
  // Opened first, all of them: the writer may remove the step (its keep) while we copy, and
  // an open file stays readable.
  std::vector<Fd> fds;
  if (!move) {
    for (const auto& f : r.files) {
      std::string p = step_dir + "/" + f.path;
      int fd = open(p.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) fail("open", p, errno);
      fds.emplace_back(fd);
      struct stat st {};
      if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) ||
          static_cast<uint64_t>(st.st_size) != f.size)
        throw Error("cannot persist " + p + ": changed after its commit");
    }
  }
  // Held to the marker (taken once the files are open: it may wait on a slow disk): a stale round's
  // step must not land beside (or over) a newer round's.
  FenceGuard fence(durableRoot(r), r.writer,
                   "persisting checkpoint step " + std::to_string(r.step) + " of rank " +
                       std::to_string(r.rank));
  makeDirs(r.durable_path);
  // An earlier attempt's marker of this step goes first: its files are about to be replaced one
  // by one, and until the new marker the step is not on disk.
  const std::string marker = r.durable_path + "/" + markerName(r.step, r.rank);
  if (unlink(marker.c_str()) == 0)
    syncDirectory(r.durable_path);
  else if (errno != ENOENT)
    fail("remove", marker, errno);
  uint64_t written = 0;
  std::vector<char> buf;
  for (size_t i = 0; i < r.files.size(); ++i) {
    const auto& f = r.files[i];
    std::string to = r.durable_path + "/" + f.path;
    std::string parent = parentOf(to);
    if (parent != r.durable_path) makeDirs(parent);
    if (move) {
      std::string from = step_dir + "/" + f.path;
      int fd = open(from.c_str(), O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
      if (fd < 0) fail("open", from, errno);
      int rc = fsync(fd);
      int e = errno;
      close(fd);
      if (rc != 0) fail("sync", from, e);
      if (rename(from.c_str(), to.c_str()) != 0) fail("move " + from + " to", to, errno);
      syncDirectory(parent);
    } else {
      if (buf.empty()) buf.resize(4 << 20);
      int fd = fds[i].fd;
      writeFileAtomically(
          to,
          [&](const FileSink& sink) {
            uint64_t off = 0;
            while (off < f.size) {
              ssize_t n = pread(fd, buf.data(), std::min<uint64_t>(buf.size(), f.size - off),
                                static_cast<off_t>(off));
              if (n < 0 && errno == EINTR) continue;
              if (n <= 0) throw Error("cannot persist " + step_dir + "/" + f.path + ": short read");
              sink(buf.data(), static_cast<size_t>(n));
              off += static_cast<uint64_t>(n);
            }
          },
          AtomicWriteOptions{0600, true});
    }
    written += f.size;
  }
  // Last: the marker says the files above are all there.
  writeFileAtomically(marker, encodeRecord(r), AtomicWriteOptions{0600, true});
  return written;
}

namespace {

struct Marker {
  int64_t step = 0;
  int64_t rank = 0;
  std::string dir;  // where the marker (and the step's files) are
  std::string path;
};

// The markers in `dir` (flat) and in each `dir`/step-<N>/ (step N's only), any rank.
std::vector<Marker> markersUnder(const std::string& dir) {
  std::vector<Marker> out;
  auto scan = [&](const std::string& d, std::optional<int64_t> only_step) {
    for (const auto& e : listDir(d)) {
      auto m = parseMarkerName(e.name);
      if (m && (!only_step || *only_step == m->step))
        out.push_back({m->step, m->rank, d, d + "/" + e.name});
    }
  };
  scan(dir, std::nullopt);
  for (const auto& e : listDir(dir))
    if (auto step = parseStepDirName(e.name); step && e.dir) scan(dir + "/" + e.name, step);
  return out;
}

std::optional<CommitRecord> readMarker(const Marker& m) {
  std::string text;
  if (!readSmallFile(m.path, kMaxRecordBytes, text, nullptr)) return std::nullopt;
  try {
    CommitRecord r = decodeRecord(text);
    if (r.step != m.step || r.rank != m.rank) return std::nullopt;
    return r;
  } catch (const Error&) {
    return std::nullopt;
  }
}

}  // namespace

std::vector<StoredStep> listDurable(const std::string& dir, int64_t rank) {
  std::vector<StoredStep> out;
  if (dir.empty()) return out;
  std::vector<Marker> candidates;
  for (auto& m : markersUnder(dir))
    if (m.rank == rank || m.rank == 0) candidates.push_back(std::move(m));
  // Per step, the rank's own marker before rank 0's, a step's own directory before the flat one.
  std::stable_sort(candidates.begin(), candidates.end(), [&](const Marker& a, const Marker& b) {
    return std::make_pair(a.rank != rank, a.dir == dir) <
           std::make_pair(b.rank != rank, b.dir == dir);
  });
  for (const auto& m : candidates) {
    auto r = readMarker(m);
    if (!r || (m.rank != rank && !r->replicated) || !filesPresent(m.dir, *r, nullptr)) continue;
    if (std::any_of(out.begin(), out.end(), [&](const StoredStep& s) { return s.step == m.step; }))
      continue;
    out.push_back({m.step, m.dir, std::move(*r)});
  }
  std::sort(out.begin(), out.end(),
            [](const StoredStep& a, const StoredStep& b) { return a.step > b.step; });
  return out;
}

size_t retireDurable(const std::string& dir, int64_t rank, int64_t keep) {
  if (keep <= 0 || dir.empty()) return 0;
  std::vector<Marker> mine;
  std::vector<int64_t> steps;
  for (auto& m : markersUnder(dir))
    if (m.rank == rank) {
      steps.push_back(m.step);
      mine.push_back(std::move(m));
    }
  auto doomed = stepsToRetire(steps, keep);
  auto retired = [&](int64_t step) {
    return std::binary_search(doomed.begin(), doomed.end(), step);
  };
  // A file a kept step lists stays (a flat layout may reuse a name).
  std::set<std::string> kept;
  for (const auto& m : mine)
    if (!retired(m.step))
      if (auto r = readMarker(m))
        for (const auto& f : r->files) kept.insert(m.dir + "/" + f.path);
  size_t removed = 0;
  for (const auto& m : mine) {
    if (!retired(m.step)) continue;
    auto r = readMarker(m);
    // The marker goes first: a step whose files are being removed is never offered.
    if (unlink(m.path.c_str()) != 0 && errno != ENOENT) continue;
    if (r)
      for (const auto& f : r->files)
        if (!kept.count(m.dir + "/" + f.path)) unlink((m.dir + "/" + f.path).c_str());
    if (m.dir != dir) rmdir(m.dir.c_str());  // only when empty: other ranks' files stay
    ++removed;
  }
  return removed;
}

}  // namespace ddpl::ckpt
