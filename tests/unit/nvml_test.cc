// launcher/gpu/nvml.h against the fake NVML of tests/fake_nvml (its figures come from the file that
// FAKE_NVML_CONFIG names), and against this machine's missing driver.
#include "launcher/gpu/nvml.h"

#include <dlfcn.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>

#include "common/errors.h"
#include "launcher/gpu/gpu.h"
#include "tests/common/subprocess.h"

using namespace ddpl::launcher;
using ::testing::HasSubstr;

namespace {

class NvmlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ddpl::testing::makeTempDir("nvml_test");
    config_ = dir_ + "/fake_nvml.conf";
    setenv("FAKE_NVML_CONFIG", config_.c_str(), 1);
  }
  void TearDown() override { std::remove(config_.c_str()); }

  // As tests must: a new file renamed over the old, so the fake never reads half of one.
  void configure(const std::string& text) {
    std::string tmp = config_ + ".tmp";
    std::ofstream(tmp) << text;
    ASSERT_EQ(std::rename(tmp.c_str(), config_.c_str()), 0);
  }

  std::unique_ptr<Nvml> load(const char* library = FAKE_NVML) {
    std::string why;
    auto nvml = Nvml::load(library, &why);
    EXPECT_TRUE(nvml) << why;
    return nvml;
  }

  std::string dir_, config_;
};

std::string listed(const Nvml& nvml, int gpu) {
  auto memory = nvml.processMemory(gpu);
  if (!memory) return "unknown";
  std::string out;
  for (const auto& [pid, bytes] : *memory)
    out += std::to_string(pid) + "=" + std::to_string(bytes) + " ";
  return out;
}

const char* kTwoGpus = R"(# two GPUs, the second one reporting little
driver_version 550.54.15
cuda_driver_version 12040
gpu0.name NVIDIA H100 80GB HBM3
gpu0.uuid GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0
gpu0.compute_capability 9.0
gpu0.memory 85520809984 1073741824
gpu0.utilization 87 40
gpu0.temperature 64   # Celsius
gpu0.throttle_reasons 0x24
gpu0.ecc_volatile 2 0
gpu0.ecc_aggregate 10 1
gpu0.mig 0 1
gpu1.name NVIDIA A10
gpu1.utilization error:3
gpu1.memory error:4
)";

TEST_F(NvmlTest, DriverAndStaticFactsOfEachGpu) {
  configure(kTwoGpus);
  auto nvml = load();
  ASSERT_TRUE(nvml);
  EXPECT_EQ(nvml->driverVersion(), "550.54.15");
  EXPECT_EQ(nvml->cudaDriverVersion(), 12040);
  ASSERT_EQ(nvml->deviceCount(), 2);

  GpuDeviceInfo a = nvml->device(0);
  EXPECT_EQ(a.index, 0);
  EXPECT_EQ(a.name, "NVIDIA H100 80GB HBM3");
  EXPECT_EQ(a.uuid, "GPU-0f1e2d3c-4b5a-6978-8796-a5b4c3d2e1f0");
  EXPECT_EQ(a.compute_major, 9);
  EXPECT_EQ(a.compute_minor, 0);
  EXPECT_EQ(a.memory_total_bytes, 85520809984ULL);
  EXPECT_EQ(a.mig_enabled, false);
  EXPECT_EQ(a.mig_enabled_pending, true);

  // What the driver does not report stays unknown, whatever the reason (not supported, not
  // permitted).
  GpuDeviceInfo b = nvml->device(1);
  EXPECT_EQ(b.name, "NVIDIA A10");
  EXPECT_EQ(b.uuid, "");
  EXPECT_FALSE(b.compute_major.has_value());
  EXPECT_FALSE(b.memory_total_bytes.has_value());
  EXPECT_FALSE(b.mig_enabled.has_value());
}

