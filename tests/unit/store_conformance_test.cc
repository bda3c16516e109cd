// One suite, every Store: the in-memory store, the file store, the prefix decorator, and the
// gRPC client (on its Session stream, and with one unary call per operation) against a real
// in-process server on port 0. A behaviour that differs between them is a bug in one of them.
#include <fmt/format.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <functional>
#include <limits>
#include <thread>

#include "common/errors.h"
#include "rendezvous/client/grpc_store.h"
#include "rendezvous/server/server.h"
#include "rendezvous/store/file_store.h"
#include "rendezvous/store/memory_store.h"
#include "rendezvous/store/prefix_store.h"

namespace ddpl::rdzv {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;
using ::testing::HasSubstr;

// Owns whatever a store needs besides itself (a server, a temporary file).
struct StoreUnderTest {
  std::shared_ptr<void> keepalive;
  std::unique_ptr<Store> store;
  // Gets and waits the backend holds parked now, where it can tell (the gRPC server): the
  // blocking tests set their key only once the call is parked, so they cannot pass by the
  // key arriving first.
  std::function<int64_t()> parked;
};

struct Backend {
  std::string name;
  std::function<StoreUnderTest()> make;
};

std::string tempPath(const std::string& tag) {
  static std::atomic<int> n{0};
  auto dir = std::filesystem::temp_directory_path();
  return (dir / fmt::format("ddpl_store_{}_{}_{}", tag, getpid(), n++)).string();
}

StoreUnderTest grpcWithToken(bool session, bool socket = true) {
  ServerOptions so;
  so.token = "conformance-token";
  so.log_name = "conformance";
  auto server = std::make_shared<RendezvousServer>(so);
  GrpcStoreOptions o;
  o.endpoint = server->endpoint();
  o.token = so.token;
  o.connect_timeout = seconds(10);
  o.use_session = session;
  o.socket = socket;
  return StoreUnderTest{server, connectGrpcStore(o),
                        [server] { return server->stats().parked_store_calls; }};
}

std::vector<Backend> backends() {
  return {
      {"Memory",
       [] {
         return StoreUnderTest{nullptr, std::make_unique<MemoryStore>()};
       }},
      {"File",
       [] {
         auto path = tempPath("file");
         auto cleanup =
             std::shared_ptr<void>(nullptr, [path](void*) { std::filesystem::remove(path); });
         return StoreUnderTest{cleanup, std::make_unique<FileStore>(path)};
       }},
      {"PrefixOverMemory",
       [] {
         return StoreUnderTest{
             nullptr, std::make_unique<PrefixStore>("run/0/", std::make_shared<MemoryStore>())};
       }},
      // The store socket (the default client) and the gRPC Session stream.
      {"Grpc", [] { return grpcWithToken(/*session=*/true); }},
      {"GrpcStream", [] { return grpcWithToken(/*session=*/true, /*socket=*/false); }},
      // One unary call per operation: what clients of servers without Session use.
      {"GrpcUnary", [] { return grpcWithToken(/*session=*/false); }},
      {"GrpcWithPrefix",
       [] {
         auto server = std::make_shared<RendezvousServer>(ServerOptions{});
         GrpcStoreOptions o;
         o.endpoint = server->endpoint();
         o.prefix = "job/attempt_0/";
         return StoreUnderTest{server, connectGrpcStore(o),
                               [server] { return server->stats().parked_store_calls; }};
       }},
  };
}

class StoreConformance : public ::testing::TestWithParam<Backend> {
 protected:
  void SetUp() override {
    sut_ = GetParam().make();
    store_ = sut_.store.get();
  }
  void TearDown() override {
    sut_.store.reset();
    sut_.keepalive.reset();
  }
  // From another thread: waits until the test's blocking call is under way, then runs `set`.
  // Where the backend counts parked calls, "under way" is exact; otherwise it is 100 ms after
  // the call was about to start.
  std::thread setWhenBlocked(std::atomic<bool>& about_to_block, std::function<void()> set) {
    return std::thread([this, &about_to_block, set = std::move(set)] {
      while (!about_to_block) std::this_thread::sleep_for(milliseconds(1));
      if (sut_.parked) {
        auto deadline = Clock::now() + seconds(20);
        while (sut_.parked() < 1 && Clock::now() < deadline)
          std::this_thread::sleep_for(milliseconds(2));
        EXPECT_EQ(sut_.parked(), 1) << "the call never parked: it could not block";
      } else {
        std::this_thread::sleep_for(milliseconds(100));
      }
      set();
    });
  }
  StoreUnderTest sut_;
  Store* store_ = nullptr;
};

TEST_P(StoreConformance, SetGetRoundTripsOpaqueBytes) {
  Bytes binary = {0, 1, 0xff, 0, 'x', 0x80};
  store_->set("bin", binary);
  store_->set("empty", {});
  EXPECT_EQ(store_->get("bin", seconds(5)), binary);
  EXPECT_TRUE(store_->get("empty", seconds(5)).empty());
  store_->set("bin", toBytes("overwritten"));
  EXPECT_EQ(toString(store_->get("bin", seconds(5))), "overwritten");
}

TEST_P(StoreConformance, GetBlocksUntilAnotherThreadSets) {
  std::atomic<bool> about_to_block{false};
  std::thread setter =
      setWhenBlocked(about_to_block, [&] { store_->set("late", toBytes("here")); });
  about_to_block = true;
  EXPECT_EQ(toString(store_->get("late", seconds(20))), "here");
  setter.join();
}

TEST_P(StoreConformance, GetTimesOutNamingTheKey) {
  auto start = Clock::now();
  try {
    store_->get("never/set", milliseconds(150));
    FAIL() << "get of a missing key returned";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("never/set"));
  }
  EXPECT_GE(Clock::now() - start, milliseconds(150));
}

