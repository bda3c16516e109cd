#include "launcher/gpu/nvml.h"

#include <dlfcn.h>

#include <cstdio>
#include <vector>

#include "common/errors.h"

namespace ddpl::launcher {

namespace {

// The few NVML declarations we use, with the ABI of nvml.h (NVML API version 12). Enums are
// int-sized in the C ABI, so they are passed as int.
using nvmlReturn_t = int;
struct nvmlDevice_st;
using nvmlDevice_t = nvmlDevice_st*;
struct nvmlMemory_t {
  unsigned long long total;
  unsigned long long free;
  unsigned long long used;
};
struct nvmlUtilization_t {
  unsigned int gpu;
  unsigned int memory;
};
// nvmlProcessInfo_v2_t, what the _v3 process queries fill. Only its layout must match NVML's
// (usedGpuMemory, gpuInstanceId, computeInstanceId): the fields carry our names.
struct nvmlProcessInfo_t {
  unsigned int pid;
  unsigned long long used_gpu_memory;
  unsigned int gpu_instance_id;
  unsigned int compute_instance_id;
};
static_assert(sizeof(nvmlProcessInfo_t) == 24, "nvmlProcessInfo_v2_t is 24 bytes on LP64");

constexpr nvmlReturn_t kSuccess = 0;
constexpr nvmlReturn_t kErrorInsufficientSize = 7;
constexpr nvmlReturn_t kErrorGpuIsLost = 15;
constexpr int kTemperatureGpu = 0;                        // NVML_TEMPERATURE_GPU
constexpr int kMemoryErrorCorrected = 0;                  // NVML_MEMORY_ERROR_TYPE_CORRECTED
constexpr int kMemoryErrorUncorrected = 1;                // NVML_MEMORY_ERROR_TYPE_UNCORRECTED
constexpr int kVolatileEcc = 0;                           // NVML_VOLATILE_ECC
constexpr int kAggregateEcc = 1;                          // NVML_AGGREGATE_ECC
constexpr unsigned kNameBufferSize = 96;                  // NVML_DEVICE_NAME_V2_BUFFER_SIZE
constexpr unsigned kUuidBufferSize = 96;                  // NVML_DEVICE_UUID_V2_BUFFER_SIZE
constexpr unsigned kDriverVersionBufferSize = 80;         // NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE
constexpr unsigned long long kValueNotAvailable = ~0ULL;  // NVML_VALUE_NOT_AVAILABLE

template <typename F>
F symbol(void* handle, const char* name) {
  return reinterpret_cast<F>(dlsym(handle, name));
}

using ErrorStringFn = const char* (*)(nvmlReturn_t);

std::string describe(ErrorStringFn error_string, nvmlReturn_t rc) {
  const char* s = error_string(rc);
  return std::string(s ? s : "unknown error") + " (NVML error " + std::to_string(rc) + ")";
}

// Whether a figure came back. Unsupported, not permitted and the like leave it unknown; a lost
// GPU is news in itself, so it throws.
bool known(nvmlReturn_t rc, int index, const char* function, ErrorStringFn error_string) {
  if (rc == kSuccess) return true;
  if (rc == kErrorGpuIsLost)
    throw Error("GPU " + std::to_string(index) + " is lost (fallen off the bus?): " + function +
                " returned " + describe(error_string, rc));
  return false;
}

}  // namespace

struct Nvml::Api {
  // Required: without these there is nothing to ask.
  nvmlReturn_t (*init)() = nullptr;
  nvmlReturn_t (*shutdown)() = nullptr;
  const char* (*error_string)(nvmlReturn_t) = nullptr;
  nvmlReturn_t (*device_count)(unsigned int*) = nullptr;
  nvmlReturn_t (*handle_by_index)(unsigned int, nvmlDevice_t*) = nullptr;
  // Optional: an old driver without one leaves that figure unknown.
  nvmlReturn_t (*driver_version)(char*, unsigned int) = nullptr;
  nvmlReturn_t (*cuda_driver_version)(int*) = nullptr;
  nvmlReturn_t (*name)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*uuid)(nvmlDevice_t, char*, unsigned int) = nullptr;
  nvmlReturn_t (*compute_capability)(nvmlDevice_t, int*, int*) = nullptr;
  nvmlReturn_t (*memory)(nvmlDevice_t, nvmlMemory_t*) = nullptr;
  nvmlReturn_t (*utilization)(nvmlDevice_t, nvmlUtilization_t*) = nullptr;
  nvmlReturn_t (*temperature)(nvmlDevice_t, int, unsigned int*) = nullptr;
  nvmlReturn_t (*throttle_reasons)(nvmlDevice_t, unsigned long long*) = nullptr;
  nvmlReturn_t (*ecc_errors)(nvmlDevice_t, int, int, unsigned long long*) = nullptr;
  nvmlReturn_t (*mig_mode)(nvmlDevice_t, unsigned int*, unsigned int*) = nullptr;
  nvmlReturn_t (*processes)(nvmlDevice_t, unsigned int*, nvmlProcessInfo_t*) = nullptr;
};

