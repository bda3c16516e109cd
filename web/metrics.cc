#include "web/metrics.h"

#include <CivetServer.h>
#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <poll.h>
#include <prometheus/counter.h>
#include <prometheus/exposer.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/registry.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <list>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

#include "common/errors.h"
#include "common/log.h"
#include "web/civet_util.h"

namespace ddpl::web {

namespace {

using prometheus::Counter;
using prometheus::Family;
using prometheus::Gauge;
using prometheus::Labels;

Labels rankLabels(int rank, int local_rank) {
  return {{"rank", std::to_string(rank)}, {"local_rank", std::to_string(local_rank)}};
}

// Debian's civetweb is built without IPv6 (mg_check_feature(8) is 0), so an IPv6 --metrics-host
// is served by a relay: it listens on the IPv6 address and passes each connection's bytes to
// civetweb on 127.0.0.1, where scrapes get exactly what IPv4 ones do. Bounded like civetweb
// itself: a few connections at a time (more are closed at once), each dropped after
// kIdleMs without a byte either way, 16 KiB in flight per direction.
class Ipv6Relay {
 public:
  static constexpr int kMaxConnections = 8;
  static constexpr int kIdleMs = 5000;

  Ipv6Relay(const std::string& host, int port, int target_port) : target_port_(target_port) {
    sockaddr_in6 a{};
    a.sin6_family = AF_INET6;
    a.sin6_port = htons(static_cast<uint16_t>(port));
    if (inet_pton(AF_INET6, host.c_str(), &a.sin6_addr) != 1)
      throw NetworkError("metrics endpoint cannot listen on [" + host +
                         "]:" + std::to_string(port) + ": not an IPv6 address");
    listen_fd_ = socket(AF_INET6, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    if (listen_fd_ >= 0) {
      setsockopt(listen_fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
      setsockopt(listen_fd_, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    }
    stop_fd_ = eventfd(0, EFD_CLOEXEC);
    if (listen_fd_ < 0 || stop_fd_ < 0 ||
        bind(listen_fd_, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
        listen(listen_fd_, 16) != 0) {
      std::string why = strerror(errno);
      closeAll();
      throw NetworkError("metrics endpoint cannot listen on [" + host +
                         "]:" + std::to_string(port) + ": " + why);
    }
    socklen_t len = sizeof a;
    getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin6_port);
    acceptor_ = std::thread([this] { acceptLoop(); });
  }
  ~Ipv6Relay() {
    uint64_t one = 1;
    ssize_t ignored = write(stop_fd_, &one, sizeof one);
    (void)ignored;
    if (acceptor_.joinable()) acceptor_.join();
    std::list<Pipe> left;
    {
      std::lock_guard<std::mutex> lock(mu_);
      left.swap(pipes_);
    }
    for (auto& p : left) p.thread.join();
    closeAll();
  }
  int port() const { return port_; }

 private:
  void closeAll() {
    if (listen_fd_ >= 0) close(listen_fd_);
    if (stop_fd_ >= 0) close(stop_fd_);
    listen_fd_ = stop_fd_ = -1;
  }

  void acceptLoop() {
    while (true) {
      pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      if (poll(p, 2, -1) < 0 && errno != EINTR) return;
      if (p[1].revents) return;
      if (!(p[0].revents & POLLIN)) continue;
      int client = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (client < 0) continue;
      if (active_.load() >= kMaxConnections) {
        close(client);
        continue;
      }
      int upstream = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
      sockaddr_in t{};
      t.sin_family = AF_INET;
      t.sin_port = htons(static_cast<uint16_t>(target_port_));
      t.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (upstream < 0 || connect(upstream, reinterpret_cast<sockaddr*>(&t), sizeof t) != 0) {
        if (upstream >= 0) close(upstream);
        close(client);
        continue;
      }
      ++active_;
      std::lock_guard<std::mutex> lock(mu_);
      // Finished connections' threads are joined here: a long job is scraped thousands of times.
      for (auto it = pipes_.begin(); it != pipes_.end();) {
        if (it->done->load()) {
          it->thread.join();
          it = pipes_.erase(it);
        } else {
          ++it;
        }
      }
      auto done = std::make_shared<std::atomic<bool>>(false);
      pipes_.push_back({std::thread([this, client, upstream, done] {
                          pipe(client, upstream);
                          close(client);
                          close(upstream);
                          --active_;
                          done->store(true);
                        }),
                        done});
    }
  }

  // Copies both ways until either side closes, kIdleMs pass without a byte, or the relay stops.
  void pipe(int a, int b) {
    char buf[16384];
    while (true) {
      pollfd p[3] = {{a, POLLIN, 0}, {b, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
      int n = poll(p, 3, kIdleMs);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0 || p[2].revents) return;
      for (int i = 0; i < 2; ++i) {
        if (!(p[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
        ssize_t got = read(p[i].fd, buf, sizeof buf);
        if (got <= 0) return;
        // The peer's socket buffer takes a scrape whole in practice; a peer that stops reading
        // for kIdleMs is dropped.
        pollfd out{p[1 - i].fd, POLLOUT, 0};
        for (ssize_t sent = 0; sent < got;) {
          if (poll(&out, 1, kIdleMs) != 1) return;
          ssize_t w = send(out.fd, buf + sent, static_cast<size_t>(got - sent),
                           MSG_NOSIGNAL | MSG_DONTWAIT);
          if (w < 0 && (errno == EAGAIN || errno == EINTR)) continue;
          if (w <= 0) return;
          sent += w;
        }
      }
    }
  }

  int listen_fd_ = -1;
  int stop_fd_ = -1;
  int port_ = 0;
  int target_port_ = 0;
  struct Pipe {
    std::thread thread;
    std::shared_ptr<std::atomic<bool>> done;
  };
  std::atomic<int> active_{0};
  std::mutex mu_;
  std::list<Pipe> pipes_;
  std::thread acceptor_;
};

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
  std::unique_ptr<Ipv6Relay> relay;  // an IPv6 host's listener, in front of the exposer
};

MetricsExporter::MetricsExporter(MetricsOptions options) : impl_(std::make_unique<Impl>(options)) {
  if (options.port < 0 || options.port > 65535)
    throw InvalidArgument("metrics port " + std::to_string(options.port) + " is not in 0-65535");
  if (options.threads < 1)
    throw InvalidArgument("metrics endpoint needs at least 1 thread, not " +
                          std::to_string(options.threads));
  const bool ipv6 = options.host.find(':') != std::string::npos;
  std::string address = ipv6 ? "[" + options.host + "]:" + std::to_string(options.port)
                             : options.host + ":" + std::to_string(options.port);
  // "": all. IPv6: civetweb serves on loopback, behind the relay below.
  const char* host = ipv6 ? "127.0.0.1" : options.host.empty() ? nullptr : options.host.c_str();
  const std::string numeric = listenIpv4(host, "metrics endpoint", address);
  const int civet_port = ipv6 ? 0 : options.port;
  startCivet("metrics endpoint", address, [&](const CivetCallbacks* callbacks) {
    // A short request timeout: a client that connects and sends nothing must not hold one of
    // the few worker threads, and with it the next scrape, for civetweb's default 30 s.
    impl_->exposer = std::make_unique<prometheus::Exposer>(
        std::vector<std::string>{"listening_ports", numeric + ":" + std::to_string(civet_port),
                                 "num_threads", std::to_string(options.threads),
                                 "request_timeout_ms", "5000"},
        callbacks);
  });
  impl_->exposer->RegisterCollectable(impl_->registry);
  if (ipv6) {
    auto ports = impl_->exposer->GetListeningPorts();
    impl_->relay = std::make_unique<Ipv6Relay>(options.host, options.port, ports.front());
  }
}

MetricsExporter::~MetricsExporter() {
  // Stopping civetweb would hold up the agent's exit by up to 2 s otherwise (measured: 1.7 s ->
  // 13 ms).
  impl_->relay.reset();
  auto civet_ports = impl_->exposer->GetListeningPorts();
  wakeCivetListener(civet_ports.empty() ? 0 : civet_ports.front());
  impl_->exposer.reset();
}

int MetricsExporter::port() const {
  if (impl_->relay) return impl_->relay->port();
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

}  // namespace ddpl::web
