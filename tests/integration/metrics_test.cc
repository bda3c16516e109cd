// web/metrics.h: the Prometheus endpoint, scraped over real HTTP on loopback with a
// plain socket, against the names and labels that docs/monitoring.md documents.
#include "web/metrics.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>
#include <thread>
#include <vector>

#include "common/errors.h"
#include "common/log.h"
#include "tests/common/subprocess.h"

using namespace ddpl::web;
using ::testing::HasSubstr;

namespace {

struct Scrape {
  int status = 0;
  std::map<std::string, double> series;     // `name{labels}`, labels sorted -> value
  std::map<std::string, std::string> type;  // metric name -> counter, gauge
  std::set<std::string> help;               // metric names with a HELP line
  std::string body;

  bool has(const std::string& key) const { return series.count(key) > 0; }
  double at(const std::string& key) const {
    auto it = series.find(key);
    if (it == series.end()) ADD_FAILURE() << "no series " << key << " in\n" << body;
    return it == series.end() ? -1 : it->second;
  }
};

// `name{b="1",a="2"}` as `name{a="2",b="1"}`: the text format leaves the order of labels to
// the server (prometheus-cpp writes constant labels first).
std::string canonical(const std::string& series) {
  auto brace = series.find('{');
  if (brace == std::string::npos) return series;
  std::set<std::string> labels;
  std::string inside = series.substr(brace + 1, series.size() - brace - 2);
  std::regex label(R"re([a-z_]+="[^"]*")re");
  for (std::sregex_iterator it(inside.begin(), inside.end(), label), end; it != end; ++it)
    labels.insert(it->str());
  std::string out = series.substr(0, brace) + "{";
  for (const std::string& l : labels) out += (out.back() == '{' ? "" : ",") + l;
  return out + "}";
}

// GET http://127.0.0.1:port/path with HTTP/1.0, so the server closes when it is done.
Scrape scrape(int port, const std::string& path = "/metrics") {
  Scrape s;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) != 0) {
    ADD_FAILURE() << "cannot connect to 127.0.0.1:" << port << ": " << strerror(errno);
    close(fd);
    return s;
  }
  std::string request = "GET " + path + " HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n";
  EXPECT_EQ(send(fd, request.data(), request.size(), MSG_NOSIGNAL),
            static_cast<ssize_t>(request.size()));
  std::string response;
  char buffer[4096];
  for (ssize_t n; (n = recv(fd, buffer, sizeof buffer, 0)) > 0;) response.append(buffer, n);
  close(fd);
  std::sscanf(response.c_str(), "HTTP/1.%*d %d", &s.status);
  auto end = response.find("\r\n\r\n");
  s.body = end == std::string::npos ? "" : response.substr(end + 4);
  if (s.status != 200) return s;
  std::istringstream lines(s.body);
  for (std::string line; std::getline(lines, line);) {
    std::istringstream words(line);
    std::string a, b, name, kind;
    if (line.rfind("# TYPE ", 0) == 0) {
      words >> a >> b >> name >> kind;
      s.type[name] = kind;
    } else if (line.rfind("# HELP ", 0) == 0) {
      words >> a >> b >> name;
      s.help.insert(name);
    } else if (!line.empty() && line[0] != '#') {
      s.series[canonical(line.substr(0, line.rfind(' ')))] =
          std::stod(line.substr(line.rfind(' ')));
    }
  }
  return s;
}

std::string rank(const std::string& name, int r, int local) {
  return name + "{local_rank=\"" + std::to_string(local) + "\",node=\"node-a\",rank=\"" +
         std::to_string(r) + "\"}";
}
std::string job(const std::string& name) { return name + "{node=\"node-a\"}"; }

MetricsOptions loopback() {
  MetricsOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  o.node = "node-a";
  return o;
}

std::vector<RankMetrics> twoRanks() {
  RankMetrics a;
  a.rank = 4;
  a.local_rank = 0;
  a.step = 120;
  a.step_seconds = 0.25;
  a.cpu_percent = 95;
  a.rss_bytes = 3'000'000'000;
  a.gpu_util_percent = 87;
  a.gpu_memory_bytes = 40'000'000'000;
  RankMetrics b;  // no step time yet, no GPU, process gone
  b.rank = 5;
  b.local_rank = 1;
  b.alive = false;
  b.cpu_percent = 250;
  b.rss_bytes = 1'000'000;
  return {a, b};
}

double now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