std::string describeThrottleReasons(uint64_t reasons) {
  static const std::pair<uint64_t, const char*> kNames[] = {
      {throttle::kGpuIdle, "gpu_idle"},
      {throttle::kApplicationsClocksSetting, "applications_clocks_setting"},
      {throttle::kSwPowerCap, "sw_power_cap"},
      {throttle::kHwSlowdown, "hw_slowdown"},
      {throttle::kSyncBoost, "sync_boost"},
      {throttle::kSwThermalSlowdown, "sw_thermal_slowdown"},
      {throttle::kHwThermalSlowdown, "hw_thermal_slowdown"},
      {throttle::kHwPowerBrakeSlowdown, "hw_power_brake_slowdown"},
      {throttle::kDisplayClockSetting, "display_clock_setting"},
  };
  if (reasons == 0) return "none";
  std::string out;
  for (const auto& [bit, name] : kNames) {
    if (!(reasons & bit)) continue;
    if (!out.empty()) out += ',';
    out += name;
    reasons &= ~bit;
  }
  if (reasons) {
    char hex[32];
    std::snprintf(hex, sizeof hex, "0x%llx", static_cast<unsigned long long>(reasons));
    if (!out.empty()) out += ',';
    out += hex;
  }
  return out;
}

std::unique_ptr<Nvml> Nvml::load(const std::string& library, std::string* why) {
  auto fail = [why](std::string message) -> std::unique_ptr<Nvml> {
    if (why) *why = std::move(message);
    return nullptr;
  };
  dlerror();
  void* handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!handle) {
    const char* e = dlerror();
    std::string error = e ? e : "unknown dlopen error";
    // NVML ships with the driver, so its absence is the honest test for "no driver here".
    if (error.find("No such file or directory") != std::string::npos)
      return fail(library + " not found: no NVIDIA driver");
    return fail(library + " could not be loaded: " + error);
  }
  auto api = std::make_unique<Api>();
  struct Required {
    const char* name;
    bool found;
  };
  api->init = symbol<decltype(api->init)>(handle, "nvmlInit_v2");
  api->shutdown = symbol<decltype(api->shutdown)>(handle, "nvmlShutdown");
  api->error_string = symbol<decltype(api->error_string)>(handle, "nvmlErrorString");
  api->device_count = symbol<decltype(api->device_count)>(handle, "nvmlDeviceGetCount_v2");
  api->handle_by_index =
      symbol<decltype(api->handle_by_index)>(handle, "nvmlDeviceGetHandleByIndex_v2");
  for (const Required& r :
       {Required{"nvmlInit_v2", api->init != nullptr},
        Required{"nvmlShutdown", api->shutdown != nullptr},
        Required{"nvmlErrorString", api->error_string != nullptr},
        Required{"nvmlDeviceGetCount_v2", api->device_count != nullptr},
        Required{"nvmlDeviceGetHandleByIndex_v2", api->handle_by_index != nullptr}}) {
    if (!r.found) {
      dlclose(handle);
      return fail(library + " has no " + r.name + ": a driver too old for ddplaunch");
    }
  }
  api->driver_version = symbol<decltype(api->driver_version)>(handle, "nvmlSystemGetDriverVersion");
  api->cuda_driver_version =
      symbol<decltype(api->cuda_driver_version)>(handle, "nvmlSystemGetCudaDriverVersion_v2");
  if (!api->cuda_driver_version)
    api->cuda_driver_version =
        symbol<decltype(api->cuda_driver_version)>(handle, "nvmlSystemGetCudaDriverVersion");
  api->name = symbol<decltype(api->name)>(handle, "nvmlDeviceGetName");
  api->uuid = symbol<decltype(api->uuid)>(handle, "nvmlDeviceGetUUID");
  api->compute_capability =
      symbol<decltype(api->compute_capability)>(handle, "nvmlDeviceGetCudaComputeCapability");
  api->memory = symbol<decltype(api->memory)>(handle, "nvmlDeviceGetMemoryInfo");
  api->utilization = symbol<decltype(api->utilization)>(handle, "nvmlDeviceGetUtilizationRates");
  api->temperature = symbol<decltype(api->temperature)>(handle, "nvmlDeviceGetTemperature");
  api->throttle_reasons =
      symbol<decltype(api->throttle_reasons)>(handle, "nvmlDeviceGetCurrentClocksThrottleReasons");
  // Newer drivers call it "event reasons" and deprecate the old name, which may one day go.
  if (!api->throttle_reasons)
    api->throttle_reasons =
        symbol<decltype(api->throttle_reasons)>(handle, "nvmlDeviceGetCurrentClocksEventReasons");
  api->ecc_errors = symbol<decltype(api->ecc_errors)>(handle, "nvmlDeviceGetTotalEccErrors");
  api->mig_mode = symbol<decltype(api->mig_mode)>(handle, "nvmlDeviceGetMigMode");
  // _v3 fills nvmlProcessInfo_v2_t wherever it exists; the earlier entry points fill layouts
  // that depend on the release, and a wrong guess reads garbage, so without _v3 the figure
  // stays unknown.
  api->processes =
      symbol<decltype(api->processes)>(handle, "nvmlDeviceGetComputeRunningProcesses_v3");

  auto error = [&](nvmlReturn_t rc) { return describe(api->error_string, rc); };
  nvmlReturn_t rc = api->init();
  if (rc != kSuccess) {
    std::string message = "nvmlInit failed: " + error(rc);
    dlclose(handle);
    return fail(message);
  }
  unsigned int count = 0;
  rc = api->device_count(&count);
  if (rc != kSuccess) {
    std::string message = "nvmlDeviceGetCount failed: " + error(rc);
    api->shutdown();
    dlclose(handle);
    return fail(message);
  }
  return std::unique_ptr<Nvml>(new Nvml(handle, std::move(api), static_cast<int>(count)));
}

