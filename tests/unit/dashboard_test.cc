// The dashboard's model (what GET /api/job says, within its bounds) and its server's access
// rules, over HTTP on loopback. The page in a browser and a real job: tests/dashboard/.
#include "web/dashboard.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>
#include <string>

#include "web/dashboard_model.h"

using namespace ddpl::web;
using nlohmann::json;

namespace {

DashboardRank rank(int g, double step_ms, std::string state = "training") {
  DashboardRank r;
  r.node = "n0";
  r.global_rank = g;
  r.local_rank = g;
  r.step = 10;
  r.step_ms = step_ms;
  r.state = std::move(state);
  return r;
}

TEST(DashboardModel, RanksSeriesAndEventsAsThePageReadsThem) {
  DashboardModel m;
  DashboardJob job;
  job.run_id = "job7";
  job.world_size = 2;
  job.steps_per_sec = 2.5;
  m.sample(job, {rank(0, 100), rank(1, 300, "straggling")}, 1000);
  m.event(1000.5, "restart", "restart 1 of 3");
  m.sample(job, {rank(0, 110)}, 1001);  // rank 1 gone (a re-formation)
  json j = json::parse(m.json(1001.2));
  EXPECT_EQ(j["version"], 1);
  EXPECT_EQ(j["job"]["run_id"], "job7");
  EXPECT_DOUBLE_EQ(j["job"]["now"].get<double>(), 1001.2);
  ASSERT_EQ(j["ranks"].size(), 1u);
  EXPECT_EQ(j["series"]["t"], json({1000, 1001}));
  EXPECT_EQ(j["series"]["step_ms"]["0"], json({100, 110}));
  EXPECT_EQ(j["series"]["step_ms"]["1"], json({300, nullptr})) << "same length as t";
  EXPECT_TRUE(j["ranks"][0]["gpu_util_percent"].is_null()) << "unknown is null, not 0";
  EXPECT_EQ(j["events"][0]["kind"], "restart");
  EXPECT_TRUE(j["summary"].is_null());
  EXPECT_TRUE(j["incidents"].is_null());
  EXPECT_TRUE(j["stacks"].is_null());
}

// Issue 48: the incident table (launcher/warm/restart_phases.h's incidentTable), its own text
// in the JSON beside the summary, replaced as rows complete, bounded and masked like it.
TEST(DashboardModel, TheIncidentTableIsItsOwnBoundedText) {
  DashboardModel m;
  const std::string table =
      "where each lost second went (...):\n  # detect cause\n  1 0.12   rank 1 (local rank 1) "
      "signal 9 (SIGKILL)\n  totals: 1 incident, 0.50s lost";
  m.setIncidents(table);
  m.setSummary("per-rank summary");
  json j = json::parse(m.json(1));
  EXPECT_EQ(j["incidents"], table);
  EXPECT_EQ(j["summary"], "per-rank summary");
  m.setIncidents("two rows now");
  EXPECT_EQ(json::parse(m.json(2))["incidents"], "two rows now");
  m.setIncidents(std::string(1 << 20, 'r') + " --token=abcdef");
  EXPECT_LE(json::parse(m.json(3))["incidents"].get<std::string>().size(),
            DashboardModel::kMaxTextBytes + 3);
  m.setIncidents("cause: round ended: --password=hunter2");
  EXPECT_EQ(json::parse(m.json(4))["incidents"].get<std::string>().find("hunter2"),
            std::string::npos);
}

TEST(DashboardModel, EverythingItKeepsIsBounded) {
  DashboardModel m;
  DashboardJob job;
  for (int i = 0; i < 2000; ++i) {
    DashboardRank r = rank(i % 3 == 0 ? 0 : 1000 + i, 1);  // ranks that come and go
    r.last_line = std::string(5000, 'x');
    m.sample(job, {r}, i);
    m.event(i, "exit", std::string(5000, 'y'));
  }
  m.setStacks(1, "hang", std::string(1 << 20, 'z'));
  json j = json::parse(m.json(2000));
  EXPECT_EQ(j["series"]["t"].size(), DashboardModel::kMaxSamples);
  EXPECT_LE(j["series"]["step_ms"].size(), DashboardModel::kMaxSamples + 1);
  for (auto& [k, v] : j["series"]["step_ms"].items())
    EXPECT_EQ(v.size(), DashboardModel::kMaxSamples) << k;
  EXPECT_EQ(j["events"].size(), DashboardModel::kMaxEvents);
  EXPECT_LE(j["ranks"][0]["last_line"].get<std::string>().size(),
            DashboardModel::kMaxLineBytes + 3);
  EXPECT_LE(j["stacks"]["text"].get<std::string>().size(), DashboardModel::kMaxTextBytes + 3);
}

TEST(DashboardModel, WorkerOutputThatIsNotUtf8DoesNotBreakTheJson) {
  DashboardModel m;
  DashboardRank r = rank(0, 1);
  r.last_line = "bad \xff\xfe bytes and \"quotes\" <script>";
  m.sample({}, {r}, 1);
  json j = json::parse(m.json(1));
  EXPECT_NE(j["ranks"][0]["last_line"].get<std::string>().find("<script>"), std::string::npos);
  EXPECT_EQ(cutUtf8("h\xC3\xA9llo", 2), "h\xE2\x80\xA6") << "never half a character";
}

TEST(DashboardAccess, LoopbackAndBearer) {
  EXPECT_TRUE(isLoopbackAddress("127.0.0.1"));
  EXPECT_TRUE(isLoopbackAddress("127.3.2.1"));
  EXPECT_TRUE(isLoopbackAddress("::1"));
  EXPECT_TRUE(isLoopbackAddress("::ffff:127.0.0.1"));
  EXPECT_FALSE(isLoopbackAddress("10.0.0.1"));
  EXPECT_FALSE(isLoopbackAddress("::ffff:10.0.0.1"));
  EXPECT_FALSE(isLoopbackAddress("garbage"));
  EXPECT_TRUE(bearerMatches("Bearer abc123", "abc123"));
  EXPECT_TRUE(bearerMatches("bearer abc123", "abc123"));
  EXPECT_FALSE(bearerMatches("Bearer abc12", "abc123"));
  EXPECT_FALSE(bearerMatches("Bearer abc1234", "abc123"));
  EXPECT_FALSE(bearerMatches("Basic abc123", "abc123"));
  EXPECT_FALSE(bearerMatches(nullptr, "abc123"));
  EXPECT_FALSE(bearerMatches("Bearer ", ""));
}

struct Reply {
  int status = 0;
  std::string body;
};

Reply http(int port, const std::string& request) {
  Reply r;
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  timeval timeout{10, 0};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &timeout, sizeof timeout);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(static_cast<uint16_t>(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    close(fd);
    return r;
  }
  (void)!write(fd, request.data(), request.size());
  std::string all;
  char buf[4096];
  for (ssize_t n; (n = read(fd, buf, sizeof buf)) > 0;) all.append(buf, static_cast<size_t>(n));
  close(fd);
  if (all.rfind("HTTP/1.1 ", 0) == 0) r.status = std::stoi(all.substr(9, 3));
  auto body = all.find("\r\n\r\n");
  if (body != std::string::npos) r.body = all.substr(body + 4);
  return r;
}

Reply get(int port, const std::string& path, const std::string& extra = "") {
  return http(port, "GET " + path + " HTTP/1.1\r\nHost: x\r\n" + extra + "\r\n");
}

TEST(DashboardServer, ServesThePageTheJsonAndTheLogsAndGuardsTheStacks) {
  DashboardOptions o;
  o.token = "s3cret";
  std::unique_ptr<DashboardEndpoint> d(newDashboard(
      o, [](int rank) { return std::vector<std::string>{"line of " + std::to_string(rank)}; }));
  ASSERT_GT(d->port(), 0);
  Reply page = get(d->port(), "/");
  EXPECT_EQ(page.status, 200);
  EXPECT_NE(page.body.find("<canvas"), std::string::npos);
  EXPECT_NE(page.body.find("D.incidents"), std::string::npos) << "the incident table's <pre>";
  EXPECT_EQ(get(d->port(), "/etc/passwd").status, 404);
  EXPECT_EQ(get(d->port(), "/api/job").body, "{}");
  d->publish(R"({"version":1})");
  EXPECT_EQ(get(d->port(), "/api/job").body, R"({"version":1})");
  Reply logs = get(d->port(), "/api/logs?rank=3");
  EXPECT_EQ(logs.status, 200);
  EXPECT_EQ(json::parse(logs.body)["lines"][0], "line of 3");
  for (const char* bad :
       {"/api/logs", "/api/logs?rank=-1", "/api/logs?rank=x", "/api/logs?rank=99999999999"})
    EXPECT_EQ(get(d->port(), bad).status, 400) << bad;
  // Changing anything needs the token, even from loopback.
  auto post = [&](const std::string& extra) {
    return http(d->port(),
                "POST /api/stacks HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n" + extra + "\r\n");
  };
  Reply refused = post("");
  EXPECT_EQ(refused.status, 401);
  EXPECT_NE(refused.body.find("token"), std::string::npos);
  EXPECT_EQ(post("Authorization: Bearer wrong\r\n").status, 401);
  EXPECT_FALSE(d->takeStacksRequest());
  EXPECT_EQ(post("Authorization: Bearer s3cret\r\n").status, 202);
  EXPECT_TRUE(d->takeStacksRequest());
  EXPECT_FALSE(d->takeStacksRequest()) << "one answer per request";
  EXPECT_EQ(get(d->port(), "/api/stacks").status, 405);
}

TEST(DashboardServer, APortInUseOrABadHostSaysWhich) {
  DashboardOptions o;
  o.token = "t";
  std::unique_ptr<DashboardEndpoint> first(newDashboard(o, {}));
  o.port = first->port();
  try {
    std::unique_ptr<DashboardEndpoint> second(newDashboard(o, {}));
    FAIL() << "two dashboards on one port";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(o.port)), std::string::npos)
        << e.what();
  }
  o.port = 0;
  o.host = "no-such-host.invalid";
  EXPECT_THROW(std::unique_ptr<DashboardEndpoint>(newDashboard(o, {})), std::exception);
  o.host = "127.0.0.1";
  o.token = "";
  EXPECT_THROW(std::unique_ptr<DashboardEndpoint>(newDashboard(o, {})), std::exception);
}

}  // namespace

