// startDashboard: loads launch's metrics plugin, where the dashboard's server lives.
#include <dlfcn.h>

#include <mutex>

#include "common/errors.h"
#include "common/log.h"
#include "launcher/dashboard/dashboard.h"
#include "launcher/membership/grpc_plugin.h"

namespace ddpl::launcher {
namespace {
using StartFn = DashboardEndpoint* (*)(const DashboardOptions*, const DashboardLogs*, int, char*,
                                       size_t);
}  // namespace

std::unique_ptr<DashboardEndpoint> startDashboard(const DashboardOptions& options,
                                                  DashboardLogs logs) {
  static std::once_flag once;
  static StartFn start = nullptr;
  static std::string error;
  std::call_once(once, [] {
    std::string path = GrpcPlugin::defaultPath();
    path = path.substr(0, path.rfind('/') + 1) + "libddpl_launch_metrics.so";
    void* h = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!h) {
      error = "cannot load " + path +
              " (launch's metrics and dashboard plugin; rebuild with make build): " + dlerror();
      return;
    }
    start = reinterpret_cast<StartFn>(dlsym(h, "ddpl_dashboard_start"));
    if (!start) error = path + " lacks ddpl_dashboard_start: version mismatch?";
  });
  if (!start) throw Error(error);
  char buf[1024] = {0};
  DashboardEndpoint* e =
      start(&options, &logs, static_cast<int>(log::logger().level()), buf, sizeof(buf));
  if (!e) throw NetworkError(buf);
  return std::unique_ptr<DashboardEndpoint>(e);
}

}  // namespace ddpl::launcher
