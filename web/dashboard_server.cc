// The dashboard's HTTP side (dashboard.h), in launch's metrics plugin with civetweb.
#include <CivetServer.h>
#include <arpa/inet.h>
#include <fmt/format.h>
#include <netinet/in.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>

#include "common/errors.h"
#include "common/log.h"
#include "common/peer_uid.h"
#include "web/civet_util.h"
#include "web/dashboard.h"

namespace ddpl::web {

bool isLoopbackAddress(const std::string& address) {
  if (address == "::1") return true;
  std::string v4 = address.rfind("::ffff:", 0) == 0 ? address.substr(7) : address;
  in_addr a{};
  if (inet_pton(AF_INET, v4.c_str(), &a) != 1) return false;
  return (ntohl(a.s_addr) >> 24) == 127;
}

namespace {

// `given` against the token, in time independent of where they differ.
bool tokenMatches(const char* given, const std::string& token) {
  if (!given || token.empty()) return false;
  const size_t n = strlen(given);
  unsigned char diff = n == token.size() ? 0 : 1;
  for (size_t i = 0; i < token.size(); ++i)
    diff |= static_cast<unsigned char>(token[i] ^ (i < n ? given[i] : 0));
  return diff == 0;
}

}  // namespace

bool bearerMatches(const char* header, const std::string& token) {
  if (!header || token.empty()) return false;
  static constexpr char kScheme[] = "Bearer ";
  if (strncasecmp(header, kScheme, sizeof kScheme - 1) != 0) return false;
  return tokenMatches(header + sizeof kScheme - 1, token);
}

namespace {

void answer(mg_connection* conn, int status, const char* reason, const char* type,
            const std::string& body) {
  // The page's data are the job's: no caching by a proxy, no sniffing, no framing elsewhere;
  // the page loads nothing from outside itself.
  mg_printf(conn,
            "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
            "Cache-Control: no-store\r\nX-Content-Type-Options: nosniff\r\n"
            "X-Frame-Options: DENY\r\nReferrer-Policy: no-referrer\r\n"
            "Content-Security-Policy: default-src 'self'; script-src 'unsafe-inline'; "
            "style-src 'unsafe-inline'; img-src 'self' data:; connect-src 'self'\r\n"
            "Connection: close\r\n\r\n",
            status, reason, type, body.size());
  mg_write(conn, body.data(), body.size());
}

void error(mg_connection* conn, int status, const char* reason, const std::string& why) {
  answer(conn, status, reason, "application/json",
         nlohmann::json{{"error", why}}.dump(-1, ' ', false,
                                             nlohmann::json::error_handler_t::replace));
}

// The token as `Authorization: Bearer TOKEN`, or as `?token=TOKEN` (a browser sends no header
// with the page's own URL; the page sends the header with its data requests).
bool tokenGiven(mg_connection* conn, const std::string& token) {
  if (bearerMatches(mg_get_header(conn, "Authorization"), token)) return true;
  const mg_request_info* ri = mg_get_request_info(conn);
  if (!ri || !ri->query_string) return false;
  char given[256] = {0};
  int n = mg_get_var(ri->query_string, strlen(ri->query_string), "token", given, sizeof given);
  return n > 0 && tokenMatches(given, token);
}

// Whose socket the request came from. civetweb gives the client's address and port and the
// port it was accepted on; the server's address is the one it listens on, or, listening on
// every interface, the client's own (a connection within one host goes from an address to
// itself unless the client bound another: then nothing is found and the token is needed).
PeerUid requestUid(const mg_request_info* ri, const std::string& listen_ip) {
  sockaddr_storage local{}, peer{};
  auto* l = reinterpret_cast<sockaddr_in*>(&local);
  auto* p = reinterpret_cast<sockaddr_in*>(&peer);
  l->sin_family = p->sin_family = AF_INET;
  l->sin_port = htons(static_cast<uint16_t>(ri->server_port));
  p->sin_port = htons(static_cast<uint16_t>(ri->remote_port));
  const std::string server_ip = listen_ip == "0.0.0.0" ? ri->remote_addr : listen_ip;
  if (inet_pton(AF_INET, ri->remote_addr, &p->sin_addr) != 1 ||
      inet_pton(AF_INET, server_ip.c_str(), &l->sin_addr) != 1)
    return {std::nullopt, std::string("not an IPv4 peer: ") + ri->remote_addr};
  return tcpPeerUid(local, peer);
}

// Who may read without the token, from loopback (from elsewhere, nobody). Unset (rdzv-server's
// page of every job): anyone on this machine. Set (launch's page of its job): only the job's
// user; another user on the machine would read the job's last lines.
struct Readers {
  uint32_t uid = 0;
  std::string listen_ip;
};

log::Limiter g_refusals{std::chrono::seconds(10)};

// Writers always need the token, readers as Readers says.
bool allowedRequest(mg_connection* conn, const std::string& token, bool writes,
                    const std::optional<Readers>& readers) {
  if (tokenGiven(conn, token)) return true;
  const mg_request_info* ri = mg_get_request_info(conn);
  const bool local = ri && isLoopbackAddress(ri->remote_addr);
  if (writes || !readers || !local) {
    if (local && !writes) return true;
    error(conn, local ? 401 : 403, local ? "Unauthorized" : "Forbidden",
          std::string(writes ? "this action" : "a request from another machine") +
              " needs the job's dashboard token (Authorization: Bearer TOKEN, or ?token=TOKEN "
              "in the URL; launch printed where to find it)");
    return false;
  }
  const PeerUid owner = requestUid(ri, readers->listen_ip);
  if (owner.uid && *owner.uid == readers->uid) return true;
  int64_t held_back = 0;
  if (g_refusals.admit(&held_back))
    log::warn(
        "dashboard: refused {} {} from {}:{}: {}, and it gave no token (the job's user, uid "
        "{}, reads without; others need the token in the run directory's dashboard-token){}",
        ri->request_method ? ri->request_method : "?", ri->local_uri ? ri->local_uri : "?",
        ri->remote_addr, ri->remote_port,
        owner.uid ? fmt::format("its socket is uid {}'s", *owner.uid) : owner.why, readers->uid,
        held_back > 0 ? fmt::format(" ({} more refused in the last 10 s)", held_back) : "");
  error(conn, 403, "Forbidden",
        fmt::format("this job's page is its user's (uid {}): {} needs the job's dashboard "
                    "token (Authorization: Bearer TOKEN, or ?token=TOKEN in the URL; launch "
                    "printed where to find it)",
                    readers->uid,
                    owner.uid ? fmt::format("uid {}", *owner.uid)
                              : std::string("a client whose user cannot be told")));
  return false;
}

std::unique_ptr<CivetServer> startServer(const DashboardOptions& options, const std::string& who,
                                         std::string* listen_ip = nullptr) {
  if (options.token.empty()) throw InvalidArgument(who + " needs a token");
  if (options.port < 0 || options.port > 65535)
    throw InvalidArgument(who + " port " + std::to_string(options.port) + " is not in 0-65535");
  const std::string address = options.host + ":" + std::to_string(options.port);
  const std::string numeric = listenIpv4(options.host.c_str(), who, address);
  if (listen_ip) *listen_ip = numeric;
  std::unique_ptr<CivetServer> server;
  startCivet(who, address, [&](const CivetCallbacks* callbacks) {
    // A short request timeout: a client that connects and sends nothing holds one of the few
    // threads 5 s at most. No document root: what is not a route is a 404.
    server = std::make_unique<CivetServer>(
        std::vector<std::string>{"listening_ports", numeric + ":" + std::to_string(options.port),
                                 "num_threads", std::to_string(options.threads),
                                 "request_timeout_ms", "5000", "enable_keep_alive", "no"},
        callbacks);
  });
  return server;
}

int portOf(CivetServer& server) {
  auto ports = server.getListeningPorts();
  return ports.empty() ? 0 : ports.front();
}

class Dashboard;

class Handler : public CivetHandler {
 public:
  enum class Route { kPage, kJob, kLogs, kStacks };
  Handler(Dashboard& d, Route r) : d_(d), route_(r) {}
  bool handleGet(CivetServer*, mg_connection* conn) override;
  bool handlePost(CivetServer*, mg_connection* conn) override;

