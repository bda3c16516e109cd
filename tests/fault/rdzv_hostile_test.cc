// The rendezvous server under hostile clients and a long uptime (issue 11): a Session client
// that never reads its answers, a thousand unauthenticated connections under a 1024-file
// limit, 20,000 runs through one server, and a server restarted under a running job. Every
// server here is a real rdzv-server process (its memory and file descriptors are measured
// from /proc) or an in-process one on loopback port 0; nothing asserts on wall-clock speed.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <thread>

#include "common/errors.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/client/grpc_store.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/protocol/grpc_common.h"
#include "rendezvous/server/server.h"
#include "tests/common/rdzv_server_process.h"
#include "tests/common/subprocess.h"

namespace ddpl::rdzv {
namespace {

namespace fs = std::filesystem;
namespace pb = ::ddpl::rendezvous::v1;
using ::ddpl::testing::eventually;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

const std::string kBin = DDPL_BIN_DIR;

using ::ddpl::testing::count;
using ::ddpl::testing::openFilesOf;
using ::ddpl::testing::rssOf;
using ::ddpl::testing::OpenFilesRaised;
using ::ddpl::testing::ServerProcess;
using ::ddpl::testing::tooFewOpenFiles;

std::unique_ptr<Store> connect(const std::string& endpoint, const std::string& token = "",
                               bool socket = true) {
  GrpcStoreOptions o;
  o.endpoint = endpoint;
  o.token = token;
  o.socket = socket;
  o.connect_timeout = seconds(20);
  return connectGrpcStore(o);
}

// ---- back-pressure -----------------------------------------------------------------------

// The first finding: a client sends gets of a 1 MiB value on one Session stream and
// never reads the answers. The server used to queue every answer (gigabytes in seconds) and
// keep the memory after the client left. Now the stream stops being read once
// --max-stream-queued-bytes of answers wait, so the server's memory stays within that bound
// plus gRPC's own buffers (docs/rendezvous.md, "Limits"), and it is given back when the
// client goes.
TEST(HostileClientTest, SessionClientThatNeverReadsDoesNotGrowTheServer) {
  constexpr int64_t kValue = 1 << 20;
  constexpr int64_t kStreamBound = 8 << 20;
  ServerProcess server({"--max-stream-queued-bytes", std::to_string(kStreamBound),
                        "--max-queued-bytes", std::to_string(32 << 20)});
  auto good = connect(server.endpoint());
  good->set("big", Bytes(kValue, 7));
  good->get("big", seconds(5));
  const int64_t baseline = rssOf(server.pid());
  ASSERT_GT(baseline, 0);

  auto channel = grpc::CreateChannel(server.endpoint(), grpc::InsecureChannelCredentials());
  auto stub = pb::Store::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  std::atomic<int> sent{0};
  constexpr int kGets = 600;  // 600 MiB of answers if the server queued them all
  std::thread writer([&] {
    for (int i = 0; i < kGets; ++i) {
      pb::StoreRequest r;
      r.set_id(static_cast<uint64_t>(i) + 1);
      r.mutable_get()->set_key("big");
      r.mutable_get()->set_timeout_ms(1000);
      if (!stream->Write(r)) return;  // the stream was cancelled below
      ++sent;
    }
  });
  // Wait until the server has read as much as it will: the writer blocks (flow control) or
  // has sent everything, and the server's memory stops moving.
  int64_t peak = baseline;
  int last_sent = -1;
  int still = 0;
  for (int i = 0; i < 600 && still < 25; ++i) {
    std::this_thread::sleep_for(milliseconds(40));
    peak = std::max(peak, rssOf(server.pid()));
    still = sent.load() == last_sent ? still + 1 : 0;
    last_sent = sent.load();
  }
  peak = std::max(peak, rssOf(server.pid()));
  // The documented bound: the stream's queue, the answer in flight, gRPC's buffers (slack).
  const int64_t bound = kStreamBound + 2 * kValue + (64 << 20);
  EXPECT_LT(peak - baseline, bound)
      << fmt::format("server grew by {} MiB (sent {} gets)", (peak - baseline) >> 20, sent.load());
  // Others are still served meanwhile.
  EXPECT_EQ(good->get("big", seconds(5)).size(), static_cast<size_t>(kValue));

  ctx.TryCancel();
  writer.join();
  stream.reset();
  // Back near the baseline once the client is gone.
  EXPECT_TRUE(eventually([&] { return rssOf(server.pid()) - baseline < (24 << 20); }, seconds(20)))
      << fmt::format("server still {} MiB above its baseline",
                     (rssOf(server.pid()) - baseline) >> 20);
}

// The server-wide bound: answers that would pass --max-queued-bytes are refused with
// RESOURCE_EXHAUSTED naming the limit, while the operations themselves ran.
TEST(HostileClientTest, AnswersPastTheServerWideQueueAreRefusedNamingTheLimit) {
  ServerOptions o;
  o.limits.max_stream_queued_bytes = 64 << 20;
  o.limits.max_queued_bytes = 3 << 20;
  RendezvousServer server(o);
  connect(server.endpoint())->set("big", Bytes(1 << 20, 1));
  auto channel = grpc::CreateChannel(server.endpoint(), grpc::InsecureChannelCredentials());
  auto stub = pb::Store::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  for (int i = 1; i <= 12; ++i) {
    pb::StoreRequest r;
    r.set_id(i);
    r.mutable_get()->set_key("big");
    r.mutable_get()->set_timeout_ms(1000);
    ASSERT_TRUE(stream->Write(r));
  }
  ASSERT_TRUE(eventually([&] { return server.stats().refused_for_memory > 0; }, seconds(20)));
  int refused = 0, answered = 0;
  for (int i = 0; i < 12; ++i) {
    pb::StoreResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    if (resp.has_error()) {
      ++refused;
      EXPECT_EQ(resp.error().code(), grpc::RESOURCE_EXHAUSTED);
      EXPECT_THAT(resp.error().message(), HasSubstr("limit 3145728 bytes"));
    } else {
      ++answered;
    }
  }
  EXPECT_GT(refused, 0);
  EXPECT_GT(answered, 0);
  ctx.TryCancel();
  EXPECT_TRUE(eventually([&] { return server.stats().queued_bytes == 0; }));
}

// A stream with too many parked operations stops being read; the rest of the server is not.
TEST(HostileClientTest, UnansweredOperationsPerStreamAreBounded) {
  ServerOptions o;
  o.limits.max_stream_pending = 16;
  RendezvousServer server(o);
  auto channel = grpc::CreateChannel(server.endpoint(), grpc::InsecureChannelCredentials());
  auto stub = pb::Store::NewStub(channel);
  grpc::ClientContext ctx;
  auto stream = stub->Session(&ctx);
  for (int i = 1; i <= 100; ++i) {
    pb::StoreRequest r;
    r.set_id(i);
    r.mutable_wait()->add_keys(fmt::format("never/{}", i));
    r.mutable_wait()->set_timeout_ms(60000);
    ASSERT_TRUE(stream->Write(r));  // small: flow control lets them all through to the server
  }
  ASSERT_TRUE(eventually([&] { return server.stats().parked_store_calls == 16; }));
  std::this_thread::sleep_for(milliseconds(300));
  EXPECT_EQ(server.stats().parked_store_calls, 16) << "read past max_stream_pending";
  EXPECT_GE(server.stats().paused_reads, 1);
  // Keys arriving answer the parked waits, and the stream is read again.
  auto store = connect(server.endpoint());
  for (int i = 1; i <= 100; ++i) store->set(fmt::format("never/{}", i), toBytes("x"));
  for (int i = 0; i < 100; ++i) {
    pb::StoreResponse resp;
    ASSERT_TRUE(stream->Read(&resp));
    EXPECT_TRUE(resp.has_wait()) << resp.DebugString();
  }
  ctx.TryCancel();
}

// ---- unauthenticated connections ---------------------------------------------------------

// A thousand peers without the token complete the HTTP/2 handshake, make one refused call
// each and stay connected. Under a 1024-file limit they used to lock real clients out; now
// the server closes each refused peer at once (its own accept loop keeps a handle on every
// connection; the 30 s idle limit is not what ends them), the refusals are logged a line per
// interval with their count, and a client with the token keeps working throughout.
TEST(HostileClientTest, ThousandUnauthenticatedConnectionsUnder1024FilesLeaveRoomForRealClients) {
  if (auto why = tooFewOpenFiles(2200); !why.empty()) GTEST_SKIP() << why;
  OpenFilesRaised raised(65536);
  ASSERT_TRUE(raised.ok());

  const std::string token = "s3cret-token";
  std::string dir = ::ddpl::testing::makeTempDir("rdzv_token");
  std::ofstream(dir + "/token") << token << "\n";
  ServerProcess server({"--token-file", dir + "/token"}, {"prlimit", "--nofile=1024:1024", "--"});
  // 4,096 connections need 8,256 files: the server says what it can hold instead.
  EXPECT_THAT(server.log(), HasSubstr("the open-file limit is 1024"));
  EXPECT_THAT(server.log(), HasSubstr("it will hold at most 480"));

  // On gRPC, not the store socket: its stream keeps this process's gRPC polling, and that is
  // what reads the close of the refused peers' idle connections for GetState below. (With
  // no gRPC call running here, 115 of them still read READY after 20 s although the
  // server had closed them all.)
  auto good = connect(server.endpoint(), token, /*socket=*/false);
  std::vector<std::shared_ptr<grpc::Channel>> hostile;
  int refused = 0;
  int max_files = 0;
  for (int i = 0; i < 1000; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);  // a connection of its own
    // Reconnecting after the server closes it would hide what is measured here.
    args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 600000);
    args.SetInt(GRPC_ARG_MIN_RECONNECT_BACKOFF_MS, 600000);
    auto ch =
        grpc::CreateCustomChannel(server.endpoint(), grpc::InsecureChannelCredentials(), args);
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(20));
    pb::PingResponse resp;
    if (pb::Store::NewStub(ch)->Ping(&ctx, pb::PingRequest{}, &resp).error_code() ==
        grpc::UNAUTHENTICATED)
      ++refused;
    hostile.push_back(ch);  // kept: the connection stays open from this side
    if (i % 100 == 99) {
      max_files = std::max(max_files, openFilesOf(server.pid()));
      good->set(fmt::format("k{}", i), toBytes("v"));  // the real client is never locked out
    }
  }
  // Every refusal reached its client before the connection was closed.
  EXPECT_EQ(refused, 1000);
  // Closed 0.2 s after the refusal, so only the last few hundred milliseconds' worth are open
  // at a time; before, all 1,000 stayed (1,012 of its 1,024 files) until the idle limit.
  EXPECT_LT(max_files, 600) << "files open in the server while the peers kept connecting";
  EXPECT_TRUE(eventually([&] { return openFilesOf(server.pid()) < 100; }, seconds(5)))
      << openFilesOf(server.pid()) << " files open in the server";
  // From the clients' side too. Under ASan a few channels in a thousand (1 once, 9 once) were
  // seen still READY after 20 s while the server's files were back to a handful: gRPC's client
  // had not yet read the close of those idle connections (cause not found). Up to 1% is
  // allowed here; the bound on the server's files above is the one that matters.
  int still_ready = 0;
  eventually([&] {
    still_ready = 0;
    for (auto& ch : hostile) still_ready += ch->GetState(false) == GRPC_CHANNEL_READY;
    return still_ready == 0;
  }, seconds(20));
  EXPECT_LE(still_ready, 10) << still_ready << " refused peer(s) still connected";
  EXPECT_EQ(toString(good->get("k999", seconds(5))), "v");
  // A line per interval (10 s) with a count, not a line per refusal.
  std::regex counted("refused (\\d+) calls without a valid token");
  EXPECT_TRUE(eventually([&] { return std::regex_search(server.log(), counted); }, seconds(20)));
  std::string log = server.log();
  EXPECT_LT(count(log, "refused"), 20) << log;
  fs::remove_all(dir);
}

