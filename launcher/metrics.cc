#include "launcher/metrics.h"

#include "common/errors.h"
#include "common/log.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <dirent.h>
#include <netdb.h>
#include <netinet/in.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <sys/socket.h>

#include <chrono>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <set>

namespace ddpl::launcher {

namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Labels;

// civetweb reports why it cannot listen only through its log callback, on the thread that
// starts it; the exporter's constructor collects those lines here for its exception.
thread_local std::string* t_start_errors = nullptr;

int civetLog(const mg_connection*, const char* message) {
  if (t_start_errors) {
    if (!t_start_errors->empty()) *t_start_errors += "; ";
    *t_start_errors += message;
  } else {
    log::debug("metrics endpoint: {}", message);
  }
  return 1;  // handled: civetweb must not print to stderr itself
}

Labels rankLabels(int rank, int local_rank) {
  return {{"rank", std::to_string(rank)}, {"local_rank", std::to_string(local_rank)}};
}

}  // namespace

struct MetricsExporter::Impl {
  // One rank's gauges; nullptr where the last update left the figure unknown.
  struct RankSeries {
    Gauge* step = nullptr;
    Gauge* step_seconds = nullptr;
    Gauge* cpu = nullptr;
    Gauge* rss = nullptr;
    Gauge* gpu_util = nullptr;
    Gauge* gpu_memory = nullptr;
  };

  explicit Impl(const MetricsOptions& options)
      : registry(std::make_shared<prometheus::Registry>()),
        node{{"node", options.node}},
        step(gauge("ddpl_rank_step", "Last training step the rank reported (0 before its first).")),
        step_seconds(gauge("ddpl_rank_step_duration_seconds",
                           "Mean wall time per step over the rank's recent steps.")),
        cpu(gauge("ddpl_rank_cpu_usage_ratio",
                  "CPU time per wall time of the rank's process (1 = one core busy).")),
        rss(gauge("ddpl_rank_resident_memory_bytes", "Resident memory of the rank's process.")),
        gpu_util(gauge("ddpl_rank_gpu_utilization_ratio",
                       "Utilisation of the rank's GPU over NVML's last sample period (0-1).")),
        gpu_memory(gauge("ddpl_rank_gpu_memory_bytes", "GPU memory held by the rank's process.")),
        hangs(counter("ddpl_rank_hang_events_total",
                      "Times the rank was found hung (no progress past its limit).")),
        stragglers(counter("ddpl_rank_straggler_events_total",
                           "Attempts in which the rank was found a straggler.")),
        restarts(counter("ddpl_restarts_total", "Restarts of this node's worker group.").Add({})),
        attempt(gauge("ddpl_attempt",
                      "Worker groups started on this node before the current one (restarts "
                      "and re-formations alike).")
                    .Add({})),
        world_size(gauge("ddpl_world_size", "Ranks in the job, all nodes.").Add({})),
        max_restarts(
            gauge("ddpl_max_restarts", "Restarts the job allows (--max-restarts).").Add({})),
        alive(gauge("ddpl_local_ranks_alive", "Ranks of this node whose process is running.")
                  .Add({})),
        last_update(gauge("ddpl_last_update_timestamp_seconds",
                          "When the agent last updated the rank figures (Unix time).")
                        .Add({})) {}

  Family<Gauge>& gauge(const std::string& name, const std::string& help) {
    return prometheus::BuildGauge().Name(name).Help(help).Labels(node).Register(*registry);
  }
  Family<Counter>& counter(const std::string& name, const std::string& help) {
    return prometheus::BuildCounter().Name(name).Help(help).Labels(node).Register(*registry);
  }

  // Sets the series to `value`, adding it, or removes it when the value is unknown.
  template <typename T>
  static void set(Family<Gauge>& family, Gauge*& series, const Labels& labels,
                  const std::optional<T>& value, double divisor = 1) {
    if (!value) {
      if (series) family.Remove(series);
      series = nullptr;
      return;
    }
    if (!series) series = &family.Add(labels);
    series->Set(static_cast<double>(*value) / divisor);
  }

  void remove(RankSeries& s) {
    std::optional<double> none;
    Labels unused;
    set(step, s.step, unused, none);
    set(step_seconds, s.step_seconds, unused, none);
    set(cpu, s.cpu, unused, none);
    set(rss, s.rss, unused, none);
    set(gpu_util, s.gpu_util, unused, none);
    set(gpu_memory, s.gpu_memory, unused, none);
  }

  std::mutex mutex;
  std::shared_ptr<prometheus::Registry> registry;
  Labels node;
  Family<Gauge>& step;
  Family<Gauge>& step_seconds;
  Family<Gauge>& cpu;
  Family<Gauge>& rss;
  Family<Gauge>& gpu_util;
  Family<Gauge>& gpu_memory;
  Family<Counter>& hangs;
  Family<Counter>& stragglers;
  Counter& restarts;
  Gauge& attempt;
  Gauge& world_size;
  Gauge& max_restarts;
  Gauge& alive;
  Gauge& last_update;
  std::map<std::pair<int, int>, RankSeries> ranks;  // by (rank, local_rank)
  // Last: destroyed first, so no scrape runs while the families go.
  std::unique_ptr<prometheus::Exposer> exposer;
};