namespace {

TEST(DashboardModel, TextsAreMaskedAsAManifestIs) {
  DashboardModel m;
  DashboardRank r = rank(0, 1);
  r.last_line = "train.py --api-key=k1 --db-password hunter2 DB_PASSWORD=x  two  spaces";
  m.sample({}, {r}, 1);
  m.setStacks(1, "on demand",
              "Process 12: python train.py --token abc\nfetch https://u:pw@h/x\nPATH=/usr/bin");
  json j = json::parse(m.json(1));
  EXPECT_EQ(j["ranks"][0]["last_line"],
            "train.py --api-key=<masked> --db-password <masked> DB_PASSWORD=<masked>  two  spaces");
  EXPECT_EQ(j["stacks"]["text"],
            "Process 12: python train.py --token <masked>\nfetch https://u:<masked>@h/x\n"
            "PATH=/usr/bin");
}

}  // namespace

namespace {

TEST(DashboardModel, RowsFromAnotherNodeAreCheckedBeforeTheyAreShown) {
  DashboardRank r = rank(5, 80, "straggling");
  r.node_rank = 1;
  r.gpu_util_percent = 40;
  auto back = decodeRanks(encodeRanks({r}));
  ASSERT_EQ(back.size(), 1u);
  EXPECT_EQ(back[0].global_rank, 5);
  EXPECT_EQ(back[0].node_rank, 1);
  EXPECT_EQ(back[0].state, "straggling");
  EXPECT_DOUBLE_EQ(*back[0].step_ms, 80);
  EXPECT_DOUBLE_EQ(*back[0].gpu_util_percent, 40);
  // Out of range: the figure is unknown; a row without its ranks, or not JSON: nothing.
  auto odd = decodeRanks(R"([{"global_rank":1,"local_rank":0,"node_rank":1,"gpu_util_percent":900,
                               "step_ms":-4,"state":"<script>","last_line":7}])");
  ASSERT_EQ(odd.size(), 1u);
  EXPECT_FALSE(odd[0].gpu_util_percent.has_value());
  EXPECT_FALSE(odd[0].step_ms.has_value());
  EXPECT_EQ(odd[0].state, "starting");
  EXPECT_EQ(odd[0].last_line, "");
  EXPECT_TRUE(decodeRanks(R"([{"global_rank":-1,"local_rank":0,"node_rank":0}])").empty());
  EXPECT_TRUE(decodeRanks("not json").empty());
  EXPECT_TRUE(decodeRanks(R"({"global_rank":1})").empty());
  std::string many = "[";
  for (size_t i = 0; i <= kMaxPeerRanks; ++i)
    many += std::string(i ? "," : "") + R"({"global_rank":1,"local_rank":0,"node_rank":0})";
  EXPECT_TRUE(decodeRanks(many + "]").empty()) << "more rows than a node can have";
}

}  // namespace