namespace {

// True once the server has closed the connection (EOF or reset).
bool closedByServer(int fd) {
  char c;
  ssize_t n = recv(fd, &c, 1, MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK);
}
}  // namespace

// The connection cap: 50 silent TCP connections against a cap of 20. The server never holds
// more than 20; the silent ones, which never made an authorized call, make room for newer
// ones (oldest first), so a client with the token still gets in; once the cap is all
// authorized clients, a newcomer is closed on arrival and the log says why.
TEST(HostileClientTest, ConnectionCapHoldsAndSilentPeersMakeRoomForRealClients) {
  ServerOptions o;
  o.token = "tok";
  o.connections.max_connections = 20;
  RendezvousServer server(o);
  std::vector<int> silent;
  for (int i = 0; i < 50; ++i) silent.push_back(ddpl::testing::connectLoopback(server.port()));
  EXPECT_TRUE(eventually([&] { return server.stats().connections_accepted == 50; }, seconds(5)));
  EXPECT_LE(server.stats().connections, 20);
  EXPECT_EQ(server.stats().connections_evicted, 30);
  // The 30 oldest were closed by the server; the 20 newest are still held.
  EXPECT_TRUE(eventually([&] {
    int closed = 0;
    for (int i = 0; i < 30; ++i) closed += closedByServer(silent[i]);
    return closed == 30;
  }, seconds(5)));
  for (int i = 30; i < 50; ++i) EXPECT_FALSE(closedByServer(silent[i])) << i;

  // Real clients, each on a connection of its own: each evicts a silent peer.
  auto ping = [&](const std::shared_ptr<grpc::Channel>& ch) {
    grpc::ClientContext ctx;
    ctx.AddMetadata(std::string(grpc_detail::kTokenHeader), "tok");
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    pb::PingResponse resp;
    return pb::Store::NewStub(ch)->Ping(&ctx, pb::PingRequest{}, &resp);
  };
  std::vector<std::shared_ptr<grpc::Channel>> clients;
  for (int i = 0; i < 20; ++i) {
    grpc::ChannelArguments args;
    args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
    clients.push_back(
        grpc::CreateCustomChannel(server.endpoint(), grpc::InsecureChannelCredentials(), args));
    EXPECT_TRUE(ping(clients.back()).ok()) << i;
  }
  EXPECT_LE(server.stats().connections, 20);
  for (int i = 30; i < 50; ++i)
    EXPECT_TRUE(eventually([&] { return closedByServer(silent[i]); }, seconds(5))) << i;
  // Now all 20 are authorized: a 21st is closed on arrival and the others keep working.
  int extra = ddpl::testing::connectLoopback(server.port());
  EXPECT_TRUE(eventually([&] { return closedByServer(extra); }, seconds(5)));
  EXPECT_EQ(server.stats().connections_rejected, 1);
  for (auto& ch : clients) {
    EXPECT_EQ(ch->GetState(false), GRPC_CHANNEL_READY);
    EXPECT_TRUE(ping(ch).ok());
  }
  for (int fd : silent) close(fd);
  close(extra);
}

