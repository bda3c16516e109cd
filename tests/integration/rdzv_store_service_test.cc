// The store service against a real server on port 0: concurrency, parked calls, deadlines,
// the token, size limits and TLS.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <thread>

#include "common/errors.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/client/grpc_store.h"
#include "rendezvous/server/server.h"
#include "tests/common/subprocess.h"

namespace ddpl::rdzv {
namespace {

namespace pb = ::ddpl::rendezvous::v1;
using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;
using ::ddpl::testing::eventually;

std::unique_ptr<Store> connect(const RendezvousServer& s, const std::string& token = "",
                               const std::string& prefix = "") {
  GrpcStoreOptions o;
  o.endpoint = s.endpoint();
  o.token = token;
  o.prefix = prefix;
  o.connect_timeout = seconds(10);
  return connectGrpcStore(o);
}

TEST(StoreServiceTest, ConcurrentClientsLoseNoIncrement) {
  RendezvousServer server(ServerOptions{});
  constexpr int kClients = 256, kAdds = 20;
  std::vector<std::unique_ptr<Store>> clients;
  for (int i = 0; i < kClients; ++i) clients.push_back(connect(server));
  std::atomic<int> ready{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kClients; ++i)
    threads.emplace_back([&, i] {
      ++ready;
      while (ready.load() < kClients) std::this_thread::yield();
      for (int j = 0; j < kAdds; ++j) clients[i]->add("counter", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(clients[0]->add("counter", 0), kClients * kAdds);
}

TEST(StoreServiceTest, ParkedGetsAndWaitsAreReleasedBySets) {
  RendezvousServer server(ServerOptions{});
  auto writer = connect(server);
  constexpr int kGets = 32;
  std::vector<std::unique_ptr<Store>> readers;
  for (int i = 0; i < kGets; ++i) readers.push_back(connect(server));
  std::atomic<int> released{0};
  std::vector<std::thread> threads;
  for (int i = 0; i < kGets; ++i)
    threads.emplace_back([&, i] {
      if (i % 2) {
        if (toString(readers[i]->get("nccl_id/0", seconds(60))) == "id") ++released;
      } else {
        readers[i]->wait({"nccl_id/0", "barrier"}, seconds(60));
        ++released;
      }
    });
  ASSERT_TRUE(eventually([&] { return server.stats().parked_store_calls == kGets; }))
      << "parked: " << server.stats().parked_store_calls;
  EXPECT_EQ(released.load(), 0);
  writer->set("nccl_id/0", toBytes("id"));
  ASSERT_TRUE(eventually([&] { return released.load() == kGets / 2; }));
  writer->add("barrier", 1);
  for (auto& t : threads) t.join();
  EXPECT_EQ(released.load(), kGets);
  EXPECT_EQ(server.stats().parked_store_calls, 0);
}

TEST(StoreServiceTest, DeadlinesAreHonouredAndNamed) {
  RendezvousServer server(ServerOptions{});
  auto store = connect(server);
  store->set("present", toBytes("1"));
  auto start = Clock::now();
  try {
    store->wait({"present", "nccl_id/3"}, milliseconds(300));
    FAIL();
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("300ms"));
    EXPECT_THAT(e.what(), HasSubstr("1/2 keys: 'nccl_id/3'"));
    EXPECT_THAT(e.what(), HasSubstr(server.endpoint()));
  }
  EXPECT_GE(Clock::now() - start, milliseconds(300));
  EXPECT_EQ(server.stats().parked_store_calls, 0) << "a timed-out call must not stay parked";
}

TEST(StoreServiceTest, ClientGoingAwayUnparksItsCall) {
  RendezvousServer server(ServerOptions{});
  auto store = connect(server);
  GrpcStoreOptions o;
  o.endpoint = server.endpoint();
  o.default_timeout = milliseconds(200);
  // The client-side deadline (timeout + grace) is far off; cancel by destroying a channel is
  // not exposed, so use a raw stub with a short deadline and a long server-side timeout.
  auto channel = grpc::CreateChannel(server.endpoint(), grpc::InsecureChannelCredentials());
  auto stub = pb::Store::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + milliseconds(300));
  pb::GetRequest req;
  req.set_key("never");
  req.set_timeout_ms(600000);
  pb::GetResponse resp;
  auto s = stub->Get(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::DEADLINE_EXCEEDED);
  EXPECT_TRUE(eventually([&] { return server.stats().parked_store_calls == 0; }));
}

TEST(StoreServiceTest, WrongOrMissingTokenIsRefusedWithoutChangingState) {
  ServerOptions so;
  so.token = "s3cret-token";
  RendezvousServer server(so);
  GrpcStoreOptions o;
  o.endpoint = server.endpoint();
  o.connect_timeout = seconds(10);
  EXPECT_THROW(connectGrpcStore(o), AuthError);
  o.token = "s3cret-tokeN";
  try {
    connectGrpcStore(o);
    FAIL();
  } catch (const AuthError& e) {
    EXPECT_THAT(e.what(), HasSubstr("UNAUTHENTICATED"));
  }

  auto channel = grpc::CreateChannel(server.endpoint(), grpc::InsecureChannelCredentials());
  auto stub = pb::Store::NewStub(channel);
  for (const char* token : {"", "wrong", "s3cret-token-and-more"}) {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    if (*token) ctx.AddMetadata("x-ddpl-token", token);
    pb::SetRequest req;
    req.set_key("victim");
    req.set_value("evil");
    pb::SetResponse resp;
    EXPECT_EQ(stub->Set(&ctx, req, &resp).error_code(), grpc::UNAUTHENTICATED) << token;
  }
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
    pb::GetRequest req;
    req.set_key("victim");
    req.set_timeout_ms(100000);
    pb::GetResponse resp;
    EXPECT_EQ(stub->Get(&ctx, req, &resp).error_code(), grpc::UNAUTHENTICATED)
        << "an unauthenticated get must not even park";
  }
  auto good = connect(server, so.token);
  EXPECT_FALSE(good->check({"victim"}));
  EXPECT_EQ(good->numKeys(), 0);
  EXPECT_GE(server.stats().unauthenticated_calls, 6);
}

TEST(StoreServiceTest, OversizedValuesAreRefusedNamingTheLimit) {
  ServerOptions so;
  so.max_value_bytes = 1024;
  RendezvousServer server(so);
  // The server itself refuses, whatever the client believes the limit is.
  auto channel = grpc::CreateChannel(server.endpoint(), grpc::InsecureChannelCredentials());
  auto stub = pb::Store::NewStub(channel);
  grpc::ClientContext ctx;
  ctx.set_deadline(std::chrono::system_clock::now() + seconds(10));
  pb::SetRequest req;
  req.set_key("big");
  req.set_value(std::string(2048, 'x'));
  pb::SetResponse resp;
  auto s = stub->Set(&ctx, req, &resp);
  EXPECT_EQ(s.error_code(), grpc::RESOURCE_EXHAUSTED);
  EXPECT_THAT(s.error_message(), HasSubstr("2048 bytes"));
  EXPECT_THAT(s.error_message(), HasSubstr("limit is 1024 bytes"));
  // The client learned the limit when it connected and refuses before sending.
  auto store = connect(server);
  try {
    store->set("big", Bytes(1025, 1));
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr("at most 1024 bytes"));
  }
  EXPECT_THROW(store->multiSet({"ok", "big"}, {Bytes(10, 1), Bytes(4096, 1)}), StoreError);
  store->set("fits", Bytes(1024, 7));
  EXPECT_EQ(store->get("fits", seconds(5)).size(), 1024u);
  EXPECT_FALSE(store->check({"big"}));
  EXPECT_FALSE(store->check({"ok"})) << "multiSet is all or nothing";
}

TEST(StoreServiceTest, PrefixesIsolateRunsOnOneServer) {
  RendezvousServer server(ServerOptions{});
  auto a = connect(server, "", "jobA/0/");
  auto b = connect(server, "", "jobB/0/");
  a->set("rank0_addr", toBytes("10.0.0.1"));
  b->set("rank0_addr", toBytes("10.0.0.2"));
  b->add("count", 1);
  EXPECT_EQ(toString(a->get("rank0_addr", seconds(1))), "10.0.0.1");
  EXPECT_EQ(toString(b->get("rank0_addr", seconds(1))), "10.0.0.2");
  EXPECT_EQ(a->numKeys(), 1);
  EXPECT_EQ(b->numKeys(), 2);
}

TEST(StoreServiceTest, UnreachableServerFailsWithinTheConnectTimeoutNamingIt) {
  // A port that was free a moment ago: nothing listens there.
  int port;
  {
    RendezvousServer probe(ServerOptions{});
    port = probe.port();
  }
  GrpcStoreOptions o;
  o.endpoint = "127.0.0.1:" + std::to_string(port);
  o.connect_timeout = milliseconds(700);
  auto start = Clock::now();
  try {
    connectGrpcStore(o);
    FAIL();
  } catch (const NetworkError& e) {
    EXPECT_THAT(e.what(), HasSubstr(o.endpoint));
    EXPECT_THAT(e.what(), HasSubstr("attempts"));
  }
  EXPECT_GE(Clock::now() - start, milliseconds(700));
}

// ---- TLS -------------------------------------------------------------------------------

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    dir_ = std::filesystem::temp_directory_path() / ("ddpl_tls_" + std::to_string(getpid()));
    std::filesystem::create_directories(dir_);
    std::string d = dir_.string();
    std::string key = "-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes";
    std::string script = fmt::format(
        "set -e; cd {0}; "
        "openssl req -x509 {1} -keyout ca.key -out ca.pem -days 1 -subj /CN=ddpl-test-ca; "
        "openssl req {1} -keyout server.key -out server.csr -subj /CN=localhost; "
        "printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\\n' > server.ext; "
        "openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out server.pem -days 1 -extfile server.ext; "
        "openssl req {1} -keyout client.key -out client.csr -subj /CN=agent; "
        "printf 'extendedKeyUsage=clientAuth\\n' > client.ext; "
        "openssl x509 -req -in client.csr -CA ca.pem -CAkey ca.key -CAcreateserial "
        "-out client.pem -days 1 -extfile client.ext; "
        "openssl req -x509 {1} -keyout other.key -out other.pem -days 1 -subj /CN=other-ca",
        d, key);
    ok_ = std::system(("(" + script + ") >/dev/null 2>&1").c_str()) == 0;
  }
  static void TearDownTestSuite() { std::filesystem::remove_all(dir_); }
  void SetUp() override {
    if (!ok_) GTEST_FAIL() << "openssl could not generate test certificates in " << dir_;
  }
  static std::string f(const char* name) { return (dir_ / name).string(); }

  static inline std::filesystem::path dir_;
  static inline bool ok_ = false;
};

