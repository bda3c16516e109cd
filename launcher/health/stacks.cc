#include "launcher/health/stacks.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <sstream>

#include "common/parse.h"

namespace ddpl::launcher {
namespace {

std::string findExecutable(const std::string& name, const std::string& path_env) {
  for (const auto& dir : splitList(path_env, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
}

struct Running {
  pid_t pid = -1;
  int out = -1;
  std::string text;
  bool done = false;
};

Running start(const std::vector<std::string>& argv) {
  Running r;
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return r;
  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    setpgid(0, 0);
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    dup2(fds[1], STDOUT_FILENO);
    dup2(fds[1], STDERR_FILENO);
    execv(cargv[0], cargv.data());
    _exit(127);
  }
  close(fds[1]);
  if (pid < 0) {
    close(fds[0]);
    return r;
  }
  r.pid = pid;
  r.out = fds[0];
  return r;
}

}  // namespace

StackTools findStackTools(const std::string& python, const std::string& path_env) {
  StackTools t;
  if (!python.empty()) {
    std::string beside = python.substr(0, python.rfind('/') + 1) + "py-spy";
    if (python.find('/') != std::string::npos && access(beside.c_str(), X_OK) == 0)
      t.py_spy = beside;
  }
  if (t.py_spy.empty()) t.py_spy = findExecutable("py-spy", path_env);
  t.eu_stack = findExecutable("eu-stack", path_env);
  t.gdb = findExecutable("gdb", path_env);
  return t;
}

std::vector<StackSnapshot> snapshotStacks(const std::vector<std::pair<int, pid_t>>& workers,
                                          bool python, const StackTools& tools,
                                          double timeout_sec) {
  std::vector<StackSnapshot> snaps;
  std::vector<Running> runs;
  for (const auto& [lr, pid] : workers) {
    StackSnapshot s;
    s.local_rank = lr;
    s.pid = pid;
    std::vector<std::string> argv;
    std::string p = std::to_string(pid);
    if (python && !tools.py_spy.empty())
      argv = {tools.py_spy, "dump", "--pid", p};
    else if (!tools.eu_stack.empty())
      argv = {tools.eu_stack, "-p", p};
    else if (!tools.gdb.empty())
      argv = {tools.gdb, "-batch", "-nx", "-p", p, "-ex", "thread apply all bt"};
    if (argv.empty()) {
      s.text = python ? "no stack tool found: install py-spy (pip) or elfutils (eu-stack)"
                      : "no stack tool found: install elfutils (eu-stack) or gdb";
    } else {
      for (const auto& a : argv) s.tool += (s.tool.empty() ? "" : " ") + a;
    }
    snaps.push_back(s);
    runs.push_back(argv.empty() ? Running{} : start(argv));
    if (!argv.empty() && runs.back().pid < 0) snaps.back().text = "cannot start " + argv[0];
  }
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(timeout_sec * 1000));
  while (true) {
    std::vector<pollfd> fds;
    std::vector<size_t> which;
    for (size_t i = 0; i < runs.size(); ++i)
      if (runs[i].out >= 0) {
        fds.push_back({runs[i].out, POLLIN, 0});
        which.push_back(i);
      }
    if (fds.empty()) break;
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) break;
    if (poll(fds.data(), fds.size(), static_cast<int>(left)) < 0 && errno != EINTR) break;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      Running& r = runs[which[k]];
      char buf[8192];
      ssize_t n = read(r.out, buf, sizeof(buf));
      if (n > 0 && r.text.size() < (1 << 20)) r.text.append(buf, static_cast<size_t>(n));
      if (n <= 0) {
        close(r.out);
        r.out = -1;
        r.done = true;
      }
    }
  }
  for (size_t i = 0; i < runs.size(); ++i) {
    Running& r = runs[i];
    if (r.pid < 0) continue;
    if (!r.done) {
      kill(-r.pid, SIGKILL);
      r.text += "\n(stopped after " + std::to_string(static_cast<int>(timeout_sec)) + "s)";
    }
    if (r.out >= 0) close(r.out);
    int status;
    while (waitpid(r.pid, &status, 0) < 0 && errno == EINTR) {
    }
    snaps[i].text = r.text;
  }
  return snaps;
}

StackSummary summarizeStack(const std::string& text, pid_t pid, size_t frames) {
  StackSummary s;
  std::istringstream in(text);
  std::string line;
  const std::string py_main = "Thread " + std::to_string(pid) + " ";
  const std::string native_main = "TID " + std::to_string(pid) + ":";
  bool in_main = false, any_thread = false;
  std::vector<std::string> all;  // every frame of the main thread
  while (std::getline(in, line)) {
    bool header = line.rfind("Thread ", 0) == 0 || line.rfind("TID ", 0) == 0 ||
                  line.rfind("Thread 0x", 0) == 0;
    if (header) {
      any_thread = true;
      in_main = line.rfind(py_main, 0) == 0 || line.rfind(native_main, 0) == 0;
      continue;
    }
    if (!in_main) continue;
    auto b = line.find_first_not_of(" \t");
    if (b == std::string::npos) continue;
    all.push_back(line.substr(b));
  }
  if (!any_thread) {  // gdb's "#0 ..." lines without our headers: take them as they come
    std::istringstream again(text);
    while (std::getline(again, line))
      if (line.rfind("#", 0) == 0) all.push_back(line);
  }
  for (const auto& f : all) {
    if (f.find("torch/distributed/") != std::string::npos ||
        f.find("c10d::") != std::string::npos || f.find("gloo::") != std::string::npos ||
        f.find("ProcessGroup") != std::string::npos || f.find("ncclGroup") != std::string::npos)
      s.in_collective = true;
    if (s.innermost.size() < frames) s.innermost.push_back(f);
  }
  return s;
}

bool runsPython(const std::vector<std::string>& command) {
  if (command.empty()) return false;
  std::string name = command[0].substr(command[0].rfind('/') + 1);
  if (name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0) return true;
  if (name.rfind("python", 0) != 0) return false;
  return name.find_first_not_of("0123456789.", 6) == std::string::npos;
}

}  // namespace ddpl::launcher
