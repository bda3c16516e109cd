#pragma once
// `launch --standalone` hosts our gRPC store for its workers, on a free loopback port with a
// fresh random token, without making `launch` itself pay for gRPC:
//  - gRPC lives in a plugin (launcher/grpc_plugin.h) that is dlopen'ed only here, so plain
//    runs load none of its ~50 shared libraries (about 10 ms of start-up);
//  - the port is reserved first (bound, not listening, until the server listens on it, so a
//    program binding ports the ordinary way cannot take it), the endpoint goes into the
//    workers' environment at once, and the
//    server starts on a background thread while the workers start. Clients retry connecting
//    within their deadline, so a worker that is faster than the server just waits a moment.
#include <atomic>
#include <map>
#include <mutex>
#include <string>
#include <thread>

namespace ddpl::launcher {

class EmbeddedStore {
 public:
  // Reserves the port now; throws ddpl::NetworkError when it cannot.
  explicit EmbeddedStore(std::string host = "127.0.0.1");
  ~EmbeddedStore();  // stops the server (joins the start-up thread first)
  EmbeddedStore(const EmbeddedStore&) = delete;
  EmbeddedStore& operator=(const EmbeddedStore&) = delete;

  // DDPL_STORE_ADDR, DDPL_STORE_TOKEN and DDPL_STORE_PREFIX ("<run_id>/attempt_<n>/", so a
  // restarted group starts from clean keys). Starts the server on first use.
  std::map<std::string, std::string> workerEnv(const std::string& run_id, int attempt);

  // Blocks until the background start finished; returns "" on success or what went wrong.
  std::string waitUntilServing();

  const std::string& endpoint() const { return endpoint_; }

 private:
  void startInBackground();

  std::string host_, token_, endpoint_;
  int port_ = 0;
  int reserve_fd_ = -1;
  std::thread starter_;
  std::mutex mu_;
  std::string start_error_;
  void* server_ = nullptr;
};

}  // namespace ddpl::launcher