TEST_F(TlsTest, RoundTripWithServerAndClientCertificates) {
  ServerOptions so;
  so.tls_cert_file = f("server.pem");
  so.tls_key_file = f("server.key");
  so.tls_client_ca_file = f("ca.pem");
  so.token = "tls-and-token";
  RendezvousServer server(so);
  GrpcStoreOptions o;
  o.endpoint = server.endpoint();
  o.token = so.token;
  o.tls_ca_file = f("ca.pem");
  o.tls_cert_file = f("client.pem");
  o.tls_key_file = f("client.key");
  o.connect_timeout = seconds(10);
  auto store = connectGrpcStore(o);
  store->set("secret", toBytes("over tls"));
  EXPECT_EQ(toString(store->get("secret", seconds(5))), "over tls");

  // No client certificate, a CA that did not sign the server, or plaintext: refused.
  GrpcStoreOptions no_cert = o;
  no_cert.tls_cert_file.clear();
  no_cert.tls_key_file.clear();
  no_cert.connect_timeout = milliseconds(800);
  EXPECT_THROW(connectGrpcStore(no_cert), NetworkError);
  GrpcStoreOptions wrong_ca = o;
  wrong_ca.tls_ca_file = f("other.pem");
  wrong_ca.connect_timeout = milliseconds(800);
  EXPECT_THROW(connectGrpcStore(wrong_ca), NetworkError);
  GrpcStoreOptions plain = o;
  plain.tls_ca_file.clear();
  plain.tls_cert_file.clear();
  plain.tls_key_file.clear();
  plain.connect_timeout = milliseconds(800);
  EXPECT_THROW(connectGrpcStore(plain), NetworkError);
}

TEST_F(TlsTest, ServerCertificateOnly) {
  ServerOptions so;
  so.tls_cert_file = f("server.pem");
  so.tls_key_file = f("server.key");
  RendezvousServer server(so);
  GrpcStoreOptions o;
  o.endpoint = server.endpoint();
  o.tls_ca_file = f("ca.pem");
  o.connect_timeout = seconds(10);
  auto store = connectGrpcStore(o);
  EXPECT_EQ(store->add("n", 3), 3);
}

}  // namespace
}  // namespace ddpl::rdzv
