#pragma once
// `launch --standalone` hosts our gRPC store for its workers, on a free loopback port with a
// fresh random token, without making `launch` itself pay for gRPC:
//  - gRPC lives in a plugin (launcher/membership/grpc_plugin.h) that is dlopen'ed only here, so
//  plain
//    runs load none of its ~50 shared libraries (about 10 ms of start-up);
//  - the port is reserved first (bound, not listening, until the server listens on it, so a
//    program binding ports the ordinary way cannot take it), the endpoint goes into the
//    workers' environment at once, and the
//    server starts on a background thread shortly after the workers started (startServing).
//    Clients retry connecting within their deadline, so a worker that is faster than the
//    server just waits a moment.
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace ddpl::launcher {

class EmbeddedStore {
 public:
  // Reserves the port now (`port` 0: a free one); throws ddpl::NetworkError when it cannot.
  // `tcpstore`: the server also speaks torch's TCPStore protocol on that port, for workers
  // started with TORCHELASTIC_USE_AGENT_STORE=True (the agent store, as torchrun's), one
  // namespace per attempt (beginAttempt). That protocol has no token: it serves only clients
  // whose socket is launch's own user's (its euid; docs/rendezvous.md, "Which user may
  // connect"). gRPC and the store socket serve whoever has the token, as before.
  explicit EmbeddedStore(std::string host = "127.0.0.1", bool tcpstore = false, int port = 0);
  ~EmbeddedStore();  // stops the server (joins the start-up thread first)
  EmbeddedStore(const EmbeddedStore&) = delete;
  EmbeddedStore& operator=(const EmbeddedStore&) = delete;

  // DDPL_STORE_ADDR, DDPL_STORE_TOKEN and DDPL_STORE_PREFIX ("<run_id>/attempt_<n>/", so a
  // restarted group starts from clean keys).
  std::map<std::string, std::string> workerEnv(const std::string& run_id, int attempt);

  // Starts the server in the background, once (later calls do nothing). Called after the
  // workers are forked: loading gRPC maps ~50 libraries, ~10 ms of CPU; done while the agent
  // forked, it competed with the forks for the CPU and for the address space's lock, and
  // every fork then copied the bigger process (issue 33: launch went from 2.5x to 3x the
  // spawn floor). No worker connects before its program is up, and clients retry until their
  // deadline.
  void startServing();

  // Blocks until the background start finished; returns "" on success or what went wrong.
  std::string waitUntilServing();

  const std::string& endpoint() const { return endpoint_; }
  const std::string& host() const { return host_; }
  int port() const { return port_; }
  bool tcpstore() const { return tcpstore_; }

  // The agent store's attempt `attempt` (before its workers start): the previous attempt's
  // torch clients are disconnected and its keys deleted. Before the server runs, it opens
  // with this attempt. Throws ddpl::Error when the server refuses.
  void beginAttempt(int64_t attempt);

 private:
  void startInBackground();

  std::string host_, token_, endpoint_;
  bool tcpstore_ = false;
  int port_ = 0;
  int64_t attempt_ = -1;  // guarded by mu_
  int reserve_fd_ = -1;
  std::thread starter_;
  // How long after the workers' start the server starts: no worker's program is up sooner
  // (a Python interpreter alone takes longer), and a client that is faster retries.
  static constexpr std::chrono::milliseconds kStartDelay{25};
  std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stopping_ = false;
  std::string start_error_;
  void* server_ = nullptr;
};

}  // namespace ddpl::launcher
