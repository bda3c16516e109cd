// The store's Session stream: one long-lived stream per client carrying every operation.
// Raw streams check what the server promises (token once, limits, out-of-order answers);
// GrpcStore is checked for what its callers count on (many threads on one store, deadlines,
// a broken stream failing its operations and the next one reconnecting, prompt destruction).
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <atomic>
#include <future>
#include <limits>
#include <thread>

#include "common/errors.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/client/grpc_store.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/protocol/store_ops.h"
#include "rendezvous/server/server.h"
#include "tests/common/subprocess.h"

namespace ddpl::rdzv {
namespace {

namespace pb = ::ddpl::rendezvous::v1;
using ::ddpl::testing::eventually;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

// socket: the store socket (the default) or, false, the gRPC Session stream.
std::unique_ptr<Store> connect(const std::string& endpoint, const std::string& token = "",
                               bool socket = true) {
  GrpcStoreOptions o;
  o.endpoint = endpoint;
  o.token = token;
  o.socket = socket;
  o.connect_timeout = seconds(10);
  return connectGrpcStore(o);
}

// A raw Session stream driven by hand, for what GrpcStore never sends.
struct RawSession {
  explicit RawSession(const std::string& endpoint, const std::string& token = "") {
    channel = grpc::CreateChannel(endpoint, grpc::InsecureChannelCredentials());
    stub = pb::Store::NewStub(channel);
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(30));
    if (!token.empty()) ctx.AddMetadata("x-ddpl-token", token);
    stream = stub->Session(&ctx);
  }
  bool send(uint64_t id, const std::function<void(pb::StoreRequest&)>& fill) {
    pb::StoreRequest r;
    r.set_id(id);
    fill(r);
    return stream->Write(r);
  }
  pb::StoreResponse read() {
    pb::StoreResponse r;
    EXPECT_TRUE(stream->Read(&r));
    return r;
  }
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Store::Stub> stub;
  grpc::ClientContext ctx;
  std::unique_ptr<grpc::ClientReaderWriter<pb::StoreRequest, pb::StoreResponse>> stream;
};

TEST(StoreSessionTest, ParkedGetAnswersOutOfOrderWhileLaterOpsGoAhead) {
  RendezvousServer server(ServerOptions{});
  RawSession s(server.endpoint());
  ASSERT_TRUE(s.send(1, [](auto& r) {
    r.mutable_get()->set_key("late");
    r.mutable_get()->set_timeout_ms(20000);
  }));
  ASSERT_TRUE(s.send(2, [](auto& r) {
    r.mutable_add()->set_key("n");
    r.mutable_add()->set_delta(4);
  }));
  auto first = s.read();
  EXPECT_EQ(first.id(), 2u) << "the add must not queue behind the parked get";
  EXPECT_EQ(first.add().value(), 4);
  EXPECT_EQ(server.stats().parked_store_calls, 1);
  // Another client's set releases the get parked on this stream.
  connect(server.endpoint())->set("late", toBytes("here"));
  auto second = s.read();
  EXPECT_EQ(second.id(), 1u);
  ASSERT_EQ(second.result_case(), pb::StoreResponse::kGet);
  EXPECT_EQ(second.get().value(), "here");
  // Errors travel per operation, with the unary call's code and text; the stream lives on.
  ASSERT_TRUE(s.send(3, [](auto& r) {
    r.mutable_wait()->add_keys("never");
    r.mutable_wait()->set_timeout_ms(100);
  }));
  auto timeout = s.read();
  EXPECT_EQ(timeout.id(), 3u);
  ASSERT_TRUE(timeout.has_error());
  EXPECT_EQ(timeout.error().code(), grpc::DEADLINE_EXCEEDED);
  EXPECT_THAT(timeout.error().message(),
              HasSubstr("timed out after 100ms waiting for key 'never'"));
  ASSERT_TRUE(s.send(4, [](auto& r) {
    r.mutable_set()->set_key("n");
    r.mutable_set()->set_value("x");
  }));
  EXPECT_FALSE(s.read().has_error());
  ASSERT_TRUE(s.send(5, [](auto& r) {
    r.mutable_add()->set_key("n");
    r.mutable_add()->set_delta(1);
  }));
  auto bad_add = s.read();
  EXPECT_EQ(bad_add.error().code(), grpc::FAILED_PRECONDITION);
  EXPECT_THAT(bad_add.error().message(), HasSubstr("not an integer"));
  ASSERT_TRUE(s.send(6, [](auto&) {}));
  EXPECT_EQ(s.read().error().code(), grpc::INVALID_ARGUMENT);
  s.stream->WritesDone();
  EXPECT_TRUE(s.stream->Finish().ok());
  EXPECT_EQ(server.stats().parked_store_calls, 0);
}

TEST(StoreSessionTest, ClosingTheStreamUnparksItsOperations) {
  RendezvousServer server(ServerOptions{});
  {
    RawSession s(server.endpoint());
    ASSERT_TRUE(s.send(1, [](auto& r) {
      r.mutable_get()->set_key("never");
      r.mutable_get()->set_timeout_ms(600000);
    }));
    ASSERT_TRUE(eventually([&] { return server.stats().parked_store_calls == 1; }));
    s.ctx.TryCancel();
  }
  EXPECT_TRUE(eventually([&] { return server.stats().parked_store_calls == 0; }));
}

TEST(StoreSessionTest, WrongOrMissingTokenEndsTheStreamWithoutChangingState) {
  ServerOptions so;
  so.token = "s3cret-token";
  RendezvousServer server(so);
  for (const char* token : {"", "wrong", "s3cret-token-and-more"}) {
    RawSession s(server.endpoint(), token);
    s.send(1, [](auto& r) {
      r.mutable_set()->set_key("victim");
      r.mutable_set()->set_value("evil");
    });
    s.send(2, [](auto& r) {
      r.mutable_get()->set_key("victim");
      r.mutable_get()->set_timeout_ms(100000);
    });
    pb::StoreResponse resp;
    EXPECT_FALSE(s.stream->Read(&resp)) << token;
    auto status = s.stream->Finish();
    EXPECT_EQ(status.error_code(), grpc::UNAUTHENTICATED) << token;
    EXPECT_EQ(server.stats().parked_store_calls, 0) << "an unauthenticated get must not park";
  }
  auto good = connect(server.endpoint(), so.token);
  EXPECT_FALSE(good->check({"victim"}));
  EXPECT_EQ(good->numKeys(), 0);
  EXPECT_GE(server.stats().unauthenticated_calls, 3);

  // GrpcStore with a wrong token: refused at connect, as with unary calls.
  try {
    connect(server.endpoint(), "s3cret-tokeN");
    FAIL();
  } catch (const AuthError& e) {
    EXPECT_THAT(e.what(), HasSubstr("UNAUTHENTICATED"));
  }
}

TEST(StoreSessionTest, OversizedValuesAreRefusedNamingTheLimit) {
  ServerOptions so;
  so.max_value_bytes = 1024;
  RendezvousServer server(so);
  RawSession s(server.endpoint());
  ASSERT_TRUE(s.send(1, [](auto& r) {
    r.mutable_set()->set_key("big");
    r.mutable_set()->set_value(std::string(2048, 'x'));
  }));
  auto resp = s.read();
  ASSERT_TRUE(resp.has_error());
  EXPECT_EQ(resp.error().code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_THAT(resp.error().message(), HasSubstr("2048 bytes"));
  EXPECT_THAT(resp.error().message(), HasSubstr("limit is 1024 bytes"));
  ASSERT_TRUE(s.send(2, [](auto& r) {
    auto* m = r.mutable_multi_set();
    m->add_keys("ok");
    m->add_values("small");
    m->add_keys("big");
    m->add_values(std::string(4096, 'x'));
  }));
  EXPECT_EQ(s.read().error().code(), grpc::RESOURCE_EXHAUSTED);
  ASSERT_TRUE(s.send(3, [](auto& r) { r.mutable_check()->add_keys("ok"); }));
  EXPECT_FALSE(s.read().check().all_present()) << "multiSet is all or nothing";
  s.ctx.TryCancel();
}

void manyThreadsShareOneStore(bool socket) {
  RendezvousServer server(ServerOptions{});
  auto store = connect(server.endpoint(), "", socket);
  auto other = connect(server.endpoint(), "", socket);
  constexpr int kThreads = 16, kRounds = 50;
  std::atomic<int> wrong{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t)
    threads.emplace_back([&, t] {
      for (int r = 0; r < kRounds; ++r) {
        std::string mine = fmt::format("t{}/r{}", t, r);
        store->set(mine, toBytes(mine));
        store->add("count", 1);
        // Each answer must reach the thread that asked: values name their key.
        if (toString(store->get(mine, seconds(10))) != mine) ++wrong;
        // Parked on the shared stream while the other threads keep going.
        if (t % 4 == 0 && toString(store->get(mine + "/echo", seconds(30))) != "echo") ++wrong;
      }
    });
  std::thread echo([&] {
    for (int r = 0; r < kRounds; ++r)
      for (int t = 0; t < kThreads; t += 4) {
        std::string k = fmt::format("t{}/r{}", t, r);
        other->wait({k}, seconds(30));
        other->set(k + "/echo", toBytes("echo"));
      }
  });
  for (auto& t : threads) t.join();
  echo.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(store->add("count", 0), kThreads * kRounds);
}

// On both links: the store socket and the gRPC Session stream.
TEST(StoreSessionTest, ManyThreadsShareOneStore) {
  for (bool socket : {true, false}) {
    SCOPED_TRACE(socket ? "store socket" : "gRPC Session stream");
    manyThreadsShareOneStore(socket);
  }
}

void operationDeadlinesAreHonouredAndNamed(bool socket) {
  RendezvousServer server(ServerOptions{});
  auto store = connect(server.endpoint(), "", socket);
  auto start = Clock::now();
  try {
    store->multiGet({"nccl_id/0", "nccl_id/1"}, milliseconds(200));
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("2/2 keys: 'nccl_id/0', 'nccl_id/1'"));
    EXPECT_THAT(e.what(), HasSubstr(server.endpoint()));
  }
  auto took = Clock::now() - start;
  EXPECT_GE(took, milliseconds(200));
  EXPECT_LT(took, seconds(4)) << "the server answers at its timeout, not the client's grace";
  EXPECT_EQ(server.stats().parked_store_calls, 0);
}

// On both links: the store socket and the gRPC Session stream.
TEST(StoreSessionTest, OperationDeadlinesAreHonouredAndNamed) {
  for (bool socket : {true, false}) {
    SCOPED_TRACE(socket ? "store socket" : "gRPC Session stream");
    operationDeadlinesAreHonouredAndNamed(socket);
  }
}

// A fake server's connect check: accepts any client.
class PingingStore : public pb::Store::CallbackService {
 public:
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx, const pb::PingRequest*,
                                 pb::PingResponse* resp) override {
    resp->set_max_value_bytes(1 << 20);
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
};

// A Session server that answers the handshake ping and nothing else: the client's own
// deadline is all that ends an operation.
class SilentStore final : public PingingStore {
 public:
  grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse>* Session(
      grpc::CallbackServerContext*) override {
    class Reactor : public grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse> {
     public:
      explicit Reactor(std::atomic<int>* seen) : seen_(seen) { StartRead(&req_); }
      void OnReadDone(bool ok) override {
        if (!ok) return;  // OnCancel finishes
        ++*seen_;
        if (req_.has_ping()) {
          resp_.set_id(req_.id());
          resp_.mutable_ping();
          StartWrite(&resp_);
        }
        StartRead(&req_);
      }
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }

     private:
      std::atomic<int>* seen_;
      pb::StoreRequest req_;
      pb::StoreResponse resp_;
    };
    return new Reactor(&seen);
  }
  std::atomic<int> seen{0};
};

