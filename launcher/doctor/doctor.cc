#include "launcher/doctor/doctor.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <netdb.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/statvfs.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "common/errors.h"
#include "common/parse.h"
#include "common/torchrun_env.h"
#include "launcher/gpu/gpu.h"

namespace ddpl::launcher {
namespace fs = std::filesystem;
namespace {

constexpr uint64_t kMiB = 1024ull * 1024;
constexpr uint64_t kGiB = 1024 * kMiB;
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
constexpr unsigned kTemperatureWarnAt = 85;
// Clocks held down by heat or by the board's power brake: the GPU is slower than its peers.
constexpr uint64_t kBadThrottle = throttle::kHwSlowdown | throttle::kSwThermalSlowdown |
                                  throttle::kHwThermalSlowdown | throttle::kHwPowerBrakeSlowdown;

std::string getEnv(const std::map<std::string, std::string>& env, const char* name) {
  auto it = env.find(name);
  return it == env.end() ? std::string() : it->second;
}

std::string bytes(uint64_t b) {
  if (b >= kGiB) return fmt::format("{:.1f} GiB", static_cast<double>(b) / kGiB);
  return fmt::format("{} MiB", b / kMiB);
}

std::string cudaVersion(int v) { return fmt::format("{}.{}", v / 1000, (v % 1000) / 10); }

// "12.4" -> 12040; nullopt when not a version.
std::optional<int> parseCudaVersion(const std::string& s) {
  int major = 0, minor = 0;
  if (sscanf(s.c_str(), "%d.%d", &major, &minor) < 1) return std::nullopt;
  return major * 1000 + minor * 10;
}

std::string readAll(const std::string& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::set<std::string> dirEntries(const std::string& dir) {
  std::set<std::string> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) out.insert(e.path().filename().string());
  return out;
}

std::string joinSet(const std::set<std::string>& s) {
  std::string out;
  for (const auto& x : s) out += (out.empty() ? "" : ",") + x;
  return out.empty() ? "none" : out;
}

}  // namespace

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

const char* const kTorchProbeScript = R"PY(
import sys
try:
    import torch
except Exception as e:
    print("error=" + (str(e).splitlines() or ["import failed"])[0]); sys.exit(0)
print("torch=" + torch.__version__)
print("cuda=" + (torch.version.cuda or ""))
try:
    print("cudnn=" + str(torch.backends.cudnn.version() or ""))
except Exception:
    print("cudnn=")
try:
    print("nccl=" + ".".join(str(x) for x in torch.cuda.nccl.version()))
except Exception:
    print("nccl=")
ok = torch.cuda.is_available()
print("cuda_available=" + ("1" if ok else "0"))
print("device_count=" + str(torch.cuda.device_count() if ok else 0))
# The compiled list, known without a GPU (get_arch_list() is empty when CUDA is unavailable).
flags = getattr(torch._C, "_cuda_getArchFlags", lambda: None)()
print("arch_list=" + (flags or " ".join(torch.cuda.get_arch_list() if ok else [])))
)PY";

TorchProbe parseTorchProbe(const std::string& output) {
  TorchProbe t;
  std::istringstream in(output);
  std::string line;
  bool any = false;
  while (std::getline(in, line)) {
    auto eq = line.find('=');
    if (eq == std::string::npos) continue;
    std::string k = line.substr(0, eq), v = line.substr(eq + 1);
    if (k == "error")
      t.error = v, any = true;
    else if (k == "torch")
      t.torch_version = v, any = true;
    else if (k == "cuda")
      t.cuda_version = v;
    else if (k == "cudnn")
      t.cudnn_version = v;
    else if (k == "nccl")
      t.nccl_version = v;
    else if (k == "cuda_available")
      t.cuda_available = v == "1";
    else if (k == "device_count")
      t.device_count = atoi(v.c_str());
    else if (k == "arch_list")
      t.arch_list = splitList(v, ' ');
  }
  t.probed = any;
  if (!any && t.error.empty()) {
    std::string first = output.substr(0, output.find('\n'));
    t.error = "the interpreter printed no probe result" + (first.empty() ? "" : ": " + first);
  }
  return t;
}

