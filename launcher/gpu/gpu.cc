#include "launcher/gpu/gpu.h"

#include <dirent.h>

#include <cctype>
#include <cstring>
#include <sstream>

#include "common/parse.h"
#include "launcher/gpu/nvml.h"

namespace ddpl::launcher {

int countVisible(int physical, const std::string& value) {
  std::stringstream in(value);
  std::string item;
  int n = 0;
  while (std::getline(in, item, ',')) {
    auto b = item.find_first_not_of(" ");
    if (b == std::string::npos) break;
    item = item.substr(b);
    if (item.rfind("GPU-", 0) == 0 || item.rfind("MIG-", 0) == 0) {
      ++n;  // UUIDs: cannot be checked against an index, count them
      continue;
    }
    int64_t idx;
    try {
      idx = parseInteger("CUDA_VISIBLE_DEVICES", item, 0, 1 << 20);
    } catch (const InvalidArgument&) {
      break;  // as CUDA: the first invalid entry ends the list
    }
    if (idx >= physical) break;
    ++n;
  }
  return n < physical ? n : physical;
}

namespace {
int countDeviceNodes() {
  int n = 0;
  DIR* d = opendir("/dev");
  if (!d) return 0;
  while (dirent* e = readdir(d)) {
    const char* name = e->d_name;
    if (std::strncmp(name, "nvidia", 6) != 0 || !name[6]) continue;
    bool digits = true;
    for (const char* c = name + 6; *c; ++c)
      digits = digits && std::isdigit(static_cast<unsigned char>(*c));
    if (digits) ++n;
  }
  closedir(d);
  return n;
}
}  // namespace

GpuInfo discoverGpus(const char* cuda_visible_devices, bool ask_driver,
                     const std::string& nvml_library) {
  GpuInfo info;
  if (!ask_driver) {
    info.physical = countDeviceNodes();
    info.source = info.physical ? "/dev/nvidia*" : "none: no /dev/nvidiaN device nodes";
    info.visible =
        cuda_visible_devices ? countVisible(info.physical, cuda_visible_devices) : info.physical;
    return info;
  }
  std::string why;
  if (auto nvml = Nvml::load(nvml_library, &why)) {
    info.physical = nvml->deviceCount();
    info.source = "nvml";
  } else {
    info.source = "none: " + why;
  }
  info.visible =
      cuda_visible_devices ? countVisible(info.physical, cuda_visible_devices) : info.physical;
  return info;
}

}  // namespace ddpl::launcher