struct FakeServer {
  explicit FakeServer(grpc::Service* service) {
    grpc::ServerBuilder b;
    b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
    b.RegisterService(service);
    server = b.BuildAndStart();
  }
  ~FakeServer() { server->Shutdown(std::chrono::system_clock::now()); }
  std::string endpoint() const { return "127.0.0.1:" + std::to_string(port); }
  int port = 0;
  std::unique_ptr<grpc::Server> server;
};

TEST(StoreSessionTest, ClientDeadlineEndsAnOperationTheServerNeverAnswers) {
  SilentStore service;
  FakeServer fake(&service);
  GrpcStoreOptions o;
  o.endpoint = fake.endpoint();
  o.connect_timeout = seconds(10);
  o.default_timeout = milliseconds(300);
  auto store = connectGrpcStore(o);
  auto start = Clock::now();
  try {
    store->add("counter", 1);
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("add 'counter'"));
    EXPECT_THAT(e.what(), HasSubstr("DEADLINE_EXCEEDED"));
    EXPECT_THAT(e.what(), HasSubstr(fake.endpoint()));
  }
  auto took = Clock::now() - start;
  EXPECT_GE(took, milliseconds(300));
  EXPECT_LT(took, seconds(5));
  try {
    store->check({"a", "b"});
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("check 'a', 'b'"));
  }
  EXPECT_EQ(service.seen.load(), 3) << "handshake, add, check: all on the one stream";
}

