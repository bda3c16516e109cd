#include "launcher/doctor/preflight.h"

#include <fmt/format.h>

#include "launcher/agent/numa.h"
#include "launcher/agent/run_dir.h"

namespace ddpl::launcher {

std::vector<Finding> runPreflight(const LaunchOptions& o, const Environment& env, int nproc,
                                  const std::string& nvml_library) {
  DoctorOptions d;
  d.env = env;
  d.nvml_library = nvml_library;
  d.nproc = nproc;
  d.fast = true;
  d.rdzv_endpoint = o.rdzv_endpoint;
  d.data_paths = {o.log_dir.empty() ? temporaryLogParent(env, writesOnlySmallFiles(o)) : o.log_dir};
  return runDoctor(d);
}

std::vector<std::string> preflightProblems(const std::string& node,
                                           const std::vector<Finding>& findings) {
  std::vector<std::string> out;
  for (const auto& f : findings) {
    if (f.verdict == Verdict::kOk) continue;
    out.push_back(fmt::format("{:<4} {} {}: {}{}", verdictName(f.verdict), node, f.check, f.value,
                              f.advice.empty() ? "" : " -> " + f.advice));
  }
  return out;
}

}  // namespace ddpl::launcher
