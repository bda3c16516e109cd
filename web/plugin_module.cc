// The metrics endpoint and the dashboard as a plugin (libddpl_launch_metrics.so): `launch` links
// no prometheus-cpp or civetweb; jobs with --metrics-port or --dashboard load this
// (web/plugin.h). Errors cross the boundary as text, never as exceptions.
#include <cstdio>
#include <exception>

#include "common/log.h"
#include "web/dashboard.h"
#include "web/metrics.h"

extern "C" {

__attribute__((visibility("default"))) ddpl::web::MetricsEndpoint* ddpl_metrics_start(
    const ddpl::web::MetricsOptions* options, int log_level, char* error, size_t error_len) {
  try {
    // The plugin has its own copy of the logging facade: give it the launcher's identity.
    ddpl::log::init({"launch", -1, ""}, static_cast<spdlog::level::level_enum>(log_level));
    return new ddpl::web::MetricsExporter(*options);
  } catch (const std::exception& e) {
    snprintf(error, error_len, "%s", e.what());
    return nullptr;
  }
}

__attribute__((visibility("default"))) ddpl::web::DashboardEndpoint* ddpl_dashboard_start(
    const ddpl::web::DashboardOptions* options, const ddpl::web::DashboardLogs* logs, int log_level,
    char* error, size_t error_len) {
  try {
    ddpl::log::init({"launch", -1, ""}, static_cast<spdlog::level::level_enum>(log_level));
    return ddpl::web::newDashboard(*options, *logs);
  } catch (const std::exception& e) {
    snprintf(error, error_len, "%s", e.what());
    return nullptr;
  }
}

}  // extern "C"
