#pragma once
// `launch doctor` and the preflight of every job: the environment checked before a job wastes
// its time. Each check gives a verdict, the value it found and, when not ok, what to do.
// Everything the checks read comes in through DoctorOptions (the environment, the /proc and
// /sys roots, the NVML library, the interpreter), so tests point them at fakes.
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "launcher/gpu/nvml.h"

namespace ddpl::launcher {

enum class Verdict { kOk, kWarn, kFail };
const char* verdictName(Verdict v);  // "ok", "warn", "fail"

struct Finding {
  std::string check;  // "driver", "gpu0", "torch.arch", "NCCL_SOCKET_IFNAME", ...
  Verdict verdict = Verdict::kOk;
  std::string value;   // what was found, with its numbers
  std::string advice;  // what to do; empty when ok
};

// What the interpreter's torch says about itself. `python -c kTorchProbeScript` prints one
// `key=value` line each: error (import failed: the message), torch, cuda (empty for a CPU
// wheel), cudnn (e.g. 90100), nccl (e.g. 2.21.5), cuda_available (0/1), device_count,
// arch_list (space separated: "sm_80 sm_90 compute_90"). A fake interpreter prints the same.
struct TorchProbe {
  bool probed = false;  // the interpreter ran and printed something we understood
  std::string error;    // why not, or torch's import error
  std::string torch_version;
  std::string cuda_version;  // "12.4"; empty: a CPU-only build
  std::string cudnn_version;
  std::string nccl_version;
  bool cuda_available = false;
  int device_count = 0;
  std::vector<std::string> arch_list;
};
extern const char* const kTorchProbeScript;
TorchProbe parseTorchProbe(const std::string& output);
// Runs `python -c kTorchProbeScript`, killed after `timeout_sec` (importing torch takes seconds).
TorchProbe probeTorch(const std::string& python, double timeout_sec);

// The GPUs as NVML reports them; no driver is a plain fact, not a failure.
struct GpuFacts {
  bool driver = false;
  std::string why_none;  // without a driver: the loader's or NVML's reason
  std::string driver_version;
  std::optional<int> cuda_driver_version;  // 12040 = 12.4
  std::vector<GpuDeviceInfo> devices;
  std::vector<GpuSample> samples;     // same order
  std::map<int, std::string> errors;  // GPUs the driver could not be asked about, and why
};
GpuFacts readGpuFacts(const std::string& nvml_library);

struct DoctorOptions {
  std::map<std::string, std::string> env;
  std::string nvml_library = kDefaultNvmlLibrary;
  std::string proc_root = "/proc";
  std::string sys_root = "/sys";
  std::string shm_path = "/dev/shm";
  std::string python;  // empty: no torch checks
  // `python` is the interpreter launch would run a .py with, not one the user named: it may
  // lack torch on a machine that runs native programs, so a missing torch is a warning there.
  bool python_is_default = false;
  std::string python_origin;  // where it came from ("/usr/bin/python3 (python3 from PATH)")
  std::string program;        // a native program: the CUDA libraries it would load (ldd)
  std::vector<std::string> data_paths;  // where logs and checkpoints go (free space)
  int nproc = 0;                        // workers per node; 0: unknown
  std::string rdzv_endpoint;            // HOST:PORT[,HOST:PORT...] (etcd); empty: none
  // The preflight subset: nothing that runs another program or waits on the network beyond
  // a name lookup (start-up must stay fast).
  bool fast = false;
  double probe_timeout_sec = 60;
  double connect_timeout_sec = 2;
};

std::vector<Finding> runDoctor(const DoctorOptions& options);

// The checks one by one (pure where they can be: tests give them the facts).
std::vector<Finding> checkGpus(const GpuFacts& facts);
std::optional<Finding> checkCudaVisibleDevices(const std::map<std::string, std::string>& env,
                                               const GpuFacts& facts);
std::vector<Finding> checkTorch(const TorchProbe& torch, const GpuFacts& facts);
// Would a kernel compiled for `arch_list` run on a GPU of capability major.minor? "sm" (exact
// or same-major binary), "ptx" (JIT from PTX: slow first start), "none" (no kernel image).
std::string kernelImageFor(const std::vector<std::string>& arch_list, int major, int minor);
std::vector<Finding> checkNetworkNames(const std::map<std::string, std::string>& env,
                                       const std::string& sys_root);
Finding checkShm(const std::string& path, std::optional<uint64_t> bytes);
std::vector<Finding> checkLimits(const std::string& proc_root, const std::string& sys_root);
Finding checkThreads(int cores, int nproc, const std::map<std::string, std::string>& env);
int allowedCpus(const std::string& proc_root);  // Cpus_allowed_list of <proc_root>/self/status
Finding checkFreeSpace(const std::string& path);
Finding checkEndpoint(const std::string& name, const std::string& host_port, bool connect,
                      double timeout_sec);
std::vector<Finding> checkNativeLibraries(const std::string& program, double timeout_sec);

bool anyFailed(const std::vector<Finding>& findings);
// One line a check: "ok    driver      550.54.15 (CUDA 12.4)" and, when not ok, "  -> advice".
std::string formatFindings(const std::vector<Finding>& findings);
// {"ok": bool, "checks": [{"check","verdict","value","advice"}]}
std::string findingsJson(const std::vector<Finding>& findings);
std::vector<Finding> findingsFromJson(const std::string& json);

// Runs argv with stdin closed and both streams captured, killed after `timeout_sec` with all it
// started (runChild, stderr into stdout, 1 MiB kept). Returns the exit status (-1: could not
// run, 124: timed out) and sets *output.
int captureOutput(const std::vector<std::string>& argv, double timeout_sec, std::string* output);

}  // namespace ddpl::launcher