TorchProbe probeTorch(const std::string& python, double timeout_sec) {
  std::string out;
  int rc = captureOutput({python, "-c", kTorchProbeScript}, timeout_sec, &out);
  TorchProbe t = parseTorchProbe(out);
  if (rc == -1) {
    t.probed = false;
    t.error = fmt::format("cannot run '{}'", python);
  } else if (rc == 124) {
    t.probed = false;
    t.error =
        fmt::format("'{}' did not finish importing torch within {:.0f}s", python, timeout_sec);
  } else if (!t.probed) {
    t.error = fmt::format("'{}' exited with {}: {}", python, rc, t.error);
  }
  return t;
}

GpuFacts readGpuFacts(const std::string& nvml_library) {
  GpuFacts f;
  std::string why;
  auto nvml = Nvml::load(nvml_library, &why);
  if (!nvml) {
    f.why_none = why;
    return f;
  }
  f.driver = true;
  f.driver_version = nvml->driverVersion();
  f.cuda_driver_version = nvml->cudaDriverVersion();
  for (int i = 0; i < nvml->deviceCount(); ++i) {
    try {
      f.devices.push_back(nvml->device(i));
      f.samples.push_back(nvml->sample(i));
    } catch (const std::exception& e) {
      f.errors[i] = e.what();
      if (f.devices.size() > f.samples.size()) f.devices.pop_back();
    }
  }
  return f;
}

std::vector<Finding> checkGpus(const GpuFacts& facts) {
  std::vector<Finding> out;
  if (!facts.driver) {
    out.push_back({"driver", Verdict::kOk,
                   "none (" + facts.why_none +
                       "): no GPU to use here; CPU training with the gloo backend is fine",
                   ""});
    return out;
  }
  std::string driver = facts.driver_version.empty() ? "version unknown" : facts.driver_version;
  if (facts.cuda_driver_version)
    driver += fmt::format(" (supports CUDA up to {})", cudaVersion(*facts.cuda_driver_version));
  out.push_back({"driver", Verdict::kOk, driver, ""});
  int count = static_cast<int>(facts.devices.size() + facts.errors.size());
  if (count == 0)
    out.push_back({"gpus", Verdict::kWarn, "the driver is loaded but reports no GPU",
                   "check `nvidia-smi`; in a container, pass the GPUs in (--gpus all)"});
  for (const auto& [index, error] : facts.errors)
    out.push_back({fmt::format("gpu{}", index), Verdict::kFail, error,
                   "the GPU cannot be queried (fallen off the bus?): drain this node, reset "
                   "or replace the GPU"});
  for (size_t i = 0; i < facts.devices.size(); ++i) {
    const GpuDeviceInfo& d = facts.devices[i];
    const GpuSample& s = facts.samples[i];
    Finding f{fmt::format("gpu{}", d.index), Verdict::kOk, "", ""};
    std::vector<std::string> advice;
    f.value = d.name.empty() ? "unknown model" : d.name;
    if (d.compute_major)
      f.value += fmt::format(", capability {}.{}", *d.compute_major, d.compute_minor.value_or(0));
    if (d.memory_total_bytes) f.value += ", " + bytes(*d.memory_total_bytes);
    if (s.temperature_celsius) {
      f.value += fmt::format(", {}C", *s.temperature_celsius);
      if (*s.temperature_celsius >= kTemperatureWarnAt) {
        f.verdict = std::max(f.verdict, Verdict::kWarn);
        advice.push_back(fmt::format("{}C is hot (>= {}C): check the cooling",
                                     *s.temperature_celsius, kTemperatureWarnAt));
      }
    }
    if (s.ecc_volatile || s.ecc_aggregate) {
      EccErrors v = s.ecc_volatile.value_or(EccErrors{});
      EccErrors a = s.ecc_aggregate.value_or(EccErrors{});
      f.value += fmt::format(", ECC since boot {} corrected {} uncorrected, lifetime {} {}",
                             v.corrected, v.uncorrected, a.corrected, a.uncorrected);
      if (v.uncorrected > 0) {
        f.verdict = Verdict::kFail;
        advice.push_back(fmt::format(
            "{} uncorrected ECC error(s) since the driver loaded: results may be wrong and "
            "CUDA calls may fail; drain the node and reset the GPU (nvidia-smi -r)",
            v.uncorrected));
      } else if (a.uncorrected > 0) {
        f.verdict = std::max(f.verdict, Verdict::kWarn);
        advice.push_back(
            fmt::format("{} uncorrected ECC error(s) over the GPU's life: watch it "
                        "(retired pages, nvidia-smi -q -d PAGE_RETIREMENT)",
                        a.uncorrected));
      }
    }
    if (d.mig_enabled) {
      f.value += *d.mig_enabled ? ", MIG on" : ", MIG off";
      if (*d.mig_enabled) {
        f.verdict = std::max(f.verdict, Verdict::kWarn);
        advice.push_back(
            "MIG is on: CUDA sees MIG instances, not the GPU, and NCCL cannot "
            "communicate across them; turn it off for multi-GPU training "
            "(nvidia-smi -i N -mig 0)");
      }
      if (d.mig_enabled_pending && *d.mig_enabled_pending != *d.mig_enabled) {
        f.verdict = std::max(f.verdict, Verdict::kWarn);
        advice.push_back(fmt::format("MIG turns {} at the next GPU reset",
                                     *d.mig_enabled_pending ? "on" : "off"));
      }
    }
    if (s.throttle_reasons) {
      f.value += ", throttle " + describeThrottleReasons(*s.throttle_reasons);
      if (*s.throttle_reasons & kBadThrottle) {
        f.verdict = std::max(f.verdict, Verdict::kWarn);
        advice.push_back("clocks held down by " +
                         describeThrottleReasons(*s.throttle_reasons & kBadThrottle) +
                         ": this GPU will be the slowest rank; check cooling and power");
      }
    }
    for (const auto& a : advice) f.advice += (f.advice.empty() ? "" : "; ") + a;
    out.push_back(std::move(f));
  }
  return out;
}

