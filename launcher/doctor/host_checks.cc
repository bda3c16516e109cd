#include <fmt/format.h>
#include <sys/statvfs.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <sstream>

#include "common/errors.h"
#include "common/parse.h"
#include "common/torchrun_env.h"
#include "launcher/doctor/check_util.h"
#include "launcher/doctor/doctor.h"

namespace ddpl::launcher {
using checks::bytes;
using checks::dirEntries;
using checks::getEnv;
using checks::kGiB;
using checks::kMiB;
using checks::readAll;
namespace fs = std::filesystem;
namespace {

// Docker's default /dev/shm is 64 MiB: NCCL's shared-memory transport and DataLoader workers
// die in it ("Bus error"). A few hundred MiB carries small jobs; 1 GiB and up is comfortable.
constexpr uint64_t kShmFailBelow = 256 * kMiB;
constexpr uint64_t kShmWarnBelow = 1 * kGiB;
constexpr uint64_t kDiskFailBelow = 1 * kGiB;   // a checkpoint will not fit
constexpr uint64_t kDiskWarnBelow = 10 * kGiB;  // logs fit, checkpoints of a large model may not
// InfiniBand registers memory with the NIC; NCCL's docs ask for an unlimited memlock.
constexpr uint64_t kMemlockIbFailBelow = 64 * kMiB;
// Each DataLoader worker and each NCCL peer holds descriptors; 1024 (a common default) runs out.
constexpr uint64_t kNofileWarnBelow = 4096;

}  // namespace

Finding checkShm(const std::string& path, std::optional<uint64_t> size) {
  Finding f{"/dev/shm", Verdict::kOk, "", ""};
  if (!size) {
    f.verdict = Verdict::kWarn;
    f.value = path + " is missing";
    f.advice = "NCCL and DataLoader workers need shared memory: mount a tmpfs there";
    return f;
  }
  f.value = bytes(*size) + " at " + path;
  if (*size < kShmFailBelow) {
    f.verdict = Verdict::kFail;
    f.advice = fmt::format(
        "below {}: NCCL and DataLoader workers die with 'Bus error'; in a "
        "container use --shm-size=16g or --ipc=host",
        bytes(kShmFailBelow));
  } else if (*size < kShmWarnBelow) {
    f.verdict = Verdict::kWarn;
    f.advice = "small for many DataLoader workers: give it a few GiB (--shm-size)";
  }
  return f;
}

namespace {
// "Max locked memory  8388608  8388608  bytes" -> soft limit; nullopt = unlimited or missing.
std::optional<std::optional<uint64_t>> softLimit(const std::string& limits, const char* name) {
  std::istringstream in(limits);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind(name, 0) != 0) continue;
    std::istringstream rest(line.substr(strlen(name)));
    std::string soft;
    rest >> soft;
    if (soft == "unlimited") return std::optional<uint64_t>();
    try {
      return std::optional<uint64_t>(std::stoull(soft));
    } catch (const std::exception&) {
      return std::nullopt;
    }
  }
  return std::nullopt;
}
}  // namespace

std::vector<Finding> checkLimits(const std::string& proc_root, const std::string& sys_root) {
  std::vector<Finding> out;
  std::string limits = readAll(proc_root + "/self/limits");
  bool ib = !dirEntries(sys_root + "/class/infiniband").empty();
  if (auto ml = softLimit(limits, "Max locked memory")) {
    Finding f{"memlock", Verdict::kOk, *ml ? bytes(**ml) : "unlimited", ""};
    if (*ml && ib && **ml < kMemlockIbFailBelow) {
      f.verdict = Verdict::kFail;
      f.value += " with InfiniBand devices present";
      f.advice =
          "NCCL cannot register memory with the NIC: set `ulimit -l unlimited` "
          "(limits.conf, or --ulimit memlock=-1 for a container)";
    } else if (!ib && *ml) {
      f.value += " (no InfiniBand here: it does not matter)";
    }
    out.push_back(f);
  }
  if (auto nf = softLimit(limits, "Max open files")) {
    Finding f{"open files", Verdict::kOk, *nf ? std::to_string(**nf) : "unlimited", ""};
    if (*nf && **nf < kNofileWarnBelow) {
      f.verdict = Verdict::kWarn;
      f.advice = fmt::format(
          "below {}: DataLoader workers and NCCL peers run out ('Too many "
          "open files'); raise it with `ulimit -n 65536`",
          kNofileWarnBelow);
    }
    out.push_back(f);
  }
  return out;
}

int allowedCpus(const std::string& proc_root) {
  std::istringstream in(readAll(proc_root + "/self/status"));
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Cpus_allowed_list:", 0) != 0) continue;
    int n = 0;
    for (const auto& range : splitList(line.substr(18), ',')) {
      int a = 0, b = 0;
      int got = sscanf(range.c_str(), "%d-%d", &a, &b);
      if (got == 1)
        n += 1;
      else if (got == 2 && b >= a)
        n += b - a + 1;
    }
    return n;
  }
  return 0;
}

Finding checkThreads(int cores, int nproc, const std::map<std::string, std::string>& env) {
  Finding f{"threads", Verdict::kOk, "", ""};
  int ranks = std::max(nproc, 1);
  std::string omp = getEnv(env, torchrun_env::kOmpNumThreads);
  int threads = 0;
  if (!omp.empty()) {
    try {
      threads = static_cast<int>(parseInteger(torchrun_env::kOmpNumThreads, omp, 1, 1 << 20));
    } catch (const InvalidArgument&) {
      f.verdict = Verdict::kWarn;
      f.value = fmt::format("OMP_NUM_THREADS='{}' is not a number", omp);
      f.advice = "set it to the cores per rank";
      return f;
    }
  } else {
    threads = ranks > 1 ? 1 : cores;  // launch sets 1 per worker when there are several
  }
  f.value = fmt::format("{} rank(s) x {} OpenMP thread(s) = {} on {} usable core(s)", ranks,
                        threads, ranks * threads, cores);
  if (cores > 0 && ranks * threads > cores) {
    f.verdict = Verdict::kWarn;
    f.advice = fmt::format("oversubscribed: threads wait for cores; set OMP_NUM_THREADS={}",
                           std::max(1, cores / ranks));
  }
  return f;
}

Finding checkFreeSpace(const std::string& path) {
  Finding f{"disk " + path, Verdict::kOk, "", ""};
  // The directory may not exist yet: its nearest existing ancestor holds it.
  fs::path p = fs::absolute(path.empty() ? "." : path);
  std::error_code ec;
  while (!fs::exists(p, ec) && p.has_parent_path() && p != p.parent_path()) p = p.parent_path();
  struct statvfs st {};
  if (statvfs(p.c_str(), &st) != 0) {
    f.verdict = Verdict::kWarn;
    f.value = fmt::format("cannot stat {}: {}", p.string(), strerror(errno));
    return f;
  }
  uint64_t free_bytes = static_cast<uint64_t>(st.f_bavail) * st.f_frsize;
  f.value = bytes(free_bytes) + " free";
  if (free_bytes < kDiskFailBelow) {
    f.verdict = Verdict::kFail;
    f.advice = "logs and checkpoints will not fit: free space or point --log-dir elsewhere";
  } else if (free_bytes < kDiskWarnBelow) {
    f.verdict = Verdict::kWarn;
    f.advice =
        fmt::format("below {}: a large model's checkpoints may not fit", bytes(kDiskWarnBelow));
  }
  return f;
}

}  // namespace ddpl::launcher