 private:
  Dashboard& d_;
  Route route_;
};

class Dashboard : public DashboardEndpoint {
 public:
  Dashboard(const DashboardOptions& options, DashboardLogs logs)
      : token_(options.token), logs_(std::move(logs)) {
    // The job's page is the job's user's: launch's own euid, like its workers'.
    readers_.emplace();
    readers_->uid = static_cast<uint32_t>(geteuid());
    server_ = startServer(options, "the dashboard", &readers_->listen_ip);
    for (auto [uri, route] :
         {std::pair{"/", Handler::Route::kPage}, std::pair{"/api/job", Handler::Route::kJob},
          std::pair{"/api/logs", Handler::Route::kLogs},
          std::pair{"/api/stacks", Handler::Route::kStacks}}) {
      handlers_.push_back(std::make_unique<Handler>(*this, route));
      server_->addHandler(uri, handlers_.back().get());
    }
    job_ = std::make_shared<const std::string>("{}");
  }

  ~Dashboard() override {
    wakeCivetListener(port());
    server_.reset();
  }

  int port() const override { return portOf(*server_); }

  void publish(std::string job_json) override {
    auto text = std::make_shared<const std::string>(std::move(job_json));
    std::lock_guard<std::mutex> lock(mu_);
    job_ = std::move(text);
    ++published_;
  }