TEST(Metrics, ServesEachRanksFiguresWithNodeRankAndLocalRank) {
  MetricsExporter exporter(loopback());
  ASSERT_GT(exporter.port(), 0);
  exporter.setJob({/*attempt=*/2, /*world_size=*/8, /*max_restarts=*/3});
  double before = now();
  exporter.update(twoRanks());
  double after = now();
  Scrape s = scrape(exporter.port());
  ASSERT_EQ(s.status, 200) << s.body;

  EXPECT_EQ(s.at(rank("ddpl_rank_step", 4, 0)), 120);
  EXPECT_EQ(s.at(rank("ddpl_rank_step_duration_seconds", 4, 0)), 0.25);
  EXPECT_DOUBLE_EQ(s.at(rank("ddpl_rank_cpu_usage_ratio", 4, 0)), 0.95);
  EXPECT_EQ(s.at(rank("ddpl_rank_resident_memory_bytes", 4, 0)), 3e9);
  EXPECT_DOUBLE_EQ(s.at(rank("ddpl_rank_gpu_utilization_ratio", 4, 0)), 0.87);
  EXPECT_EQ(s.at(rank("ddpl_rank_gpu_memory_bytes", 4, 0)), 4e10);
  EXPECT_EQ(s.at(rank("ddpl_rank_hang_events_total", 4, 0)), 0);
  EXPECT_EQ(s.at(rank("ddpl_rank_straggler_events_total", 4, 0)), 0);

  // Unknown figures are absent, not 0.
  EXPECT_EQ(s.at(rank("ddpl_rank_step", 5, 1)), 0);
  EXPECT_DOUBLE_EQ(s.at(rank("ddpl_rank_cpu_usage_ratio", 5, 1)), 2.5);
  EXPECT_FALSE(s.has(rank("ddpl_rank_step_duration_seconds", 5, 1)));
  EXPECT_FALSE(s.has(rank("ddpl_rank_gpu_utilization_ratio", 5, 1)));
  EXPECT_FALSE(s.has(rank("ddpl_rank_gpu_memory_bytes", 5, 1)));

  EXPECT_EQ(s.at(job("ddpl_restarts_total")), 0);
  EXPECT_EQ(s.at(job("ddpl_attempt")), 2);
  EXPECT_EQ(s.at(job("ddpl_world_size")), 8);
  EXPECT_EQ(s.at(job("ddpl_max_restarts")), 3);
  EXPECT_EQ(s.at(job("ddpl_local_ranks_alive")), 1);
  double updated = s.at(job("ddpl_last_update_timestamp_seconds"));
  EXPECT_GE(updated, before - 0.001);  // printed with limited precision
  EXPECT_LE(updated, after + 0.001);

  for (const auto& [name, kind] : s.type) {
    if (name.rfind("ddpl_", 0) != 0) continue;
    bool is_counter = name.size() > 6 && name.compare(name.size() - 6, 6, "_total") == 0;
    EXPECT_EQ(kind, is_counter ? "counter" : "gauge") << name;
    EXPECT_TRUE(s.help.count(name)) << name << " has no HELP";
  }
}

// docs/monitoring.md is what users build dashboards from: every series served is documented
// there, and everything documented is served.
TEST(Metrics, TheDocumentedNamesAreTheServedOnes) {
  std::string doc = ddpl::testing::readFile(std::string(DDPL_SOURCE_DIR) + "/docs/monitoring.md");
  std::set<std::string> documented;
  std::regex row(R"(\n\| `(ddpl_[a-z_]+)` \| (gauge|counter) \|)");
  std::map<std::string, std::string> documented_type;
  for (std::sregex_iterator it(doc.begin(), doc.end(), row), end; it != end; ++it) {
    documented.insert((*it)[1]);
    documented_type[(*it)[1]] = (*it)[2];
  }
  MetricsExporter exporter(loopback());
  exporter.update(twoRanks());  // every optional figure known for rank 4
  Scrape s = scrape(exporter.port());
  std::set<std::string> served;
  for (const auto& [name, kind] : s.type) {
    if (name.rfind("ddpl_", 0) != 0) continue;  // prometheus-cpp's own exposer_*
    served.insert(name);
    EXPECT_EQ(documented_type[name], kind) << name;
  }
  EXPECT_EQ(served, documented);
}