Nvml::Nvml(void* handle, std::unique_ptr<Api> api, int device_count)
    : handle_(handle), api_(std::move(api)), device_count_(device_count) {}

Nvml::~Nvml() {
  api_->shutdown();
  dlclose(handle_);
}

void* Nvml::deviceHandle(int index) const {
  if (index < 0 || index >= device_count_)
    throw InvalidArgument("GPU index " + std::to_string(index) + " out of range: NVML reports " +
                          std::to_string(device_count_) + " GPU(s)");
  nvmlDevice_t device = nullptr;
  nvmlReturn_t rc = api_->handle_by_index(static_cast<unsigned>(index), &device);
  if (rc != kSuccess)
    throw Error("GPU " + std::to_string(index) +
                ": nvmlDeviceGetHandleByIndex failed: " + describe(api_->error_string, rc));
  return device;
}

std::string Nvml::driverVersion() const {
  if (!api_->driver_version) return "";
  char buffer[kDriverVersionBufferSize] = {};
  if (api_->driver_version(buffer, sizeof buffer) != kSuccess) return "";
  return buffer;
}

std::optional<int> Nvml::cudaDriverVersion() const {
  int version = 0;
  if (!api_->cuda_driver_version || api_->cuda_driver_version(&version) != kSuccess)
    return std::nullopt;
  return version;
}

