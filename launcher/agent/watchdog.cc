#include "launcher/agent/watchdog.h"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <set>
#include <vector>

#include "launcher/agent/containment.h"
#include "launcher/process/child_process.h"

namespace ddpl::launcher {
namespace {

// A run that orphans more processes than this is beyond what the watchdog tracks one by one.
constexpr size_t kMaxStrays = 4096;

bool environHas(pid_t pid, const std::string& needle) {
  char path[64];
  snprintf(path, sizeof(path), "/proc/%d/environ", pid);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  std::string data;
  char buf[8192];
  ssize_t n;
  while ((n = read(fd, buf, sizeof(buf))) > 0) data.append(buf, static_cast<size_t>(n));
  close(fd);
  // Entries are NUL-separated; match a whole entry.
  size_t pos = 0;
  while (pos < data.size()) {
    size_t end = data.find('\0', pos);
    if (end == std::string::npos) end = data.size();
    if (data.compare(pos, end - pos, needle) == 0) return true;
    pos = end + 1;
  }
  return false;
}

[[noreturn]] void watchdogMain(int read_fd, const std::string& marker,
                               const std::string& cgroup_path) {
  std::set<pid_t> groups;
  std::map<pid_t, unsigned long long> strays;
  std::string line;
  std::vector<std::string> private_dirs;  // the log folder, the checkpoint memory root
  char buf[256];
  bool clean = false;
  while (true) {
    ssize_t n = read(read_fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    for (ssize_t i = 0; i < n; ++i) {
      if (buf[i] != '\n') {
        line.push_back(buf[i]);
        continue;
      }
      if (line == "bye")
        clean = true;
      else if (line.size() > 1 && line[0] == 'd' && private_dirs.size() < 8)
        private_dirs.push_back(line.substr(1));
      else if (line.size() > 1 && line[0] == '+')
        groups.insert(std::atoi(line.c_str() + 1));
      else if (line.size() > 1 && line[0] == '-')
        groups.erase(std::atoi(line.c_str() + 1));
      else if (line.size() > 1 && line[0] == 's') {
        char* end = nullptr;
        pid_t pid = static_cast<pid_t>(std::strtol(line.c_str() + 1, &end, 10));
        if (end && *end == ':' && pid > 0 && strays.size() < kMaxStrays)
          strays[pid] = std::strtoull(end + 1, nullptr, 10);
      }
      line.clear();
    }
  }
  if (!clean) {
    if (!cgroup_path.empty()) killCgroup(cgroup_path);
    for (pid_t g : groups) kill(-g, SIGKILL);
    killMarkedProcesses(marker);
    for (const auto& [pid, start] : strays)
      if (processStartTime(pid) == start) kill(pid, SIGKILL);
    // The cgroup can go once its members are gone (bounded: they were all SIGKILLed).
    if (!cgroup_path.empty()) removeCgroupTree(cgroup_path);
    // So can launch's private temporary directory: nobody was told of anything in it.
    std::error_code ec;
    for (const auto& d : private_dirs) std::filesystem::remove_all(d, ec);
  }
  _exit(0);
}

}  // namespace

int killMarkedProcesses(const std::string& marker, pid_t spare) {
  std::string needle = std::string(kMarkerEnv) + "=" + marker;
  pid_t self = getpid();
  int killed = 0;
  DIR* d = opendir("/proc");
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    if (e->d_name[0] < '0' || e->d_name[0] > '9') continue;
    pid_t pid = std::atoi(e->d_name);
    if (pid == self || pid == spare) continue;
    if (environHas(pid, needle) && kill(pid, SIGKILL) == 0) ++killed;
  }
  closedir(d);
  return killed;
}

Watchdog::Watchdog(std::string marker_value, std::string cgroup_path)
    : marker_(std::move(marker_value)), cgroup_path_(std::move(cgroup_path)) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return;  // without it we still have PDEATHSIG for workers
  ChildSetup setup;
  // Out of the launcher's group: a terminal's ^C or a killpg must not reach it.
  setup.group = ProcessGroup::kNewSession;
  setup.ignored_signals = {SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2, SIGPIPE};
  // Keep nothing else of the launcher's open (its pipes would otherwise never reach EOF).
  setup.close_other_fds = true;
  setup.keep_fds = {fds[0]};
  pid_t pid = forkChild(setup, [&]() -> int {
    close(fds[1]);  // also where launch runs with 0-2 closed and the pipe took one of them
    watchdogMain(fds[0], marker_, cgroup_path_);
  });
  close(fds[0]);
  if (pid < 0) {
    close(fds[1]);
    return;
  }
  pid_ = pid;
  pipe_fd_ = fds[1];
}

void Watchdog::release() {
  if (pipe_fd_ >= 0) {
    send("bye\n", 4);
    close(pipe_fd_);
    pipe_fd_ = -1;
  }
  if (pid_ > 0) {
    int status;
    while (waitpid(pid_, &status, 0) < 0 && errno == EINTR) {
    }
    pid_ = -1;
  }
}

void Watchdog::send(const char* line, int len) {
  if (pipe_fd_ < 0 || len <= 0) return;
  ssize_t ignored = write(pipe_fd_, line, static_cast<size_t>(len));
  (void)ignored;
}

void Watchdog::removeOnDeath(const std::string& dir) {
  if (dir.empty() || dir.find('\n') != std::string::npos) return;
  std::string line = "d" + dir + "\n";
  send(line.data(), static_cast<int>(line.size()));
}

void Watchdog::watchGroup(pid_t pgid) {
  char buf[32];
  send(buf, snprintf(buf, sizeof(buf), "+%d\n", static_cast<int>(pgid)));
}

void Watchdog::unwatchGroup(pid_t pgid) {
  char buf[32];
  send(buf, snprintf(buf, sizeof(buf), "-%d\n", static_cast<int>(pgid)));
}

void Watchdog::watchStray(pid_t pid, unsigned long long start_time) {
  char buf[64];
  send(buf, snprintf(buf, sizeof(buf), "s%d:%llu\n", static_cast<int>(pid), start_time));
}

}  // namespace ddpl::launcher
