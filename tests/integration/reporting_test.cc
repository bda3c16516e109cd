// Issue 44: what only reports (the dashboard, the live view, the metrics, the summary, the
// manifest) never ends a job or changes its exit code. First the real `launch` with --dashboard
// and workers that print separator lines (which ended such jobs with exit 1 and no report), then
// the agent itself with reporting parts that throw: a manifest written where it cannot be, and a
// rendezvous whose status publication fails.
#include <gtest/gtest.h>
#include <spdlog/sinks/ostream_sink.h>

#include <csignal>
#include <filesystem>
#include <regex>
#include <sstream>

#include "common/errors.h"
#include "common/log.h"
#include "launcher/agent/agent.h"
#include "launcher/doctor/manifest.h"
#include "launcher/membership/local_rendezvous.h"
#include "tests/common/subprocess.h"

using namespace ddpl::launcher;
using namespace ddpl::testing;
using namespace std::chrono_literals;

namespace {

const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";

RunResult launch(std::vector<std::string> args) {
  args.insert(args.begin(), kLaunch);
  RunOptions o;
  o.timeout = 60s;
  return run(args, o);
}

// launch's metrics and dashboard plugin: a bare GPU host's build may lack it.
bool haveDashboard() {
  return std::filesystem::exists(std::string(DDPL_BIN_DIR) + "/../lib/libddpl_launch_metrics.so");
}

int count(const std::string& text, const std::string& needle) {
  int n = 0;
  for (size_t at = text.find(needle); at != std::string::npos; at = text.find(needle, at + 1)) ++n;
  return n;
}

// The command of the issue: three epochs, each announced by a line of dashes, while the
// dashboard samples each rank's last line twice a second.
TEST(DashboardJob, WorkerLinesOfDashesDoNotEndTheJob) {
  if (!haveDashboard()) GTEST_SKIP() << "launch was built without its dashboard plugin";
  auto r =
      launch({"--standalone", "--nproc-per-node=1", "--dashboard=127.0.0.1:0", "--no-python",
              "/bin/sh", "-c", "for i in 1 2 3; do echo \"---- epoch $i ----\"; sleep 1; done"});
  EXPECT_EQ(r.exit_code, 0) << r.all();
  EXPECT_NE(r.err.find("dashboard of the job on http://127.0.0.1:"), std::string::npos) << r.err;
  EXPECT_NE(r.out.find("---- epoch 3 ----"), std::string::npos) << r.out;
  EXPECT_EQ(r.err.find("[error]"), std::string::npos) << r.err;
  EXPECT_FALSE(std::regex_search(
      r.err, std::regex("the (dashboard|live view|metrics endpoint|end-of-run summary) failed")))
      << r.err;
}

// The failure report goes to the page before stderr; its separator lines ended launch there,
// with exit 1 instead of the worker's code and no report at all.
TEST(DashboardJob, AFailingWorkersCodeAndReportSurviveTheDashboard) {
  if (!haveDashboard()) GTEST_SKIP() << "launch was built without its dashboard plugin";
  auto r = launch({"--standalone", "--nproc-per-node=1", "--dashboard=127.0.0.1:0", "--no-python",
                   "/bin/sh", "-c", "echo ----; echo ---- >&2; exit 3"});
  EXPECT_EQ(r.exit_code, 3) << r.all();
  EXPECT_NE(r.err.find("Root Cause (first observed failure):"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("exitcode  : 3"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("    ----\n"), std::string::npos) << "the stderr tail in the report\n"
                                                         << r.err;
}

// ---- The agent in this process, so that a reporting part can be made to throw.

// A rendezvous of one node whose publication of the node's status (the live view's line for
// the job, HealthBus::publishStatus) fails, as a store that cannot be reached would.
class StatusUnpublishable : public LocalRendezvous {
 public:
  using LocalRendezvous::LocalRendezvous;
  void publishStatus(const std::string&) override {
    ++calls;
    throw ddpl::NetworkError("the job's store cannot be reached (test)");
  }
  int calls = 0;
};

class AgentReporting : public ::testing::Test {
 protected:
  void SetUp() override {
    // As launch's main does before any thread starts.
    blockSignals({SIGINT, SIGTERM, SIGHUP, SIGQUIT});
    ddpl::log::init({"launch", -1, ""}, spdlog::level::info);
    ddpl::log::logger().sinks().push_back(std::make_shared<spdlog::sinks::ostream_sink_mt>(log_));
    dir_ = makeTempDir("reporting_test");
  }
  void TearDown() override { ddpl::log::logger().sinks().pop_back(); }

  AgentConfig config(const std::string& script) {
    AgentConfig c;
    c.options.log_dir = dir_;
    c.options.program = "/bin/sh";
    c.options.monitor_interval_sec = 0.05;
    c.options.checkpoint_memory = 0;  // nothing here needs the tier
    c.nproc = 1;
    c.command = {"/bin/sh", "-c", script};
    c.base_env = {{"PATH", "/usr/bin:/bin"}};
    c.run_id = "reporting";
    c.host = "localhost";
    return c;
  }

  std::string logged() const { return log_.str(); }

  std::ostringstream log_;
  std::string dir_;
};

// The manifest is written after the workers start (main.cc's after-start steps); one that
// cannot be written is said once and the job's code is its worker's. Two of them fail here:
// the second is logged at debug level only.
TEST_F(AgentReporting, AManifestThatCannotBeWrittenIsSaidOnceAndTheExitCodeStays) {
  AgentConfig c = config("sleep 0.5; exit 3");
  ManifestFacts facts;
  facts.command_line = {"launch", "----"};
  int tried = 0;
  for (double at : {0.0, 0.2})
    c.after_start.emplace_back(at, [&] {
      ++tried;
      writeManifest(facts, dir_ + "/no/such/folder/manifest.json");
    });
  LocalRendezvous rdzv("reporting", 1, "127.0.0.1", std::nullopt);
  int code = -1;
  {
    Agent agent(std::move(c), rdzv);
    code = agent.run();
  }
  EXPECT_EQ(code, 3) << logged();
  EXPECT_EQ(tried, 2) << "both steps ran";
  EXPECT_EQ(count(logged(), "a step after the workers' start (the manifest, the preflight) failed"),
            1)
      << logged();
  EXPECT_NE(logged().find("no/such/folder"), std::string::npos) << logged();
}

// The live view publishes the node's status at every update (twice a second here): every one
// throws, one line says so, and the job ends with its worker's code.
TEST_F(AgentReporting, AStatusThatCannotBePublishedIsSaidOnceAndTheExitCodeStays) {
  AgentConfig c = config("sleep 2; exit 5");
  StatusUnpublishable rdzv("reporting", 1, "127.0.0.1", std::nullopt);
  int code = -1;
  {
    Agent agent(std::move(c), rdzv);
    code = agent.run();
  }
  EXPECT_EQ(code, 5) << logged();
  EXPECT_GE(rdzv.calls, 2) << "updates every 0.5 s for 2 s: several failures, one line";
  EXPECT_EQ(count(logged(), "the live view failed: the job's store cannot be reached (test)"), 1)
      << logged();
}

}  // namespace