std::optional<Finding> checkCudaVisibleDevices(const std::map<std::string, std::string>& env,
                                               const GpuFacts& facts) {
  auto it = env.find("CUDA_VISIBLE_DEVICES");
  if (it == env.end()) return std::nullopt;
  const std::string& v = it->second;
  Finding f{"CUDA_VISIBLE_DEVICES", Verdict::kOk, "'" + v + "'", ""};
  int physical = static_cast<int>(facts.devices.size() + facts.errors.size());
  auto items = splitList(v, ',');
  if (items.empty()) {
    f.verdict = facts.driver && physical > 0 ? Verdict::kWarn : Verdict::kOk;
    f.value += ": hides every GPU";
    if (f.verdict != Verdict::kOk)
      f.advice = "unset it to use the GPUs, or keep it for CPU-only runs";
    return f;
  }
  if (!facts.driver) {
    f.verdict = Verdict::kWarn;
    f.value += ": set, but there is no driver";
    f.advice = "no GPU will be visible whatever it says";
    return f;
  }
  std::set<std::string> seen;
  for (size_t i = 0; i < items.size(); ++i) {
    const std::string& item = items[i];
    std::string problem;
    if (!seen.insert(item).second) {
      problem = fmt::format("'{}' appears twice (CUDA fails to initialise)", item);
    } else if (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) {
      bool known = item.rfind("MIG-", 0) == 0;  // MIG instance UUIDs are not in NVML's GPU list
      for (const auto& d : facts.devices)
        if (!d.uuid.empty() && d.uuid.rfind(item, 0) == 0) known = true;
      if (!known) problem = fmt::format("no GPU has the UUID '{}'", item);
    } else {
      try {
        int64_t idx = parseInteger("CUDA_VISIBLE_DEVICES", item, 0, 1 << 20);
        if (idx >= physical)
          problem =
              fmt::format("GPU {} does not exist ({} GPU(s): 0..{})", idx, physical, physical - 1);
      } catch (const InvalidArgument&) {
        problem = fmt::format("'{}' is neither an index nor a UUID", item);
      }
    }
    if (!problem.empty()) {
      f.verdict = Verdict::kFail;
      f.value +=
          fmt::format(": entry {} {}; CUDA stops at it, leaving {} GPU(s) visible", i, problem, i);
      f.advice = fmt::format("use indices 0..{} or GPU UUIDs from `nvidia-smi -L`", physical - 1);
      return f;
    }
  }
  f.value += fmt::format(": {} of {} GPU(s) visible", items.size(), physical);
  return f;
}

