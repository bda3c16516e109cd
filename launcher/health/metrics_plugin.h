#pragma once
// Starts the metrics endpoint from libddpl_launch_metrics.so (next to the gRPC plugin, in
// ../lib beside the launcher), loaded on first use: runs without --metrics-port pay nothing.
#include <memory>

#include "launcher/health/metrics.h"

namespace ddpl::launcher {

// A symbol of the plugin (the metrics endpoint's, the dashboard's), loading it at the first
// call. Throws ddpl::Error naming the plugin's path when it cannot be loaded or lacks it.
void* metricsPluginSymbol(const char* name);

// Throws ddpl::Error naming the plugin's path when it cannot be loaded, ddpl::NetworkError
// naming host:port when the endpoint cannot listen.
std::unique_ptr<MetricsEndpoint> startMetricsEndpoint(const MetricsOptions& options);

}  // namespace ddpl::launcher
