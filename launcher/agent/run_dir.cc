#include "launcher/agent/run_dir.h"

#include <fcntl.h>
#include <linux/magic.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>

#include "common/errors.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {

namespace {

bool onTmpfs(const std::string& dir) {
  struct statfs st {};
  return statfs(dir.c_str(), &st) == 0 && st.f_type == TMPFS_MAGIC;
}

// A folder we may create our private folder in: a directory we can write, either ours alone
// (XDG_RUNTIME_DIR: 0700, our uid) or sticky like /tmp (nobody else can remove what we make).
bool usableParent(const std::string& dir, bool must_be_ours) {
  struct stat st {};
  if (dir.empty() || dir[0] != '/' || stat(dir.c_str(), &st) != 0 || !S_ISDIR(st.st_mode) ||
      access(dir.c_str(), W_OK | X_OK) != 0)
    return false;
  if (must_be_ours) return st.st_uid == geteuid() && (st.st_mode & 077) == 0;
  return (st.st_mode & S_ISVTX) != 0 || (st.st_mode & 022) == 0;
}

}  // namespace

std::string temporaryLogParent(const Environment& env, bool small_files_only,
                               const std::function<bool(const std::string&)>& is_tmpfs) {
  auto tmpdir = env.find("TMPDIR");
  if (tmpdir != env.end() && !tmpdir->second.empty()) return tmpdir->second;
  if (small_files_only) {
    const auto& memory = is_tmpfs ? is_tmpfs : onTmpfs;
    auto xdg = env.find("XDG_RUNTIME_DIR");
    if (xdg != env.end() && usableParent(xdg->second, true) && memory(xdg->second))
      return xdg->second;
    if (usableParent("/dev/shm", false) && memory("/dev/shm")) return "/dev/shm";
  }
  return "/tmp";
}

bool writesOnlySmallFiles(const LaunchOptions& o) {
  auto none = [](const StreamSpec& spec) {
    if (spec.all.stdout_ || spec.all.stderr_) return false;
    for (const auto& [rank, sel] : spec.per_rank)
      if (sel.stdout_ || sel.stderr_) return false;
    return true;
  };
  return none(o.redirects) && none(o.tee) && o.duplicate_stdout_filters.empty() &&
         o.duplicate_stderr_filters.empty();
}

LogBase makeLogBase(const std::string& log_dir, const std::string& temp_parent) {
  if (log_dir.empty()) {
    std::string tmpl = (fs::path(temp_parent) / "ddpl-launch-XXXXXX").string();
    if (!mkdtemp(tmpl.data()))
      throw Error("cannot create a temporary log directory in " + temp_parent + ": " +
                  strerror(errno) + " (set TMPDIR to a writable folder, or pass --log-dir)");
    return {tmpl, true};
  }
  std::error_code ec;
  fs::create_directories(log_dir, ec);
  if (ec) throw InvalidArgument("--log-dir '" + log_dir + "' cannot be created: " + ec.message());
  return {log_dir, false};
}

void removeAfterFailedStart(const LogBase& base, const std::string& run_dir) {
  std::error_code ec;
  if (base.temporary)
    fs::remove_all(base.path, ec);
  else if (!run_dir.empty())
    fs::remove_all(run_dir, ec);
}

void removeTemporaryBase(const LogBase& base, const std::string& run_dir,
                         const std::vector<std::string>& evidence) {
  if (!base.temporary) return;
  std::error_code ec;
  if (evidence.empty())
    fs::remove_all(base.path, ec);
  else
    keepOnlyEvidence(base.path, run_dir, evidence);
}

// Never an earlier run's logs: a reused run id gets a numbered sibling. Created by this mkdir,
// exclusively and private (0700): a --log-dir may be a shared directory, where a name planted in
// advance (a symlink to somewhere else) must never be written through, and the files inside
// hold the command line and environment (issue 33).
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

void makePrivateDirs(const std::string& base, const std::string& dir) {
  fs::path p = base;
  for (const auto& part : fs::path(dir).lexically_relative(base)) {
    p /= part;
    if (mkdir(p.c_str(), 0750) != 0 && errno != EEXIST)
      throw Error("cannot create " + p.string() + ": " + strerror(errno));
  }
}

// Deleting the evidence of a hang as the user goes to read it helps nobody (issue 33).
void keepOnlyEvidence(const std::string& log_base, const std::string& run_dir,
                      const std::vector<std::string>& evidence) {
  std::error_code ec;
  std::vector<fs::path> doomed;
  for (fs::recursive_directory_iterator it(log_base, ec), end; !ec && it != end; it.increment(ec)) {
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

int openRankLog(const std::string& path) {
  int fd =
      open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_APPEND | O_NOFOLLOW, 0640);
  if (fd < 0) throw Error("cannot open log file '" + path + "': " + strerror(errno));
  return fd;
}

}  // namespace ddpl::launcher