  void waitForOpenPages(double seconds) override {
    std::unique_lock<std::mutex> lock(mu_);
    const auto now = std::chrono::steady_clock::now();
    if (!last_read_ || now - *last_read_ > std::chrono::seconds(3)) return;  // none open
    const uint64_t wanted = published_;
    read_cv_.wait_for(lock, std::chrono::duration<double>(seconds),
                      [&] { return read_version_ >= wanted; });
  }

  bool takeStacksRequest() override { return stacks_asked_.exchange(false); }

  bool allowed(mg_connection* conn, bool writes) {
    return allowedRequest(conn, token_, writes, readers_);
  }

  void get(Handler::Route route, mg_connection* conn) {
    if (!allowed(conn, false)) return;
    switch (route) {
      case Handler::Route::kPage: {
        // civetweb hands "/" every path no other handler takes.
        const mg_request_info* ri = mg_get_request_info(conn);
        if (!ri->local_uri || std::strcmp(ri->local_uri, "/") != 0) {
          error(conn, 404, "Not Found",
                "the dashboard serves /, /api/job, /api/logs?rank=N "
                "and POST /api/stacks");
          return;
        }
        answer(conn, 200, "OK", "text/html; charset=utf-8", kDashboardPage);
        return;
      }
      case Handler::Route::kJob: {
        std::shared_ptr<const std::string> job;
        {
          std::lock_guard<std::mutex> lock(mu_);
          job = job_;
          last_read_ = std::chrono::steady_clock::now();
          read_version_ = published_;
        }
        read_cv_.notify_all();
        answer(conn, 200, "OK", "application/json", *job);
        return;
      }
      case Handler::Route::kLogs: {
        const mg_request_info* ri = mg_get_request_info(conn);
        char value[16] = {0};
        const char* q = ri->query_string ? ri->query_string : "";
        int n = mg_get_var(q, strlen(q), "rank", value, sizeof value);
        char* end = nullptr;
        long rank = n > 0 ? std::strtol(value, &end, 10) : -1;
        if (n <= 0 || *end != '\0' || rank < 0 || rank > INT32_MAX) {
          error(conn, 400, "Bad Request", "rank=N (a global rank) is required");
          return;
        }
        std::vector<std::string> lines;
        if (logs_) lines = logs_(static_cast<int>(rank));
        answer(conn, 200, "OK", "application/json",
               nlohmann::json{{"rank", rank}, {"lines", lines}}.dump(
                   -1, ' ', false, nlohmann::json::error_handler_t::replace));
        return;
      }
      case Handler::Route::kStacks:
        error(conn, 405, "Method Not Allowed", "POST /api/stacks asks for every rank's stack");
        return;
    }
  }

  void post(Handler::Route route, mg_connection* conn) {
    if (route != Handler::Route::kStacks) {
      error(conn, 405, "Method Not Allowed", "only POST /api/stacks changes anything");
      return;
    }
    if (!allowed(conn, true)) return;
    stacks_asked_ = true;
    answer(conn, 202, "Accepted", "application/json",
           R"({"ok":true,"note":"every rank's stack is being taken; it shows in /api/job"})");
  }

 private:
  std::string token_;
  std::optional<Readers> readers_;
  DashboardLogs logs_;
  std::unique_ptr<CivetServer> server_;
  std::vector<std::unique_ptr<Handler>> handlers_;
  std::mutex mu_;
  std::shared_ptr<const std::string> job_;
  uint64_t published_ = 0, read_version_ = 0;  // guarded by mu_
  std::optional<std::chrono::steady_clock::time_point> last_read_;
  std::condition_variable read_cv_;
  std::atomic<bool> stacks_asked_{false};
};

bool Handler::handleGet(CivetServer*, mg_connection* conn) {
  d_.get(route_, conn);
  return true;
}

bool Handler::handlePost(CivetServer*, mg_connection* conn) {
  d_.post(route_, conn);
  return true;
}

// rdzv-server's page of every job: / and /job/RUN/[api/job].
class JobsDashboard : public JobsDashboardEndpoint, public CivetHandler {
 public:
  explicit JobsDashboard(const DashboardOptions& options) : token_(options.token) {
    server_ = startServer(options, "the dashboard");
    server_->addHandler("/", this);
  }
  ~JobsDashboard() override {
    wakeCivetListener(port());
    server_.reset();
  }
  int port() const override { return portOf(*server_); }
  void publish(std::map<std::string, std::string> jobs) override {
    auto shared = std::make_shared<const std::map<std::string, std::string>>(std::move(jobs));
    std::lock_guard<std::mutex> lock(mu_);
    jobs_ = std::move(shared);
  }

