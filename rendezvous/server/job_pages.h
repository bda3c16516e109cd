#pragma once
// rdzv-server --dashboard: a page for every job whose agents publish their rows (launch
// --dashboard), refreshed once a second from what the server holds; the jobs shown are bounded
// (kMaxJobs). The pages are web/'s (JobsDashboardEndpoint); only rdzv-server links this.
//
// Threads: one of its own samples the server's node values and publishes; the destructor stops
// it. The page's server answers on civetweb's threads.
#include <chrono>
#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "rendezvous/server/server.h"
#include "rendezvous/server/server_flags.h"
#include "web/dashboard.h"
#include "web/dashboard_model.h"

namespace ddpl::rdzv {

class JobPages {
 public:
  static constexpr size_t kMaxJobs = 64;

  // `token`: the server's (empty: nobody from another machine may read). Throws
  // ddpl::NetworkError when the page cannot listen on `address`.
  JobPages(RendezvousServer& server, const DashboardAddress& address, const std::string& token);
  ~JobPages();
  JobPages(const JobPages&) = delete;
  JobPages& operator=(const JobPages&) = delete;

 private:
  void run();
  void publish();

  RendezvousServer& server_;
  std::unique_ptr<web::JobsDashboardEndpoint> endpoint_;
  std::map<std::string, web::DashboardModel> models_;  // the sampling thread's
  std::thread thread_;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;  // guarded by mu_
};

}  // namespace ddpl::rdzv