std::string kernelImageFor(const std::vector<std::string>& arch_list, int major, int minor) {
  const int cap = major * 10 + minor;
  bool ptx = false;
  for (const auto& a : arch_list) {
    bool sm = a.rfind("sm_", 0) == 0, compute = a.rfind("compute_", 0) == 0;
    if (!sm && !compute) continue;
    std::string digits = a.substr(sm ? 3 : 8);
    bool suffixed = !digits.empty() && !isdigit(static_cast<unsigned char>(digits.back()));
    while (!digits.empty() && !isdigit(static_cast<unsigned char>(digits.back())))
      digits.pop_back();  // sm_90a, sm_100f: arch-specific, run only on that exact major.minor
    if (digits.size() < 2) continue;
    int n = atoi(digits.c_str());
    int a_major = n / 10, a_minor = n % 10;
    if (sm) {
      if (n == cap) return "sm";
      // Binary code runs on later minor versions of the same major (8.0 on 8.6).
      if (!suffixed && a_major == major && a_minor < minor) return "sm";
    } else if (!suffixed && n <= cap) {
      ptx = true;  // the driver JIT-compiles PTX for newer GPUs
    }
  }
  return ptx ? "ptx" : "none";
}

std::vector<Finding> checkTorch(const TorchProbe& t, const GpuFacts& facts) {
  std::vector<Finding> out;
  if (!t.probed || !t.error.empty()) {
    out.push_back({"torch", Verdict::kFail, t.error.empty() ? "not probed" : t.error,
                   "install torch in that interpreter, or point launch at the one that has it "
                   "(PYTHON_EXEC or --python PATH)"});
    return out;
  }
  out.push_back({"torch", Verdict::kOk, t.torch_version, ""});
  const bool gpus = facts.driver && !facts.devices.empty();
  if (t.cuda_version.empty()) {
    out.push_back({"torch.cuda", gpus ? Verdict::kWarn : Verdict::kOk, "a CPU-only build",
                   gpus ? "this machine has GPUs: install a CUDA wheel to "
                          "use them"
                        : ""});
    return out;
  }
  Finding cuda{"torch.cuda", Verdict::kOk, "built for CUDA " + t.cuda_version, ""};
  auto wheel = parseCudaVersion(t.cuda_version);
  if (wheel && facts.cuda_driver_version) {
    int drv = *facts.cuda_driver_version;
    cuda.value += fmt::format(", driver supports {}", cudaVersion(drv));
    if (*wheel / 1000 > drv / 1000) {
      cuda.verdict = Verdict::kFail;
      cuda.advice = fmt::format(
          "the wheel's CUDA {} needs a newer driver than {} (CUDA {}): upgrade the driver, or "
          "install a torch built for CUDA {}.x",
          t.cuda_version, facts.driver_version, cudaVersion(drv), drv / 1000);
    } else if (*wheel > drv) {
      cuda.verdict = Verdict::kWarn;
      cuda.advice = fmt::format(
          "CUDA {} on a driver for {} runs through minor-version compatibility: kernels "
          "JIT-compiled from PTX will fail; upgrade the driver to be safe",
          t.cuda_version, cudaVersion(drv));
    }
  }
  out.push_back(cuda);
  out.push_back(
      {"torch.cudnn", Verdict::kOk, t.cudnn_version.empty() ? "none" : t.cudnn_version, ""});
  Finding nccl{"torch.nccl", Verdict::kOk, t.nccl_version.empty() ? "none" : t.nccl_version, ""};
  if (t.nccl_version.empty() && gpus) {
    nccl.verdict = Verdict::kWarn;
    nccl.advice = "no NCCL in this build: multi-GPU jobs must use the gloo backend";
  }
  out.push_back(nccl);
  Finding avail{"torch.cuda.is_available", Verdict::kOk, t.cuda_available ? "True" : "False", ""};
  if (t.cuda_available) {
    avail.value += fmt::format(" ({} device(s))", t.device_count);
  } else if (gpus) {
    avail.verdict = Verdict::kFail;
    avail.advice =
        "the GPUs are there but torch cannot use them: check the driver against "
        "torch.cuda above, CUDA_VISIBLE_DEVICES, and the container's GPU access";
  } else {
    avail.value += " (no GPU here: CPU training)";
  }
  out.push_back(avail);
  if (!t.arch_list.empty()) {
    std::string list;
    for (const auto& a : t.arch_list) list += (list.empty() ? "" : " ") + a;
    for (const auto& d : facts.devices) {
      if (!d.compute_major) continue;
      int major = *d.compute_major, minor = d.compute_minor.value_or(0);
      std::string how = kernelImageFor(t.arch_list, major, minor);
      Finding f{fmt::format("torch.arch gpu{}", d.index), Verdict::kOk,
                fmt::format("capability {}.{} against [{}]", major, minor, list), ""};
      if (how == "ptx") {
        f.verdict = Verdict::kWarn;
        f.value += ": PTX only";
        f.advice =
            "kernels are JIT-compiled at first use (minutes); a wheel built for "
            "sm_" +
            std::to_string(major * 10 + minor) + " starts faster";
      } else if (how == "none") {
        f.verdict = Verdict::kFail;
        f.value += ": no kernel image";
        f.advice = fmt::format(
            "the job will fail with 'no kernel image is available for execution on the "
            "device': install a torch built for sm_{} (a newer wheel, or one for a newer CUDA)",
            major * 10 + minor);
      }
      out.push_back(f);
    }
  }
  return out;
}

