// In-process tests of the worker library: c10d store adapter conformance (threads as ranks over
// MemoryStore, including a real Gloo group), GradScaler and DistributedSampler against the
// pinned PyTorch, checkpoints, error files, environment parsing.
#include <ATen/autocast_mode.h>
#include <dirent.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <torch/torch.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "common/errors.h"
#include "rendezvous/store/memory_store.h"
#include "worker/amp.h"
#include "worker/backends.h"
#include "worker/checkpoint_archive.h"
#include "worker/error_report.h"
#include "worker/sampler.h"
#include "worker/session.h"
#include "worker/store_adapter.h"

namespace dw = ddpl::worker;
using ddpl::rdzv::MemoryStore;

namespace {

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

std::string runPython(const std::string& args) {
  const std::string cmd = std::string(DDPL_PYTHON) + " " + DDPL_SOURCE_DIR + "/tests/unit/worker_reference.py " + args;
  FILE* pipe = ::popen(cmd.c_str(), "r");
  if (!pipe) throw std::runtime_error("cannot run " + cmd);
  std::string out;
  char buf[4096];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, pipe)) > 0) out.append(buf, n);
  if (::pclose(pipe) != 0) throw std::runtime_error("reference script failed: " + cmd);
  return out;
}

std::string tempPath(const std::string& name) {
  return ::testing::TempDir() + "/" + name + "." + std::to_string(::getpid());
}

TEST(WorkerStoreAdapter, BehavesLikeC10dStore) {
  auto store = c10::make_intrusive<dw::RdzvC10dStore>(std::make_shared<MemoryStore>(), std::chrono::milliseconds(200));
  store->set("a", bytes("1"));
  EXPECT_EQ(store->get("a"), bytes("1"));
  EXPECT_EQ(store->add("n", 5), 5);
  EXPECT_EQ(store->add("n", -2), 3);
  EXPECT_TRUE(store->check({"a", "n"}));
  EXPECT_FALSE(store->check({"a", "missing"}));
  // compareSet: absent + empty expected creates; wrong expected returns the current value.
  EXPECT_EQ(store->compareSet("c", {}, bytes("x")), bytes("x"));
  EXPECT_EQ(store->compareSet("c", bytes("nope"), bytes("y")), bytes("x"));
  EXPECT_EQ(store->compareSet("c", bytes("x"), bytes("y")), bytes("y"));
  store->append("log", bytes("ab"));
  store->append("log", bytes("cd"));
  EXPECT_EQ(store->get("log"), bytes("abcd"));
  store->multiSet({"m1", "m2"}, {bytes("1"), bytes("2")});
  EXPECT_EQ(store->multiGet({"m1", "m2"}), (std::vector<std::vector<uint8_t>>{bytes("1"), bytes("2")}));
  EXPECT_EQ(store->getNumKeys(), 6);
  EXPECT_TRUE(store->deleteKey("a"));
  EXPECT_FALSE(store->deleteKey("a"));
  // Timeouts are errors naming the key, never hangs (a hang fails by ctest's timeout).
  try {
    store->get("never");
    FAIL() << "get of a missing key returned";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find("never"), std::string::npos) << e.what();
  }
  EXPECT_THROW(store->wait({"never"}, std::chrono::milliseconds(50)), std::exception);
  // A waiter is released by another thread's set.
  std::thread setter([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    store->set("late", bytes("v"));
  });
  store->wait({"late"}, std::chrono::seconds(5));
  setter.join();
  auto clone = store->clone();
  EXPECT_EQ(clone->get("late"), bytes("v"));
}

