#include "rendezvous/server/server.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <grpcpp/resource_quota.h>
#include <netinet/in.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>

#include "common/errors.h"
#include "common/log.h"
#include "common/net.h"
#include "rendezvous/protocol/grpc_common.h"
#include "rendezvous/server/connection_gate.h"
#include "rendezvous/server/service.h"
#include "rendezvous/server/wire_server.h"

namespace ddpl::rdzv {
namespace {

std::string hostPort(const std::string& host, int port) {
  if (host.find(':') != std::string::npos && host.front() != '[')
    return fmt::format("[{}]:{}", host, port);
  return fmt::format("{}:{}", host, port);
}

void validate(const ServerOptions& o) {
  if (o.host.empty()) throw InvalidArgument("rendezvous server: the listen address is empty");
  if (o.port < 0 || o.port > 65535)
    throw InvalidArgument(
        fmt::format("rendezvous server: port {} is out of range 0..65535", o.port));
  if (o.tls_cert_file.empty() != o.tls_key_file.empty())
    throw InvalidArgument("rendezvous server: TLS certificate and key go together: set both");
  if (!o.tls_client_ca_file.empty() && o.tls_cert_file.empty())
    throw InvalidArgument(
        "rendezvous server: client certificates need TLS: set the server certificate and key");
  if (o.tcpstore && !o.tls_cert_file.empty())
    throw InvalidArgument(
        "rendezvous server: torch's TCPStore protocol has no encryption: it cannot be served "
        "with TLS");
  if (o.max_value_bytes <= 0 || o.max_value_bytes > (1 << 30))
    throw InvalidArgument(
        fmt::format("rendezvous server: max value size {} bytes is out of range 1..1073741824",
                    o.max_value_bytes));
  if (o.heartbeat_window.count() <= 0)
    throw InvalidArgument("rendezvous server: the heartbeat window must be positive");
  if (o.run_retention.count() < 0)
    throw InvalidArgument(
        fmt::format("rendezvous server: run retention {}ms is negative", o.run_retention.count()));
  auto positive = [](const char* what, int64_t v) {
    if (v <= 0)
      throw InvalidArgument(
          fmt::format("rendezvous server: {} is {}; it must be positive", what, v));
  };
  positive("max unanswered operations per stream", o.limits.max_stream_pending);
  positive("max queued bytes per stream", o.limits.max_stream_queued_bytes);
  positive("max queued bytes", o.limits.max_queued_bytes);
  positive("max parked gets and waits", o.limits.max_parked);
  positive("max streams per connection", o.connections.max_streams_per_connection);
  positive("max connection idle (ms)", o.connections.max_connection_idle.count());
  positive("max connections", o.connections.max_connections);
  if (o.connections.max_grpc_memory_bytes < 0 || o.connections.max_grpc_threads < 0)
    throw InvalidArgument("rendezvous server: gRPC memory and thread limits must be >= 0");
}

// File descriptors the server needs besides those of its connections: listening sockets,
// gRPC's epoll and wake-up fds, the log, TLS files.
constexpr rlim_t kReservedFds = 64;
// A gRPC connection holds two: gRPC's and the gate's duplicate (a store socket holds one,
// and counts as two here: the cap is the same for both transports).
constexpr rlim_t kFdsPerConnection = 2;

// The connections this server can hold: the configured cap, or fewer when the open-file
// limit cannot back it, said at start rather than found out when a job grows (accept:
// EMFILE).
int connectionCap(const ServerOptions& o) {
  int want = o.connections.max_connections;
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0 || rl.rlim_cur == RLIM_INFINITY) return want;
  if (o.connections.max_connections_from_file_limit) {
    rlim_t fits = rl.rlim_cur > kReservedFds + kFdsPerConnection
                      ? (rl.rlim_cur - kReservedFds) / kFdsPerConnection
                      : 1;
    return static_cast<int>(std::min<rlim_t>(fits, rlim_t{1} << 24));
  }
  rlim_t need = static_cast<rlim_t>(want) * kFdsPerConnection + kReservedFds;
  if (rl.rlim_cur >= need) return want;
  int fits = rl.rlim_cur > kReservedFds + kFdsPerConnection
                 ? static_cast<int>((rl.rlim_cur - kReservedFds) / kFdsPerConnection)
                 : 1;
  log::warn(
      "[{}] the open-file limit is {} (hard {}) but this server is sized for {} connections "
      "(needs {} files): it will hold at most {}. Raise the limit (systemd LimitNOFILE=, "
      "ulimit -n, the container's nofile limit) or lower --max-connections",
      o.log_name, rl.rlim_cur,
      rl.rlim_max == RLIM_INFINITY ? "unlimited" : std::to_string(rl.rlim_max), want, need, fits);
  return fits;
}

}  // namespace

