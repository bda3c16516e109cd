#pragma once
// The job's web page (launch --dashboard[=HOST:PORT], docs/monitoring.md): GET / is the page
// (inside the binary: no internet needed), GET /api/job its data as JSON (DashboardModel),
// GET /api/logs?rank=N a rank's last lines, POST /api/stacks asks for every rank's stack.
//
// Served by civetweb from launch's metrics plugin (libddpl_launch_metrics.so; web/plugin.h starts
// it), so that jobs without it load no HTTP server. Access: the job's user (launch's euid, told by
// the kernel's socket diagnostics: common/peer_uid.h) may read from loopback without the token;
// other users, other machines, and POST from anyone must carry the job's dashboard token as
// `Authorization: Bearer TOKEN` or `?token=TOKEN`. Bounded: a few server threads, a short request
// timeout, and answers that are copies of text the agent made at most twice a second, so many open
// pages or a hostile client cost the server's threads, never the agent's loop.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace ddpl::web {

struct DashboardOptions {
  std::string host = "127.0.0.1";  // IPv4 address or name; loopback unless told otherwise
  int port = 0;                    // 0: the kernel picks; port() says which
  std::string token;               // required as above; never empty
  int threads = 4;
};

// Called on the server's threads: must be safe from any thread.
using DashboardLogs = std::function<std::vector<std::string>(int global_rank)>;

class DashboardEndpoint {
 public:
  virtual ~DashboardEndpoint() = default;
  virtual int port() const = 0;
  // The next answers of GET /api/job.
  virtual void publish(std::string job_json) = 0;
  // Whether POST /api/stacks came since the last call (one answer for several).
  virtual bool takeStacksRequest() = 0;
  // The job is over: if a page read /api/job in the last few seconds (one is open), waits up to
  // `seconds` for it to read what was published last (the summary), so that it shows the end.
  virtual void waitForOpenPages(double seconds) = 0;
};

// rdzv-server --dashboard: a page for every job it hosts. GET / lists them; /job/RUN/ is the
// same page as launch's and /job/RUN/api/job its data, from the rows the job's agents publish
// (launch --dashboard on its nodes); a job's logs and stacks stay on its nodes' pages. Access:
// from loopback anyone may read (as before: rdzv-server is a shared service, not one user's
// job); from elsewhere, rdzv-server's token.
class JobsDashboardEndpoint {
 public:
  virtual ~JobsDashboardEndpoint() = default;
  virtual int port() const = 0;
  // Every job's GET /job/RUN/api/job answer, by run id (replaces the last set).
  virtual void publish(std::map<std::string, std::string> jobs) = 0;
};
JobsDashboardEndpoint* newJobsDashboard(const DashboardOptions& options);

// The server itself (dashboard_server.cc): the plugin's side of startDashboard.
DashboardEndpoint* newDashboard(const DashboardOptions& options, DashboardLogs logs);

// The page, from web/page.html (generated into the server's library).
extern const char* const kDashboardPage;

// Whether `address` (as civetweb gives a peer: "127.0.0.1", "::1") is a loopback one.
bool isLoopbackAddress(const std::string& address);
// "Bearer TOKEN" against the token, in time independent of where they differ.
bool bearerMatches(const char* header, const std::string& token);

}  // namespace ddpl::web