// Threads as ranks: LibTorch's ProcessGroupGloo bootstraps through our store and all-reduces.
TEST(WorkerStoreAdapter, BootstrapsGlooProcessGroup) {
  constexpr int kWorld = 3;
  auto shared = std::make_shared<MemoryStore>();
  std::vector<double> results(kWorld, -1);
  std::vector<std::thread> ranks;
  for (int r = 0; r < kWorld; ++r) {
    ranks.emplace_back([&, r] {
      dw::detail::BackendSpec spec;
      spec.store = c10::make_intrusive<dw::RdzvC10dStore>(shared, std::chrono::seconds(30));
      spec.rank = r;
      spec.world_size = kWorld;
      spec.timeout = std::chrono::seconds(30);
      spec.gloo_interface = "lo";
      auto backend = dw::detail::makeGlooBackend(spec);
      std::vector<at::Tensor> t{torch::full({4}, static_cast<double>(r + 1))};
      backend->allreduce(t)->wait();
      results[r] = t[0][3].item<double>();
    });
  }
  for (auto& t : ranks) t.join();
  for (int r = 0; r < kWorld; ++r) EXPECT_EQ(results[r], 6.0);
}

TEST(WorkerGradScaler, MatchesPyTorchSkipsOnInfAndAdjustsScale) {
  const std::string pattern = "ffiffffiif";
  const auto expected = nlohmann::json::parse(runPython("scaler " + pattern));
  auto p = torch::zeros({3}).requires_grad_(true);
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(1.0));
  dw::GradScalerOptions options;
  options.init_scale = 1024.0;
  options.growth_interval = 2;
  dw::GradScaler scaler(options);
  ASSERT_EQ(expected.size(), pattern.size());
  for (size_t i = 0; i < pattern.size(); ++i) {
    opt.zero_grad();
    auto loss = (p * (pattern[i] == 'i' ? std::numeric_limits<float>::infinity() : 1.0f)).sum();
    scaler.scale(loss).backward();
    const bool stepped = scaler.step(opt);
    scaler.update();
    EXPECT_EQ(stepped, expected[i]["stepped"].get<bool>()) << "step " << i;
    EXPECT_EQ(scaler.currentScale(), expected[i]["scale"].get<double>()) << "step " << i;
    EXPECT_FLOAT_EQ(p[0].item<float>(), expected[i]["param"].get<float>()) << "step " << i;
  }
}

TEST(WorkerGradScaler, RefusesDoubleUnscale) {
  auto p = torch::zeros({2}).requires_grad_(true);
  torch::optim::SGD opt({p}, torch::optim::SGDOptions(0.1));
  dw::GradScaler scaler;
  scaler.scale(p.sum()).backward();
  scaler.unscale(opt);
  EXPECT_THROW(scaler.unscale(opt), ddpl::InvalidArgument);
}

TEST(WorkerAutocast, ScopeEnablesAndRestores) {
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  {
    dw::AutocastScope scope(at::kCPU);
    auto a = torch::randn({4, 4});
    EXPECT_EQ(torch::mm(a, a).scalar_type(), at::kBFloat16);
  }
  EXPECT_FALSE(at::autocast::is_autocast_enabled(at::kCPU));
  EXPECT_EQ(torch::mm(torch::randn({2, 2}), torch::randn({2, 2})).scalar_type(), at::kFloat);
}

TEST(WorkerSampler, MatchesPyTorchShards) {
  for (const auto& [n, world, drop] : {std::tuple{23, 4, 0}, std::tuple{23, 4, 1}, std::tuple{3, 4, 0}}) {
    const auto expected = nlohmann::json::parse(runPython("sampler " + std::to_string(n) + " " + std::to_string(world) +
                                                          " 7 3 " + std::to_string(drop)));
    for (int r = 0; r < world; ++r) {
      dw::SamplerOptions o;
      o.seed = 7;
      o.drop_last = drop != 0;
      dw::DistributedSampler sampler(n, r, world, o);
      sampler.setEpoch(3);
      EXPECT_EQ(sampler.indices(), expected[r].get<std::vector<int64_t>>()) << "n=" << n << " rank " << r;
    }
  }
}