namespace {

// NCCL_SOCKET_IFNAME / NCCL_IB_HCA syntax: "^" excludes, "=" matches exactly, otherwise each
// item is a prefix. Returns the interfaces the value selects.
std::set<std::string> ncclSelect(const std::string& value, const std::set<std::string>& have,
                                 bool strip_port) {
  std::string v = value;
  bool exclude = false, exact = false;
  if (!v.empty() && v[0] == '^') exclude = true, v = v.substr(1);
  if (!v.empty() && v[0] == '=') exact = true, v = v.substr(1);
  std::vector<std::string> items;
  for (auto item : splitList(v, ',')) {
    if (strip_port) item = item.substr(0, item.find(':'));
    if (!item.empty()) items.push_back(item);
  }
  std::set<std::string> out;
  for (const auto& name : have) {
    bool match = std::any_of(items.begin(), items.end(), [&](const std::string& i) {
      return exact ? name == i : name.rfind(i, 0) == 0;
    });
    if (match != exclude) out.insert(name);
  }
  return out;
}

}  // namespace

std::vector<Finding> checkNetworkNames(const std::map<std::string, std::string>& env,
                                       const std::string& sys_root) {
  std::vector<Finding> out;
  std::set<std::string> nets = dirEntries(sys_root + "/class/net");
  if (auto it = env.find("NCCL_SOCKET_IFNAME"); it != env.end()) {
    auto chosen = ncclSelect(it->second, nets, false);
    Finding f{"NCCL_SOCKET_IFNAME", Verdict::kOk, fmt::format("'{}'", it->second), ""};
    if (chosen.empty()) {
      f.verdict = Verdict::kFail;
      f.value += fmt::format(" selects no interface (this node has {})", joinSet(nets));
      f.advice =
          "NCCL will fail with 'no socket interface found': name an interface that "
          "exists here, or unset it";
    } else {
      f.value += " selects " + joinSet(chosen);
    }
    out.push_back(f);
  }
  if (auto it = env.find("GLOO_SOCKET_IFNAME"); it != env.end()) {
    Finding f{"GLOO_SOCKET_IFNAME", Verdict::kOk, fmt::format("'{}'", it->second), ""};
    std::set<std::string> missing;
    for (const auto& name : splitList(it->second, ','))
      if (!nets.count(name)) missing.insert(name);
    if (!missing.empty() || splitList(it->second, ',').empty()) {
      f.verdict = Verdict::kFail;
      f.value +=
          fmt::format(": no interface {} here (this node has {})", joinSet(missing), joinSet(nets));
      f.advice = "Gloo will fail to create its device: name an interface that exists, or unset it";
    }
    out.push_back(f);
  }
  if (auto it = env.find("NCCL_IB_HCA"); it != env.end()) {
    std::set<std::string> hcas = dirEntries(sys_root + "/class/infiniband");
    auto chosen = ncclSelect(it->second, hcas, true);
    Finding f{"NCCL_IB_HCA", Verdict::kOk, fmt::format("'{}'", it->second), ""};
    if (chosen.empty()) {
      f.verdict = Verdict::kWarn;
      f.value += fmt::format(" selects no InfiniBand device (this node has {})", joinSet(hcas));
      f.advice =
          "NCCL falls back to TCP sockets, far slower: name HCAs that exist "
          "(ls /sys/class/infiniband)";
    } else {
      f.value += " selects " + joinSet(chosen);
    }
    out.push_back(f);
  }
  return out;
}

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

