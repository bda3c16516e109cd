#include "launcher/agent/containment.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>

#include "common/log.h"

namespace ddpl::launcher {
namespace {

// The cgroup2 mount point, from /proc/self/mountinfo ("... MOUNTPOINT ... - cgroup2 ...").
std::string cgroup2Mount() {
  std::ifstream in("/proc/self/mountinfo");
  for (std::string line; std::getline(in, line);) {
    auto dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line.substr(0, dash));
    std::string id, parent, devno, root, mount;
    fields >> id >> parent >> devno >> root >> mount;
    if (root == "/") return mount;
  }
  return "";
}

// This process's cgroup v2 path ("0::/some/path" in /proc/self/cgroup).
std::string ownCgroup() {
  std::ifstream in("/proc/self/cgroup");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return "";
}

bool writeFile(const std::string& path, const char* text) {
  int fd = open(path.c_str(), O_WRONLY | O_CLOEXEC);
  if (fd < 0) return false;
  ssize_t n = write(fd, text, strlen(text));
  close(fd);
  return n == static_cast<ssize_t>(strlen(text));
}

// Fields after the command name, which may itself hold spaces and parentheses.
bool statFields(pid_t pid, std::vector<std::string>& out) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/stat", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buf[1024];
  ssize_t n = read(fd, buf, sizeof(buf) - 1);
  close(fd);
  if (n <= 0) return false;
  std::string s(buf, static_cast<size_t>(n));
  auto close_paren = s.rfind(')');
  if (close_paren == std::string::npos) return false;
  std::istringstream rest(s.substr(close_paren + 1));
  out.clear();
  for (std::string f; rest >> f;) out.push_back(f);
  return true;
}

}  // namespace

std::unique_ptr<RunCgroup> RunCgroup::create(const std::string& name, std::string* why_not) {
  auto fail = [&](std::string why) -> std::unique_ptr<RunCgroup> {
    if (why_not) *why_not = std::move(why);
    return nullptr;
  };
  std::string mount = cgroup2Mount();
  if (mount.empty()) return fail("no cgroup v2 hierarchy is mounted");
  std::string own = ownCgroup();
  if (own.empty()) return fail("this process is in no cgroup v2");
  std::string dir = mount + (own == "/" ? "" : own) + "/" + name;
  if (mkdir(dir.c_str(), 0755) != 0) return fail("cannot create " + dir + ": " + strerror(errno));
  std::unique_ptr<RunCgroup> cg(new RunCgroup(dir));
  if (!cg->openLeaf()) {
    std::string why = "cannot create " + cg->leaf_ + ": " + strerror(errno);
    cg.reset();
    return fail(why);
  }
  return cg;
}

