#include "launcher/doctor/doctor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <signal.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <nlohmann/json.hpp>

#include "common/torchrun_env.h"
#include "launcher/doctor/check_util.h"

namespace ddpl::launcher {
using checks::getEnv;

const char* verdictName(Verdict v) {
  switch (v) {
    case Verdict::kOk:
      return "ok";
    case Verdict::kWarn:
      return "warn";
    case Verdict::kFail:
      return "fail";
  }
  return "?";
}

std::vector<Finding> runDoctor(const DoctorOptions& o) {
  std::vector<Finding> out;
  GpuFacts gpus = readGpuFacts(o.nvml_library);
  for (auto& f : checkGpus(gpus)) out.push_back(std::move(f));
  if (auto f = checkCudaVisibleDevices(o.env, gpus)) out.push_back(*f);
  if (!o.fast && !o.python.empty()) {
    if (!o.python_origin.empty()) out.push_back({"python", Verdict::kOk, o.python_origin, ""});
    for (auto& f : checkTorch(probeTorch(o.python, o.probe_timeout_sec), gpus)) {
      if (o.python_is_default && f.check == "torch" && f.verdict == Verdict::kFail) {
        f.verdict = Verdict::kWarn;
        f.advice = "a Python program launched here would fail: " + f.advice;
      }
      out.push_back(std::move(f));
    }
  }
  if (!o.fast && !o.program.empty())
    for (auto& f : checkNativeLibraries(o.program, o.probe_timeout_sec))
      out.push_back(std::move(f));
  for (auto& f : checkNetworkNames(o.env, o.sys_root)) out.push_back(std::move(f));
  struct statvfs st {};
  std::optional<uint64_t> shm;
  if (statvfs(o.shm_path.c_str(), &st) == 0) shm = static_cast<uint64_t>(st.f_blocks) * st.f_frsize;
  out.push_back(checkShm(o.shm_path, shm));
  for (auto& f : checkLimits(o.proc_root, o.sys_root)) out.push_back(std::move(f));
  out.push_back(checkThreads(allowedCpus(o.proc_root), o.nproc, o.env));
  for (const auto& p : o.data_paths) out.push_back(checkFreeSpace(p));
  if (!o.rdzv_endpoint.empty())
    out.push_back(checkEndpoint("rendezvous", o.rdzv_endpoint, !o.fast, o.connect_timeout_sec));
  std::string master = getEnv(o.env, torchrun_env::kMasterAddr);
  if (!master.empty()) {
    std::string port = getEnv(o.env, torchrun_env::kMasterPort);
    std::string hp = master.find(':') != std::string::npos ? "[" + master + "]" : master;
    out.push_back(checkEndpoint(torchrun_env::kMasterAddr, port.empty() ? hp : hp + ":" + port,
                                !o.fast, o.connect_timeout_sec));
  }
  return out;
}

bool anyFailed(const std::vector<Finding>& findings) {
  return std::any_of(findings.begin(), findings.end(),
                     [](const Finding& f) { return f.verdict == Verdict::kFail; });
}

std::string formatFindings(const std::vector<Finding>& findings) {
  size_t width = 0;
  for (const auto& f : findings) width = std::max(width, f.check.size());
  std::string out;
  for (const auto& f : findings) {
    out += fmt::format("{:<4}  {:<{}}  {}\n", verdictName(f.verdict), f.check, width, f.value);
    if (!f.advice.empty()) out += fmt::format("{:<4}  {:<{}}  -> {}\n", "", "", width, f.advice);
  }
  return out;
}

std::string findingsJson(const std::vector<Finding>& findings) {
  nlohmann::json checks = nlohmann::json::array();
  for (const auto& f : findings)
    checks.push_back({{"check", f.check},
                      {"verdict", verdictName(f.verdict)},
                      {"value", f.value},
                      {"advice", f.advice}});
  nlohmann::json j = {{"ok", !anyFailed(findings)}, {"checks", checks}};
  return j.dump(2);
}

std::vector<Finding> findingsFromJson(const std::string& text) {
  std::vector<Finding> out;
  auto j = nlohmann::json::parse(text);
  for (const auto& c : j.at("checks")) {
    Finding f;
    f.check = c.at("check").get<std::string>();
    std::string v = c.at("verdict").get<std::string>();
    f.verdict = v == "fail" ? Verdict::kFail : v == "warn" ? Verdict::kWarn : Verdict::kOk;
    f.value = c.at("value").get<std::string>();
    f.advice = c.at("advice").get<std::string>();
    out.push_back(std::move(f));
  }
  return out;
}

int captureOutput(const std::vector<std::string>& argv, double timeout_sec, std::string* output) {
  output->clear();
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return -1;
  int exec_fds[2];
  if (pipe2(exec_fds, O_CLOEXEC) != 0) {
    close(fds[0]);
    close(fds[1]);
    return -1;
  }
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) return -1;
  if (pid == 0) {
    // launch blocks its handled signals for the signalfd: the child must not inherit that.
    sigset_t none;
    sigemptyset(&none);
    sigprocmask(SIG_SETMASK, &none, nullptr);
    signal(SIGPIPE, SIG_DFL);
    setpgid(0, 0);
    int devnull = open("/dev/null", O_RDONLY);
    dup2(devnull, 0);
    dup2(fds[1], 1);
    dup2(fds[1], 2);
    execvp(args[0], args.data());
    int e = errno;
    ssize_t ignored = write(exec_fds[1], &e, sizeof(e));
    (void)ignored;
    _exit(127);
  }
  close(fds[1]);
  close(exec_fds[1]);
  int exec_errno = 0;
  bool exec_failed = read(exec_fds[0], &exec_errno, sizeof(exec_errno)) == sizeof(exec_errno);
  close(exec_fds[0]);
  auto deadline = std::chrono::steady_clock::now() +
                  std::chrono::milliseconds(static_cast<int64_t>(timeout_sec * 1000));
  bool timed_out = false;
  char buf[4096];
  while (true) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
                    deadline - std::chrono::steady_clock::now())
                    .count();
    if (left <= 0) {
      timed_out = true;
      break;
    }
    pollfd p{fds[0], POLLIN, 0};
    int r = poll(&p, 1, static_cast<int>(left));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    ssize_t n = read(fds[0], buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    if (output->size() < (1u << 20)) output->append(buf, static_cast<size_t>(n));
  }
  close(fds[0]);
  if (timed_out) kill(-pid, SIGKILL);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (exec_failed) return -1;
  if (timed_out) return 124;
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

}  // namespace ddpl::launcher