Finding checkEndpoint(const std::string& name, const std::string& host_port, bool connect,
                      double timeout_sec) {
  Finding f{name, Verdict::kOk, host_port, ""};
  HostPort hp;
  try {
    hp = parseHostPort(name, host_port, 0);
  } catch (const std::exception& e) {
    f.verdict = Verdict::kFail;
    f.value = e.what();
    return f;
  }
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(hp.host.c_str(), nullptr, &hints, &res);
  if (rc != 0) {
    f.verdict = Verdict::kFail;
    f.value += fmt::format(": '{}' does not resolve ({})", hp.host, gai_strerror(rc));
    f.advice = "use a name every node resolves, or an address";
    return f;
  }
  char addr[NI_MAXHOST] = "?";
  getnameinfo(res->ai_addr, res->ai_addrlen, addr, sizeof(addr), nullptr, 0, NI_NUMERICHOST);
  f.value += fmt::format(" resolves to {}", addr);
  if (connect && hp.port > 0) {
    bool reached = false;
    std::string why = "no address";
    for (addrinfo* ai = res; ai && !reached; ai = ai->ai_next) {
      int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
      if (fd < 0) continue;
      reinterpret_cast<sockaddr_in*>(ai->ai_addr)->sin_port = htons(static_cast<uint16_t>(hp.port));
      int c = ::connect(fd, ai->ai_addr, ai->ai_addrlen);
      if (c != 0 && errno == EINPROGRESS) {
        pollfd p{fd, POLLOUT, 0};
        if (poll(&p, 1, static_cast<int>(timeout_sec * 1000)) == 1) {
          int err = 0;
          socklen_t len = sizeof(err);
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
          c = err == 0 ? 0 : -1;
          why = err ? strerror(err) : "";
        } else {
          why = fmt::format("no answer within {:.0f}s", timeout_sec);
        }
      } else if (c != 0) {
        why = strerror(errno);
      }
      reached = c == 0;
      close(fd);
    }
    if (reached) {
      f.value += fmt::format(", port {} answers", hp.port);
    } else {
      f.verdict = Verdict::kWarn;
      f.value += fmt::format(", port {} does not answer ({})", hp.port, why);
      f.advice =
          "fine before the job starts if the first agent hosts it; otherwise check the "
          "service and the firewall";
    }
  }
  freeaddrinfo(res);
  return f;
}

std::vector<Finding> checkNativeLibraries(const std::string& program, double timeout_sec) {
  std::vector<Finding> out;
  std::string text;
  int rc = captureOutput({"ldd", program}, timeout_sec, &text);
  if (rc != 0) {
    out.push_back(
        {"libraries", Verdict::kWarn,
         fmt::format("ldd {} exited with {}: {}", program, rc, text.substr(0, text.find('\n'))),
         "not a dynamic executable? nothing to check"});
    return out;
  }
  static const char* kWatched[] = {"libcudart", "libcuda.so", "libnccl", "libcudnn", "libcublas"};
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string soname, arrow, path;
    words >> soname >> arrow >> path;
    bool watched = std::any_of(std::begin(kWatched), std::end(kWatched),
                               [&](const char* w) { return soname.rfind(w, 0) == 0; });
    if (!watched) continue;
    Finding f{soname, Verdict::kOk, "", ""};
    if (path == "not") {
      f.verdict = Verdict::kFail;
      f.value = "not found";
      f.advice =
          "the program will not start: add the library's directory to LD_LIBRARY_PATH "
          "or install it";
    } else {
      std::error_code ec;
      fs::path real = fs::canonical(path, ec);
      f.value = ec ? path : path + " (" + real.filename().string() + ")";
    }
    out.push_back(f);
  }
  if (out.empty())
    out.push_back(
        {"libraries", Verdict::kOk, program + " links no CUDA, NCCL or cuDNN library", ""});
  return out;
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
