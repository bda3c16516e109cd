#include "launcher/membership/grpc_rendezvous.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mutex>

#include "common/defaults.h"
#include "common/errors.h"
#include "common/log.h"
#include "common/parse.h"
#include "launcher/membership/multi_node_rendezvous.h"
#include "launcher/membership/ports.h"
#include "rendezvous/client/grpc_store.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/server/server.h"

namespace ddpl::launcher {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

std::pair<std::string, int> splitEndpoint(const std::string& endpoint) {
  HostPort hp = parseHostPort("rendezvous endpoint", endpoint, defaults::kRdzvPort);
  return {hp.host, hp.port};
}

// How long a hosting agent keeps serving for nodes that have not finished yet (a node that was
// SIGKILLed never says goodbye, so this is bounded).
constexpr milliseconds kHostLinger{std::chrono::seconds(30)};

// A health read (`launch status`, stacks) waits at most this long for one key.
constexpr milliseconds kHealthCallTimeout{std::chrono::seconds(3)};

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

// The job's health keys in the rendezvous service's store (under ddpl-agents/<run>/). The
// service keeps no list and pushes nothing: lists are a counter and numbered keys, and the
// health thread polls.
class StoreJobKv : public JobKv {
 public:
  StoreJobKv(rdzv::Store* store, milliseconds read_timeout)
      : store_(store), read_timeout_(read_timeout) {}
  int64_t add(const std::string& key, int64_t delta) override { return store_->add(key, delta); }
  void set(const std::string& key, const std::string& value) override {
    store_->set(key, rdzv::toBytes(value));
  }
  std::optional<std::string> get(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    return rdzv::toString(store_->get(key, kHealthCallTimeout));
  }
  std::optional<std::string> getOutcome(const std::string& key) override {
    if (!store_->check({key})) return std::nullopt;
    return rdzv::toString(store_->get(key, read_timeout_));
  }
  void append(const std::string& list, const std::string& /*node*/,
              const std::string& value) override {
    int64_t id = store_->add(list + "/count", 1);
    set(fmt::format("{}/{}", list, id), value);
  }
  int64_t tally(const std::string& key, const std::string& /*node*/) override {
    return store_->add(key, 1);
  }
  // A store call that times out (the wait, or the read after it) is no answer in time.
  std::optional<std::string> waitFor(const std::string& key, milliseconds timeout) override {
    try {
      store_->wait({key}, timeout);
      return rdzv::toString(store_->get(key, read_timeout_));
    } catch (const TimeoutError&) {
      return std::nullopt;
    }
  }
  std::vector<std::string> readNew(const std::string& list, int64_t* cursor) override {
    std::vector<std::string> out;
    int64_t n = store_->add(list + "/count", 0);
    for (int64_t id = *cursor + 1; id <= n; ++id) {
      auto v = get(fmt::format("{}/{}", list, id));
      if (!v) continue;  // being written: the next read has it
      out.push_back(*v);
      *cursor = id;
    }
    return out;
  }