TEST(WorkerSampler, ShardsAreDisjointAndReshuffledPerEpoch) {
  std::vector<int64_t> all;
  for (int r = 0; r < 3; ++r) {
    dw::DistributedSampler s(30, r, 3);
    auto idx = s.indices();
    all.insert(all.end(), idx.begin(), idx.end());
    s.setEpoch(1);
    EXPECT_NE(s.indices(), idx);
  }
  std::sort(all.begin(), all.end());
  for (int i = 0; i < 30; ++i) EXPECT_EQ(all[i], i);
}

TEST(WorkerCheckpoint, RoundTripsModelOptimizerScalerProgress) {
  torch::manual_seed(3);
  auto model = torch::nn::Linear(4, 2);
  torch::optim::Adam opt(model->parameters());
  model(torch::randn({2, 4})).sum().backward();
  opt.step();
  dw::GradScaler scaler;
  scaler.scale(torch::ones({1}));
  dw::TrainingProgress progress{3, 42, 1000};
  const std::string path = tempPath("ckpt");
  dw::saveCheckpoint(path, {model.get(), &opt, &scaler, &progress});

  torch::manual_seed(99);
  auto other = torch::nn::Linear(4, 2);
  torch::optim::Adam otherOpt(other->parameters());
  dw::GradScaler otherScaler(dw::GradScalerOptions{.init_scale = 8.0});
  dw::TrainingProgress loaded;
  ASSERT_TRUE(dw::loadCheckpoint(path, {other.get(), &otherOpt, &otherScaler, &loaded}));
  EXPECT_TRUE(torch::equal(other->weight, model->weight));
  EXPECT_EQ(loaded.step, 42);
  EXPECT_EQ(loaded.epoch, 3);
  EXPECT_EQ(loaded.samples_seen, 1000);
  EXPECT_EQ(otherScaler.currentScale(), 65536.0);
  EXPECT_FALSE(dw::loadCheckpoint(path + ".absent", {other.get()}));
  std::remove(path.c_str());
}

TEST(WorkerErrorFile, TorchrunFormatForC10Error) {
  const std::string path = tempPath("error.json");
  const int rc = dw::recordErrors(path, []() -> int {
    TORCH_CHECK(false, "shape check failed for ", 7);  // throw site: TorchrunFormatForC10Error
    return 0;
  });
  EXPECT_EQ(rc, 1);
  std::ifstream in(path);
  const auto json = nlohmann::json::parse(in);
  EXPECT_EQ(json["message"]["message"].get<std::string>(), "c10::Error: shape check failed for 7");
  EXPECT_TRUE(json["message"]["extraInfo"]["timestamp"].is_string());
  // The frame of the TORCH_CHECK is symbolised from this program's debug information (c10 alone
  // names only exported functions, with no source line).
  const std::string trace = json["message"]["extraInfo"]["py_callstack"].get<std::string>();
  int line = 0, throwLine = 0;
  std::ifstream source(std::string(DDPL_SOURCE_DIR) + "/tests/unit/worker_unit_test.cc");
  for (std::string text; throwLine == 0 && std::getline(source, text);) {
    ++line;
    if (text.find("// throw site: TorchrunFormatForC10Error") != std::string::npos)
      throwLine = line;
  }
  ASSERT_GT(throwLine, 0);
  std::istringstream frames(trace);
  int named = 0;
  for (std::string text; std::getline(frames, text);) {
    if (text.rfind("frame #", 0) == 0 &&
        text.find("tests/unit/worker_unit_test.cc:" + std::to_string(throwLine) + " (") !=
            std::string::npos)
      ++named;
  }
  EXPECT_EQ(named, 1) << trace;
  std::remove(path.c_str());
}

