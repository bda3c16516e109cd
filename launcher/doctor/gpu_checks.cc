#include <fmt/format.h>

#include "common/errors.h"
#include "common/parse.h"
#include "launcher/doctor/check_util.h"
#include "launcher/doctor/doctor.h"

namespace ddpl::launcher {
using checks::bytes;
using checks::cudaVersion;
namespace {

constexpr unsigned kTemperatureWarnAt = 85;
// Clocks held down by heat or by the board's power brake: the GPU is slower than its peers.
constexpr uint64_t kBadThrottle = throttle::kHwSlowdown | throttle::kSwThermalSlowdown |
                                  throttle::kHwThermalSlowdown | throttle::kHwPowerBrakeSlowdown;

}  // namespace

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

}  // namespace ddpl::launcher