 private:
  rdzv::Store* store_;
  milliseconds read_timeout_;
};

// Rounds through the gRPC rendezvous service (rdzv::RendezvousClient), job-wide facts and the
// health view in its store. Threads, on top of multi_node_rendezvous.h's contract:
// - the joiner thread blocks in RendezvousClient::join() (up to the join timeout) and then in
//   the store for MASTER_PORT (up to the read timeout);
// - RoundEnded runs on the RoundWatch's stream thread; roundStillCurrent() asks the service
//   (one heartbeat, bounded by the read timeout);
// - the health thread polls the store once a second (no push);
// - when this agent hosts the service (server_), finish() keeps it up until the other nodes
//   of the last round have left, at most kHostLinger more.
class GrpcRendezvous : public MultiNodeRendezvous {
 public:
  explicit GrpcRendezvous(const GrpcRendezvousConfig& c) : MultiNodeRendezvous(c.node_id), c_(c) {
    auto [host, port] = splitEndpoint(c_.endpoint);
    endpoint_ =
        fmt::format("{}:{}", host.find(':') != std::string::npos ? "[" + host + "]" : host, port);
    if (c_.host != GrpcRendezvousConfig::Host::kNo &&
        (c_.host == GrpcRendezvousConfig::Host::kYes || namesThisMachine(host))) {
      maybeHost(host, port);
      // Only kAuto gets here without hosting: the port was taken, so the service was up.
      hosted_here_by_another_ = !server_;
    }
    address_ = c_.local_addr.empty() ? routeAddressTo(host, port) : c_.local_addr;
    // The read timeout gives a service that is not up yet, or restarts, time to come. One that
    // was up on this machine when this agent looked, hosted by another agent, is not coming
    // back once it stops answering: that agent closed it (its job ended or failed, e.g. at its
    // join timeout, a moment after this agent found the port taken). Waiting for it longer than
    // this node would wait for the job to form only delays the failure (issue 44: 60 s).
    milliseconds connect_timeout = c_.read_timeout;
    if (hosted_here_by_another_) connect_timeout = std::min(c_.read_timeout, c_.join_timeout);

    rdzv::RendezvousClientOptions ro;
    ro.endpoint = endpoint_;
    ro.token = c_.token;
    ro.tls_ca_file = c_.tls_ca_file;
    ro.connect_timeout = connect_timeout;
    // Heartbeats, leave and withdraw wait no longer than a store call: a server that does not
    // answer within the read timeout is lost, whatever the call.
    ro.call_timeout = std::min(ro.call_timeout, c_.read_timeout);

    rdzv::GrpcStoreOptions so;
    so.endpoint = endpoint_;
    so.token = c_.token;
    so.tls_ca_file = c_.tls_ca_file;
    so.connect_timeout = connect_timeout;
    so.default_timeout = c_.read_timeout;
    // Job-wide facts every agent shares: the failure count and the last root cause.
    so.prefix = "ddpl-agents/" + c_.run_id + "/";
    try {
      client_ = std::make_unique<rdzv::RendezvousClient>(ro);
      store_ = rdzv::connectGrpcStore(so);
    } catch (const NetworkError& e) {
      if (!hosted_here_by_another_) throw;
      throw NetworkError(closedByItsHost(e.what(), connect_timeout));
    }
    setKv(std::make_unique<StoreJobKv>(store_.get(), c_.read_timeout));
    log::info("rendezvous {} ({}), run '{}', node '{}' at {}, {}:{} nodes", endpoint_,
              server_ ? "hosted by this agent" : "client", c_.run_id, c_.node_id, address_,
              c_.min_nodes, c_.max_nodes);
  }

  ~GrpcRendezvous() override {
    stopThreads();
    watch_.reset();
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
      // The server's word: throws when the round has ended. Asked even when the service was
      // lost (it may be back): recordFailure(), which follows, goes by this answer.
      client_->heartbeat(*current);
      clearLost();
      return true;
    } catch (const StoreError& e) {
      log::warn("round {} is over for this node: {}", current->round, e.what());
      return false;
    } catch (const std::exception& e) {
      noteTransport(e);
      log::debug("cannot tell whether round {} is current ({}): counting the failure",
                 current->round, e.what());
      return true;
    }
  }

  void leaveEarly() override { leaveQuietly(); }

  bool finish(bool success) override {
    stopHealth();  // nothing is published for a node on its way out
    bool job_ok = true;
    if (success && current_ &&
        mayCall(Clock::time_point::max(), "waiting for the other nodes to finish")) {
      auto late = [&] {
        log::warn("other nodes did not finish within the exit barrier ({}s); leaving anyway",
                  c_.exit_barrier_timeout.count() / 1000);
      };
      try {
        auto end =
            exitBarrier(current_->round, current_->group_world_size, c_.exit_barrier_timeout);
        if (end)
          job_ok = *end == "done";
        else
          late();
      } catch (const TimeoutError&) {
        late();  // the store did not take this node's count in time
      } catch (const std::exception& e) {
        noteTransport(e);
        log::warn("exit barrier: {}", e.what());
      }
    }
    // Leaving, the outcome and "gone" share one read timeout: a server lost on the way out
    // costs at most that, not a read timeout per call.
    close_by_ = Clock::now() + c_.read_timeout;
    leaveQuietly();
    if (current_ && mayCall(close_by_, "closing the rendezvous")) {
      try {
        // The hosting agent must outlive the other members of its round: they may still be
        // reading the outcome (a failure's root cause) from the service it hosts.
        // Read the job's outcome before saying goodbye: the last node to leave clears it.
        cached_failure_ = jobFailure();
        int64_t gone = countGone(current_->round);
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
        noteTransport(e);
        log::warn("closing the rendezvous: {}", e.what());
      }
    }
    if (server_) {
      if (cached_failure_.empty()) cached_failure_ = jobFailure();  // nobody serves it after this
      server_->shutdown();
    }
    return job_ok;
  }

