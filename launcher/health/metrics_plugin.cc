#include "launcher/health/metrics_plugin.h"

#include "common/errors.h"
#include "common/log.h"
#include "common/plugin.h"

namespace ddpl::launcher {
namespace {
using StartFn = MetricsEndpoint* (*)(const MetricsOptions*, int, char*, size_t);
}  // namespace

void* metricsPluginSymbol(const char* name) {
  return Plugin::load("libddpl_launch_metrics.so", "launch's metrics and dashboard plugin")
      .symbol(name);
}

std::unique_ptr<MetricsEndpoint> startMetricsEndpoint(const MetricsOptions& options) {
  auto start = reinterpret_cast<StartFn>(metricsPluginSymbol("ddpl_metrics_start"));
  char buf[1024] = {0};
  MetricsEndpoint* e = start(&options, static_cast<int>(log::logger().level()), buf, sizeof(buf));
  if (!e) throw NetworkError(buf);
  return std::unique_ptr<MetricsEndpoint>(e);
}

}  // namespace ddpl::launcher