  bool handleGet(CivetServer*, mg_connection* conn) override {
    if (!allowedRequest(conn, token_, false, std::nullopt)) return true;
    const mg_request_info* ri = mg_get_request_info(conn);
    const std::string uri = ri->local_uri ? ri->local_uri : "";
    std::shared_ptr<const std::map<std::string, std::string>> jobs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      jobs = jobs_;
    }
    if (uri == "/") {
      std::string body =
          "<!doctype html><meta charset=utf-8><title>ddplaunch jobs</title>"
          "<style>body{font:14px system-ui,sans-serif;margin:24px}</style><h1>Jobs</h1><ul>";
      for (const auto& [run, json] : *jobs) {
        char* quoted = mg_url_encode_alloc(run);
        body += "<li><a href=\"job/" + std::string(quoted) + "/\">" + htmlEscape(run) + "</a></li>";
        free(quoted);
      }
      if (jobs->empty())
        body += "<li>none: a job's agents show here when they run with --dashboard</li>";
      body += "</ul>";
      answer(conn, 200, "OK", "text/html; charset=utf-8", body);
      return true;
    }
    // /job/RUN/ and /job/RUN/api/job (RUN decoded by civetweb already).
    static constexpr std::string_view kPrefix = "/job/";
    if (uri.rfind(kPrefix, 0) == 0) {
      std::string rest = uri.substr(kPrefix.size());
      for (const auto& [suffix, page] :
           {std::pair{std::string("/"), true}, std::pair{std::string("/api/job"), false}}) {
        if (rest.size() <= suffix.size() ||
            rest.compare(rest.size() - suffix.size(), suffix.size(), suffix) != 0)
          continue;
        const std::string run = rest.substr(0, rest.size() - suffix.size());
        auto it = jobs->find(run);
        if (it == jobs->end()) break;
        if (page)
          answer(conn, 200, "OK", "text/html; charset=utf-8", kDashboardPage);
        else
          answer(conn, 200, "OK", "application/json", it->second);
        return true;
      }
      if (rest.find("/api/") != std::string::npos) {
        error(conn, 404, "Not Found",
              "rdzv-server serves a job's /api/job only: its logs and stacks are on its nodes' "
              "pages (launch --dashboard)");
        return true;
      }
    }
    error(conn, 404, "Not Found", "no such job here: / lists the jobs");
    return true;
  }

 private:
  static char* mg_url_encode_alloc(const std::string& s) {
    size_t n = s.size() * 3 + 1;
    char* out = static_cast<char*>(malloc(n));
    mg_url_encode(s.c_str(), out, n);
    return out;
  }
  static std::string htmlEscape(const std::string& s) {
    std::string out;
    for (char c : s) {
      switch (c) {
        case '<':
          out += "&lt;";
          break;
        case '>':
          out += "&gt;";
          break;
        case '&':
          out += "&amp;";
          break;
        case '"':
          out += "&quot;";
          break;
        default:
          out += c;
      }
    }
    return out;
  }

  std::string token_;
  std::unique_ptr<CivetServer> server_;
  std::mutex mu_;
  std::shared_ptr<const std::map<std::string, std::string>> jobs_ =
      std::make_shared<const std::map<std::string, std::string>>();
};

}  // namespace

JobsDashboardEndpoint* newJobsDashboard(const DashboardOptions& options) {
  return new JobsDashboard(options);
}

DashboardEndpoint* newDashboard(const DashboardOptions& options, DashboardLogs logs) {
  return new Dashboard(options, std::move(logs));
}

}  // namespace ddpl::web