namespace {

// Issue 44: a rank's last line "---- epoch 1 ----" (and the failure report's separator lines in
// the summary) made the masking throw, and the exception ended the job. Such text is shown as
// it is, from this node's ranks and another node's rows alike.
TEST(DashboardModel, SeparatorLinesOfDashesAreShownAsTheyAre) {
  DashboardModel m;
  DashboardRank r = rank(0, 1);
  r.last_line = "---- epoch 1 ----";
  DashboardRank peer = rank(1, 1);
  peer.node_rank = 1;
  peer.last_line = "----";
  auto from_peer = decodeRanks(encodeRanks({peer}));
  ASSERT_EQ(from_peer.size(), 1u);
  m.sample({}, {r, from_peer[0]}, 1);
  m.event(1, "exit", "rank 0 ---- exited");
  m.setSummary(
      "------------------------------------------------------------\n"
      "Root Cause (first observed failure):\n----\n");
  m.setStacks(1, "on demand", "---\n--- --- ---");
  json j = json::parse(m.json(1));
  EXPECT_EQ(j["ranks"][0]["last_line"], "---- epoch 1 ----");
  EXPECT_EQ(j["ranks"][1]["last_line"], "----");
  EXPECT_EQ(j["events"][0]["text"], "rank 0 ---- exited");
  EXPECT_EQ(j["summary"],
            "------------------------------------------------------------\n"
            "Root Cause (first observed failure):\n----\n");
  EXPECT_EQ(j["stacks"]["text"], "---\n--- --- ---");
}

}  // namespace