// A server from before Session: only unary calls.
class UnaryOnlyStore final : public PingingStore {
 public:
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const pb::AddRequest* req,
                                pb::AddResponse* resp) override {
    resp->set_value(total += req->delta());
    auto* r = ctx->DefaultReactor();
    r->Finish(grpc::Status::OK);
    return r;
  }
  std::atomic<int64_t> total{0};
};

// Issue 17: sets go quiet (answered only when they fail), as TCPStore's set goes unanswered.
TEST(StoreSessionTest, QuietSetsAreAnsweredOnlyWhenTheyFail) {
  ServerOptions so;
  so.max_value_bytes = 1024;
  RendezvousServer server(so);
  RawSession s(server.endpoint());
  ASSERT_TRUE(s.send(1, [](auto& r) {
    r.set_quiet(true);
    r.mutable_set()->set_key("ok");
    r.mutable_set()->set_value("small");
  }));
  ASSERT_TRUE(s.send(2, [](auto& r) {
    r.set_quiet(true);
    r.mutable_set()->set_key("big");
    r.mutable_set()->set_value(std::string(2048, 'x'));
  }));
  ASSERT_TRUE(s.send(3, [](auto& r) {
    r.set_quiet(true);  // ignored: a check always answers
    r.mutable_check()->add_keys("ok");
  }));
  auto refused = s.read();
  EXPECT_EQ(refused.id(), 2u) << "the set that succeeded is not answered";
  ASSERT_TRUE(refused.has_error());
  EXPECT_EQ(refused.error().code(), grpc::RESOURCE_EXHAUSTED);
  auto checked = s.read();
  EXPECT_EQ(checked.id(), 3u);
  EXPECT_TRUE(checked.check().all_present()) << "the quiet set was applied before the check";
  s.ctx.TryCancel();
}

