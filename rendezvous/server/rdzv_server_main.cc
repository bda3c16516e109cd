// rdzv-server: the standalone rendezvous service for multi-node jobs.
#include <fmt/format.h>
#include <signal.h>
#include <sys/random.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "common/defaults.h"
#include "common/environment.h"
#include "common/errors.h"
#include "common/file_io.h"
#include "common/log.h"
#include "common/parse.h"
#include "ddpl/config.h"
#include "rendezvous/server/server.h"
#include "rendezvous/store/token.h"
#ifdef DDPL_WITH_DASHBOARD
#include "web/dashboard.h"
#include "web/dashboard_model.h"
#endif

namespace {

// The defaults kUsage states.
static_assert(ddpl::defaults::kRdzvPort == 29400 && ddpl::defaults::kHeartbeatWindow.count() == 30,
              "update rdzv-server's --help text");

constexpr char kUsage[] = R"(usage: rdzv-server [options]

Serves the ddplaunch rendezvous (membership rounds) and key-value store over gRPC.

  --host ADDR              address to listen on (default 127.0.0.1; 0.0.0.0 for all)
  --port N                 port (default 29400; 0 picks a free one, see --port-file)
  --port-file PATH         write the bound port to PATH once serving
  --token-file PATH        require this shared token on every call (unreadable or empty
                           file: exit 1). Without it, DDPL_RDZV_TOKEN is used if set
                           (the name launch reads too; the old DDPL_STORE_TOKEN is still
                           accepted, with a warning); with neither the server warns that
                           anyone may call it
  --tls-cert PATH          server certificate (PEM); with --tls-key enables TLS
  --tls-key PATH           server private key (PEM)
  --tls-client-ca PATH     require client certificates signed by this CA (PEM)
  --max-value-bytes N      largest value accepted (default 16777216)
  --heartbeat-window SECS  evict members silent this long (default 30)
  --run-retention SECS     forget a run (and its keys) this long after its last node
                           left or was evicted (default 600)
  --max-stream-pending N   unanswered operations per store stream before the server
                           stops reading it (default 1024)
  --max-stream-queued-bytes N
                           answer bytes queued per store stream before the server
                           stops reading it (default 67108864)
  --max-queued-bytes N     answer bytes queued on all streams; past it an answer is
                           RESOURCE_EXHAUSTED (default 268435456)
  --max-parked N           gets and waits parked at once (default 100000)
  --max-streams-per-connection N
                           concurrent calls per connection (default 1024)
  --max-connection-idle SECS
                           close connections without a call this long (default 30)
  --max-connections N      connections held at once; silent or refused peers make room
                           for new ones (default 4096; lowered, with a warning, when
                           the open-file limit cannot back 2 files per connection)
  --no-store-socket        serve the store over gRPC only (by default clients may also
                           reach it on the same port without gRPC, a few times faster;
                           always off with TLS)
  --dashboard[=HOST:PORT]  serve a page for every job whose agents run with --dashboard
                           (127.0.0.1 at a free port by default; other addresses need
                           the server's token)
  --stats-interval SECS    log runs, keys and streams this often when they changed;
                           0: never (default 300)
  --log-level LEVEL        trace, debug, info, warn, error (default info)
  --version                print the version
  -h, --help               this text

Every flag also accepts underscores (--token_file) and --flag=value.
)";

[[noreturn]] void usageError(const std::string& msg) {
  std::fprintf(stderr, "rdzv-server: %s (see --help)\n", msg.c_str());
  std::exit(2);
}

// The checked parser every ddplaunch program shares (common/parse.h); a bad value is a usage
// error naming the flag and the value.
int64_t parseInt(const std::string& flag, const std::string& v, int64_t lo, int64_t hi) {
  try {
    return ddpl::parseInteger(flag, v, lo, hi);
  } catch (const ddpl::InvalidArgument& e) {
    usageError(e.what());
  }
}

std::string parseHost(const std::string& flag, const std::string& v) {
  try {
    return ddpl::parseListenHost(flag, v);
  } catch (const ddpl::InvalidArgument& e) {
    usageError(e.what());
  }
}

struct DashboardFlag {
  std::string host;
  int port = 0;
};

#ifdef DDPL_WITH_DASHBOARD
// --dashboard: a page for every job whose agents publish their rows (launch --dashboard),
// refreshed once a second from what the server holds; the jobs shown are bounded.
class JobPages {
 public:
  static constexpr size_t kMaxJobs = 64;