MetricsExporter::MetricsExporter(MetricsOptions options) : impl_(std::make_unique<Impl>(options)) {
  if (options.port < 0 || options.port > 65535)
    throw InvalidArgument("metrics port " + std::to_string(options.port) + " is not in 0-65535");
  if (options.threads < 1)
    throw InvalidArgument("metrics endpoint needs at least 1 thread, not " +
                          std::to_string(options.threads));
  std::string address = options.host + ":" + std::to_string(options.port);
  if (options.host.find(':') != std::string::npos)
    throw NetworkError("metrics endpoint cannot listen on " + options.host + " port " +
                       std::to_string(options.port) +
                       ": IPv6 addresses are not supported (Debian's civetweb is built without "
                       "IPv6); use an IPv4 address or host name");
  // civetweb calls a name it cannot resolve an "invalid port spec": resolve it here to say so.
  addrinfo hints{};
  hints.ai_family = AF_INET;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const char* host = options.host.empty() ? nullptr : options.host.c_str();  // "": all
  if (int rc = getaddrinfo(host, "0", &hints, &found); rc != 0)
    throw NetworkError("metrics endpoint cannot listen on " + address + ": cannot resolve '" +
                       options.host + "' to an IPv4 address: " + gai_strerror(rc));
  char numeric[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(found->ai_addr)->sin_addr, numeric,
            sizeof numeric);
  freeaddrinfo(found);
  CivetCallbacks callbacks;
  callbacks.log_message = civetLog;
  std::string errors;
  t_start_errors = &errors;
  try {
    // A short request timeout: a client that connects and sends nothing must not hold one of
    // the few worker threads, and with it the next scrape, for civetweb's default 30 s.
    impl_->exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{
            "listening_ports", std::string(numeric) + ":" + std::to_string(options.port),
            "num_threads", std::to_string(options.threads), "request_timeout_ms", "5000"},
        &callbacks);
  } catch (const std::exception& e) {
    t_start_errors = nullptr;
    throw NetworkError("metrics endpoint cannot listen on " + address + ": " +
                       (errors.empty() ? e.what() : errors));
  }
  t_start_errors = nullptr;
  impl_->exposer->RegisterCollectable(impl_->registry);
}

MetricsExporter::~MetricsExporter() {
  // civetweb's listener thread polls in 2 s quanta and looks at its stop flag only between
  // them, so stopping it would hold up the agent's exit by up to 2 s. Shutting the listening
  // socket down wakes the poll (measured: 1.7 s -> 13 ms).
  int port = this->port();
  if (DIR* d = opendir("/proc/self/fd")) {
    while (dirent* e = readdir(d)) {
      int fd = std::atoi(e->d_name);
      sockaddr_storage address{};
      socklen_t length = sizeof address;
      int listening = 0;
      socklen_t size = sizeof listening;
      if (fd <= 2 || getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length) != 0 ||
          address.ss_family != AF_INET ||
          ntohs(reinterpret_cast<sockaddr_in*>(&address)->sin_port) != port ||
          getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &size) != 0 || !listening)
        continue;
      shutdown(fd, SHUT_RD);
    }
    closedir(d);
  }
  impl_->exposer.reset();
}

int MetricsExporter::port() const {
  auto ports = impl_->exposer->GetListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

void MetricsExporter::update(const std::vector<RankMetrics>& ranks) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  std::set<std::pair<int, int>> present;
  for (const RankMetrics& r : ranks) present.insert({r.rank, r.local_rank});
  for (auto it = impl_->ranks.begin(); it != impl_->ranks.end();) {
    if (present.count(it->first)) {
      ++it;
      continue;
    }
    impl_->remove(it->second);
    it = impl_->ranks.erase(it);
  }
  int alive = 0;
  for (const RankMetrics& r : ranks) {
    Labels labels = rankLabels(r.rank, r.local_rank);
    Impl::RankSeries& s = impl_->ranks[{r.rank, r.local_rank}];
    Impl::set(impl_->step, s.step, labels, std::optional<uint64_t>(r.step));
    Impl::set(impl_->step_seconds, s.step_seconds, labels, r.step_seconds);
    Impl::set(impl_->cpu, s.cpu, labels, r.cpu_percent, 100);
    Impl::set(impl_->rss, s.rss, labels, r.rss_bytes);
    Impl::set(impl_->gpu_util, s.gpu_util, labels, r.gpu_util_percent, 100);
    Impl::set(impl_->gpu_memory, s.gpu_memory, labels, r.gpu_memory_bytes);
    // Counters start at 0 with the rank, so that the first event shows in increase().
    impl_->hangs.Add(labels);
    impl_->stragglers.Add(labels);
    alive += r.alive ? 1 : 0;
  }
  impl_->alive.Set(alive);
  impl_->last_update.Set(
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count());
}

void MetricsExporter::setJob(const JobMetrics& job) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->attempt.Set(job.attempt);
  impl_->world_size.Set(job.world_size);
  impl_->max_restarts.Set(job.max_restarts);
}

void MetricsExporter::onRestart() {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->restarts.Increment();
}

void MetricsExporter::onHang(int rank, int local_rank) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->hangs.Add(rankLabels(rank, local_rank)).Increment();
}

void MetricsExporter::onStraggler(int rank, int local_rank) {
  std::lock_guard<std::mutex> lock(impl_->mutex);
  impl_->stragglers.Add(rankLabels(rank, local_rank)).Increment();
}

}  // namespace ddpl::launcher