// A Session server that refuses every set, quiet or not, and answers the rest trivially.
class RefusingStore final : public PingingStore {
 public:
  grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse>* Session(
      grpc::CallbackServerContext*) override {
    class Reactor : public grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse> {
     public:
      Reactor() { StartRead(&req_); }
      void OnReadDone(bool ok) override {
        if (!ok) return;  // OnCancel finishes
        resp_.Clear();
        resp_.set_id(req_.id());
        if (req_.has_set()) {
          resp_.mutable_error()->set_code(grpc::FAILED_PRECONDITION);
          resp_.mutable_error()->set_message("no room for key " + req_.set().key());
        } else if (req_.has_add()) {
          resp_.mutable_add()->set_value(req_.add().delta());
        } else {
          resp_.mutable_ping();
        }
        StartWrite(&resp_);  // one at a time: the next read starts when it is written
      }
      void OnWriteDone(bool ok) override {
        if (ok) StartRead(&req_);
      }
      void OnCancel() override { Finish(grpc::Status::CANCELLED); }
      void OnDone() override { delete this; }

     private:
      pb::StoreRequest req_;
      pb::StoreResponse resp_;
    };
    return new Reactor;
  }
};

TEST(StoreSessionTest, RefusedQuietSetIsReportedOnceByALaterOperation) {
  RefusingStore service;
  FakeServer fake(&service);
  auto store = connect(fake.endpoint());
  store->set("k", toBytes("v"));  // returns before the server's answer
  // The refusal is reported by the first operation to find it arrived: the add right after the
  // set if the refusal came back before that add was sent, else the next one (the first add's
  // answer comes after the refusal: one stream, in order). Exactly one of the two fails.
  std::string reported, reporter;
  int succeeded = 0;
  for (const char* key : {"n", "m"}) {
    try {
      EXPECT_EQ(store->add(key, 1), 1);
      ++succeeded;
    } catch (const StoreError& e) {
      EXPECT_TRUE(reported.empty()) << "reported twice: " << reported << " / " << e.what();
      reported = e.what();
      reporter = key;
    }
  }
  EXPECT_EQ(succeeded, 1) << "the refused set went unreported, or was reported twice";
  EXPECT_THAT(reported, HasSubstr("set 'k'"));
  EXPECT_THAT(reported, HasSubstr("no room for key k"));
  EXPECT_THAT(reported, HasSubstr("reported by add '" + reporter + "'"));
  EXPECT_THAT(reported, HasSubstr(fake.endpoint()));
  EXPECT_EQ(store->add("n", 5), 5) << "reported once; the store goes on";

  GrpcStoreOptions o;
  o.endpoint = fake.endpoint();
  o.connect_timeout = seconds(10);
  o.quiet_sets = false;
  EXPECT_THROW(connectGrpcStore(o)->set("k", toBytes("v")), StoreError)
      << "without quiet sets the set itself fails";
}

