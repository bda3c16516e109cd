#include "launcher/health/stacks.h"

#include <unistd.h>

#include <cstring>
#include <sstream>

#include "common/parse.h"
#include "launcher/process/child_process.h"

namespace ddpl::launcher {
namespace {

std::string findExecutable(const std::string& name, const std::string& path_env) {
  for (const auto& dir : splitList(path_env, ':')) {
    std::string candidate = (dir.empty() ? "." : dir) + "/" + name;
    if (access(candidate.c_str(), X_OK) == 0) return candidate;
  }
  return "";
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
  std::vector<ChildRun> runs;
  std::vector<size_t> run_of;  // the snapshot each run fills
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
      ChildRun run;
      run.argv = std::move(argv);
      run.stderr_to = ChildRun::Stderr::kIntoStdout;  // the tools say why they failed there
      run.timeout_sec = timeout_sec;
      runs.push_back(std::move(run));
      run_of.push_back(snaps.size());
    }
    snaps.push_back(s);
  }
  // Every rank's stack at the same moment (a hang is a picture of all of them), each tool and
  // what it started killed at the deadline.
  std::vector<ChildResult> results = runChildren(runs);
  for (size_t i = 0; i < results.size(); ++i) {
    const ChildResult& r = results[i];
    StackSnapshot& s = snaps[run_of[i]];
    if (!r.started) {
      s.text = "cannot start " + runs[i].argv[0] + (r.error.empty() ? "" : ": " + r.error);
      continue;
    }
    s.text = r.out;
    if (r.timed_out)
      s.text += "\n(stopped after " + std::to_string(static_cast<int>(timeout_sec)) + "s)";
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