// ---- retention ---------------------------------------------------------------------------

// 20,000 one-node jobs through one server with a short retention: at the end it holds only
// the recent runs and their keys, and the state machine's work per join (runs it examines on
// its timers) is the same for the last thousand jobs as for the first thousand.
TEST(LongUptimeTest, TwentyThousandRunsLeaveOnlyTheRecentOnesAndFlatWorkPerJoin) {
  ServerOptions o;
  o.run_retention = milliseconds(200);
  RendezvousServer server(o);
  RendezvousClientOptions co;
  co.endpoint = server.endpoint();
  RendezvousClient client(co);
  auto store = connect(server.endpoint());
  constexpr int kRuns = 20000, kWindow = 1000;
  std::vector<uint64_t> visited_at;
  for (int i = 0; i < kRuns; ++i) {
    if (i % kWindow == 0) visited_at.push_back(server.stats().runs_visited);
    JoinOptions j;
    j.run_id = fmt::format("job{}", i);
    j.node_id = "n";
    auto a = client.join(j);
    store->set(a.store_prefix + "addr", toBytes("x"));  // the run's own key
    client.leave(j.run_id, j.node_id);
  }
  visited_at.push_back(server.stats().runs_visited);
  // The second window is the reference: in the first, runs are younger than their 200 ms of
  // retention, and a quick machine joins the first 1,000 in less than that (0 visits, then
  // 1,146 in the last window: flat, and the comparison with 0 failed).
  uint64_t first = visited_at[2] - visited_at[1];
  uint64_t last = visited_at.back() - visited_at[visited_at.size() - 2];
  // Flat: each run is looked at a few times (its retention deadline), never all runs per call.
  EXPECT_LE(last, 2 * first + kWindow) << "second 1000 joins: " << first << ", last: " << last;
  EXPECT_LE(last, 4u * kWindow);
  auto s = server.stats();
  EXPECT_GE(s.runs_forgotten, kRuns - 2 * kWindow);
  // Eventually only what is within its retention is left, keys included.
  EXPECT_TRUE(eventually([&] { return server.stats().runs == 0; }, seconds(20)))
      << server.stats().runs << " runs left";
  EXPECT_TRUE(eventually([&] { return server.stats().keys == 0; }, seconds(20)))
      << server.stats().keys << " keys left";
}