TEST(WorkerSessionOptions, ParsesLauncherEnvironmentExplicitly) {
  const auto o = dw::SessionOptions::fromEnvironment(dw::Environment{
      {"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
      {"MASTER_ADDR", "10.0.0.1"}, {"MASTER_PORT", "29999"}, {"TORCHELASTIC_USE_AGENT_STORE", "True"},
      {"TORCHELASTIC_RESTART_COUNT", "2"}, {"TORCHELASTIC_ERROR_FILE", "/tmp/e.json"},
      {"DDPL_STORE_ADDR", "h:1"}, {"DDPL_BACKEND", "gloo"}});
  EXPECT_EQ(o.rank, 3);
  EXPECT_EQ(o.world_size, 4);
  EXPECT_EQ(o.local_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 29999);
  EXPECT_TRUE(o.agent_hosts_store);
  EXPECT_EQ(o.restart_count, 2);
  EXPECT_EQ(o.error_file, "/tmp/e.json");
  EXPECT_EQ(o.store_addr, "h:1");
  EXPECT_EQ(o.backend, dw::BackendKind::kGloo);
  try {
    dw::SessionOptions::fromEnvironment(dw::Environment{{"RANK", "x1"}});
    FAIL();
  } catch (const ddpl::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='x1'"), std::string::npos);
  }
  EXPECT_THROW(dw::SessionOptions::fromEnvironment(dw::Environment{{"RANK", "2"}, {"WORLD_SIZE", "2"}}),
               ddpl::InvalidArgument);
}

TEST(WorkerSessionOptions, RetainFreedMemoryIsOnUnlessTheUserTunesMalloc) {
  using E = dw::Environment;
  EXPECT_TRUE(dw::SessionOptions::fromEnvironment(E{}).retain_freed_memory);
  // glibc's own settings are the user's choice: ours would override them.
  EXPECT_FALSE(dw::SessionOptions::fromEnvironment(E{{"MALLOC_MMAP_THRESHOLD_", "65536"}})
                   .retain_freed_memory);
  EXPECT_FALSE(
      dw::SessionOptions::fromEnvironment(E{{"MALLOC_TRIM_THRESHOLD_", "0"}}).retain_freed_memory);
  EXPECT_FALSE(
      dw::SessionOptions::fromEnvironment(E{{"GLIBC_TUNABLES", "glibc.malloc.trim_threshold=0"}})
          .retain_freed_memory);
  EXPECT_TRUE(
      dw::SessionOptions::fromEnvironment(E{{"GLIBC_TUNABLES", "glibc.malloc.tcache_count=0"}})
          .retain_freed_memory);
  // DDPL_RETAIN_FREED_MEMORY says it outright, either way.
  EXPECT_TRUE(dw::SessionOptions::fromEnvironment(
                  E{{"MALLOC_MMAP_THRESHOLD_", "65536"}, {"DDPL_RETAIN_FREED_MEMORY", "1"}})
                  .retain_freed_memory);
  EXPECT_FALSE(dw::SessionOptions::fromEnvironment(E{{"DDPL_RETAIN_FREED_MEMORY", "0"}})
                   .retain_freed_memory);
  try {
    dw::SessionOptions::fromEnvironment(E{{"DDPL_RETAIN_FREED_MEMORY", "maybe"}});
    FAIL();
  } catch (const ddpl::InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("DDPL_RETAIN_FREED_MEMORY"), std::string::npos) << e.what();
  }
}