void quietSetsReachTheServerBeforeTheStoreIsGone(bool socket) {
  RendezvousServer server(ServerOptions{});
  constexpr int kKeys = 3 * kMaxQuietSets;  // past the bound some sets wait for their answer
  {
    auto store = connect(server.endpoint(), "", socket);
    for (int i = 0; i < kKeys; ++i) store->set(fmt::format("k{}", i), toBytes("v"));
  }  // a rank that sets its key and exits at once
  auto reader = connect(server.endpoint(), "", socket);
  std::vector<std::string> keys;
  for (int i = 0; i < kKeys; ++i) keys.push_back(fmt::format("k{}", i));
  EXPECT_TRUE(reader->check(keys));
}

// On both links: the store socket and the gRPC Session stream.
TEST(StoreSessionTest, QuietSetsReachTheServerBeforeTheStoreIsGone) {
  for (bool socket : {true, false}) {
    SCOPED_TRACE(socket ? "store socket" : "gRPC Session stream");
    quietSetsReachTheServerBeforeTheStoreIsGone(socket);
  }
}

TEST(StoreSessionTest, QuietSetsOnAStreamThatBreaksAreReported) {
  SilentStore service;  // confirms nothing
  auto fake = std::make_unique<FakeServer>(&service);
  std::string endpoint = fake->endpoint();
  GrpcStoreOptions o;
  o.endpoint = endpoint;
  o.connect_timeout = seconds(1);
  auto store = connectGrpcStore(o);
  store->set("k1", toBytes("v"));
  store->set("k2", toBytes("v"));
  ASSERT_TRUE(eventually([&] { return service.seen.load() == 3; }));  // ping, k1, k2
  fake.reset();  // the stream breaks before the server confirmed them
  // The first operation after the break may itself fail on the broken stream; by then the
  // lost sets are recorded, and the next operation reports them.
  std::string reported;
  for (int attempt = 0; attempt < 2 && reported.empty(); ++attempt) {
    try {
      store->add("n", 1);
      FAIL() << "no server: the add cannot succeed";
    } catch (const NetworkError& e) {
      if (std::string(e.what()).find("set 'k1'") != std::string::npos) reported = e.what();
    }
  }
  EXPECT_THAT(reported, HasSubstr("1 more set(s)"));
  EXPECT_THAT(reported, HasSubstr("may not have been applied"));
  EXPECT_THAT(reported, HasSubstr(endpoint));
}

TEST(StoreSessionTest, ServersWithoutSessionGetUnaryCalls) {
  UnaryOnlyStore service;
  FakeServer fake(&service);
  auto store = connect(fake.endpoint());
  EXPECT_EQ(store->add("n", 2), 2);
  EXPECT_EQ(store->add("n", 3), 5);
}

