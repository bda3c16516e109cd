#include "launcher/doctor/doctor.h"

#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <nlohmann/json.hpp>

#include "common/parse.h"
#include "common/torchrun_env.h"
#include "launcher/doctor/check_util.h"
#include "launcher/process/child_process.h"

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
  // The etcd backend takes a comma-separated list of members: each is checked on its own
  // (the whole list is no host name).
  for (const auto& one : splitList(o.rdzv_endpoint, ','))
    if (!one.empty())
      out.push_back(checkEndpoint("rendezvous", one, !o.fast, o.connect_timeout_sec));
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
  ChildRun run;
  run.argv = argv;
  run.stderr_to = ChildRun::Stderr::kIntoStdout;
  run.timeout_sec = timeout_sec;
  ChildResult r = runChild(run);
  *output = std::move(r.out);
  return r.status();
}

}  // namespace ddpl::launcher