TEST(Metrics, LaterUpdatesChangeValuesAndDropWhatIsGone) {
  MetricsExporter exporter(loopback());
  exporter.update(twoRanks());
  exporter.onHang(5, 1);

  auto ranks = twoRanks();
  ranks[0].step = 121;
  ranks[0].step_seconds = 0.5;
  ranks[0].gpu_util_percent.reset();  // NVML stopped answering
  ranks[1].step = 7;
  ranks[1].gpu_memory_bytes = 1234;
  exporter.update(ranks);
  Scrape s = scrape(exporter.port());
  EXPECT_EQ(s.at(rank("ddpl_rank_step", 4, 0)), 121);
  EXPECT_EQ(s.at(rank("ddpl_rank_step_duration_seconds", 4, 0)), 0.5);
  EXPECT_FALSE(s.has(rank("ddpl_rank_gpu_utilization_ratio", 4, 0)));
  EXPECT_EQ(s.at(rank("ddpl_rank_gpu_memory_bytes", 4, 0)), 4e10);
  EXPECT_EQ(s.at(rank("ddpl_rank_step", 5, 1)), 7);
  EXPECT_EQ(s.at(rank("ddpl_rank_gpu_memory_bytes", 5, 1)), 1234);

  // Rank 5 leaves (an elastic re-formation gave this node one rank): its gauges go, its
  // counts stay.
  exporter.update({ranks[0]});
  s = scrape(exporter.port());
  EXPECT_EQ(s.at(rank("ddpl_rank_step", 4, 0)), 121);
  for (const char* gauge : {"ddpl_rank_step", "ddpl_rank_cpu_usage_ratio",
                            "ddpl_rank_resident_memory_bytes", "ddpl_rank_gpu_memory_bytes"})
    EXPECT_FALSE(s.has(rank(gauge, 5, 1))) << gauge;
  EXPECT_EQ(s.at(rank("ddpl_rank_hang_events_total", 5, 1)), 1);
  EXPECT_EQ(s.at(job("ddpl_local_ranks_alive")), 1);
}

TEST(Metrics, HangStragglerAndRestartEventsCount) {
  MetricsExporter exporter(loopback());
  exporter.update(twoRanks());
  exporter.onHang(4, 0);
  exporter.onStraggler(5, 1);
  exporter.onRestart();
  exporter.update({});  // between attempts: no rank running
  exporter.onHang(4, 0);
  exporter.onRestart();
  exporter.onStraggler(9, 2);  // a rank never in an update still counts
  Scrape s = scrape(exporter.port());
  EXPECT_EQ(s.at(rank("ddpl_rank_hang_events_total", 4, 0)), 2);
  EXPECT_EQ(s.at(rank("ddpl_rank_hang_events_total", 5, 1)), 0);
  EXPECT_EQ(s.at(rank("ddpl_rank_straggler_events_total", 5, 1)), 1);
  EXPECT_EQ(s.at(rank("ddpl_rank_straggler_events_total", 9, 2)), 1);
  EXPECT_EQ(s.at(rank("ddpl_rank_straggler_events_total", 4, 0)), 0);
  EXPECT_EQ(s.at(job("ddpl_restarts_total")), 2);
  EXPECT_FALSE(s.has(rank("ddpl_rank_step", 4, 0)));
  EXPECT_EQ(s.at(job("ddpl_local_ranks_alive")), 0);
}

TEST(Metrics, APortInUseNamesHostPortAndWhy) {
  MetricsExporter first(loopback());
  MetricsOptions same = loopback();
  same.port = first.port();
  try {
    MetricsExporter second(same);
    FAIL() << "two endpoints on 127.0.0.1:" << same.port;
  } catch (const ddpl::NetworkError& e) {
    std::string p = std::to_string(same.port);
    EXPECT_THAT(e.what(), HasSubstr("metrics endpoint cannot listen on 127.0.0.1:" + p + ": "));
    EXPECT_THAT(e.what(), HasSubstr("Address already in use"));
  }
  EXPECT_EQ(scrape(first.port()).status, 200);  // the first one is undisturbed

  // IPv6 (issue 33: it was refused): served through launch's relay, and a port in use there is
  // said the same way. (A scrape over [::1]: LaunchHardening.MetricsOnIpv6Loopback.)
  MetricsOptions v6 = loopback();
  v6.host = "::1";
  MetricsExporter first6(v6);
  ASSERT_GT(first6.port(), 0);
  v6.port = first6.port();
  try {
    MetricsExporter second6(v6);
    FAIL() << "two endpoints on [::1]:" << v6.port;
  } catch (const ddpl::NetworkError& e) {
    std::string p = std::to_string(v6.port);
    EXPECT_THAT(e.what(), HasSubstr("metrics endpoint cannot listen on [::1]:" + p + ": "));
    EXPECT_THAT(e.what(), HasSubstr("Address already in use"));
  }
}

