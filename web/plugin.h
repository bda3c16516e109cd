#pragma once
// How launch starts the metrics endpoint and the dashboard: from its plugin
// libddpl_launch_metrics.so (loaded by common/plugin.h at the first start; its side is
// plugin_module.cc), so that runs without --metrics-port or --dashboard load no prometheus-cpp,
// civetweb or HTTP server. rdzv-server links the servers instead.
#include <memory>

#include "web/dashboard.h"
#include "web/metrics.h"

namespace ddpl::web {

// Throws ddpl::Error naming the plugin's path when it cannot be loaded, ddpl::NetworkError
// naming host:port when the endpoint cannot listen.
std::unique_ptr<MetricsEndpoint> startMetricsEndpoint(const MetricsOptions& options);

// Throws ddpl::NetworkError naming the address and why it cannot listen, ddpl::Error when the
// plugin is missing.
std::unique_ptr<DashboardEndpoint> startDashboard(const DashboardOptions& options,
                                                  DashboardLogs logs);

}  // namespace ddpl::web