  void stopBeforeJoining(const std::string& reason) override {
    rdzv::JoinOptions jo = joinOptions();
    rdzv::RendezvousClient::Withdrawal w;
    try {
      w = client_->withdraw(jo, reason);
    } catch (const std::exception& e) {
      log::warn(
          "cannot tell the other nodes that this node stops: {} (they wait up to the join "
          "timeout, {}s, for it)",
          e.what(), c_.join_timeout.count() / 1000);
      return;
    }
    if (w.failed || w.can_come < c_.min_nodes)
      log::error(
          "the job cannot form without this node ({} of --nnodes={}:{} can still come): "
          "the other nodes are told",
          std::max(w.can_come, 0), c_.min_nodes, c_.max_nodes);
    else
      log::info("the other nodes go on without this node ({} of --nnodes={}:{} can still come)",
                w.can_come, c_.min_nodes, c_.max_nodes);
    if (!server_ || !(w.failed || w.can_come < c_.min_nodes)) return;
    // The other nodes reach the service through this process: it serves until those that can
    // still come have been turned away (each says so), within kHostLinger. Signals are not
    // handled yet (main has them blocked), so this stays short.
    int others = std::max(w.can_come, 0);
    if (others <= 0) return;
    log::info(
        "keeping the rendezvous up to {}s for {} other node(s) to learn that the job "
        "cannot form",
        kHostLinger.count() / 1000, others);
    try {
      store_->wait({fmt::format("turned_away/{}", others)}, kHostLinger);
    } catch (const std::exception& e) {
      log::debug("not every other node learnt it: {}", e.what());
    }
    server_->shutdown();
  }

  std::string describe() const override { return "elastic via " + endpoint_; }

 private:
  void beforeJoin() override { watch_.reset(); }

  std::string roundKey(const std::string& what) const {
    return fmt::format("round/{}/{}", current_ ? current_->round : -1, what);
  }