struct RendezvousServer::Impl {
  ServerOptions options;
  // Before services: it is told of their token checks, so it must outlive them.
  std::unique_ptr<grpc_detail::ConnectionGate> gate;
  std::unique_ptr<grpc_detail::Services> services;
  grpc_detail::WireServer* wire = nullptr;  // the services' own; null without it
  std::unique_ptr<grpc::Server> server;
  int port = 0;
  std::mutex mu;
  std::condition_variable stopped_cv;
  bool stopping = false;
  bool stopped = false;
};

RendezvousServer::RendezvousServer(const ServerOptions& options) : impl_(std::make_unique<Impl>()) {
  validate(options);
  grpc_detail::routeGrpcLogs();
  impl_->options = options;
  grpc_detail::ServiceConfig cfg;
  cfg.token = options.token;
  cfg.max_value_bytes = options.max_value_bytes;
  cfg.max_wait = options.max_wait;
  cfg.heartbeat_window = options.heartbeat_window;
  cfg.started = Clock::now();
  cfg.epoch_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  cfg.run_retention = options.run_retention;
  cfg.limits = options.limits;
  cfg.max_sessions_per_connection = options.connections.max_streams_per_connection;
  cfg.stats_interval = options.stats_interval;
  cfg.log_name = options.log_name;
  grpc_detail::GateOptions gate_options;
  gate_options.max_connections = connectionCap(options);
  gate_options.log_name = options.log_name;
  if (options.tcpstore) gate_options.torch_uid = options.tcpstore_uid;
  // Listening first: a taken port is reported before anything else starts.
  impl_->gate =
      std::make_unique<grpc_detail::ConnectionGate>(options.host, options.port, gate_options);
  impl_->port = impl_->gate->port();
  auto* gate = impl_->gate.get();
  cfg.on_token_checked = [gate](const std::string& peer, bool ok) { gate->noteCall(peer, ok); };
  cfg.on_too_many_streams = [gate](const std::string& peer) { gate->closePeer(peer); };
  // The store socket's server comes after the services it serves: rounds reach it through this.
  auto wire_slot = std::make_shared<std::atomic<grpc_detail::WireServer*>>(nullptr);
  if (options.tcpstore && !options.tcpstore_run_id.empty()) {
    cfg.tcpstore_run_id = options.tcpstore_run_id;
    bool loopback = isLoopback(options.host);
    cfg.on_round_formed = [wire_slot, loopback](const RoundMembership& m) {
      std::vector<std::string> ips;
      for (const auto& n : m.nodes) ips.push_back(n.address);
      if (auto* w = wire_slot->load()) w->beginTorchAttempt(m.round, std::move(ips), loopback);
    };
  }
  impl_->services = std::make_unique<grpc_detail::Services>(cfg);
  if ((options.store_socket || options.tcpstore) && options.tls_cert_file.empty()) {
    grpc_detail::WireOptions wire_options;
    // The gate is destroyed after the services, and forgets everything once stopped.
    wire_options.before_close = [gate](int fd) { gate->wireClosed(fd); };
    auto* wire = impl_->wire = impl_->services->startWire(std::move(wire_options));
    wire_slot->store(wire);
    if (options.store_socket)
      gate->setWire([wire](int fd, const std::string& peer) { return wire->adopt(fd, peer); });
    if (options.tcpstore) {
      if (options.tcpstore_attempt >= 0)
        wire->beginTorchAttempt(options.tcpstore_attempt, options.tcpstore_peer_ips,
                                options.tcpstore_loopback);
      gate->setTorch(
          [wire](int fd, const std::string& peer) { return wire->adoptTorch(fd, peer); });
    }
  }

  std::shared_ptr<grpc::ServerCredentials> creds;
  if (options.tls_cert_file.empty()) {
    creds = grpc::InsecureServerCredentials();
  } else {
    grpc::SslServerCredentialsOptions ssl(
        options.tls_client_ca_file.empty()
            ? GRPC_SSL_DONT_REQUEST_CLIENT_CERTIFICATE
            : GRPC_SSL_REQUEST_AND_REQUIRE_CLIENT_CERTIFICATE_AND_VERIFY);
    ssl.pem_key_cert_pairs.push_back(
        {grpc_detail::readFile(options.tls_key_file, "TLS key"),
         grpc_detail::readFile(options.tls_cert_file, "TLS certificate")});
    if (!options.tls_client_ca_file.empty())
      ssl.pem_root_certs = grpc_detail::readFile(options.tls_client_ca_file, "TLS client CA");
    creds = grpc::SslServerCredentials(ssl);
  }

  grpc::ServerBuilder b;
  // The gate accepts; gRPC gets each connection from it, with these credentials.
  auto acceptor = b.experimental().AddExternalConnectionAcceptor(
      grpc::ServerBuilder::experimental_type::ExternalConnectionType::FROM_FD, creds);
  b.RegisterService(impl_->services->store());
  b.RegisterService(impl_->services->rendezvous());
  // Without this a second server on a busy port would silently share it (SO_REUSEPORT).
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  b.SetMaxReceiveMessageSize(static_cast<int>(
      std::min<int64_t>(options.max_value_bytes + grpc_detail::kMessageOverheadBytes, INT32_MAX)));
  // Find dead peers whose TCP connection lingers, so their watch streams break and the node
  // is evicted; let agents' own keepalive pings through. A ping unanswered for less than the
  // heartbeat window is no evidence: a link that drops everything for a few seconds delays it
  // (TCP backs off its retransmissions), and a broken watch ends the node's round, so the
  // heartbeat window, not a shorter ping timeout, decides when a silent node is gone.
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_TIME_MS, 10000);
  b.AddChannelArgument(
      GRPC_ARG_KEEPALIVE_TIMEOUT_MS,
      static_cast<int>(std::clamp<int64_t>(
          std::chrono::duration_cast<std::chrono::milliseconds>(options.heartbeat_window).count(),
          10000, INT32_MAX)));
  b.AddChannelArgument(GRPC_ARG_HTTP2_MIN_RECV_PING_INTERVAL_WITHOUT_DATA_MS, 5000);
  b.AddChannelArgument(GRPC_ARG_KEEPALIVE_PERMIT_WITHOUT_CALLS, 1);
  // No per-call channelz bookkeeping: nothing here serves channelz.
  b.AddChannelArgument(GRPC_ARG_ENABLE_CHANNELZ, 0);
  // Hostile or idle peers: bounded streams per connection, idle connections closed (a peer
  // refused for its token holds no call, so it goes after the idle limit), and a memory
  // quota past which gRPC refuses new connections instead of growing.
  const auto& conn = options.connections;
  b.AddChannelArgument(GRPC_ARG_MAX_CONCURRENT_STREAMS, conn.max_streams_per_connection);
  // A peer that connects and never finishes its (TLS) handshake holds a slot this long.
  b.AddChannelArgument(GRPC_ARG_SERVER_HANDSHAKE_TIMEOUT_MS, 10000);
  b.AddChannelArgument(
      GRPC_ARG_MAX_CONNECTION_IDLE_MS,
      static_cast<int>(std::min<int64_t>(conn.max_connection_idle.count(), INT32_MAX)));
  if (conn.max_grpc_memory_bytes > 0 || conn.max_grpc_threads > 0) {
    grpc::ResourceQuota quota("rdzv-server");
    if (conn.max_grpc_memory_bytes > 0)
      quota.Resize(static_cast<size_t>(conn.max_grpc_memory_bytes));
    if (conn.max_grpc_threads > 0) quota.SetMaxThreads(conn.max_grpc_threads);
    b.SetResourceQuota(quota);
  }
  impl_->server = b.BuildAndStart();
  if (!impl_->server)
    throw NetworkError(fmt::format("rendezvous server on {}: gRPC could not start", endpoint()));
  impl_->gate->start(std::move(acceptor));
  if (options.token.empty())
    log::warn(
        "[{}] serving on {} WITHOUT a token: anyone who can reach this address can read "
        "and change the store and the membership",
        options.log_name, endpoint());
  log::info(
      "[{}] serving on {} ({}{}, {}, max value {} bytes, heartbeat window {}ms, run "
      "retention {}s, per stream {} unanswered / {} bytes queued, {} bytes queued in all)",
      options.log_name, endpoint(), options.tls_cert_file.empty() ? "plaintext" : "TLS",
      impl_->wire ? (options.tcpstore ? " + store socket + torch TCPStore" : " + store socket")
                  : "",
      options.token.empty() ? "no token" : "token required", options.max_value_bytes,
      options.heartbeat_window.count(), options.run_retention.count() / 1000,
      options.limits.max_stream_pending, options.limits.max_stream_queued_bytes,
      options.limits.max_queued_bytes);
}