TEST_P(StoreConformance, AddIsAnAtomicCounter) {
  EXPECT_EQ(store_->add("n", 5), 5);
  EXPECT_EQ(store_->add("n", -7), -2);
  EXPECT_EQ(toString(store_->get("n", seconds(1))), "-2");
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&] {
      for (int i = 0; i < 25; ++i) store_->add("shared", 1);
    });
  for (auto& t : threads) t.join();
  EXPECT_EQ(store_->add("shared", 0), 100);
  store_->set("text", toBytes("abc"));
  EXPECT_THROW(store_->add("text", 1), StoreError);
}

// Issue 11: add past the int64 range used to wrap silently (INT64_MAX + 1 = INT64_MIN).
TEST_P(StoreConformance, AddPastTheInt64RangeIsAnErrorNamingTheValueNotAWrap) {
  constexpr int64_t kMax = std::numeric_limits<int64_t>::max();
  constexpr int64_t kMin = std::numeric_limits<int64_t>::min();
  EXPECT_EQ(store_->add("hi", kMax), kMax);
  try {
    store_->add("hi", 1);
    FAIL() << "add past INT64_MAX returned";
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr("9223372036854775807 + 1 does not fit"));
  }
  EXPECT_EQ(store_->add("hi", 0), kMax) << "the counter must keep its value";
  EXPECT_EQ(store_->add("lo", kMin), kMin);
  EXPECT_THROW(store_->add("lo", -1), StoreError);
  EXPECT_EQ(store_->add("lo", 0), kMin);
  EXPECT_EQ(store_->add("lo", kMax), -1);  // in range: fine
}

TEST_P(StoreConformance, CompareSetFollowsC10dSemantics) {
  // Missing key with a non-empty expectation: unchanged, returns the expectation.
  EXPECT_EQ(toString(store_->compareSet("k", toBytes("x"), toBytes("y"))), "x");
  EXPECT_FALSE(store_->check({"k"}));
  // Missing key, empty expectation: created.
  EXPECT_EQ(toString(store_->compareSet("k", {}, toBytes("v1"))), "v1");
  // Mismatch: unchanged, returns the current value.
  EXPECT_EQ(toString(store_->compareSet("k", toBytes("nope"), toBytes("v2"))), "v1");
  EXPECT_EQ(toString(store_->compareSet("k", toBytes("v1"), toBytes("v2"))), "v2");
  EXPECT_EQ(toString(store_->get("k", seconds(1))), "v2");
}

TEST_P(StoreConformance, CheckAndWaitSeeEveryKey) {
  store_->set("a", toBytes("1"));
  EXPECT_TRUE(store_->check({"a"}));
  EXPECT_FALSE(store_->check({"a", "b"}));
  EXPECT_TRUE(store_->check({}));
  std::atomic<bool> about_to_block{false};
  std::thread setter = setWhenBlocked(about_to_block, [&] {
    store_->set("b", toBytes("2"));
    store_->set("c", toBytes("3"));
  });
  about_to_block = true;
  store_->wait({"a", "b", "c"}, seconds(20));
  setter.join();
  try {
    store_->wait({"a", "missing1", "b", "missing2"}, milliseconds(100));
    FAIL() << "wait on missing keys returned";
  } catch (const TimeoutError& e) {
    EXPECT_THAT(e.what(), HasSubstr("missing1"));
    EXPECT_THAT(e.what(), HasSubstr("missing2"));
    EXPECT_THAT(e.what(), HasSubstr("2/4"));
  }
}

