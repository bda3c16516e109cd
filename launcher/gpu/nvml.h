#pragma once
// NVML (the NVIDIA Management Library, part of the driver) loaded at run time, never linked:
// `launch` must start on machines without a driver, and no CUDA header is needed to build it.
// Serves GPU discovery (gpu.h), the per-rank GPU figures of the metrics endpoint and
// `launch doctor` (driver, CUDA version, per-GPU facts and health).
#include <sys/types.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>

namespace ddpl::launcher {

inline constexpr const char* kDefaultNvmlLibrary = "libnvidia-ml.so.1";

// Why a GPU's clocks are held down: NVML's nvmlClocksThrottleReason* bits.
namespace throttle {
inline constexpr uint64_t kGpuIdle = 0x1;
inline constexpr uint64_t kApplicationsClocksSetting = 0x2;
inline constexpr uint64_t kSwPowerCap = 0x4;
inline constexpr uint64_t kHwSlowdown = 0x8;
inline constexpr uint64_t kSyncBoost = 0x10;
inline constexpr uint64_t kSwThermalSlowdown = 0x20;
inline constexpr uint64_t kHwThermalSlowdown = 0x40;
inline constexpr uint64_t kHwPowerBrakeSlowdown = 0x80;
inline constexpr uint64_t kDisplayClockSetting = 0x100;
}  // namespace throttle

// "sw_power_cap,hw_thermal_slowdown"; "none" for 0; unnamed bits as "0x...".
std::string describeThrottleReasons(uint64_t reasons);

struct EccErrors {
  uint64_t corrected = 0;
  uint64_t uncorrected = 0;
};

// What does not change while the driver is loaded. Every optional is unset when the driver
// does not report it (not supported on this GPU, no permission, or a driver too old to have
// the function).
struct GpuDeviceInfo {
  int index = 0;     // NVML's index: all GPUs of the machine, whatever CUDA_VISIBLE_DEVICES says
  std::string name;  // "NVIDIA H100 80GB HBM3"; empty when unknown
  std::string uuid;  // "GPU-8c1f..."; empty when unknown
  std::optional<int> compute_major;
  std::optional<int> compute_minor;
  std::optional<uint64_t> memory_total_bytes;
  std::optional<bool> mig_enabled;          // MIG mode now
  std::optional<bool> mig_enabled_pending;  // after the next GPU reset
};

// Figures that change, read on each call.
struct GpuSample {
  std::optional<unsigned> utilization_percent;         // kernels running, over the last period
  std::optional<unsigned> memory_utilization_percent;  // memory read or written, same period
  std::optional<uint64_t> memory_used_bytes;
  std::optional<uint64_t> memory_total_bytes;
  std::optional<unsigned> temperature_celsius;  // the GPU die
  std::optional<uint64_t> throttle_reasons;     // throttle::k* bits
  std::optional<EccErrors> ecc_volatile;        // since the driver was last loaded
  std::optional<EccErrors> ecc_aggregate;       // over the GPU's life
};

// One loaded NVML session: nvmlInit at load, nvmlShutdown and dlclose at destruction (NVML
// counts its initialisations, so several sessions in one process are fine). nvmlInit can take
// 100 ms or more on a GPU machine: load once and keep the session.
//
// Thread safety: after load() the object is immutable and NVML is thread-safe, so every
// method may be called from several threads at once. Destruction must not race with a call.
//
// Errors: a figure the driver cannot give is left unset. A device query that cannot even get
// the GPU's handle, or that finds the GPU lost (fallen off the bus), throws ddpl::Error naming
// the GPU, the NVML function and its error; an index out of range throws
// ddpl::InvalidArgument.
class Nvml {
 public:
  // Loads `library` (a name for the dynamic loader's search, or a path) and initialises it.
  // Returns nullptr and sets `*why` when it cannot: "libnvidia-ml.so.1 not found: no NVIDIA
  // driver", "nvmlInit failed: Driver Not Loaded (NVML error 9)", a missing required function.
  static std::unique_ptr<Nvml> load(const std::string& library, std::string* why);
  ~Nvml();
  Nvml(const Nvml&) = delete;
  Nvml& operator=(const Nvml&) = delete;

  // "550.54.15"; empty when unknown.
  std::string driverVersion() const;
  // The newest CUDA version the driver supports, as CUDA writes it (12040 = 12.4).
  std::optional<int> cudaDriverVersion() const;
  // Counted once, at load (the driver's device list is fixed while it is initialised).
  int deviceCount() const { return device_count_; }
  GpuDeviceInfo device(int index) const;
  GpuSample sample(int index) const;
  // GPU memory per compute process on this GPU, by pid as the driver sees it (the host's pid
  // namespace: inside a container with its own, the pids differ from the container's). A pid
  // listed more than once (MIG instances) is summed; a process whose memory the driver does
  // not report is left out. nullopt when the driver cannot list processes.
  std::optional<std::map<pid_t, uint64_t>> processMemory(int index) const;

 private:
  struct Api;
  Nvml(void* handle, std::unique_ptr<Api> api, int device_count);
  void* deviceHandle(int index) const;

  void* handle_ = nullptr;  // dlopen's
  std::unique_ptr<Api> api_;
  int device_count_ = 0;
};

}  // namespace ddpl::launcher