// The library reads and writes no environment of its own accord: the explicit parser is pure,
// and only the process-level fromEnvironment() (called in main) gives NCCL its error-handling
// default, keeping a value already set under either of the names ProcessGroupNCCL reads.
TEST(WorkerSessionOptions, OnlyTheProcessLevelParserSetsNcclErrorHandling) {
  struct Saved {
    std::optional<std::string> current, legacy;
    Saved() {
      if (const char* v = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING")) current = v;
      if (const char* v = std::getenv("NCCL_ASYNC_ERROR_HANDLING")) legacy = v;
    }
    ~Saved() {
      current ? ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", current->c_str(), 1)
              : ::unsetenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
      legacy ? ::setenv("NCCL_ASYNC_ERROR_HANDLING", legacy->c_str(), 1) : ::unsetenv("NCCL_ASYNC_ERROR_HANDLING");
    }
  } saved;
  auto value = []() -> std::string {
    const char* v = std::getenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
    return v ? v : "<unset>";
  };
  ::unsetenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  ::unsetenv("NCCL_ASYNC_ERROR_HANDLING");
  dw::SessionOptions::fromEnvironment(dw::Environment{});
  EXPECT_EQ(value(), "<unset>");
  dw::SessionOptions::fromEnvironment();
  EXPECT_EQ(value(), dw::kDefaultNcclAsyncErrorHandling);
  ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0", 1);
  dw::SessionOptions::fromEnvironment();
  EXPECT_EQ(value(), "0");
  ::unsetenv("TORCH_NCCL_ASYNC_ERROR_HANDLING");
  ::setenv("NCCL_ASYNC_ERROR_HANDLING", "2", 1);
  dw::SessionOptions::fromEnvironment();
  EXPECT_EQ(value(), "<unset>");
}

// A write that fails part way through the archive (EFBIG past RLIMIT_FSIZE, which binds root
// too, as a full disk would): the error names the path and errno, crosses LibTorch's zip writer
// as our error rather than its generic one, and leaves the previous checkpoint and no temporary.
// (POSIX calls, not std::filesystem: LibTorch exports its own, ABI-incompatible copy of some of
// it, and remove_all resolved there crashes.)
TEST(WorkerCheckpoint, FailedWriteNamesThePathAndLeavesTheOldOneAndNoTemporary) {
  const std::string dir = tempPath("ckpt-fail");
  ASSERT_EQ(::mkdir(dir.c_str(), 0700), 0) << std::strerror(errno);
  const std::string path = dir + "/ckpt.pt";
  torch::manual_seed(5);
  auto model = torch::nn::Linear(2, 2);
  dw::saveCheckpoint(path, {model.get()});
  auto big = torch::nn::Linear(512, 512);  // 1 MiB of weights, past the limit below
  rlimit saved{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &saved), 0);
  auto* previous = ::signal(SIGXFSZ, SIG_IGN);
  rlimit small = saved;
  small.rlim_cur = 64 << 10;
  ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
  std::string message;
  try {
    dw::saveCheckpoint(path, {big.get()});
  } catch (const std::exception& e) {
    message = e.what();
  }
  ::setrlimit(RLIMIT_FSIZE, &saved);
  ::signal(SIGXFSZ, previous);
  EXPECT_NE(message.find("cannot write " + path + ": write " + path + ".tmp."), std::string::npos) << message;
  EXPECT_NE(message.find("errno " + std::to_string(EFBIG)), std::string::npos) << message;
  std::vector<std::string> names;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (const dirent* e = ::readdir(d))
      if (std::string(e->d_name) != "." && std::string(e->d_name) != "..") names.push_back(e->d_name);
    ::closedir(d);
  }
  EXPECT_EQ(names, std::vector<std::string>{"ckpt.pt"});
  auto other = torch::nn::Linear(2, 2);
  EXPECT_TRUE(dw::loadCheckpoint(path, {other.get()}));
  EXPECT_TRUE(torch::equal(other->weight, model->weight));
  for (const auto& name : names) ::unlink((dir + "/" + name).c_str());
  ::rmdir(dir.c_str());
}

TEST(WorkerNccl, SkipsCleanlyWithoutGpu) {
  if (dw::detail::cudaAvailable()) GTEST_SKIP() << "GPU present: exercised by tests/gpu/";
  dw::detail::BackendSpec spec;
  spec.store = c10::make_intrusive<dw::RdzvC10dStore>(std::make_shared<MemoryStore>());
  try {
    dw::detail::makeNcclBackend(spec);
    FAIL() << "NCCL backend created without a GPU";
  } catch (const ddpl::BackendError& e) {
    EXPECT_NE(std::string(e.what()).find("NCCL"), std::string::npos);
  }
}

}  // namespace