TEST(Metrics, BadOptionsAreRefusedWithTheirNumbers) {
  MetricsOptions o = loopback();
  o.port = 70000;
  EXPECT_THROW(
      try { MetricsExporter{o}; } catch (const ddpl::InvalidArgument& e) {
        EXPECT_STREQ(e.what(), "metrics port 70000 is not in 0-65535");
        throw;
      },
      ddpl::InvalidArgument);
  o = loopback();
  o.threads = 0;
  EXPECT_THROW(MetricsExporter{o}, ddpl::InvalidArgument);
  o = loopback();
  o.host = "no-such-host.invalid";
  try {
    MetricsExporter exporter(o);
    FAIL() << "listening on a name that does not resolve";
  } catch (const ddpl::NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr("metrics endpoint cannot listen on no-such-host.invalid:0: "
                                    "cannot resolve 'no-such-host.invalid' to an IPv4 address: "));
  }
}

TEST(Metrics, AHostNameAndEveryInterfaceServeToo) {
  MetricsOptions named = loopback();
  named.host = "localhost";
  MetricsExporter a(named);
  MetricsOptions any = loopback();
  any.host = kDefaultMetricsHost;
  MetricsExporter b(any);
  MetricsOptions empty = loopback();
  empty.host = "";
  MetricsExporter c(empty);
  EXPECT_NE(a.port(), b.port());
  EXPECT_EQ(scrape(a.port()).status, 200);
  EXPECT_EQ(scrape(b.port()).status, 200);
  EXPECT_EQ(scrape(c.port()).status, 200);
  EXPECT_EQ(scrape(b.port(), "/elsewhere").status, 404);
}

// Workers are forked from the agent: a listening socket they inherited would keep the port
// (and a scrape target) alive after the agent is gone.
TEST(Metrics, WorkersInheritNoSocket) {
  MetricsExporter exporter(loopback());
  int sockets = 0;
  DIR* d = opendir("/proc/self/fd");
  ASSERT_TRUE(d);
  while (dirent* e = readdir(d)) {
    std::string link(256, '\0');
    std::string path = std::string("/proc/self/fd/") + e->d_name;
    ssize_t n = readlink(path.c_str(), link.data(), link.size());
    if (n <= 0 || link.compare(0, 7, "socket:") != 0) continue;
    int fd = std::atoi(e->d_name);
    ++sockets;
    EXPECT_TRUE(fcntl(fd, F_GETFD) & FD_CLOEXEC) << "socket fd " << fd << " is inherited";
  }
  closedir(d);
  EXPECT_GE(sockets, 1);
}

// The agent's exit waits for the server to stop: civetweb alone waits out its listener's poll,
// which a scrape has just begun again, and so took 1.7-2 s after every scrape. Judged by the
// fastest of three stops: a civetweb left to its poll is slow every time, however quiet the
// machine, while a stop descheduled under load is one slow stop, not three.
TEST(Metrics, StopsAtOnce) {
  std::vector<double> took_ms;
  for (int i = 0; i < 3; ++i) {
    auto exporter = std::make_unique<MetricsExporter>(loopback());
    int port = exporter->port();
    EXPECT_EQ(scrape(port).status, 200);
    auto start = std::chrono::steady_clock::now();
    exporter.reset();
    took_ms.push_back(
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
            .count());
    // And the port is free again.
    MetricsOptions again = loopback();
    again.port = port;
    EXPECT_NO_THROW(MetricsExporter{again});
  }
  EXPECT_LT(*std::min_element(took_ms.begin(), took_ms.end()), 500)
      << "stops took " << std::lround(took_ms[0]) << ", " << std::lround(took_ms[1]) << " and "
      << std::lround(took_ms[2]) << " ms";
}

TEST(Metrics, ScrapesWhileTheAgentUpdates) {
  MetricsExporter exporter(loopback());
  std::atomic<bool> stop{false};
  std::thread agent([&] {
    for (uint64_t step = 1; !stop; ++step) {
      auto ranks = twoRanks();
      ranks[0].step = step;
      if (step % 2)
        ranks.pop_back();  // rank 5 comes and goes
      else
        ranks[1].gpu_memory_bytes = 1;
      exporter.update(ranks);
      if (step % 7 == 0) exporter.onHang(5, 1);
    }
  });
  double last_step = 0;
  for (int i = 0; i < 20; ++i) {
    Scrape s = scrape(exporter.port());
    ASSERT_EQ(s.status, 200);
    double step = s.has(rank("ddpl_rank_step", 4, 0)) ? s.at(rank("ddpl_rank_step", 4, 0)) : 0;
    EXPECT_GE(step, last_step);
    last_step = step;
  }
  stop = true;
  agent.join();
  EXPECT_GT(last_step, 0);
}

}  // namespace

