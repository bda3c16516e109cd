#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <sstream>

#include "common/parse.h"
#include "launcher/doctor/check_util.h"
#include "launcher/doctor/doctor.h"

namespace ddpl::launcher {
using checks::cudaVersion;
using checks::parseCudaVersion;
namespace fs = std::filesystem;

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

}  // namespace ddpl::launcher