TEST_F(NvmlTest, SamplesReadTheFiguresOfTheMoment) {
  configure(kTwoGpus);
  auto nvml = load();
  ASSERT_TRUE(nvml);
  GpuSample s = nvml->sample(0);
  EXPECT_EQ(s.utilization_percent, 87u);
  EXPECT_EQ(s.memory_utilization_percent, 40u);
  EXPECT_EQ(s.memory_used_bytes, 1073741824ULL);
  EXPECT_EQ(s.memory_total_bytes, 85520809984ULL);
  EXPECT_EQ(s.temperature_celsius, 64u);
  EXPECT_EQ(s.throttle_reasons, throttle::kSwPowerCap | throttle::kSwThermalSlowdown);
  ASSERT_TRUE(s.ecc_volatile && s.ecc_aggregate);
  EXPECT_EQ(s.ecc_volatile->corrected, 2u);
  EXPECT_EQ(s.ecc_volatile->uncorrected, 0u);
  EXPECT_EQ(s.ecc_aggregate->corrected, 10u);
  EXPECT_EQ(s.ecc_aggregate->uncorrected, 1u);

  GpuSample unknown = nvml->sample(1);
  EXPECT_FALSE(unknown.utilization_percent.has_value());
  EXPECT_FALSE(unknown.memory_used_bytes.has_value());
  EXPECT_FALSE(unknown.temperature_celsius.has_value());
  EXPECT_FALSE(unknown.throttle_reasons.has_value());
  EXPECT_FALSE(unknown.ecc_volatile.has_value());

  // The same session sees new figures: nothing is cached between samples.
  configure(R"(gpu0.utilization 3 1
gpu0.memory 85520809984 42
gpu0.temperature 81
gpu0.throttle_reasons 0x40
gpu1.name NVIDIA A10
)");
  s = nvml->sample(0);
  EXPECT_EQ(s.utilization_percent, 3u);
  EXPECT_EQ(s.memory_used_bytes, 42u);
  EXPECT_EQ(s.temperature_celsius, 81u);
  EXPECT_EQ(s.throttle_reasons, throttle::kHwThermalSlowdown);
  EXPECT_FALSE(s.ecc_volatile.has_value());
}

TEST_F(NvmlTest, ALostGpuOrOneWithoutAHandleThrowsNamingIt) {
  configure("gpu0.name a\ngpu1.temperature error:15\ngpu2.handle error:4\n");
  auto nvml = load();
  ASSERT_TRUE(nvml);
  EXPECT_EQ(nvml->deviceCount(), 3);
  EXPECT_NO_THROW(nvml->sample(0));
  try {
    nvml->sample(1);
    FAIL() << "a lost GPU went unnoticed";
  } catch (const ddpl::Error& e) {
    EXPECT_STREQ(e.what(),
                 "GPU 1 is lost (fallen off the bus?): nvmlDeviceGetTemperature returned GPU is "
                 "lost (NVML error 15)");
  }
  try {
    nvml->device(2);
    FAIL() << "a GPU without a handle went unnoticed";
  } catch (const ddpl::Error& e) {
    EXPECT_STREQ(e.what(),
                 "GPU 2: nvmlDeviceGetHandleByIndex failed: Insufficient Permissions (NVML error "
                 "4)");
  }
  try {
    nvml->processMemory(3);
    FAIL() << "index 3 of 3 GPUs was accepted";
  } catch (const ddpl::InvalidArgument& e) {
    EXPECT_STREQ(e.what(), "GPU index 3 out of range: NVML reports 3 GPU(s)");
  }
  EXPECT_THROW(nvml->sample(-1), ddpl::InvalidArgument);
}

TEST_F(NvmlTest, ProcessMemoryByPidSummedWithUnreportedLeftOut) {
  // More processes than a first guess holds: the query's "insufficient size" round runs.
  std::string text = "gpu0.process 100 1000\ngpu0.process 100 24\ngpu0.process 200 n/a\n";
  for (int pid = 300; pid < 310; ++pid) text += "gpu0.process " + std::to_string(pid) + " 7\n";
  text += "gpu1.name idle\ngpu2.process error:3\n";
  configure(text);
  auto nvml = load();
  ASSERT_TRUE(nvml);
  auto memory = nvml->processMemory(0);
  ASSERT_TRUE(memory.has_value());
  EXPECT_EQ(memory->size(), 11u);
  EXPECT_EQ(memory->at(100), 1024u);  // listed twice (two MIG instances): summed
  EXPECT_EQ(memory->count(200), 0u);  // NVML_VALUE_NOT_AVAILABLE
  EXPECT_EQ(memory->at(309), 7u);
  // No process is an answer; a failed query is not.
  auto idle = nvml->processMemory(1);
  ASSERT_TRUE(idle.has_value());
  EXPECT_TRUE(idle->empty());
  EXPECT_FALSE(nvml->processMemory(2).has_value());
}

TEST_F(NvmlTest, ProcessMemoryOfProcessesTheTestStarted) {
  ddpl::testing::RunOptions rank1;
  rank1.env["NVML_TEST_LOCAL_RANK"] = "1";
  ddpl::testing::Background a({"/bin/sleep", "30"});
  ddpl::testing::Background b({"/bin/sleep", "30"}, rank1);
  configure("gpu0.process children:" + std::to_string(getpid()) +
            " 4096\ngpu1.process env:NVML_TEST_LOCAL_RANK=1 8192\n");
  auto nvml = load();
  ASSERT_TRUE(nvml);
  std::map<pid_t, uint64_t> both{{a.pid(), 4096}, {b.pid(), 4096}};
  std::map<pid_t, uint64_t> only_b{{b.pid(), 8192}};
  // The environment is the program's once it has exec'd: wait for that.
  EXPECT_TRUE(ddpl::testing::eventually([&] {
    return nvml->processMemory(0) == both && nvml->processMemory(1) == only_b;
  })) << "children found: "
      << listed(*nvml, 0) << "; with the variable: " << listed(*nvml, 1);
}

