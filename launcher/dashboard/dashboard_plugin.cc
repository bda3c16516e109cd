// startDashboard: the server lives in launch's metrics plugin (metrics_plugin.h).
#include "common/errors.h"
#include "common/log.h"
#include "launcher/dashboard/dashboard.h"
#include "launcher/health/metrics_plugin.h"

namespace ddpl::launcher {
namespace {
using StartFn = DashboardEndpoint* (*)(const DashboardOptions*, const DashboardLogs*, int, char*,
                                       size_t);
}  // namespace

std::unique_ptr<DashboardEndpoint> startDashboard(const DashboardOptions& options,
                                                  DashboardLogs logs) {
  auto start = reinterpret_cast<StartFn>(metricsPluginSymbol("ddpl_dashboard_start"));
  char buf[1024] = {0};
  DashboardEndpoint* e =
      start(&options, &logs, static_cast<int>(log::logger().level()), buf, sizeof(buf));
  if (!e) throw NetworkError(buf);
  return std::unique_ptr<DashboardEndpoint>(e);
}

}  // namespace ddpl::launcher
