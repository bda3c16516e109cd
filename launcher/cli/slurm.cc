#include <fmt/format.h>

#include <algorithm>

#include "launcher/cli/cli.h"
#include "launcher/cli/values.h"

namespace ddpl::launcher {
using cli::parseInt;
using cli::split;

std::vector<std::string> expandSlurmNodeList(const std::string& list) {
  std::vector<std::string> out;
  size_t i = 0;
  while (i < list.size()) {
    // One item: prefix, optionally followed by [ranges], up to a top-level comma.
    size_t j = i;
    std::string prefix;
    while (j < list.size() && list[j] != ',' && list[j] != '[') prefix.push_back(list[j++]);
    if (j < list.size() && list[j] == '[') {
      size_t close = list.find(']', j);
      if (close == std::string::npos)
        throw UsageError("SLURM_JOB_NODELIST: unbalanced '[' in '" + list + "'");
      std::string suffix;
      size_t k = close + 1;
      while (k < list.size() && list[k] != ',') suffix.push_back(list[k++]);
      for (const auto& range : split(list.substr(j + 1, close - j - 1), ',')) {
        auto dash = range.find('-');
        std::string lo = dash == std::string::npos ? range : range.substr(0, dash);
        std::string hi = dash == std::string::npos ? range : range.substr(dash + 1);
        int a = parseInt("SLURM_JOB_NODELIST", lo, 0), b = parseInt("SLURM_JOB_NODELIST", hi, 0);
        // 64-bit counter: n++ past INT_MAX was undefined; and a bound, since a 13-byte list
        // ("x[0-99999999]") would otherwise allocate gigabytes (both found by fuzz_cli).
        constexpr size_t kMaxSlurmNodes = 100000;
        for (int64_t n = a; n <= b; ++n) {
          if (out.size() >= kMaxSlurmNodes)
            throw UsageError(fmt::format("SLURM_JOB_NODELIST: '{}' names more than {} nodes",
                                         list.substr(0, 200), kMaxSlurmNodes));
          std::string num = std::to_string(n);
          if (num.size() < lo.size()) num = std::string(lo.size() - num.size(), '0') + num;
          out.push_back(prefix + num + suffix);
        }
      }
      j = k;
    } else if (!prefix.empty()) {
      out.push_back(prefix);
    }
    i = j + 1;
  }
  return out;
}

std::string applySlurmDefaults(LaunchOptions& o, const std::vector<std::string>& given,
                               const std::map<std::string, std::string>& env) {
  auto get = [&](const char* k) {
    auto it = env.find(k);
    return it == env.end() ? std::string() : it->second;
  };
  std::string job = get("SLURM_JOB_ID"), nnodes = get("SLURM_NNODES"),
              nodelist = get("SLURM_JOB_NODELIST");
  if (job.empty() || nnodes.empty() || nodelist.empty()) return "";
  int n = parseInt("SLURM_NNODES", nnodes, 1);
  if (n < 2) return "";
  auto was_given = [&](const char* flag) {
    return std::find(given.begin(), given.end(), flag) != given.end();
  };
  // The user spelled out a rendezvous or node count: they configured it themselves.
  if (was_given("--nnodes") || was_given("--rdzv-endpoint") || was_given("--rdzv-backend") ||
      was_given("--node-rank") || was_given("--master-addr"))
    return "";
  auto nodes = expandSlurmNodeList(nodelist);
  if (nodes.empty()) return "";
  o.nnodes_min = o.nnodes_max = n;
  o.rdzv_backend = "c10d";
  o.rdzv_endpoint = nodes.front() + ":" + std::to_string(kDefaultRdzvPort);
  if (!was_given("--rdzv-id")) o.rdzv_id = "slurm-" + job;
  return fmt::format("Slurm job {}: {} nodes, rendezvous on {} (first node of the allocation)", job,
                     n, o.rdzv_endpoint);
}

}  // namespace ddpl::launcher
