#pragma once
// GPU discovery at run time, with no CUDA at build time: `launch` must start in milliseconds
// and run on machines without a driver.
#include <map>
#include <string>

#include "launcher/gpu/nvml.h"

namespace ddpl::launcher {

struct GpuInfo {
  int physical = 0;    // what the driver (NVML) reports; 0 without a driver
  int visible = 0;     // after CUDA_VISIBLE_DEVICES
  std::string source;  // "nvml", "none: <why>"
};

// `cuda_visible_devices` is the value of CUDA_VISIBLE_DEVICES, or nullptr when unset.
// With `ask_driver`, NVML is loaded and asked (exact, but initialising it can take 100 ms on a
// GPU machine); otherwise /dev/nvidiaN device nodes are counted (instant, and what a container
// is given). `nvml_library`: where to find NVML (tests point it at a fake).
GpuInfo discoverGpus(const char* cuda_visible_devices, bool ask_driver,
                     const std::string& nvml_library = kDefaultNvmlLibrary);

// Pure: how many devices CUDA_VISIBLE_DEVICES leaves of `physical`. CUDA stops at the first
// invalid entry, so "0,1,-1,2" is 2 devices.
int countVisible(int physical, const std::string& cuda_visible_devices);

}  // namespace ddpl::launcher
