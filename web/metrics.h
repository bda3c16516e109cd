#pragma once
// The agent's Prometheus endpoint (`--metrics-port`): per-rank progress and health as gauges and
// counters, served over HTTP at /metrics by prometheus-cpp's embedded server. The names, labels
// and meanings are documented in docs/monitoring.md; a change here changes users' dashboards.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ddpl::web {

// Every interface: a Prometheus server scrapes the agent from another machine.
inline constexpr const char* kDefaultMetricsHost = "0.0.0.0";

struct MetricsOptions {
  // An IPv4 address, a host name that resolves to one, empty for every interface, or an IPv6
  // address (served through a relay to the embedded server on 127.0.0.1: Debian's civetweb,
  // the server under prometheus-cpp, is built without IPv6).
  std::string host = kDefaultMetricsHost;
  int port = 0;      // 0: the kernel picks one; port() says which
  std::string node;  // the `node` label of every series: the agent's node name
  int threads = 2;   // HTTP worker threads: one scrape at a time is the usual load
};

// One rank's figures at the time of an update. Unset optionals are unknown: their series is
// left out of the scrape (not exported as 0, which would read as a real value).
struct RankMetrics {
  int rank = 0;                        // global rank
  int local_rank = 0;                  // on this node
  bool alive = true;                   // its process is running (counted in ddpl_local_ranks_alive)
  uint64_t step = 0;                   // last step it reported; 0 before the first
  std::optional<double> step_seconds;  // mean wall time per step, recent steps
  std::optional<double> cpu_percent;   // CPU time per wall time, 100 = one core busy
  std::optional<int64_t> rss_bytes;    // resident memory of the rank's process
  std::optional<double> gpu_util_percent;   // its GPU's utilisation, 0-100
  std::optional<int64_t> gpu_memory_bytes;  // GPU memory held by the rank's process
};

// Job-level figures as this agent sees them.
struct JobMetrics {
  int attempt = 0;       // worker groups started before the current one: restarts and
                         // re-formations alike (the attempt_<n> of the log directories)
  int world_size = 0;    // ranks in the job, all nodes
  int max_restarts = 0;  // --max-restarts
};

// Serves /metrics from construction to destruction.
//
// Series that the last update() did not include are removed (a rank that left in an elastic
// re-formation, or that has no GPU figure any more): Prometheus then marks them stale. The
// counters (restarts, hang and straggler events) are kept for the life of the exporter, so a
// rank's counts survive the restarts they cause.
//
// Thread safety: every method may be called from any thread; calls are serialised inside, and
// scrapes (on the server's threads) read a consistent snapshot of each series.
// What the agent uses: the exporter, loaded from launch's metrics plugin (web/plugin.h), so
// runs without --metrics-port load no prometheus-cpp.
class MetricsEndpoint {
 public:
  virtual ~MetricsEndpoint() = default;
  virtual int port() const = 0;
  virtual void update(const std::vector<RankMetrics>& ranks) = 0;
  virtual void setJob(const JobMetrics& job) = 0;
  virtual void onRestart() = 0;
  virtual void onHang(int rank, int local_rank) = 0;
  virtual void onStraggler(int rank, int local_rank) = 0;
};

class MetricsExporter : public MetricsEndpoint {
 public:
  // Starts the server. Throws ddpl::NetworkError naming host:port and why it cannot listen
  // ("cannot bind to 127.0.0.1:9400: 98 (Address already in use)").
  explicit MetricsExporter(MetricsOptions options);
  ~MetricsExporter() override;
  MetricsExporter(const MetricsExporter&) = delete;
  MetricsExporter& operator=(const MetricsExporter&) = delete;

  int port() const override;  // the bound port (the chosen one when options.port was 0)

  // The ranks of this node now; replaces the previous update (see above).
  void update(const std::vector<RankMetrics>& ranks) override;
  void setJob(const JobMetrics& job) override;
  void onRestart() override;  // the group on this node restarted (a failure, a hang)
  void onHang(int rank, int local_rank) override;
  void onStraggler(int rank, int local_rank) override;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpl::web