// ---- a server restarted under a running job -----------------------------------------------

// Three agents run a job; the rdzv-server dies and a new one comes up on the same port 10 s
// later. The agents keep trying for the read timeout (60 s by default) instead of ~5 s, so
// they re-form on the new server and the job finishes without using a restart.
TEST(LongUptimeTest, ServerRestartedAfterTenSecondsUnderThreeAgentsTheJobSurvives) {
  int port = ::ddpl::testing::freeLoopbackPort();
  auto server =
      std::make_unique<ServerProcess>(std::vector<std::string>{}, std::vector<std::string>{}, port);
  std::string dir = ::ddpl::testing::makeTempDir("rdzv_restart");
  // Each worker writes a marker when it starts, runs 6 s, and reports its restart count.
  std::string program =
      "echo start rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT; touch " + dir +
      "/started.$RANK; sleep 6; echo done rank=$RANK restart=$TORCHELASTIC_RESTART_COUNT";
  std::vector<std::unique_ptr<::ddpl::testing::Background>> agents;
  for (int i = 0; i < 3; ++i)
    agents.push_back(std::make_unique<::ddpl::testing::Background>(std::vector<std::string>{
        kBin + "/launch", "--nnodes=3", "--nproc-per-node=1", "--rdzv-backend=c10d",
        "--rdzv-endpoint=127.0.0.1:" + std::to_string(port), "--rdzv-id=job", "--max-restarts=0",
        "--rdzv-conf=is_host=0", "--no-python", "/bin/sh", "-c", program}));
  ASSERT_TRUE(eventually(
      [&] {
        for (int r = 0; r < 3; ++r)
          if (!fs::exists(dir + "/started." + std::to_string(r))) return false;
        return true;
      },
      seconds(60)))
      << agents[0]->outputSoFar();
  server->stop();
  std::this_thread::sleep_for(seconds(10));
  server =
      std::make_unique<ServerProcess>(std::vector<std::string>{}, std::vector<std::string>{}, port);
  // One deadline for the three, inside the test's own timeout: when one agent hangs, every
  // agent's output still gets printed (which one gave up is what tells why).
  std::string all;
  auto deadline = std::chrono::steady_clock::now() + seconds(150);
  for (auto& a : agents) {
    auto left = std::chrono::duration_cast<seconds>(deadline - std::chrono::steady_clock::now());
    auto r = a->wait(std::max(left, seconds(1)));
    EXPECT_EQ(r.exit_code, 0) << r.all();
    all += r.all();
  }
  EXPECT_EQ(count(all, "done rank="), 3) << all;
  EXPECT_EQ(count(all, "restart=1"), 0) << "the re-formation used a restart: " << all;
  EXPECT_THAT(all, HasSubstr("lost the rendezvous service"));
  fs::remove_all(dir);
}

}  // namespace
}  // namespace ddpl::rdzv
