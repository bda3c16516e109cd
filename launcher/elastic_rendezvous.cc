#include "launcher/elastic_rendezvous.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <mutex>
#include <regex>
#include <set>
#include <thread>
#include <tuple>

#include "common/errors.h"
#include "common/log.h"
#include "common/parse.h"
#include "launcher/ports.h"
#include "rendezvous/grpc_store.h"
#include "rendezvous/rendezvous_client.h"
#include "rendezvous/server.h"

namespace ddpl::launcher {
namespace {

using std::chrono::milliseconds;

std::pair<std::string, int> splitEndpoint(const std::string& endpoint) {
  HostPort hp = parseHostPort("rendezvous endpoint", endpoint, defaults::kRdzvPort);
  return {hp.host, hp.port};
}

// How long a hosting agent keeps serving for nodes that have not finished yet (a node that was
// SIGKILLed never says goodbye, so this is bounded).
constexpr milliseconds kHostLinger{std::chrono::seconds(30)};

// The health thread: how often it looks for another node's request for stacks (one `check`
// a second per node) and publishes this node's status (one `set` every 5 s: a node summary,
// not a message per step).
constexpr milliseconds kStacksPoll{std::chrono::seconds(1)};
constexpr milliseconds kStatusEvery{std::chrono::seconds(5)};
// Calls the agent makes for the user (`launch status`) or on a hang wait at most this long.
constexpr milliseconds kHealthCallTimeout{std::chrono::seconds(3)};

double unixSeconds() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch())
      .count();
}

bool isLoopback(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1";
}

// Does `host` name this machine? Compared by name and by address: an address of this machine
// can be bound.
bool namesThisMachine(const std::string& host) {
  if (isLoopback(host)) return true;
  if (host == log::hostname()) return true;
  char full[256] = {0};
  gethostname(full, sizeof(full) - 1);
  if (host == full) return true;
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), nullptr, &hints, &res) != 0) return false;
  bool local = false;
  for (addrinfo* ai = res; ai && !local; ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    sockaddr_storage ss{};
    memcpy(&ss, ai->ai_addr, ai->ai_addrlen);
    reinterpret_cast<sockaddr_in*>(&ss)->sin_port = 0;  // same offset for v6
    local = bind(fd, reinterpret_cast<sockaddr*>(&ss), ai->ai_addrlen) == 0;
    close(fd);
  }
  freeaddrinfo(res);
  return local;
}

class ElasticRendezvous : public RendezvousHandler {
 public:
  explicit ElasticRendezvous(const ElasticConfig& c) : c_(c) {
    auto [host, port] = splitEndpoint(c_.endpoint);
    endpoint_ = fmt::format("{}:{}", host.find(':') != std::string::npos ? "[" + host + "]" : host,
                            port);
    if (c_.host != ElasticConfig::Host::kNo && (c_.host == ElasticConfig::Host::kYes || namesThisMachine(host)))
      maybeHost(host, port);
    address_ = c_.local_addr.empty() ? routeAddressTo(host, port) : c_.local_addr;

    rdzv::RendezvousClientOptions ro;
    ro.endpoint = endpoint_;
    ro.token = c_.token;
    ro.tls_ca_file = c_.tls_ca_file;
    ro.connect_timeout = c_.read_timeout;
    client_ = std::make_unique<rdzv::RendezvousClient>(ro);

    rdzv::GrpcStoreOptions so;
    so.endpoint = endpoint_;
    so.token = c_.token;
    so.tls_ca_file = c_.tls_ca_file;
    so.connect_timeout = c_.read_timeout;
    so.default_timeout = c_.read_timeout;
    // Job-wide facts every agent shares: the failure count and the last root cause.
    so.prefix = "ddpl-agents/" + c_.run_id + "/";
    store_ = rdzv::connectGrpcStore(so);
    log::info("rendezvous {} ({}), run '{}', node '{}' at {}, {}:{} nodes", endpoint_,
              server_ ? "hosted by this agent" : "client", c_.run_id, c_.node_id, address_,
              c_.min_nodes, c_.max_nodes);
  }

  ~ElasticRendezvous() override {
    stopHealth();
    if (joiner_.joinable()) joiner_.join();
    watch_.reset();
  }

  void publishPreflight(const std::string& report) override {
    try {
      int64_t id = store_->add("preflight/count", 1);
      store_->set(fmt::format("preflight/{}", id), rdzv::toBytes(report));
    } catch (const std::exception& e) {
      log::warn("cannot publish this node's preflight to the job: {}", e.what());
    }
  }