// End to end: a real `launch --metrics-port 0` of two Python ranks that report steps, on a
// "GPU machine" (the fake NVML, found the way the real one is: libnvidia-ml.so.1 on the
// loader's path) where each rank's process holds memory on a GPU of its own. The scrape shows
// each rank's steps, CPU, memory and GPU figures; the plain log line shows the GPU figures too.
TEST(MetricsEndToEnd, LaunchServesEachRanksFiguresWithGpusFromNvml) {
  std::string dir = ddpl::testing::makeTempDir("metrics-e2e");
  std::string config = dir + "/nvml.conf";
  std::ofstream(config) << "driver_version 550.54.15\ncuda_driver_version 12040\n"
                        << "device_count 2\n"
                        << "gpu0.name NVIDIA H200\ngpu0.utilization 40 10\n"
                        << "gpu0.memory 150000000000 2000000000\n"
                        << "gpu0.process env:LOCAL_RANK=0 1073741824\n"
                        << "gpu1.name NVIDIA H200\ngpu1.utilization 70 20\n"
                        << "gpu1.memory 150000000000 3000000000\n"
                        << "gpu1.process env:LOCAL_RANK=1 2147483648\n";
  std::string fake_dir = std::string(FAKE_NVML);
  fake_dir = fake_dir.substr(0, fake_dir.rfind('/'));
  ddpl::testing::RunOptions o;
  o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"LINES", "60"}, {"STEP_SECONDS", "0.1"},
           {"FAKE_NVML_CONFIG", config}, {"LD_LIBRARY_PATH", fake_dir}};
  ddpl::testing::Background bg(
      {std::string(DDPL_BIN_DIR) + "/launch", "--nproc-per-node=2", "--metrics-port=0",
       "--metrics-host=127.0.0.1", "--monitor=log", "--monitor-log-interval=1",
       std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/chatty_beats.py"},
      o);
  std::smatch m;
  std::string out;
  std::regex announced(R"(metrics of this node's ranks on http://127\.0\.0\.1:(\d+)/metrics)");
  ASSERT_TRUE(ddpl::testing::eventually([&] {
    out = bg.outputSoFar();
    return std::regex_search(out, m, announced);
  }, std::chrono::seconds(30))) << out;
  int port = std::stoi(m[1]);
  auto series = [&](const std::string& name, int r) {
    return name + "{local_rank=\"" + std::to_string(r) + "\",node=\"" + ddpl::log::hostname() +
           "\",rank=\"" + std::to_string(r) + "\"}";
  };
  Scrape s;
  ASSERT_TRUE(ddpl::testing::eventually([&] {
    s = scrape(port);
    // Each rank's own figures: under load rank 0 may have no step time yet when rank 1 has 5.
    return s.has(series("ddpl_rank_step", 1)) && s.at(series("ddpl_rank_step", 1)) >= 5 &&
           s.has(series("ddpl_rank_gpu_memory_bytes", 1)) &&
           s.has(series("ddpl_rank_cpu_usage_ratio", 0)) &&
           s.has(series("ddpl_rank_step_duration_seconds", 0));
  }, std::chrono::seconds(30))) << s.body;
  EXPECT_EQ(s.at(series("ddpl_rank_gpu_memory_bytes", 0)), 1073741824);
  EXPECT_EQ(s.at(series("ddpl_rank_gpu_memory_bytes", 1)), 2147483648);
  EXPECT_DOUBLE_EQ(s.at(series("ddpl_rank_gpu_utilization_ratio", 0)), 0.40);
  EXPECT_DOUBLE_EQ(s.at(series("ddpl_rank_gpu_utilization_ratio", 1)), 0.70);
  EXPECT_GT(s.at(series("ddpl_rank_resident_memory_bytes", 0)), 1e6);
  EXPECT_GT(s.at(series("ddpl_rank_step_duration_seconds", 0)), 0.05);
  EXPECT_EQ(s.at("ddpl_world_size{node=\"" + ddpl::log::hostname() + "\"}"), 2);
  auto r = bg.wait(std::chrono::seconds(60));
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_THAT(r.err, HasSubstr("; gpu% 40 70; gpu mem 1.0GiB 2.0GiB"));
  // The end-of-run summary has the GPU columns: 40% and 1.0GiB for rank 0.
  EXPECT_THAT(r.err, HasSubstr("peak GPU mem"));
  EXPECT_TRUE(std::regex_search(r.err, std::regex(R"(\n +0 +0 .* 40% +1\.0GiB\n)"))) << r.err;
  std::filesystem::remove_all(dir);
}