void brokenStreamFailsWaitingOpsAndTheNextOpReconnects(bool socket) {
  auto server = std::make_unique<RendezvousServer>(ServerOptions{});
  int port = server->port();
  std::string endpoint = server->endpoint();
  GrpcStoreOptions o;
  o.endpoint = endpoint;
  o.connect_timeout = seconds(10);
  o.socket = socket;
  auto store = connectGrpcStore(o);
  store->set("before", toBytes("1"));
  auto parked = std::async(std::launch::async, [&]() -> std::string {
    try {
      store->get("never", seconds(600));
      return "returned";
    } catch (const NetworkError& e) {
      return e.what();
    } catch (const std::exception& e) {
      return std::string("wrong exception type: ") + e.what();
    }
  });
  ASSERT_TRUE(eventually([&] { return server->stats().parked_store_calls == 1; }));
  server.reset();  // the stream breaks under the parked get
  ASSERT_EQ(parked.wait_for(seconds(20)), std::future_status::ready) << "the get hung";
  std::string err = parked.get();
  EXPECT_THAT(err, HasSubstr("get 'never'"));
  EXPECT_THAT(err, HasSubstr(endpoint));
  EXPECT_THAT(err, HasSubstr("stream broke"));

  // Nothing listens: the next operation tries to reopen for a bounded time, then says so.
  auto start = Clock::now();
  try {
    store->set("x", toBytes("1"));
    FAIL();
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr(endpoint));
  }
  EXPECT_LT(Clock::now() - start, seconds(15));

  // The server comes back on the same port: the next operation reconnects by itself.
  ServerOptions so;
  so.port = port;
  RendezvousServer again(so);
  store->set("after", toBytes("2"));
  EXPECT_EQ(toString(store->get("after", seconds(5))), "2");
  EXPECT_FALSE(store->check({"before"})) << "a new server starts empty";
}

// On both links: the store socket and the gRPC Session stream.
TEST(StoreSessionTest, BrokenStreamFailsWaitingOpsAndTheNextOpReconnects) {
  for (bool socket : {true, false}) {
    SCOPED_TRACE(socket ? "store socket" : "gRPC Session stream");
    brokenStreamFailsWaitingOpsAndTheNextOpReconnects(socket);
  }
}

void destroyingTheStoreEndsItsParkedOperationsPromptly(bool socket) {
  RendezvousServer server(ServerOptions{});
  auto store = connect(server.endpoint(), "", socket);
  auto parked = std::async(std::launch::async, [&]() -> std::string {
    try {
      store->wait({"never"}, seconds(600));
      return "returned";
    } catch (const Error& e) {
      return e.what();
    }
  });
  ASSERT_TRUE(eventually([&] { return server.stats().parked_store_calls == 1; }));
  auto start = Clock::now();
  store.reset();
  EXPECT_LT(Clock::now() - start, seconds(5));
  ASSERT_EQ(parked.wait_for(seconds(5)), std::future_status::ready);
  EXPECT_THAT(parked.get(), HasSubstr(server.endpoint()));
  EXPECT_TRUE(eventually([&] { return server.stats().parked_store_calls == 0; }))
      << "the server must unpark the operations of a stream that ended";
}

// On both links: the store socket and the gRPC Session stream.
TEST(StoreSessionTest, DestroyingTheStoreEndsItsParkedOperationsPromptly) {
  for (bool socket : {true, false}) {
    SCOPED_TRACE(socket ? "store socket" : "gRPC Session stream");
    destroyingTheStoreEndsItsParkedOperationsPromptly(socket);
  }
}

// ---- the store socket (docs/rendezvous.md, "The store's socket transport") ---------------

TEST(StoreSocketTest, ServerWithoutTheSocketIsDetectedAndTheStoreUsesGrpc) {
  RendezvousServer with_socket(ServerOptions{});
  auto fast = connect(with_socket.endpoint());
  EXPECT_EQ(with_socket.stats().store_sockets, 1);
  // The port is shared: a client on the gRPC stream sees the socket client's keys.
  fast->set("k", toBytes("from the socket"));
  auto slow = connect(with_socket.endpoint(), "", /*socket=*/false);
  EXPECT_EQ(toString(slow->get("k", seconds(5))), "from the socket");
  EXPECT_EQ(with_socket.stats().store_sockets, 1);
  fast.reset();
  EXPECT_TRUE(eventually([&] { return with_socket.stats().store_sockets == 0; }));

  ServerOptions so;
  so.store_socket = false;  // as a server from before the socket: gRPC gets the magic bytes
  RendezvousServer without(so);
  auto store = connect(without.endpoint());
  store->set("a", toBytes("1"));
  EXPECT_EQ(store->add("n", 2), 2);
  EXPECT_EQ(toString(store->get("a", seconds(5))), "1");
  EXPECT_EQ(without.stats().store_sockets, 0);
}