  void publishStatus(const std::string& line) override {
    std::lock_guard<std::mutex> lock(health_mu_);
    status_ = line;
  }

  std::vector<std::string> otherNodesStatus() override {
    auto [me, nodes, round] = position();
    std::vector<std::string> out;
    auto deadline = std::chrono::steady_clock::now() + kHealthCallTimeout;
    for (int r = 0; r < nodes; ++r) {
      if (r == me) continue;
      std::string key = fmt::format("status/{}", r);
      try {
        if (std::chrono::steady_clock::now() > deadline || !store_->check({key})) {
          out.push_back(fmt::format("node {}: no status published yet", r));
          continue;
        }
        // "<round>\n<host>\n<unix time>\n<line>"
        std::string v = rdzv::toString(store_->get(key, kHealthCallTimeout));
        auto a = v.find('\n'), b = v.find('\n', a + 1), c = v.find('\n', b + 1);
        if (c == std::string::npos || v.substr(0, a) != std::to_string(round)) {
          out.push_back(fmt::format("node {}: no status published in round {} yet", r, round));
          continue;
        }
        double age = unixSeconds() - std::strtod(v.substr(b + 1, c - b - 1).c_str(), nullptr);
        out.push_back(fmt::format("node {} ({}): {} ({:.0f}s ago)", r, v.substr(a + 1, b - a - 1),
                                  v.substr(c + 1), std::max(0.0, age)));
      } catch (const std::exception& e) {
        out.push_back(fmt::format("node {}: cannot read its status: {}", r, e.what()));
      }
    }
    return out;
  }

  void setStacksRequestedCallback(StacksRequested requested) override {
    std::lock_guard<std::mutex> lock(health_mu_);
    stacks_requested_ = std::move(requested);
  }

  int64_t requestStacks(const std::string& why) override {
    auto [me, nodes, round] = position();
    if (nodes <= 1) return 0;
    try {
      int64_t id = store_->add("stacks/next", 1);
      {
        std::lock_guard<std::mutex> lock(health_mu_);
        mine_.insert(id);
      }
      store_->set(fmt::format("stacks/{}", id), rdzv::toBytes(why));
      return id;
    } catch (const std::exception& e) {
      log::warn("cannot ask the other nodes for their stacks: {}", e.what());
      return 0;
    }
  }

  void answerStacks(int64_t id, const std::string& answer) override {
    auto [me, nodes, round] = position();
    try {
      store_->set(fmt::format("stacks/{}/{}", id, me), rdzv::toBytes(answer));
    } catch (const std::exception& e) {
      log::warn("cannot answer request {} for stacks: {}", id, e.what());
    }
  }

  StacksAnswers stacksAnswers(int64_t id) override {
    auto [me, nodes, round] = position();
    StacksAnswers out;
    if (id <= 0) return out;
    for (int r = 0; r < nodes; ++r) {
      if (r == me) continue;
      std::string key = fmt::format("stacks/{}/{}", id, r);
      try {
        if (store_->check({key})) {
          out.answers.push_back(rdzv::toString(store_->get(key, kHealthCallTimeout)));
          continue;
        }
      } catch (const std::exception& e) {
        log::debug("stacks of node {}: {}", r, e.what());
      }
      out.missing.push_back(r);
    }
    return out;
  }

  void setRoundEndedCallback(RoundEnded ended) override { ended_ = std::move(ended); }

  void startRendezvous(Done done) override {
    if (joiner_.joinable()) joiner_.join();
    watch_.reset();
    // join() blocks until the round completes (up to the join timeout): a thread of its own,
    // so the agent keeps handling signals meanwhile.
    joiner_ = std::thread([this, done = std::move(done)] {
      try {
        done(joinOnce(), "");
      } catch (const std::exception& e) {
        done(std::nullopt, e.what());
      }
    });
  }

  bool roundStillCurrent() override {
    std::optional<rdzv::RoundAssignment> current;
    {
      std::lock_guard<std::mutex> lock(mu_);
      current = current_;
    }
    if (!current) return true;
    if (watch_ && watch_->changed()) return false;
    try {
      client_->heartbeat(*current);  // the server's word: throws when the round has ended
      return true;
    } catch (const StoreError& e) {
      log::warn("round {} is over for this node: {}", current->round, e.what());
      return false;
    } catch (const std::exception& e) {
      log::debug("cannot tell whether round {} is current ({}): counting the failure",
                 current->round, e.what());
      return true;
    }
  }

