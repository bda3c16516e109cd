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

void* metricsPluginSymbol(const char* name) {
  static std::once_flag once;
  static void* handle = nullptr;
  static std::string path, error;
  std::call_once(once, [] {
    path = GrpcPlugin::defaultPath();
    path = path.substr(0, path.rfind('/') + 1) + "libddpl_launch_metrics.so";
    handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!handle)
      error = "cannot load " + path +
              " (launch's metrics and dashboard plugin; rebuild with make build): " + dlerror();
  });
  if (!handle) throw Error(error);
  void* symbol = dlsym(handle, name);
  if (!symbol) throw Error(path + " lacks " + name + ": version mismatch?");
  return symbol;
}

std::unique_ptr<MetricsEndpoint> startMetricsEndpoint(const MetricsOptions& options) {
  auto start = reinterpret_cast<StartFn>(metricsPluginSymbol("ddpl_metrics_start"));
  char buf[1024] = {0};
  MetricsEndpoint* e = start(&options, static_cast<int>(log::logger().level()), buf, sizeof(buf));
  if (!e) throw NetworkError(buf);
  return std::unique_ptr<MetricsEndpoint>(e);
}

}  // namespace ddpl::launcher