// Nobody reads the socket between operations: an operation after the server restarted must
// find the old connection closed and go on a new one, not fail on the dead one.
void anOperationAfterAServerRestartGoesOnANewConnection(bool socket) {
  auto server = std::make_unique<RendezvousServer>(ServerOptions{});
  int port = server->port();
  auto store = connect(server->endpoint(), "", socket);
  EXPECT_EQ(store->add("n", 1), 1);
  server.reset();
  ServerOptions so;
  so.port = port;
  server = std::make_unique<RendezvousServer>(so);
  std::this_thread::sleep_for(milliseconds(50));  // an operation after a pause, as an agent's
  EXPECT_EQ(store->add("n", 1), 1) << "a new server starts empty";
  store->set("k", toBytes("v"));
  EXPECT_EQ(toString(store->get("k", seconds(5))), "v");
}

TEST(StoreSocketTest, AnOperationAfterAServerRestartGoesOnANewConnection) {
  for (bool socket : {true, false}) {
    SCOPED_TRACE(socket ? "store socket" : "gRPC Session stream");
    anOperationAfterAServerRestartGoesOnANewConnection(socket);
  }
}

// The store socket needs no gRPC channel, but options that could not make one are still an
// error at connect, not silently ignored.
TEST(StoreSocketTest, OptionsNoChannelCouldUseAreRefusedAtConnect) {
  RendezvousServer server(ServerOptions{});
  GrpcStoreOptions o;
  o.endpoint = server.endpoint();
  o.connect_timeout = seconds(5);
  o.tls_cert_file = "/nonexistent/client.pem";  // a client certificate without TLS
  try {
    connectGrpcStore(o);
    FAIL() << "a client certificate without a CA file was accepted";
  } catch (const InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("needs TLS"));
  }
}

TEST(StoreSocketTest, WrongTokenIsRefusedAtConnectNamingIt) {
  ServerOptions so;
  so.token = "s3cret";
  RendezvousServer server(so);
  try {
    connect(server.endpoint(), "wrong");
    FAIL() << "connected with a wrong token";
  } catch (const AuthError& e) {
    EXPECT_THAT(e.what(), HasSubstr("token does not match"));
    EXPECT_THAT(e.what(), HasSubstr(server.endpoint()));
  }
  try {
    connect(server.endpoint());
    FAIL() << "connected without a token";
  } catch (const AuthError& e) {
    EXPECT_THAT(e.what(), HasSubstr("requires a token"));
  }
  auto good = connect(server.endpoint(), "s3cret");
  good->set("k", toBytes("v"));
  EXPECT_EQ(server.stats().store_sockets, 1);
  EXPECT_EQ(server.stats().unauthenticated_calls, 2);
}

// Issue 11: timeouts near INT64_MAX ms from a caller mean "wait very long", on the store and
// on a join; they used to overflow into "time out now".
namespace {
RendezvousClientOptions clientOptions(const std::string& endpoint) {
  RendezvousClientOptions co;
  co.endpoint = endpoint;
  return co;
}
// A join of a run of exactly two nodes (the node id and sizes are the test's to set).
JoinOptions twoNodeJoin(const std::string& run_id) {
  JoinOptions j;
  j.run_id = run_id;
  j.min_nodes = 2;
  j.max_nodes = 2;
  return j;
}
}  // namespace

TEST(HugeNumbersTest, Int64MaxTimeoutsWaitInsteadOfTimingOutAtOnce) {
  RendezvousServer server(ServerOptions{});
  auto store = connect(server.endpoint());
  const Duration huge{std::numeric_limits<int64_t>::max()};
  auto got = std::async(std::launch::async, [&] { return toString(store->get("late", huge)); });
  auto waited = std::async(std::launch::async, [&] { store->wait({"late"}, huge); });
  ASSERT_TRUE(eventually([&] { return server.stats().parked_store_calls == 2; }));
  EXPECT_EQ(got.wait_for(milliseconds(200)), std::future_status::timeout);
  connect(server.endpoint())->set("late", toBytes("here"));
  EXPECT_EQ(got.get(), "here");
  waited.get();

  RendezvousClient client(clientOptions(server.endpoint()));
  JoinOptions j = twoNodeJoin("r");
  j.join_timeout = huge;
  j.last_call_timeout = huge;
  j.node_id = "a";
  auto a = std::async(std::launch::async, [&, j] { return client.join(j); });
  ASSERT_TRUE(eventually([&] { return server.stats().parked_joins == 1; }));
  EXPECT_EQ(a.wait_for(milliseconds(200)), std::future_status::timeout) << "timed out at once";
  j.node_id = "b";
  EXPECT_EQ(client.join(j).world_size, 2);
  EXPECT_EQ(a.get().world_size, 2);
}