  int recordFailure(const std::string& summary) override {
    int n = static_cast<int>(store_->add("failures", 1));
    store_->set("last_failure", rdzv::toBytes(summary));
    if (current_) store_->set(roundKey("end"), rdzv::toBytes("failed"));
    leaveQuietly();  // the other nodes learn at once and stop their workers
    return n;
  }

  std::string jobFailure() override {
    if (!cached_failure_.empty()) return cached_failure_;
    try {
      if (store_->check({"last_failure"}))
        return rdzv::toString(store_->get("last_failure", c_.read_timeout));
    } catch (const std::exception& e) {
      return std::string("<could not read it: ") + e.what() + ">";
    }
    return "";
  }

  bool finish(bool success) override {
    stopHealth();  // nothing is published for a node on its way out
    bool job_ok = true;
    if (success && current_) {
      try {
        int64_t done = store_->add(roundKey("done"), 1);
        if (done >= current_->group_world_size) store_->set(roundKey("end"), rdzv::toBytes("done"));
        // Leaving ends the round for nodes still running, so wait for them: returns at once when
        // the last node is done or any node failed.
        store_->wait({roundKey("end")}, c_.exit_barrier_timeout);
        job_ok = rdzv::toString(store_->get(roundKey("end"), c_.read_timeout)) == "done";
      } catch (const TimeoutError&) {
        log::warn("other nodes did not finish within the exit barrier ({}s); leaving anyway",
                  c_.exit_barrier_timeout.count() / 1000);
      } catch (const std::exception& e) {
        log::warn("exit barrier: {}", e.what());
      }
    }
    leaveQuietly();
    if (current_) {
      try {
        // The hosting agent must outlive the other members of its round: they may still be
        // reading the outcome (a failure's root cause) from the service it hosts.
        // Read the job's outcome before saying goodbye: the last node to leave clears it.
        cached_failure_ = jobFailure();
        int64_t gone = store_->add(roundKey("gone"), 1);
        if (gone >= current_->group_world_size) {
          // The job is over on every node of its last round. Its failure count must not
          // outlive it: a job re-run under the same --rdzv-id (a Kubernetes Job's pods
          // restarting, say) on a long-lived rdzv-server would otherwise start "already
          // failed". (A node SIGKILLed never gets here; then the count stays.)
          store_->deleteKey("failures");
          store_->deleteKey("last_failure");
          store_->set(roundKey("all_gone"), rdzv::toBytes("1"));
        }
        if (server_ && gone < current_->group_world_size) {
          log::info("waiting for {} other node(s) to finish before closing the rendezvous",
                    current_->group_world_size - gone);
          store_->wait({roundKey("all_gone")}, kHostLinger);
        }
      } catch (const std::exception& e) {
        log::warn("closing the rendezvous: {}", e.what());
      }
    }
    if (server_) {
      if (cached_failure_.empty()) cached_failure_ = jobFailure();  // nobody serves it after this
      server_->shutdown();
    }
    return job_ok;
  }

  std::string describe() const override { return "elastic via " + endpoint_; }

 private:
  std::string roundKey(const std::string& what) const {
    return fmt::format("round/{}/{}", current_ ? current_->round : -1, what);
  }

  void maybeHost(const std::string& host, int port) {
    std::string bind_host = isLoopback(host) ? "127.0.0.1" : "0.0.0.0";
    if (c_.host == ElasticConfig::Host::kAuto) {
      // Usual case on every node but one: the port is taken by the hosting agent. Find out
      // quietly instead of through gRPC's bind error.
      try {
        checkPortFree(bind_host, port);
      } catch (const NetworkError&) {
        return;
      }
    }
    rdzv::ServerOptions so;
    so.host = bind_host;
    so.port = port;
    so.token = c_.token;
    so.heartbeat_window = c_.heartbeat_window;
    so.log_name = "rdzv";
    try {
      server_ = std::make_unique<rdzv::RendezvousServer>(so);
    } catch (const NetworkError& e) {
      if (c_.host == ElasticConfig::Host::kYes) throw;
      // Another agent (or an rdzv-server) holds the port: it hosts, we are a client.
      log::debug("not hosting the rendezvous: {}", e.what());
    }
  }

