#pragma once
// The rendezvous server, embeddable: `rdzv-server` runs one, and `launch --standalone`
// starts one on a free loopback port and hands its endpoint and token to the workers
// (DDPL_STORE_ADDR / DDPL_STORE_TOKEN / DDPL_STORE_PREFIX). No gRPC in this header.
#include <memory>
#include <string>

#include "rendezvous/grpc_store.h"
#include "rendezvous/rendezvous_state.h"

namespace ddpl::rdzv {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 0;                             // 0: pick a free port; read it back with port()
  std::string token;                        // empty: anyone may call (logged as a warning at start)
  std::string tls_cert_file, tls_key_file;  // both set: TLS
  std::string tls_client_ca_file;           // set: clients must present a certificate from it
  int64_t max_value_bytes = kDefaultMaxValueBytes;
  Duration heartbeat_window = kDefaultHeartbeatWindow;
  // Upper bound on the timeout a client may ask a get/wait to be parked for.
  Duration max_wait = std::chrono::hours(2);
  std::string log_name = "rdzv";  // prefix of this server's log lines
};

struct ServerStats {
  int64_t parked_store_calls = 0;  // gets and waits waiting for keys
  int64_t parked_joins = 0;
  int64_t watchers = 0;
  int64_t unauthenticated_calls = 0;
};

class RendezvousServer {
 public:
  // Validates the options and starts serving. Throws ddpl::InvalidArgument for bad options
  // and ddpl::NetworkError naming host:port when it cannot listen (port in use, bad address).
  explicit RendezvousServer(const ServerOptions& options);
  ~RendezvousServer();  // shutdown()
  RendezvousServer(const RendezvousServer&) = delete;
  RendezvousServer& operator=(const RendezvousServer&) = delete;

  int port() const;              // the bound port, also when started with port 0
  std::string endpoint() const;  // host:port for clients ([v6]:port for IPv6 hosts)

  // Ends parked calls (CANCELLED) and stops serving. Idempotent; safe from any thread
  // other than a gRPC callback.
  void shutdown();
  // Blocks until shutdown() has been called (by another thread or a signal handler's helper).
  void wait();

  ServerStats stats() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpl::rdzv