  void maybeHost(const std::string& host, int port) {
    std::string bind_host = isLoopback(host) ? "127.0.0.1" : "0.0.0.0";
    if (c_.host == GrpcRendezvousConfig::Host::kAuto) {
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
    so.tcpstore = c_.agent_store;
    if (c_.agent_store) {
      so.tcpstore_run_id = c_.run_id;
      so.connections.max_connections_from_file_limit = true;  // a client per rank of the job
    }
    try {
      server_ = std::make_unique<rdzv::RendezvousServer>(so);
    } catch (const NetworkError& e) {
      if (c_.host == GrpcRendezvousConfig::Host::kYes) throw;
      // Another agent (or an rdzv-server) holds the port: it hosts, we are a client.
      log::debug("not hosting the rendezvous: {}", e.what());
    }
  }

  rdzv::JoinOptions joinOptions() const {
    rdzv::JoinOptions jo;
    jo.run_id = c_.run_id;
    jo.node_id = c_.node_id;
    jo.local_world_size = c_.local_world_size;
    jo.address = address_;
    jo.min_nodes = c_.min_nodes;
    jo.max_nodes = c_.max_nodes;
    jo.join_timeout = c_.join_timeout;
    jo.last_call_timeout = c_.last_call_timeout;
    return jo;
  }

  // A call failed: on the transport (no server, or no answer within the read timeout), the
  // service counts as lost from now on (MultiNodeRendezvous::markLost). A timeout of a wait
  // for a key is no such failure, but the calls this is given for do not wait for keys.
  void noteTransport(const std::exception& e) override {
    if (dynamic_cast<const NetworkError*>(&e) || dynamic_cast<const TimeoutError*>(&e))
      markLost(e.what());
  }

  std::optional<int64_t> currentRound() const override {
    return current_ ? std::optional<int64_t>(current_->round) : std::nullopt;
  }

  std::string storeName(bool with_address) const override {
    return with_address ? "the rendezvous service at " + endpoint_ : "the rendezvous service";
  }

  // The other nodes learn at once and stop their workers.
  void leaveAfterFailure() override { leaveQuietly(); }

  std::optional<WorldAssignment> joinOnce() override {
    try {
      auto w = joinRound();
      clearLost();  // the service answers (again)
      return w;
    } catch (const NetworkError& e) {
      markLost(e.what());
      if (hosted_here_by_another_)
        throw NetworkError(closedByItsHost(e.what(), std::min(c_.read_timeout, c_.join_timeout)));
      throw;
    }
  }

  // Why a service that another agent on this machine hosted no longer answers.
  std::string closedByItsHost(const std::string& why, milliseconds gave_up_after) const {
    return fmt::format(
        "the rendezvous at {} was hosted by another agent on this machine (its port was taken "
        "when this agent started), which has closed it since, as an agent does when its job "
        "ends or fails (at its join timeout, say): no answer for {:.1f}s, the join timeout "
        "(or the read timeout where shorter): {}",
        endpoint_, std::chrono::duration<double>(gave_up_after).count(), why);
  }

  std::optional<WorldAssignment> joinRound() {
    std::optional<WorldAssignment> over;
    try {
      over = failedForGood(c_.run_id, c_.max_restarts);
    } catch (const TimeoutError& e) {
      markLost(e.what());  // no answer within the read timeout
      throw;
    }
    if (over) return over;
    rdzv::RoundAssignment a;
    try {
      a = client_->join(joinOptions());
    } catch (const StoreError& e) {
      // Refused because a node stopped before joining and the job cannot form: say so to a
      // hosting node that stopped, which serves until every node still to come has heard it.
      if (std::string(e.what()).find(rdzv::kStoppedBeforeJoining) != std::string::npos) {
        try {
          int64_t n = store_->add("turned_away/count", 1);
          store_->set(fmt::format("turned_away/{}", n), rdzv::toBytes(c_.node_id));
        } catch (const std::exception&) {
        }
      }
      throw;
    }
    {
      std::lock_guard<std::mutex> lock(mu_);
      current_ = a;
      left_ = false;
    }
    roundAssigned(a.group_rank, a.group_world_size, a.round);
    int64_t round = a.round;
    watch_ = client_->watch(a, [this, round](const rdzv::RoundChange& ch) {
      if (ch.fenced) markFenced(round, std::chrono::duration<double>(ch.stop_within).count());
      if (ch.connection_lost) markLost(ch.reason);
      endRound(round, ch.connection_lost
                          ? "lost the rendezvous service at " + endpoint_ + ": " + ch.reason
                          : ch.reason);
    });

    WorldAssignment w;
    static_cast<rdzv::round_rules::NodePlace&>(w) = a;  // the place, whole
    w.run_id = a.run_id;
    w.master_addr = a.master_address;
    w.restart_count = failureCount();
    std::string port_key = roundKey("master_port");
    if (a.agent_store) {
      // The service's host serves the job's TCPStore on its port, this round's namespace open.
      auto [host, port] = splitEndpoint(c_.endpoint);
      w.agent_store = true;
      w.master_addr = host;
      w.master_port = port;
    } else if (a.group_rank == 0) {
      // Group rank 0 picks MASTER_PORT on its own machine and tells the others.
      int port = pickMasterPort(a.master_address, c_.local_addr);
      store_->set(port_key, rdzv::toBytes(std::to_string(port)));
      w.master_port = port;
    } else {
      w.master_port = parsePort("MASTER_PORT published by node 0 under '" + port_key + "'",
                                rdzv::toString(store_->get(port_key, c_.read_timeout)));
    }
    w.worker_env = {{envvar::kStoreAddr, endpoint_},
                    {envvar::kStoreToken, c_.token},
                    {envvar::kStorePrefix, a.store_prefix}};
    log::info("round {}: node {}/{} ({} nodes, world size {}), ranks {}..{}", a.round, a.group_rank,
              a.group_world_size, a.group_world_size, a.world_size, a.rank_offset,
              a.rank_offset + a.local_world_size - 1);
    if (a.group_rank == 0) logPreflightTable();
    return w;
  }

  void leaveQuietly() {
    std::lock_guard<std::mutex> lock(mu_);
    if (left_ || !current_) return;
    left_ = true;
    if (!mayCall(close_by_, "leaving the rendezvous")) return;
    try {
      client_->leave(c_.run_id, c_.node_id);
    } catch (const std::exception& e) {
      noteTransport(e);
      log::warn("leaving the rendezvous: {}", e.what());
    }
  }

  GrpcRendezvousConfig c_;
  std::string endpoint_, address_;
  std::unique_ptr<rdzv::RendezvousServer> server_;
  // The endpoint is on this machine and another agent held its port when this one looked
  // (kAuto): it hosts, and a silence of its service means it closed it.
  bool hosted_here_by_another_ = false;
  std::unique_ptr<rdzv::RendezvousClient> client_;
  std::unique_ptr<rdzv::Store> store_;
  std::unique_ptr<rdzv::RoundWatch> watch_;
  std::mutex mu_;
  std::optional<rdzv::RoundAssignment> current_;
  bool left_ = false;
  // finish(): when the calls on the way out give up (none before: max).
  Clock::time_point close_by_ = Clock::time_point::max();
};

}  // namespace

std::unique_ptr<RendezvousHandler> makeGrpcRendezvous(const GrpcRendezvousConfig& config) {
  return std::make_unique<GrpcRendezvous>(config);
}

}  // namespace ddpl::launcher