GpuDeviceInfo Nvml::device(int index) const {
  auto dev = static_cast<nvmlDevice_t>(deviceHandle(index));
  const ErrorStringFn error = api_->error_string;
  GpuDeviceInfo info;
  info.index = index;
  if (api_->name) {
    char buffer[kNameBufferSize] = {};
    if (known(api_->name(dev, buffer, sizeof buffer), index, "nvmlDeviceGetName", error))
      info.name = buffer;
  }
  if (api_->uuid) {
    char buffer[kUuidBufferSize] = {};
    if (known(api_->uuid(dev, buffer, sizeof buffer), index, "nvmlDeviceGetUUID", error))
      info.uuid = buffer;
  }
  int major = 0, minor = 0;
  if (api_->compute_capability && known(api_->compute_capability(dev, &major, &minor), index,
                                        "nvmlDeviceGetCudaComputeCapability", error)) {
    info.compute_major = major;
    info.compute_minor = minor;
  }
  nvmlMemory_t memory{};
  if (api_->memory && known(api_->memory(dev, &memory), index, "nvmlDeviceGetMemoryInfo", error))
    info.memory_total_bytes = memory.total;
  unsigned current = 0, pending = 0;
  if (api_->mig_mode &&
      known(api_->mig_mode(dev, &current, &pending), index, "nvmlDeviceGetMigMode", error)) {
    info.mig_enabled = current != 0;
    info.mig_enabled_pending = pending != 0;
  }
  return info;
}

GpuSample Nvml::sample(int index) const {
  auto dev = static_cast<nvmlDevice_t>(deviceHandle(index));
  const ErrorStringFn error = api_->error_string;
  GpuSample s;
  nvmlUtilization_t utilization{};
  if (api_->utilization &&
      known(api_->utilization(dev, &utilization), index, "nvmlDeviceGetUtilizationRates", error)) {
    s.utilization_percent = utilization.gpu;
    s.memory_utilization_percent = utilization.memory;
  }
  nvmlMemory_t memory{};
  if (api_->memory && known(api_->memory(dev, &memory), index, "nvmlDeviceGetMemoryInfo", error)) {
    s.memory_used_bytes = memory.used;
    s.memory_total_bytes = memory.total;
  }
  unsigned temperature = 0;
  if (api_->temperature && known(api_->temperature(dev, kTemperatureGpu, &temperature), index,
                                 "nvmlDeviceGetTemperature", error))
    s.temperature_celsius = temperature;
  unsigned long long reasons = 0;
  if (api_->throttle_reasons && known(api_->throttle_reasons(dev, &reasons), index,
                                      "nvmlDeviceGetCurrentClocksThrottleReasons", error))
    s.throttle_reasons = reasons;
  if (api_->ecc_errors) {
    auto ecc = [&](int counter) -> std::optional<EccErrors> {
      unsigned long long corrected = 0, uncorrected = 0;
      if (!known(api_->ecc_errors(dev, kMemoryErrorCorrected, counter, &corrected), index,
                 "nvmlDeviceGetTotalEccErrors", error) ||
          !known(api_->ecc_errors(dev, kMemoryErrorUncorrected, counter, &uncorrected), index,
                 "nvmlDeviceGetTotalEccErrors", error))
        return std::nullopt;
      return EccErrors{corrected, uncorrected};
    };
    s.ecc_volatile = ecc(kVolatileEcc);
    s.ecc_aggregate = ecc(kAggregateEcc);
  }
  return s;
}

std::optional<std::map<pid_t, uint64_t>> Nvml::processMemory(int index) const {
  if (!api_->processes) return std::nullopt;
  auto dev = static_cast<nvmlDevice_t>(deviceHandle(index));
  const ErrorStringFn error = api_->error_string;
  std::vector<nvmlProcessInfo_t> infos;
  // Processes can start between asking how many there are and asking for them: a few rounds.
  for (int round = 0; round < 4; ++round) {
    unsigned int count = static_cast<unsigned>(infos.size());
    nvmlReturn_t rc = api_->processes(dev, &count, infos.empty() ? nullptr : infos.data());
    if (rc == kErrorInsufficientSize) {
      infos.resize(count + 4);
      continue;
    }
    if (!known(rc, index, "nvmlDeviceGetComputeRunningProcesses_v3", error)) return std::nullopt;
    infos.resize(count);
    std::map<pid_t, uint64_t> memory;
    for (const nvmlProcessInfo_t& p : infos)
      if (p.used_gpu_memory != kValueNotAvailable)
        memory[static_cast<pid_t>(p.pid)] += p.used_gpu_memory;
    return memory;
  }
  return std::nullopt;
}

}  // namespace ddpl::launcher
