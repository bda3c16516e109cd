#pragma once
// Whether this machine lets a process make a cgroup v2 of its own beside its cgroup, judged by
// doing it, independently of launch's code (launcher/agent/containment.cc): where it can, a launch
// with --cgroup=auto must run its workers in one, and a test that finds none has found a
// regression, not a machine without cgroups.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

namespace ddpl::testing {

// The cgroup v2 directory of this process ("<cgroup2 mount><path in /proc/self/cgroup>"), or ""
// with `why_not` set.
inline std::string ownCgroup2Dir(std::string* why_not) {
  std::string mount;
  std::ifstream mounts("/proc/self/mountinfo");
  for (std::string line; std::getline(mounts, line);) {
    auto dash = line.find(" - cgroup2 ");
    if (dash == std::string::npos) continue;
    std::istringstream f(line.substr(0, dash));
    std::string id, parent, dev, root, point;
    f >> id >> parent >> dev >> root >> point;
    if (root == "/") {
      mount = point;
      break;
    }
  }
  if (mount.empty()) {
    *why_not = "no cgroup v2 hierarchy is mounted (with its root) here";
    return "";
  }
  std::ifstream self("/proc/self/cgroup");
  for (std::string line; std::getline(self, line);)
    if (line.rfind("0::", 0) == 0) return mount + (line == "0::/" ? "" : line.substr(3));
  *why_not = "this process is in no cgroup v2 (no 0:: line in /proc/self/cgroup)";
  return "";
}

// "" where a child cgroup and a leaf in it can be made and a forked child can join the leaf
// through its cgroup.procs (what launch does for a run), else why not. Leaves nothing behind. The
// probe's name does not start with launch's "ddpl-", whose stale run cgroups other launches remove.
inline std::string cgroupV2Unavailable() {
  std::string why;
  std::string own = ownCgroup2Dir(&why);
  if (own.empty()) return why;
  std::string dir = own + "/cgprobe-" + std::to_string(getpid());
  if (mkdir(dir.c_str(), 0755) != 0) return "cannot create " + dir + ": " + strerror(errno);
  std::string leaf = dir + "/leaf";
  if (mkdir(leaf.c_str(), 0755) != 0) {
    why = "cannot create " + leaf + ": " + strerror(errno);
  } else {
    int fd = open((leaf + "/cgroup.procs").c_str(), O_WRONLY | O_CLOEXEC);
    if (fd < 0) {
      why = "cannot open " + leaf + "/cgroup.procs for writing: " + strerror(errno);
    } else {
      // A child joins it as a worker does (write "0" between fork and exec), then exits.
      pid_t child = fork();
      if (child == 0) _exit(write(fd, "0", 1) == 1 ? 0 : 1);
      int status = 0;
      if (child < 0 || waitpid(child, &status, 0) != child || !WIFEXITED(status) ||
          WEXITSTATUS(status) != 0)
        why = "a child cannot join " + leaf;
      close(fd);
    }
    rmdir(leaf.c_str());
  }
  rmdir(dir.c_str());
  return why;
}

// The cgroup v2 path of process `pid` ("/a/b" from its 0:: line), or "" when it is gone.
inline std::string cgroupOfProcess(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/cgroup");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return "";
}

}  // namespace ddpl::testing