  std::optional<WorldAssignment> joinOnce() {
    // A node that stopped because another failed for good must not wait for a round that
    // will never form: the count tells, and the supervisor reports the failure.
    int failures = static_cast<int>(store_->add("failures", 0));
    if (failures > c_.max_restarts) {
      WorldAssignment w;
      w.run_id = c_.run_id;
      w.restart_count = failures;
      return w;
    }
    rdzv::JoinOptions jo;
    jo.run_id = c_.run_id;
    jo.node_id = c_.node_id;
    jo.local_world_size = c_.local_world_size;
    jo.address = address_;
    jo.min_nodes = c_.min_nodes;
    jo.max_nodes = c_.max_nodes;
    jo.join_timeout = c_.join_timeout;
    jo.last_call_timeout = c_.last_call_timeout;
    rdzv::RoundAssignment a = client_->join(jo);
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = a;
      left_ = false;
    }
    startHealth();
    int64_t round = a.round;
    watch_ = client_->watch(a, [this, round](const rdzv::RoundChange& ch) {
      if (ended_)
        ended_(round, ch.connection_lost ? "lost the rendezvous service at " + endpoint_ + ": " + ch.reason
                                         : ch.reason);
    });

    WorldAssignment w;
    w.run_id = a.run_id;
    w.round = a.round;
    w.group_rank = a.group_rank;
    w.group_world_size = a.group_world_size;
    w.rank_offset = a.rank_offset;
    w.world_size = a.world_size;
    w.master_addr = a.master_address;
    w.restart_count = static_cast<int>(store_->add("failures", 0));
    // Group rank 0 picks MASTER_PORT on its own machine and tells the others.
    std::string port_key = roundKey("master_port");
    if (a.group_rank == 0) {
      std::string bind_addr = c_.local_addr.empty() ? "0.0.0.0" : c_.local_addr;
      int port = pickFreePort(isLoopback(a.master_address) ? "127.0.0.1" : bind_addr);
      store_->set(port_key, rdzv::toBytes(std::to_string(port)));
      w.master_port = port;
    } else {
      w.master_port = parsePort("MASTER_PORT published by node 0 under '" + port_key + "'",
                                rdzv::toString(store_->get(port_key, c_.read_timeout)));
    }
    w.worker_env = {{"DDPL_STORE_ADDR", endpoint_},
                    {"DDPL_STORE_TOKEN", c_.token},
                    {"DDPL_STORE_PREFIX", a.store_prefix}};
    log::info("round {}: node {}/{} ({} nodes, world size {}), ranks {}..{}", a.round,
              a.group_rank, a.group_world_size, a.group_world_size, a.world_size, a.rank_offset,
              a.rank_offset + a.local_world_size - 1);
    if (a.group_rank == 0) logPreflightTable();
    return w;
  }

  void leaveQuietly() {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_ || !current_) return;
    left_ = true;
    try {
      client_->leave(c_.run_id, c_.node_id);
    } catch (const std::exception& e) {
      log::warn("leaving the rendezvous: {}", e.what());
    }
  }

  // Group rank 0: the nodes' preflight reports published since the last table, as one table;
  // each report is taken once (a node that joins later shows in a later round's table).
  void logPreflightTable() {
    try {
      int64_t n = store_->add("preflight/count", 0);
      std::string table;
      int problems = 0, reports = 0;
      for (int64_t id = preflight_shown_ + 1; id <= n; ++id) {
        std::string key = fmt::format("preflight/{}", id);
        if (!store_->check({key})) continue;  // being written: the next table has it
        std::string r = rdzv::toString(store_->get(key, kHealthCallTimeout));
        problems += r.find("\n") != std::string::npos;
        ++reports;
        table += "\n  " + std::regex_replace(r, std::regex("\n"), "\n    ");
        preflight_shown_ = id;
      }
      if (reports == 0) return;
      if (problems > 0)
        log::warn("preflight of the job, {} node(s) reporting, {} with findings:{}", reports,
                  problems, table);
      else
        log::info("preflight of the job, {} node(s) reporting, all ok:{}", reports, table);
    } catch (const std::exception& e) {
      log::debug("no preflight table: {}", e.what());
    }
  }

  // This node's group rank, the round's number of nodes and the round; (-1, 0, -1) before
  // the first round.
  std::tuple<int, int, int64_t> position() {
    std::lock_guard<std::mutex> lock(mu_);
    if (!current_) return {-1, 0, -1};
    return {current_->group_rank, current_->group_world_size, current_->round};
  }

  void startHealth() {
    std::lock_guard<std::mutex> lock(health_mu_);
    if (health_.joinable()) return;
    health_ = std::thread([this] { healthLoop(); });
  }

  void stopHealth() {
    {
      std::lock_guard<std::mutex> lock(health_mu_);
      health_stop_ = true;
    }
    health_cv_.notify_all();
    if (health_.joinable()) health_.join();
  }

  // Publishes this node's status and hands other nodes' requests for stacks to the agent.
  // Errors (the service restarting) are retried on the next turn: health is best effort and
  // never ends the job.
  void healthLoop() {
    int64_t next = -1;  // the next request id to look for
    auto published = std::chrono::steady_clock::time_point{};
    std::unique_lock<std::mutex> lock(health_mu_);
    while (!health_stop_) {
      std::string line = status_;
      StacksRequested requested = stacks_requested_;
      lock.unlock();
      try {
        auto [me, nodes, round] = position();
        if (next < 0) next = store_->add("stacks/next", 0) + 1;  // earlier requests are over
        auto now = std::chrono::steady_clock::now();
        if (!line.empty() && me >= 0 && now - published >= kStatusEvery) {
          store_->set(fmt::format("status/{}", me),
                      rdzv::toBytes(fmt::format("{}\n{}\n{:.3f}\n{}", round, log::hostname(),
                                                unixSeconds(), line)));
          published = now;
        }
        std::string key = fmt::format("stacks/{}", next);
        if (store_->check({key})) {
          std::string why = rdzv::toString(store_->get(key, kHealthCallTimeout));
          bool own;
          {
            std::lock_guard<std::mutex> l(health_mu_);
            own = mine_.count(next) > 0;
          }
          if (!own && requested) requested(next, why);
          ++next;
          lock.lock();
          continue;  // another may follow at once
        }
      } catch (const std::exception& e) {
        log::debug("job health: {}", e.what());
      }
      lock.lock();
      health_cv_.wait_for(lock, kStacksPoll, [this] { return health_stop_; });
    }
  }

  ElasticConfig c_;
  std::string endpoint_, address_;
  std::unique_ptr<rdzv::RendezvousServer> server_;
  std::unique_ptr<rdzv::RendezvousClient> client_;
  std::unique_ptr<rdzv::Store> store_;
  std::unique_ptr<rdzv::RoundWatch> watch_;
  std::thread joiner_;
  RoundEnded ended_;
  std::mutex mu_;
  std::optional<rdzv::RoundAssignment> current_;
  bool left_ = false;
  std::string cached_failure_;
  std::mutex health_mu_;  // guards the health thread's state below
  std::condition_variable health_cv_;
  std::thread health_;
  bool health_stop_ = false;
  std::string status_;
  StacksRequested stacks_requested_;
  std::set<int64_t> mine_;  // requests this node made: not answered by itself
  int64_t preflight_shown_ = 0;  // the last preflight report in a table (group rank 0)
};

}  // namespace

std::string routeAddressTo(const std::string& host, int port) {
  addrinfo hints{};
  hints.ai_socktype = SOCK_DGRAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), std::to_string(port).c_str(), &hints, &res) != 0)
    throw NetworkError(fmt::format("cannot resolve rendezvous host '{}'", host));
  std::string out;
  for (addrinfo* ai = res; ai && out.empty(); ai = ai->ai_next) {
    int fd = socket(ai->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (fd < 0) continue;
    if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0) {
      sockaddr_storage ss{};
      socklen_t len = sizeof(ss);
      getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &len);
      char buf[INET6_ADDRSTRLEN] = {0};
      if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(&ss)->sin_addr, buf, sizeof(buf));
      else
        inet_ntop(AF_INET6, &reinterpret_cast<sockaddr_in6*>(&ss)->sin6_addr, buf, sizeof(buf));
      out = buf;
    }
    close(fd);
  }
  freeaddrinfo(res);
  if (out.empty())
    throw NetworkError(fmt::format("no route to the rendezvous host '{}' from this machine", host));
  return out;
}

std::unique_ptr<RendezvousHandler> makeElasticRendezvous(const ElasticConfig& config) {
  return std::make_unique<ElasticRendezvous>(config);
}

}  // namespace ddpl::launcher