TEST_F(NvmlTest, InitFailureSaysWhyAndLeavesNothingInitialised) {
  configure("init_error 9\n");
  void* fake = dlopen(FAKE_NVML, RTLD_NOW | RTLD_LOCAL);
  ASSERT_TRUE(fake) << dlerror();
  auto init_count = reinterpret_cast<int (*)()>(dlsym(fake, "fake_nvml_init_count"));
  ASSERT_TRUE(init_count);
  std::string why;
  EXPECT_EQ(Nvml::load(FAKE_NVML, &why), nullptr);
  EXPECT_EQ(why, "nvmlInit failed: Driver Not Loaded (NVML error 9)");
  EXPECT_EQ(init_count(), 0);

  // Sessions nest, and each one ends its own initialisation.
  configure("gpu0.name a\n");
  {
    auto one = load();
    auto two = load();
    EXPECT_EQ(init_count(), 2);
    one.reset();
    EXPECT_EQ(init_count(), 1);
    EXPECT_EQ(two->device(0).name, "a");
  }
  EXPECT_EQ(init_count(), 0);
  dlclose(fake);
}

TEST_F(NvmlTest, MissingLibraryMeansNoDriver) {
  std::string why = "unchanged";
  EXPECT_EQ(Nvml::load(dir_ + "/libnvidia-ml.so.1", &why), nullptr);
  EXPECT_EQ(why, dir_ + "/libnvidia-ml.so.1 not found: no NVIDIA driver");
  // Something that is not a library at all is a different complaint.
  std::ofstream(dir_ + "/garbage.so") << "not ELF";
  EXPECT_EQ(Nvml::load(dir_ + "/garbage.so", &why), nullptr);
  EXPECT_THAT(why, HasSubstr(dir_ + "/garbage.so could not be loaded: "));
}

TEST_F(NvmlTest, ThisMachineWithoutADriver) {
  if (void* real = dlopen(kDefaultNvmlLibrary, RTLD_NOW | RTLD_LOCAL)) {
    dlclose(real);
    GTEST_SKIP() << "this machine has an NVIDIA driver";
  }
  std::string why;
  EXPECT_EQ(Nvml::load(kDefaultNvmlLibrary, &why), nullptr);
  EXPECT_EQ(why, "libnvidia-ml.so.1 not found: no NVIDIA driver");
  GpuInfo info = discoverGpus(nullptr, true);
  EXPECT_EQ(info.physical, 0);
  EXPECT_EQ(info.source, "none: libnvidia-ml.so.1 not found: no NVIDIA driver");
}

TEST_F(NvmlTest, AnOlderDriverLeavesItsMissingFiguresUnknown) {
  configure(kTwoGpus + std::string("gpu0.process 100 1000\n"));
  auto nvml = load(FAKE_NVML_SPARSE);
  ASSERT_TRUE(nvml);
  EXPECT_EQ(nvml->cudaDriverVersion(), 12040);  // through the unversioned query
  GpuDeviceInfo info = nvml->device(0);
  EXPECT_EQ(info.name, "NVIDIA H100 80GB HBM3");
  EXPECT_FALSE(info.mig_enabled.has_value());        // no nvmlDeviceGetMigMode
  EXPECT_FALSE(nvml->processMemory(0).has_value());  // no _v3 process query
  // The throttle query under its newer name only.
  EXPECT_EQ(nvml->sample(0).throttle_reasons, 0x24u);
}

TEST_F(NvmlTest, DiscoverGpusCountsWhatNvmlReports) {
  configure(kTwoGpus);
  GpuInfo info = discoverGpus("1", true, FAKE_NVML);
  EXPECT_EQ(info.source, "nvml");
  EXPECT_EQ(info.physical, 2);
  EXPECT_EQ(info.visible, 1);
  EXPECT_EQ(discoverGpus(nullptr, true, FAKE_NVML).visible, 2);
  configure("init_error 18\n");
  info = discoverGpus(nullptr, true, FAKE_NVML);
  EXPECT_EQ(info.physical, 0);
  EXPECT_EQ(info.source,
            "none: nvmlInit failed: RM has detected an NVML/RM version mismatch. (NVML error 18)");
}

TEST(NvmlThrottle, ReasonsInWords) {
  EXPECT_EQ(describeThrottleReasons(0), "none");
  EXPECT_EQ(describeThrottleReasons(throttle::kSwPowerCap | throttle::kHwThermalSlowdown),
            "sw_power_cap,hw_thermal_slowdown");
  EXPECT_EQ(describeThrottleReasons(throttle::kGpuIdle | 0x8000000000000000ULL),
            "gpu_idle,0x8000000000000000");
}

}  // namespace
