#include "launcher/health/stacks.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "common/parse.h"
#include "launcher/health/hang_report.h"
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

// The process's state letter in /proc/PID/stat ('T': stopped, 't': stopped by a tracer).
char processState(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  auto close = stat.rfind(')');  // the command's name may hold spaces and parentheses
  return close != std::string::npos && close + 2 < stat.size() ? stat[close + 2] : '?';
}

std::string trim(const std::string& s) {
  auto b = s.find_first_not_of(" \t\r");
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(" \t\r") - b + 1);
}

// Line `line` (from 1) of `path`, trimmed; "" past kMaxSourceBytes or the end.
std::string sourceLine(const std::string& path, int line) {
  std::ifstream in(path);
  std::string text;
  size_t read = 0;
  for (int n = 1; std::getline(in, text); ++n) {
    read += text.size() + 1;
    if (read > kMaxSourceBytes) return "";
    // A comment after the code ("  # ..."; PEP 8's inline form) says nothing of where it is.
    if (n == line) return trim(text.substr(0, text.find("  # ")));
  }
  return "";
}

}  // namespace

bool processStopped(pid_t pid) {
  char state = processState(pid);
  return state == 'T' || state == 't';
}

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
    s.stopped = processStopped(pid);
    if (python && !tools.py_spy.empty())
      argv = s.stopped ? std::vector<std::string>{tools.py_spy, "dump", "--nonblocking", "--pid", p}
                       : std::vector<std::string>{tools.py_spy, "dump", "--pid", p};
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
    if (s.innermost.size() < frames) s.innermost.push_back(f);
    s.frames.push_back(StackFrame{f, false, ""});
  }
  s.in_collective = collectiveOf(s.frames).has_value();
  return s;
}

void markProgramFrames(StackSummary& summary, const std::string& script_dir) {
  if (script_dir.empty()) return;
  std::map<std::string, bool> own;  // by the file as py-spy names it
  for (auto& f : summary.frames) {
    ReadFrame r = readFrame(f);
    if (r.native || r.file.empty() || r.line < 0 || r.file[0] == '<') continue;
    std::string path = r.file[0] == '/' ? r.file : script_dir + "/" + r.file;
    auto it = own.find(r.file);
    if (it == own.end()) {
      struct stat st {};
      // An absolute name is py-spy's for a file outside any package: the program's, unless it
      // lies in an interpreter's library folders.
      bool lib = r.file[0] == '/' && (r.file.find("/site-packages/") != std::string::npos ||
                                      r.file.find("/dist-packages/") != std::string::npos ||
                                      r.file.find("/lib/python") != std::string::npos);
      it = own.emplace(r.file, !lib && stat(path.c_str(), &st) == 0 && S_ISREG(st.st_mode)).first;
    }
    f.user = it->second;
    if (f.user) f.source = sourceLine(path, r.line);
  }
}

std::string scriptDirOf(pid_t pid) {
  const std::string proc = "/proc/" + std::to_string(pid);
  char buf[4096];
  ssize_t n = readlink((proc + "/cwd").c_str(), buf, sizeof(buf) - 1);
  if (n <= 0) return "";
  std::string cwd(buf, static_cast<size_t>(n));
  std::ifstream in(proc + "/cmdline");
  std::vector<std::string> argv;
  for (std::string a; std::getline(in, a, '\0') && argv.size() < 64;) argv.push_back(a);
  // python [options] script.py ...: the options that take a value hide the script behind it;
  // -c and -m run no file (Python looks in the working directory first).
  for (size_t i = argv.empty() ? 0 : 1; i < argv.size(); ++i) {
    const std::string& a = argv[i];
    if (a == "-c" || a == "-m" || a == "-") return cwd;
    if (a == "-W" || a == "-X" || a == "--check-hash-based-pycs") {
      ++i;
      continue;
    }
    if (!a.empty() && a[0] == '-') continue;
    std::string script = a[0] == '/' ? a : cwd + "/" + a;
    return script.substr(0, script.rfind('/'));
  }
  return cwd;
}

bool runsPython(const std::vector<std::string>& command) {
  if (command.empty()) return false;
  std::string name = command[0].substr(command[0].rfind('/') + 1);
  if (name.size() > 3 && name.compare(name.size() - 3, 3, ".py") == 0) return true;
  if (name.rfind("python", 0) != 0) return false;
  return name.find_first_not_of("0123456789.", 6) == std::string::npos;
}

}  // namespace ddpl::launcher