RendezvousServer::~RendezvousServer() { shutdown(); }

int RendezvousServer::port() const { return impl_->port; }

std::string RendezvousServer::endpoint() const {
  return hostPort(impl_->options.host, impl_->port);
}

void RendezvousServer::shutdown() {
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    if (impl_->stopping) {
      // Another thread is stopping it: return only once it is down, so that the caller may
      // destroy the server.
      impl_->stopped_cv.wait(lock, [&] { return impl_->stopped; });
      return;
    }
    impl_->stopping = true;
  }
  impl_->services->beginShutdown();
  impl_->gate->stop();  // no new connections while the old ones are ended
  if (impl_->wire) impl_->wire->stop();
  // An immediate deadline cancels parked calls; their OnCancel finishes each one.
  impl_->server->Shutdown(std::chrono::system_clock::now());
  impl_->server->Wait();
  log::info("[{}] stopped serving on {}", impl_->options.log_name, endpoint());
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stopped = true;
  }
  impl_->stopped_cv.notify_all();
}

void RendezvousServer::wait() {
  std::unique_lock<std::mutex> lock(impl_->mu);
  impl_->stopped_cv.wait(lock, [&] { return impl_->stopped; });
}

ServerStats RendezvousServer::stats() const {
  ServerStats s = impl_->services->stats();
  auto g = impl_->gate->stats();
  s.connections = g.open;
  s.connections_accepted = g.accepted;
  s.connections_rejected = g.rejected_at_cap;
  s.connections_evicted = g.evicted;
  s.refused_peers_closed = g.closed_refused;
  if (impl_->wire) {
    auto w = impl_->wire->stats();
    s.store_sockets = w.open;
    s.connections += w.open;
    s.tcpstore_clients = w.torch_open;
    s.tcpstore_refused = w.torch_refused + g.refused_uid;
    s.tcpstore_errors = w.torch_errors;
  }
  return s;
}

std::vector<RendezvousServer::RunValues> RendezvousServer::nodeValues(const std::string& key,
                                                                     size_t max_runs) const {
  return impl_->services->nodeValues(key, max_runs);
}

void RendezvousServer::beginTcpStoreAttempt(int64_t attempt,
                                            const std::vector<std::string>& peer_ips,
                                            bool loopback) {
  if (!impl_->options.tcpstore || !impl_->wire)
    throw InvalidArgument("rendezvous server: started without the TCPStore protocol (tcpstore)");
  impl_->wire->beginTorchAttempt(attempt, peer_ips, loopback);
}

}  // namespace ddpl::rdzv