  JobPages(ddpl::rdzv::RendezvousServer& server, const DashboardFlag& flag, std::string token)
      : server_(server) {
    using namespace ddpl::web;
    DashboardOptions o;
    o.host = flag.host;
    o.port = flag.port;
    o.token = token;
    if (o.token.empty()) {
      // Without the server's token nobody from another machine may read: a token nobody has.
      unsigned char raw[16];
      if (getrandom(raw, sizeof raw, 0) != static_cast<ssize_t>(sizeof raw))
        throw ddpl::Error("cannot make the dashboard's token: getrandom failed");
      for (unsigned char c : raw) o.token += fmt::format("{:02x}", c);
    }
    endpoint_.reset(newJobsDashboard(o));
    ddpl::log::info("dashboard of every job on http://{}:{}/ ({})", o.host, endpoint_->port(),
                    token.empty() ? "readable from this machine only: the server has no token"
                                  : "other machines need the server's token");
    thread_ = std::thread([this] { run(); });
  }
  ~JobPages() {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }

 private:
  void run() {
    using namespace ddpl::web;
    std::unique_lock<std::mutex> lock(mu_);
    while (!cv_.wait_for(lock, std::chrono::seconds(1), [this] { return stop_; })) {
      lock.unlock();
      const double now =
          std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
              .count();
      std::map<std::string, std::string> jobs;
      std::map<std::string, DashboardModel> kept;
      for (auto& r : server_.nodeValues("dashboard", kMaxJobs)) {
        std::vector<DashboardRank> rows;
        for (size_t n = 0; n < r.values.size(); ++n) {
          if (!r.values[n]) continue;
          for (auto& row : decodeRanks(*r.values[n]))
            if (row.node_rank == static_cast<int>(n)) rows.push_back(std::move(row));
        }
        if (rows.empty()) continue;  // its agents publish nothing: not a job with a page
        std::sort(rows.begin(), rows.end(),
                  [](const auto& a, const auto& b) { return a.global_rank < b.global_rank; });
        DashboardJob job;
        job.run_id = r.run_id;
        job.attempt = static_cast<int>(r.round);
        job.world_size = static_cast<int>(rows.size());
        job.nodes = static_cast<int>(r.values.size());
        job.state = "starting";
        job.step = rows.front().step;
        for (const auto& row : rows) {
          if (row.state != "starting" && row.state != "exited") job.state = "training";
          job.step = std::min(job.step, row.step);
          if (row.steps_per_sec && (!job.steps_per_sec || *row.steps_per_sec < *job.steps_per_sec))
            job.steps_per_sec = row.steps_per_sec;  // the slowest rank's pace is the job's
        }
        DashboardModel& m = kept[r.run_id];
        if (auto old = models_.find(r.run_id); old != models_.end()) m = std::move(old->second);
        m.sample(job, std::move(rows), now);
        jobs[r.run_id] = m.json(now);
      }
      models_ = std::move(kept);  // runs gone, or without rows, are forgotten
      endpoint_->publish(std::move(jobs));
      lock.lock();
    }
  }

  ddpl::rdzv::RendezvousServer& server_;
  std::unique_ptr<ddpl::web::JobsDashboardEndpoint> endpoint_;
  std::map<std::string, ddpl::web::DashboardModel> models_;  // the sampling thread's
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
};
#endif

}  // namespace