bool RunCgroup::openLeaf() {
  leaf_ = path_ + "/attempt-" + std::to_string(attempt_);
  if (mkdir(leaf_.c_str(), 0755) != 0 && errno != EEXIST) return false;
  procs_fd_ = open((leaf_ + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
  dir_fd_ = open(leaf_.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  return procs_fd_ >= 0 && dir_fd_ >= 0;
}

void RunCgroup::closeLeaf() {
  for (int* fd : {&procs_fd_, &dir_fd_}) {
    if (*fd >= 0) close(*fd);
    *fd = -1;
  }
}

void removeCgroupTree(const std::string& path, int max_wait_ms) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(max_wait_ms);
  auto remove = [&](const std::string& dir) {
    while (rmdir(dir.c_str()) != 0 && errno == EBUSY && std::chrono::steady_clock::now() < deadline)
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
  };
  if (DIR* d = opendir(path.c_str())) {
    std::vector<std::string> leaves;
    while (dirent* e = readdir(d))
      if (e->d_type == DT_DIR && e->d_name[0] != '.') leaves.push_back(path + "/" + e->d_name);
    closedir(d);
    for (const auto& leaf : leaves) remove(leaf);
  }
  remove(path);
}

void RunCgroup::killAttempt() {
  killCgroup(leaf_);
  closeLeaf();
  ++attempt_;
  if (!openLeaf()) closeLeaf();  // children then stay in launch's cgroup, found as orphans
}

void RunCgroup::killAll() { killCgroup(path_); }

RunCgroup::~RunCgroup() {
  closeLeaf();
  killCgroup(path_);
  removeCgroupTree(path_);
}

int killCgroup(const std::string& path) {
  if (writeFile(path + "/cgroup.kill", "1")) return 0;
  // Kernels before 5.14: one by one; members forking meanwhile are caught by the next round.
  int killed = 0;
  for (int round = 0; round < 3; ++round) {
    std::ifstream in(path + "/cgroup.procs");
    bool any = false;
    for (pid_t p; in >> p;) {
      any = true;
      if (kill(p, SIGKILL) == 0) ++killed;
    }
    if (!any) break;
  }
  return killed;
}

// "ddpl-<run id>-<pid>": the pid of the launch that made it, or 0 when the name is not ours.
pid_t launchPidOf(const std::string& name) {
  if (name.rfind(kRunCgroupPrefix, 0) != 0) return 0;
  auto dash = name.rfind('-');
  if (dash == std::string::npos || dash + 1 >= name.size() || dash < std::strlen(kRunCgroupPrefix))
    return 0;
  const std::string digits = name.substr(dash + 1);
  if (digits.find_first_not_of("0123456789") != std::string::npos || digits.size() > 9) return 0;
  return static_cast<pid_t>(std::atol(digits.c_str()));
}

int removeStaleRunCgroups(const std::string& keep, int max_remove) {
  std::string mount = cgroup2Mount(), own = ownCgroup();
  if (mount.empty() || own.empty()) return 0;
  std::string parent = mount + (own == "/" ? "" : own);
  DIR* d = opendir(parent.c_str());
  if (!d) return 0;
  std::vector<std::string> stale;
  while (dirent* e = readdir(d)) {
    std::string name = e->d_name;
    if (e->d_type != DT_DIR || name == keep) continue;
    pid_t pid = launchPidOf(name);
    if (pid <= 0) continue;
    // Its launch still runs (or the pid is another launch's now): not ours to judge. A pid
    // reused by another program does not keep a dead run's cgroup.
    if (kill(pid, 0) == 0 || errno == EPERM) {
      std::ifstream comm("/proc/" + std::to_string(pid) + "/comm");
      std::string c;
      if (!(comm >> c) || c == "launch") continue;
    }
    // Only an empty one: a process still inside (one that escaped its launch's death) is left
    // to whoever can tell what it is.
    std::ifstream events(parent + "/" + name + "/cgroup.events");
    bool populated = true;
    for (std::string key, value; events >> key >> value;)
      if (key == "populated") populated = value != "0";
    if (!populated) stale.push_back(parent + "/" + name);
    if (static_cast<int>(stale.size()) >= max_remove) break;
  }
  closedir(d);
  int removed = 0;
  for (const auto& dir : stale) {
    removeCgroupTree(dir, 0);
    removed += access(dir.c_str(), F_OK) != 0;
  }
  return removed;
}

std::vector<pid_t> childrenOf(pid_t parent) {
  std::vector<pid_t> out;
  DIR* d = opendir("/proc");
  if (!d) return out;
  std::vector<std::string> f;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    pid_t pid = static_cast<pid_t>(std::atoi(e->d_name));
    // Fields after the name: state, ppid, ...
    if (!statFields(pid, f) || f.size() < 2) continue;
    if (f[0] == "Z" || f[0] == "X") continue;
    if (std::atoi(f[1].c_str()) == parent) out.push_back(pid);
  }
  closedir(d);
  return out;
}

unsigned long long processStartTime(pid_t pid) {
  std::vector<std::string> f;
  // starttime is field 22 of stat; the first field after the name is field 3.
  if (!statFields(pid, f) || f.size() < 20) return 0;
  return std::strtoull(f[19].c_str(), nullptr, 10);
}

double processCpuSeconds(pid_t pid) {
  std::vector<std::string> f;
  // utime and stime are fields 14 and 15 of stat; the first field after the name is field 3.
  if (!statFields(pid, f) || f.size() < 13) return 0;
  static const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  return (std::strtod(f[11].c_str(), nullptr) + std::strtod(f[12].c_str(), nullptr)) / ticks;
}

double processTreeCpuSeconds(pid_t root, int max_processes) {
  static const double ticks = static_cast<double>(sysconf(_SC_CLK_TCK));
  double total = 0;
  std::vector<pid_t> todo{root};
  std::vector<std::string> f;
  for (int seen = 0; !todo.empty() && seen < max_processes; ++seen) {
    pid_t pid = todo.back();
    todo.pop_back();
    // utime, stime, cutime, cstime: fields 14-17; the waited-for children's time stays in the
    // sum after they exit (a DataLoader worker that finished), so it never goes backwards.
    if (!statFields(pid, f) || f.size() < 15) continue;
    for (int k = 11; k <= 14; ++k) total += std::strtod(f[k].c_str(), nullptr) / ticks;
    // Children forked by the main thread, where Python's multiprocessing and DataLoader fork.
    std::ifstream children("/proc/" + std::to_string(pid) + "/task/" + std::to_string(pid) +
                           "/children");
    for (pid_t c; children >> c;) todo.push_back(c);
  }
  return total;
}

int64_t processRssBytes(pid_t pid) {
  // statm: size resident shared ...; in pages.
  std::ifstream in("/proc/" + std::to_string(pid) + "/statm");
  long long size = 0, resident = -1;
  if (!(in >> size >> resident)) return -1;
  static const long page = sysconf(_SC_PAGESIZE);
  return static_cast<int64_t>(resident) * page;
}

std::vector<pid_t> Leftovers::strays(const std::vector<pid_t>& ours) const {
  std::vector<pid_t> out;
  for (pid_t p : childrenOf(getpid()))
    if (p != watchdog_.pid() && std::find(ours.begin(), ours.end(), p) == ours.end())
      out.push_back(p);
  return out;
}

void Leftovers::scan(const std::vector<pid_t>& ours) {
  for (pid_t p : strays(ours)) {
    if (!told_.insert(p).second) continue;
    if (auto start = processStartTime(p)) watchdog_.watchStray(p, start);
  }
}

void Leftovers::kill(RunCgroup* cgroup, bool whole_run, pid_t spare,
                     const std::vector<pid_t>& ours) {
  if (cgroup) {
    if (whole_run)
      cgroup->killAll();
    else
      cgroup->killAttempt();
  }
  killMarkedProcesses(watchdog_.marker(), spare);
  for (pid_t p : strays(ours)) ::kill(p, SIGKILL);
}

void Leftovers::reapAll(RunCgroup* cgroup, pid_t spare, const std::vector<pid_t>& ours,
                        const std::function<void(int ms)>& await_child) {
  auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (true) {
    int wstatus;
    pid_t pid = waitpid(-1, &wstatus, WNOHANG);
    if (pid > 0) continue;
    if (pid < 0) break;  // ECHILD: nothing left
    kill(cgroup, /*whole_run=*/true, spare, ours);
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      log::warn("some processes did not exit within 5s of SIGKILL (stuck in the kernel?)");
      break;
    }
    await_child(static_cast<int>(std::min<int64_t>(left.count(), 50)));
  }
}

void retireRunCgroup(std::unique_ptr<RunCgroup> cgroup) {
  const std::string own = std::filesystem::path(cgroup->path()).filename().string();
  cgroup.reset();
  if (int n = removeStaleRunCgroups(own))
    log::info("removed {} stale run cgroup(s) of launches that were killed", n);
}

}  // namespace ddpl::launcher