TEST(HugeNumbersTest, WorldSizePastInt32AndAddPastInt64AreErrorsOverTheWire) {
  RendezvousServer server(ServerOptions{});
  auto store = connect(server.endpoint());
  store->add("n", std::numeric_limits<int64_t>::max());
  try {
    store->add("n", 1);
    FAIL() << "add wrapped";
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr("FAILED_PRECONDITION"));
    EXPECT_THAT(e.what(), HasSubstr("9223372036854775807 + 1 does not fit"));
  }
  RendezvousClient client(clientOptions(server.endpoint()));
  JoinOptions j = twoNodeJoin("r");
  j.node_id = "a";
  j.local_world_size = std::numeric_limits<int32_t>::max();
  auto a = std::async(std::launch::async, [&, j] {
    try {
      client.join(j);
    } catch (const Error&) {
    }
  });
  ASSERT_TRUE(eventually([&] { return server.stats().parked_joins == 1; }));
  j.node_id = "b";
  j.local_world_size = 1;
  try {
    client.join(j);
    FAIL() << "a world size past INT32_MAX was accepted";
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr("world size 2147483648"));
  }
  client.leave("r", "a");
  a.get();
}

// Issue 11: one list of store operations (store_ops.h) for the server's two dispatchers and the
// client. Every operation of StoreRequest's oneof is in it and has its unary RPC, and the
// server answers each one both ways.
TEST(StoreOpListTest, EveryOperationOfTheProtoIsListedServedAndSent) {
  using namespace grpc_detail;
  const auto* oneof = pb::StoreRequest::descriptor()->FindOneofByName("op");
  ASSERT_NE(oneof, nullptr);
  const auto* service = pb::StoreRequest::descriptor()->file()->FindServiceByName("Store");
  ASSERT_NE(service, nullptr);
  int listed = 0;
  for (int i = 0; i < oneof->field_count(); ++i) {
    const auto* field = oneof->field(i);
    auto c = static_cast<pb::StoreRequest::OpCase>(field->number());
    bool in_list = visitStoreOp(c, [&](auto op) {
      using Op = decltype(op);
      EXPECT_EQ(Op::kCase, c);
      EXPECT_EQ(Op::Request::descriptor(), field->message_type()) << field->name();
      ++listed;
    });
    EXPECT_TRUE(in_list) << "StoreRequest." << field->name() << " is not in store_ops.h";
    // Its unary RPC: Ping for ping, CompareSet for compare_set, ...
    std::string rpc;
    bool upper = true;
    for (char ch : field->name()) {
      if (ch == '_') {
        upper = true;
        continue;
      }
      rpc += upper ? static_cast<char>(std::toupper(ch)) : ch;
      upper = false;
    }
    const auto* method = service->FindMethodByName(rpc);
    ASSERT_NE(method, nullptr) << "no Store." << rpc << " for StoreRequest." << field->name();
    EXPECT_EQ(method->input_type(), field->message_type());
  }
  EXPECT_EQ(listed, oneof->field_count());
  EXPECT_EQ(service->method_count(), oneof->field_count() + 1) << "every RPC but Session";
  EXPECT_FALSE(visitStoreOp(pb::StoreRequest::OP_NOT_SET, [](auto) {}));

  // Served both ways: a request that names no operation is refused on the stream.
  RendezvousServer server(ServerOptions{});
  RawSession s(server.endpoint());
  ASSERT_TRUE(s.send(7, [](auto&) {}));
  auto r = s.read();
  EXPECT_EQ(r.id(), 7u);
  EXPECT_EQ(r.error().code(), grpc::INVALID_ARGUMENT);
}

}  // namespace
}  // namespace ddpl::rdzv
