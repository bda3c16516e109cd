#include "launcher/health/metrics_plugin.h"

#include <dlfcn.h>

#include <mutex>

#include "common/errors.h"
#include "common/log.h"
#include "launcher/membership/grpc_plugin.h"

namespace ddpl::launcher {
namespace {
using StartFn = MetricsEndpoint* (*)(const MetricsOptions*, int, char*, size_t);
}  // namespace

std::unique_ptr<MetricsEndpoint> startMetricsEndpoint(const MetricsOptions& options) {
  static std::once_flag once;
  static StartFn start = nullptr;
  static std::string error;
  std::call_once(once, [] {
    std::string path = GrpcPlugin::defaultPath();
    path = path.substr(0, path.rfind('/') + 1) + "libddpl_launch_metrics.so";
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      error = "cannot load " + path +
              " (launch's metrics plugin; rebuild with make build): " + dlerror();
      return;
    }
    start = reinterpret_cast<StartFn>(dlsym(h, "ddpl_metrics_start"));
    if (!start) error = path + " lacks ddpl_metrics_start: version mismatch?";
  });
  if (!start) throw Error(error);
  char buf[1024] = {0};
  MetricsEndpoint* e = start(&options, static_cast<int>(log::logger().level()), buf, sizeof(buf));
  if (!e) throw NetworkError(buf);
  return std::unique_ptr<MetricsEndpoint>(e);
}

}  // namespace ddpl::launcher
