#include "web/plugin.h"

#include "common/errors.h"
#include "common/log.h"
#include "common/plugin.h"

namespace ddpl::web {
namespace {

using MetricsStartFn = MetricsEndpoint* (*)(const MetricsOptions*, int, char*, size_t);
using DashboardStartFn = DashboardEndpoint* (*)(const DashboardOptions*, const DashboardLogs*, int,
                                                char*, size_t);

const Plugin& plugin() {
  return Plugin::load("libddpl_launch_metrics.so", "launch's metrics and dashboard plugin");
}

int logLevel() { return static_cast<int>(log::logger().level()); }

}  // namespace

std::unique_ptr<MetricsEndpoint> startMetricsEndpoint(const MetricsOptions& options) {
  auto start = plugin().function<MetricsStartFn>("ddpl_metrics_start");
  char buf[1024] = {0};
  MetricsEndpoint* e = start(&options, logLevel(), buf, sizeof(buf));
  if (!e) throw NetworkError(buf);
  return std::unique_ptr<MetricsEndpoint>(e);
}

std::unique_ptr<DashboardEndpoint> startDashboard(const DashboardOptions& options,
                                                  DashboardLogs logs) {
  auto start = plugin().function<DashboardStartFn>("ddpl_dashboard_start");
  char buf[1024] = {0};
  DashboardEndpoint* e = start(&options, &logs, logLevel(), buf, sizeof(buf));
  if (!e) throw NetworkError(buf);
  return std::unique_ptr<DashboardEndpoint>(e);
}

}  // namespace ddpl::web