int main(int argc, char** argv) {
  using namespace ddpl;
  rdzv::ServerOptions o;
  o.port = defaults::kRdzvPort;
  std::string token_file, port_file, level = "info";
  std::optional<DashboardFlag> dashboard;
  static const std::map<std::string, bool> kTakesValue = {{"--host", true},
                                                          {"--port", true},
                                                          {"--port-file", true},
                                                          {"--token-file", true},
                                                          {"--tls-cert", true},
                                                          {"--tls-key", true},
                                                          {"--tls-client-ca", true},
                                                          {"--max-value-bytes", true},
                                                          {"--heartbeat-window", true},
                                                          {"--run-retention", true},
                                                          {"--max-stream-pending", true},
                                                          {"--max-stream-queued-bytes", true},
                                                          {"--max-queued-bytes", true},
                                                          {"--max-parked", true},
                                                          {"--max-streams-per-connection", true},
                                                          {"--max-connection-idle", true},
                                                          {"--max-connections", true},
                                                          {"--no-store-socket", false},
                                                          {"--stats-interval", true},
                                                          {"--dashboard", false},
                                                          {"--log-level", true},
                                                          {"--help", false},
                                                          {"-h", false},
                                                          {"--version", false}};
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    auto eq = arg.find('=');
    bool inline_value = arg.rfind("--", 0) == 0 && eq != std::string::npos;
    if (inline_value) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    for (size_t j = 2; j < arg.size(); ++j)
      if (arg[j] == '_') arg[j] = '-';
    auto f = kTakesValue.find(arg);
    if (f == kTakesValue.end()) usageError(fmt::format("unknown flag '{}'", argv[i]));
    if (f->second && !inline_value) {
      if (i + 1 >= argc) usageError(fmt::format("{} needs a value", arg));
      value = argv[++i];
    } else if (!f->second && inline_value && arg != "--dashboard") {
      usageError(fmt::format("{} takes no value", arg));
    }
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      return 0;
    }
    if (arg == "--version") {
      std::printf("rdzv-server %s\n", DDPL_VERSION);
      return 0;
    }
    if (arg == "--host") o.host = parseHost(arg, value);
    if (arg == "--port") o.port = static_cast<int>(parseInt(arg, value, 0, 65535));
    if (arg == "--port-file") port_file = value;
    if (arg == "--token-file") token_file = value;
    if (arg == "--tls-cert") o.tls_cert_file = value;
    if (arg == "--tls-key") o.tls_key_file = value;
    if (arg == "--tls-client-ca") o.tls_client_ca_file = value;
    if (arg == "--max-value-bytes") o.max_value_bytes = parseInt(arg, value, 1, int64_t{1} << 30);
    if (arg == "--heartbeat-window")
      o.heartbeat_window = std::chrono::seconds(parseInt(arg, value, 1, 86400));
    if (arg == "--run-retention")
      o.run_retention = std::chrono::seconds(parseInt(arg, value, 0, 86400 * 365));
    if (arg == "--max-stream-pending")
      o.limits.max_stream_pending = parseInt(arg, value, 1, int64_t{1} << 30);
    if (arg == "--max-stream-queued-bytes")
      o.limits.max_stream_queued_bytes = parseInt(arg, value, 1, int64_t{1} << 40);
    if (arg == "--max-queued-bytes")
      o.limits.max_queued_bytes = parseInt(arg, value, 1, int64_t{1} << 40);
    if (arg == "--max-parked") o.limits.max_parked = parseInt(arg, value, 1, int64_t{1} << 30);
    if (arg == "--max-streams-per-connection")
      o.connections.max_streams_per_connection =
          static_cast<int>(parseInt(arg, value, 1, int64_t{1} << 20));
    if (arg == "--max-connection-idle")
      o.connections.max_connection_idle = std::chrono::seconds(parseInt(arg, value, 1, 86400));
    if (arg == "--max-connections")
      o.connections.max_connections = static_cast<int>(parseInt(arg, value, 1, 1 << 24));
    if (arg == "--no-store-socket") o.store_socket = false;
    if (arg == "--stats-interval")
      o.stats_interval = std::chrono::seconds(parseInt(arg, value, 0, 86400));
    if (arg == "--log-level") level = value;
    if (arg == "--dashboard") {
      dashboard = DashboardFlag{"127.0.0.1", 0};
      if (!value.empty()) {
        auto colon = value.rfind(':');
        if (colon == std::string::npos || colon == 0)
          usageError(fmt::format("--dashboard={}: HOST:PORT, e.g. 127.0.0.1:8265", value));
        dashboard->host = parseHost(arg, value.substr(0, colon));
        dashboard->port = static_cast<int>(parseInt(arg, value.substr(colon + 1), 0, 65535));
      }
    }
  }

  try {
    log::init({"rdzv-server", -1, ""}, log::parseLevel(level));
  } catch (const InvalidArgument& e) {
    usageError(e.what());
  }

  try {
    if (!token_file.empty()) {
      o.token = rdzv::readTokenFile(token_file);
    } else {
      const rdzv::EnvironmentToken env =
          rdzv::rdzvTokenFromEnvironment(processEnvironment(), "rdzv-server");
      if (!env.warning.empty()) log::warn("{}", env.warning);
      if (env.token) o.token = *env.token;
    }
    // Signals go to one thread that stops the server; block them before any thread exists.
    sigset_t set;
    sigemptyset(&set);
    for (int s : defaults::kStopSignals) sigaddset(&set, s);
    pthread_sigmask(SIG_BLOCK, &set, nullptr);

    rdzv::RendezvousServer server(o);
    if (!port_file.empty()) {
      // Whole or absent for whoever polls it; not synced, it is stale after a reboot anyway.
      AtomicWriteOptions quick;
      quick.durable = false;
      writeFileAtomically(port_file, std::to_string(server.port()) + "\n", quick);
    }
#ifdef DDPL_WITH_DASHBOARD
    std::unique_ptr<JobPages> pages;
    if (dashboard) pages = std::make_unique<JobPages>(server, *dashboard, o.token);
#else
    if (dashboard) throw Error("this rdzv-server was built without the dashboard (civetweb)");
#endif
    int received = 0;
    std::thread stopper([&] {
      sigwait(&set, &received);
      log::info("received signal {} ({}); shutting down", received, strsignal(received));
      server.shutdown();
    });
    server.wait();
    stopper.join();
#ifdef DDPL_WITH_DASHBOARD
    pages.reset();
#endif
    return 0;
  } catch (const InvalidArgument& e) {
    log::error("{}", e.what());
    return 2;
  } catch (const std::exception& e) {
    log::error("{}", e.what());
    return 1;
  }
}