TEST_P(StoreConformance, DeleteKeyAndNumKeys) {
  EXPECT_EQ(store_->numKeys(), 0);
  store_->set("x", toBytes("1"));
  store_->set("y", toBytes("2"));
  store_->add("z", 1);
  EXPECT_EQ(store_->numKeys(), 3);
  EXPECT_TRUE(store_->deleteKey("x"));
  EXPECT_FALSE(store_->deleteKey("x"));
  EXPECT_EQ(store_->numKeys(), 2);
  EXPECT_FALSE(store_->check({"x"}));
  EXPECT_THROW(store_->get("x", milliseconds(20)), TimeoutError);
}

TEST_P(StoreConformance, MultiGetAndMultiSet) {
  store_->multiSet({"m1", "m2", "m3"}, {toBytes("a"), {}, toBytes("c")});
  auto v = store_->multiGet({"m3", "m1", "m2"}, seconds(5));
  ASSERT_EQ(v.size(), 3u);
  EXPECT_EQ(toString(v[0]), "c");
  EXPECT_EQ(toString(v[1]), "a");
  EXPECT_TRUE(v[2].empty());
  EXPECT_THROW(store_->multiSet({"a", "b"}, {toBytes("1")}), InvalidArgument);
  EXPECT_THROW(store_->multiGet({"m1", "absent"}, milliseconds(50)), TimeoutError);
}

// Values around and far past what one read of the socket client takes (4 KiB), alone and
// several in one answer: each arrives whole and in its place.
TEST_P(StoreConformance, ValuesLargerThanOneReadArriveWhole) {
  std::vector<std::string> keys;
  std::vector<Bytes> values;
  for (size_t n : {size_t{4095}, size_t{4096}, size_t{4097}, size_t{70000}, size_t{3} << 20}) {
    Bytes v(n);
    for (size_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>((i * 131 + n) % 251);
    keys.push_back(fmt::format("large{}", n));
    values.push_back(v);
    store_->set(keys.back(), v);
    EXPECT_EQ(store_->get(keys.back(), seconds(10)), v) << n << " bytes";
  }
  auto all = store_->multiGet(keys, seconds(10));
  ASSERT_EQ(all.size(), values.size());
  for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(all[i], values[i]) << keys[i];
}

TEST_P(StoreConformance, OneSetReleasesEveryWaiter) {
  constexpr int kWaiters = 8;
  std::atomic<int> released{0};
  std::vector<std::thread> waiters;
  for (int i = 0; i < kWaiters; ++i)
    waiters.emplace_back([&] {
      if (toString(store_->get("go", seconds(30))) == "now") ++released;
    });
  // All eight parked (where the backend can tell), then one set.
  if (sut_.parked) {
    auto deadline = Clock::now() + seconds(20);
    while (sut_.parked() < kWaiters && Clock::now() < deadline)
      std::this_thread::sleep_for(milliseconds(2));
    EXPECT_EQ(sut_.parked(), kWaiters);
  } else {
    std::this_thread::sleep_for(milliseconds(100));
  }
  store_->set("go", toBytes("now"));
  for (auto& t : waiters) t.join();
  EXPECT_EQ(released.load(), kWaiters);
}

INSTANTIATE_TEST_SUITE_P(AllStores, StoreConformance, ::testing::ValuesIn(backends()),
                         [](const ::testing::TestParamInfo<Backend>& info) {
                           return info.param.name;
                         });

// The file store's point: processes that share nothing but a path.
// Run twice: with the default compaction threshold, and compacting on nearly every write, so
// that the two processes keep finding the file renamed under their locks.
class FileStoreSharing : public ::testing::TestWithParam<int64_t> {};
INSTANTIATE_TEST_SUITE_P(Compaction, FileStoreSharing, ::testing::Values(1 << 20, 64));

TEST_P(FileStoreSharing, ProcessesShareOneFile) {
  auto path = tempPath("fork");
  FileStoreOptions fo;
  fo.compact_bytes = GetParam();
  {
    FileStore parent(path, fo);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      int code = 0;
      try {
        FileStore child(path, fo);
        child.wait({"from_parent"}, seconds(20));
        for (int i = 0; i < 200; ++i) child.add("count", 1);
        child.set("from_child", toBytes("hi"));
      } catch (...) {
        code = 1;
      }
      _exit(code);
    }
    parent.set("from_parent", toBytes("go"));
    for (int i = 0; i < 200; ++i) parent.add("count", 1);
    EXPECT_EQ(toString(parent.get("from_child", seconds(20))), "hi");
    int status = 0;
    waitpid(pid, &status, 0);
    EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    EXPECT_EQ(parent.add("count", 0), 400) << "flock must make add atomic across processes";
    EXPECT_EQ(parent.numKeys(), 3);
  }
  // 400 adds and two sets appended some 12 KB of log; compaction keeps it near the live size.
  if (GetParam() < 1024) EXPECT_LT(std::filesystem::file_size(path), 1024u);
  std::filesystem::remove(path);
}

std::string readFile(const std::string& path) {
  std::string out;
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) return out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof(buf), f)) > 0) out.append(buf, n);
  std::fclose(f);
  return out;
}

// What a writer killed in the middle of a write leaves: the start of a frame.
TEST(FileStoreTest, ATornLastWriteIsIgnoredAndCutByTheNextWrite) {
  auto path = tempPath("torn");
  {
    FileStore fs(path);
    fs.set("a", toBytes("1"));
    fs.set("b", toBytes("2"));
  }
  const auto whole = readFile(path).size();
  {
    std::FILE* f = std::fopen(path.c_str(), "ab");
    const unsigned char torn[] = {100, 0, 0, 0, 1, 1, 0, 0, 0, 50, 0, 0, 0, 'c'};
    std::fwrite(torn, 1, sizeof(torn), f);
    std::fclose(f);
  }
  FileStore fs(path);
  EXPECT_EQ(fs.numKeys(), 2);
  EXPECT_EQ(toString(fs.get("b", seconds(1))), "2");
  EXPECT_FALSE(fs.check({"c"}));
  fs.set("c", toBytes("3"));
  const auto after = readFile(path).size();
  EXPECT_EQ(after, whole + 4 + 9 + 2) << "the torn bytes were cut before the new frame";
  FileStore other(path);
  EXPECT_EQ(toString(other.get("c", seconds(1))), "3");
  EXPECT_EQ(other.numKeys(), 3);
  std::filesystem::remove(path);
}

// SIGKILL a process at random points while it writes large values (and compacts): every
// write it reported done is still there, and the file always loads.
TEST(FileStoreTest, AWriterKilledMidWriteLosesNothingItReported) {
  auto path = tempPath("killed");
  FileStoreOptions fo;
  fo.compact_bytes = 4 << 20;
  {
    FileStore fs(path, fo);
    fs.set("sentinel", toBytes("kept"));
  }
  for (int round = 0; round < 8; ++round) {
    int fds[2];
    ASSERT_EQ(pipe(fds), 0);
    pid_t pid = fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      close(fds[0]);
      try {
        FileStore child(path, fo);
        Bytes value(512 * 1024, static_cast<uint8_t>(round));
        for (uint32_t i = 0;; ++i) {
          std::memcpy(value.data(), &i, sizeof(i));
          child.set(fmt::format("big{}", i % 4), value);
          if (write(fds[1], &i, sizeof(i)) != sizeof(i)) _exit(1);
        }
      } catch (...) {
        _exit(2);
      }
    }
    close(fds[1]);
    std::this_thread::sleep_for(milliseconds(20 + 37 * round));
    kill(pid, SIGKILL);
    int status = 0;
    waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the writer failed on its own: " << status;
    uint32_t i = 0, last = 0;
    bool any = false;
    while (read(fds[0], &i, sizeof(i)) == sizeof(i)) {
      last = i;
      any = true;
    }
    close(fds[0]);
    FileStore fs(path, fo);
    EXPECT_EQ(toString(fs.get("sentinel", seconds(1))), "kept") << "round " << round;
    if (any) {
      Bytes v = fs.get(fmt::format("big{}", last % 4), seconds(1));
      ASSERT_EQ(v.size(), 512u * 1024);
      uint32_t seen = 0;
      std::memcpy(&seen, v.data(), sizeof(seen));
      EXPECT_GE(seen, last) << "a write reported done was lost (round " << round << ")";
      EXPECT_EQ(seen % 4, last % 4);
    }
  }
  std::filesystem::remove(path);
  // A writer killed mid-compaction leaves its temporary ("<path>.tmp.<pid>").
  const std::string stale = std::filesystem::path(path).filename().string() + ".tmp.";
  for (const auto& e :
       std::filesystem::directory_iterator(std::filesystem::path(path).parent_path()))
    if (e.path().filename().string().rfind(stale, 0) == 0) std::filesystem::remove(e.path());
}

TEST(FileStoreTest, CorruptFileIsAStoreErrorNamingThePath) {
  auto path = tempPath("corrupt");
  {
    std::FILE* f = std::fopen(path.c_str(), "w");
    std::fputs("not a store", f);
    std::fclose(f);
  }
  FileStore fs(path);
  try {
    fs.check({"x"});
    FAIL();
  } catch (const StoreError& e) {
    EXPECT_THAT(e.what(), HasSubstr(path));
  }
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace ddpl::rdzv
