// launcher/doctor/doctor.h: each check's ok/warn/fail paths against fakes (the fake NVML, fake
// /proc and /sys roots, a fake Python that prints a chosen torch configuration), and `launch
// doctor` itself, on this machine and against the fake NVML.
#include "launcher/doctor/doctor.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <regex>
#include <set>

#include "common/errors.h"
#include "common/secrets.h"
#include "launcher/doctor/manifest.h"
#include "tests/common/subprocess.h"

using namespace ddpl::launcher;
using ddpl::kMasked;
using ddpl::maskCommandLine;
using ddpl::maskEnvironment;
using ddpl::maskSecretsInText;
using ::testing::HasSubstr;
namespace fs = std::filesystem;

namespace {

const Finding* find(const std::vector<Finding>& fs, const std::string& check) {
  for (const auto& f : fs)
    if (f.check == check) return &f;
  return nullptr;
}

Verdict verdictOf(const std::vector<Finding>& fs, const std::string& check) {
  const Finding* f = find(fs, check);
  EXPECT_TRUE(f) << "no finding '" << check << "' in\n" << formatFindings(fs);
  return f ? f->verdict : Verdict::kOk;
}

class DoctorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = ddpl::testing::makeTempDir("doctor_test");
    config_ = dir_ + "/nvml.conf";
    setenv("FAKE_NVML_CONFIG", config_.c_str(), 1);
  }
  void TearDown() override { fs::remove_all(dir_); }
  void nvml(const std::string& text) { std::ofstream(config_) << text; }
  void write(const std::string& rel, const std::string& text) {
    fs::create_directories(fs::path(dir_ + "/" + rel).parent_path());
    std::ofstream(dir_ + "/" + rel) << text;
  }
  // A fake interpreter that prints `probe` whatever it is asked.
  std::string fakePython(const std::string& probe) {
    std::string path = dir_ + "/python";
    std::ofstream(path) << "#!/bin/sh\ncat <<'END'\n" << probe << "END\n";
    chmod(path.c_str(), 0755);
    return path;
  }
  std::string dir_, config_;
};

constexpr const char* kTwoGpus =
    "driver_version 550.54.15\ncuda_driver_version 12040\n"
    "gpu0.name NVIDIA A100-SXM4-80GB\ngpu0.uuid GPU-0a0a\ngpu0.compute_capability 8.0\n"
    "gpu0.memory 85899345920 0\ngpu0.temperature 40\ngpu0.throttle_reasons 0x1\n"
    "gpu0.ecc_volatile 0 0\ngpu0.ecc_aggregate 0 0\ngpu0.mig 0 0\n"
    "gpu1.name NVIDIA H100 80GB HBM3\ngpu1.uuid GPU-1b1b\ngpu1.compute_capability 9.0\n"
    "gpu1.memory 85899345920 0\ngpu1.temperature 50\n";

TEST_F(DoctorTest, GpusFromTheFakeDriverAreOkWithTheirFacts) {
  nvml(kTwoGpus);
  GpuFacts g = readGpuFacts(FAKE_NVML);
  ASSERT_TRUE(g.driver);
  auto fs = checkGpus(g);
  EXPECT_EQ(verdictOf(fs, "driver"), Verdict::kOk);
  EXPECT_THAT(find(fs, "driver")->value, HasSubstr("550.54.15 (supports CUDA up to 12.4)"));
  EXPECT_EQ(verdictOf(fs, "gpu0"), Verdict::kOk);
  EXPECT_THAT(find(fs, "gpu0")->value,
              HasSubstr("NVIDIA A100-SXM4-80GB, capability 8.0, 80.0 GiB, 40C"));
  EXPECT_THAT(find(fs, "gpu0")->value, HasSubstr("MIG off"));
  EXPECT_EQ(verdictOf(fs, "gpu1"), Verdict::kOk);
  EXPECT_FALSE(anyFailed(fs));
}

TEST_F(DoctorTest, EccMigHeatAndThrottlingAreJudged) {
  nvml("driver_version 550.54.15\n"
       "gpu0.name G\ngpu0.ecc_volatile 5 0\ngpu0.ecc_aggregate 9 0\n"       // corrected: ok
       "gpu1.name G\ngpu1.ecc_volatile 0 0\ngpu1.ecc_aggregate 0 2\n"       // lifetime: warn
       "gpu2.name G\ngpu2.ecc_volatile 0 1\n"                               // now: fail
       "gpu3.name G\ngpu3.mig 1 1\n"                                        // MIG on: warn
       "gpu4.name G\ngpu4.mig 0 1\n"                                        // pending: warn
       "gpu5.name G\ngpu5.temperature 91\n"                                 // hot: warn
       "gpu6.name G\ngpu6.throttle_reasons 0x40\n"                          // thermal: warn
       "gpu7.name G\ngpu7.throttle_reasons 0x5\n"                           // idle+power cap: ok
       "gpu8.handle error:4\n");                                            // unreachable: fail
  auto fs = checkGpus(readGpuFacts(FAKE_NVML));
  EXPECT_EQ(verdictOf(fs, "gpu0"), Verdict::kOk);
  EXPECT_EQ(verdictOf(fs, "gpu1"), Verdict::kWarn);
  EXPECT_THAT(find(fs, "gpu1")->advice, HasSubstr("2 uncorrected ECC error(s) over the GPU's life"));
  EXPECT_EQ(verdictOf(fs, "gpu2"), Verdict::kFail);
  EXPECT_THAT(find(fs, "gpu2")->advice, HasSubstr("1 uncorrected ECC error(s) since the driver"));
  EXPECT_EQ(verdictOf(fs, "gpu3"), Verdict::kWarn);
  EXPECT_THAT(find(fs, "gpu3")->advice, HasSubstr("MIG is on"));
  EXPECT_EQ(verdictOf(fs, "gpu4"), Verdict::kWarn);
  EXPECT_THAT(find(fs, "gpu4")->advice, HasSubstr("MIG turns on at the next GPU reset"));
  EXPECT_EQ(verdictOf(fs, "gpu5"), Verdict::kWarn);
  EXPECT_THAT(find(fs, "gpu5")->advice, HasSubstr("91C is hot"));
  EXPECT_EQ(verdictOf(fs, "gpu6"), Verdict::kWarn);
  EXPECT_THAT(find(fs, "gpu6")->advice, HasSubstr("hw_thermal_slowdown"));
  EXPECT_EQ(verdictOf(fs, "gpu7"), Verdict::kOk);
  EXPECT_EQ(verdictOf(fs, "gpu8"), Verdict::kFail);
}

TEST_F(DoctorTest, NoDriverIsSaidPlainlyAndIsNotAFailure) {
  auto fs = checkGpus(readGpuFacts("/nonexistent/libnvidia-ml.so.1"));
  ASSERT_EQ(fs.size(), 1u);
  EXPECT_EQ(fs[0].verdict, Verdict::kOk);
  EXPECT_THAT(fs[0].value, HasSubstr("no GPU to use here; CPU training"));
}

TEST_F(DoctorTest, CudaVisibleDevicesIsCheckedAgainstTheGpus) {
  nvml(kTwoGpus);
  GpuFacts g = readGpuFacts(FAKE_NVML);
  auto cvd = [&](const std::string& v) { return *checkCudaVisibleDevices({{"CUDA_VISIBLE_DEVICES", v}}, g); };
  EXPECT_FALSE(checkCudaVisibleDevices({}, g));
  EXPECT_EQ(cvd("1,0").verdict, Verdict::kOk);
  EXPECT_EQ(cvd("GPU-1b1b").verdict, Verdict::kOk);
  Finding f = cvd("0,2");
  EXPECT_EQ(f.verdict, Verdict::kFail);
  EXPECT_THAT(f.value, HasSubstr("GPU 2 does not exist (2 GPU(s): 0..1)"));
  EXPECT_THAT(f.value, HasSubstr("leaving 1 GPU(s) visible"));
  EXPECT_EQ(cvd("0,0").verdict, Verdict::kFail);
  EXPECT_EQ(cvd("GPU-ffff").verdict, Verdict::kFail);
  EXPECT_EQ(cvd("").verdict, Verdict::kWarn);
  EXPECT_EQ(checkCudaVisibleDevices({{"CUDA_VISIBLE_DEVICES", "0"}}, GpuFacts{})->verdict,
            Verdict::kWarn);
}

TEST(KernelImage, ExactSameMajorPtxAndNone) {
  std::vector<std::string> l = {"sm_70", "sm_80", "sm_90a", "compute_80"};
  EXPECT_EQ(kernelImageFor(l, 8, 0), "sm");
  EXPECT_EQ(kernelImageFor(l, 8, 6), "sm");     // sm_80 binaries run on 8.6
  EXPECT_EQ(kernelImageFor(l, 9, 0), "sm");     // sm_90a is exactly 9.0
  EXPECT_EQ(kernelImageFor(l, 10, 0), "ptx");   // compute_80 JIT
  EXPECT_EQ(kernelImageFor({"sm_70", "sm_80"}, 10, 0), "none");
  EXPECT_EQ(kernelImageFor({"sm_80", "sm_90"}, 6, 1), "none");  // older than every build
  EXPECT_EQ(kernelImageFor({"sm_90a"}, 9, 1), "none");  // arch-specific: no forward use
}

TEST_F(DoctorTest, TorchProbeFromAFakePythonPredictsNoKernelImage) {
  nvml(kTwoGpus);
  GpuFacts g = readGpuFacts(FAKE_NVML);
  std::string py = fakePython(
      "torch=2.4.0+cu121\ncuda=12.1\ncudnn=90100\nnccl=2.20.5\ncuda_available=1\n"
      "device_count=2\narch_list=sm_50 sm_60 sm_70 sm_80\n");
  TorchProbe t = probeTorch(py, 10);
  ASSERT_TRUE(t.probed) << t.error;
  EXPECT_EQ(t.torch_version, "2.4.0+cu121");
  auto fs = checkTorch(t, g);
  EXPECT_EQ(verdictOf(fs, "torch"), Verdict::kOk);
  EXPECT_EQ(verdictOf(fs, "torch.cuda"), Verdict::kOk);
  EXPECT_EQ(find(fs, "torch.cudnn")->value, "90100");
  EXPECT_EQ(find(fs, "torch.nccl")->value, "2.20.5");
  EXPECT_EQ(verdictOf(fs, "torch.cuda.is_available"), Verdict::kOk);
  EXPECT_EQ(verdictOf(fs, "torch.arch gpu0"), Verdict::kOk);  // A100, sm_80
  EXPECT_EQ(verdictOf(fs, "torch.arch gpu1"), Verdict::kFail);  // H100 9.0, no sm_90
  EXPECT_THAT(find(fs, "torch.arch gpu1")->advice, HasSubstr("no kernel image is available"));
  EXPECT_THAT(find(fs, "torch.arch gpu1")->advice, HasSubstr("sm_90"));
}

TEST_F(DoctorTest, WheelCudaAgainstTheDriver) {
  nvml(kTwoGpus);  // driver for CUDA 12.4
  GpuFacts g = readGpuFacts(FAKE_NVML);
  auto torch = [&](const std::string& cuda) {
    return parseTorchProbe("torch=2.6\ncuda=" + cuda + "\ncuda_available=1\narch_list=sm_80 sm_90\n");
  };
  EXPECT_EQ(verdictOf(checkTorch(torch("12.4"), g), "torch.cuda"), Verdict::kOk);
  auto minor = checkTorch(torch("12.6"), g);
  EXPECT_EQ(verdictOf(minor, "torch.cuda"), Verdict::kWarn);
  EXPECT_THAT(find(minor, "torch.cuda")->advice, HasSubstr("minor-version compatibility"));
  auto major = checkTorch(torch("13.0"), g);
  EXPECT_EQ(verdictOf(major, "torch.cuda"), Verdict::kFail);
  EXPECT_THAT(find(major, "torch.cuda")->advice,
              HasSubstr("needs a newer driver than 550.54.15 (CUDA 12.4)"));
}

TEST_F(DoctorTest, TorchThatCannotUseTheGpusOrIsMissingFails) {
  nvml(kTwoGpus);
  GpuFacts g = readGpuFacts(FAKE_NVML);
  auto fs = checkTorch(parseTorchProbe("torch=2.6\ncuda=12.4\ncuda_available=0\n"), g);
  EXPECT_EQ(verdictOf(fs, "torch.cuda.is_available"), Verdict::kFail);
  auto cpu = checkTorch(parseTorchProbe("torch=2.6+cpu\ncuda=\ncuda_available=0\n"), g);
  EXPECT_EQ(verdictOf(cpu, "torch.cuda"), Verdict::kWarn);  // CPU wheel, GPU machine
  auto cpu_here = checkTorch(parseTorchProbe("torch=2.6+cpu\ncuda=\ncuda_available=0\n"), GpuFacts{});
  EXPECT_FALSE(anyFailed(cpu_here));
  auto missing = checkTorch(probeTorch(fakePython("error=No module named 'torch'\n"), 10), g);
  EXPECT_EQ(verdictOf(missing, "torch"), Verdict::kFail);
  EXPECT_THAT(find(missing, "torch")->value, HasSubstr("No module named 'torch'"));
  auto absent = checkTorch(probeTorch(dir_ + "/no-such-python", 10), g);
  EXPECT_EQ(verdictOf(absent, "torch"), Verdict::kFail);
}

TEST_F(DoctorTest, InterfaceNamesAgainstAFakeSysRoot) {
  for (const char* n : {"class/net/lo/x", "class/net/eth0/x", "class/net/ib0/x",
                        "class/infiniband/mlx5_0/x"})
    write(std::string("sys/") + n, "");
  std::string sys = dir_ + "/sys";
  auto check = [&](const char* var, const std::string& v) {
    auto fs = checkNetworkNames({{var, v}}, sys);
    EXPECT_EQ(fs.size(), 1u);
    return fs.at(0);
  };
  EXPECT_EQ(check("NCCL_SOCKET_IFNAME", "eth").verdict, Verdict::kOk);
  EXPECT_THAT(check("NCCL_SOCKET_IFNAME", "eth").value, HasSubstr("selects eth0"));
  EXPECT_EQ(check("NCCL_SOCKET_IFNAME", "^lo,docker").verdict, Verdict::kOk);
  EXPECT_EQ(check("NCCL_SOCKET_IFNAME", "=eth").verdict, Verdict::kFail);  // exact: no "eth"
  Finding bad = check("NCCL_SOCKET_IFNAME", "enp5s0");
  EXPECT_EQ(bad.verdict, Verdict::kFail);
  EXPECT_THAT(bad.value, HasSubstr("this node has eth0,ib0,lo"));
  EXPECT_EQ(check("GLOO_SOCKET_IFNAME", "eth0").verdict, Verdict::kOk);
  EXPECT_EQ(check("GLOO_SOCKET_IFNAME", "eth1").verdict, Verdict::kFail);
  EXPECT_EQ(check("NCCL_IB_HCA", "mlx5_0:1").verdict, Verdict::kOk);
  EXPECT_EQ(check("NCCL_IB_HCA", "mlx4").verdict, Verdict::kWarn);
  EXPECT_TRUE(checkNetworkNames({}, sys).empty());
}

TEST_F(DoctorTest, LimitsAndCoresFromAFakeProcRoot) {
  write("proc/self/limits",
        "Limit                     Soft Limit           Hard Limit           Units\n"
        "Max open files            1024                 1048576              files\n"
        "Max locked memory         8388608              8388608              bytes\n");
  write("proc/self/status", "Name:\tx\nCpus_allowed_list:\t0-3,8,10-11\n");
  std::string proc = dir_ + "/proc", sys = dir_ + "/sys";
  auto fs = checkLimits(proc, sys);
  EXPECT_EQ(verdictOf(fs, "memlock"), Verdict::kOk);  // no InfiniBand: it does not matter
  EXPECT_EQ(verdictOf(fs, "open files"), Verdict::kWarn);
  write("sys/class/infiniband/mlx5_0/x", "");
  EXPECT_EQ(verdictOf(checkLimits(proc, sys), "memlock"), Verdict::kFail);
  write("proc/self/limits",
        "Max open files            65536                65536                files\n"
        "Max locked memory         unlimited            unlimited            bytes\n");
  auto ok = checkLimits(proc, sys);
  EXPECT_EQ(verdictOf(ok, "memlock"), Verdict::kOk);
  EXPECT_EQ(find(ok, "memlock")->value, "unlimited");
  EXPECT_EQ(verdictOf(ok, "open files"), Verdict::kOk);

  EXPECT_EQ(allowedCpus(proc), 7);
  EXPECT_EQ(checkThreads(7, 7, {}).verdict, Verdict::kOk);  // launch sets 1 per worker
  Finding over = checkThreads(7, 4, {{"OMP_NUM_THREADS", "4"}});
  EXPECT_EQ(over.verdict, Verdict::kWarn);
  EXPECT_THAT(over.value, HasSubstr("4 rank(s) x 4 OpenMP thread(s) = 16 on 7 usable core(s)"));
  EXPECT_THAT(over.advice, HasSubstr("OMP_NUM_THREADS=1"));
  EXPECT_EQ(checkThreads(8, 2, {{"OMP_NUM_THREADS", "x"}}).verdict, Verdict::kWarn);
}

TEST(DoctorChecks, ShmSizes) {
  EXPECT_EQ(checkShm("/dev/shm", 64ull << 20).verdict, Verdict::kFail);
  EXPECT_THAT(checkShm("/dev/shm", 64ull << 20).advice, HasSubstr("--shm-size"));
  EXPECT_EQ(checkShm("/dev/shm", 512ull << 20).verdict, Verdict::kWarn);
  EXPECT_EQ(checkShm("/dev/shm", 8ull << 30).verdict, Verdict::kOk);
  EXPECT_EQ(checkShm("/dev/shm", std::nullopt).verdict, Verdict::kWarn);
}

TEST(DoctorChecks, EndpointsResolveAndAnswer) {
  int port = ddpl::testing::freeLoopbackPort();
  Finding closed = checkEndpoint("rendezvous", "127.0.0.1:" + std::to_string(port), true, 1);
  EXPECT_EQ(closed.verdict, Verdict::kWarn);
  EXPECT_THAT(closed.value, HasSubstr("does not answer"));
  EXPECT_EQ(checkEndpoint("MASTER_ADDR", "localhost", true, 1).verdict, Verdict::kOk);
  Finding bogus = checkEndpoint("MASTER_ADDR", "no-such-host.invalid:29500", true, 1);
  EXPECT_EQ(bogus.verdict, Verdict::kFail);
  EXPECT_THAT(bogus.value, HasSubstr("does not resolve"));
}

// The etcd backend's --rdzv-endpoint lists its members: each is checked, none is taken for a
// host named "a:1,b:2" (which never resolves: preflight warned of it on every etcd job).
TEST(DoctorChecks, EveryEtcdMemberOfAnEndpointListIsCheckedOnItsOwn) {
  DoctorOptions o;
  o.fast = true;  // resolve only
  o.rdzv_endpoint = "127.0.0.1:2379, localhost:2380";
  std::vector<std::string> rdzv;
  for (const auto& f : runDoctor(o))
    if (f.check == "rendezvous") {
      EXPECT_EQ(f.verdict, Verdict::kOk) << f.value;
      rdzv.push_back(f.value);
    }
  ASSERT_EQ(rdzv.size(), 2u);
  EXPECT_THAT(rdzv[0], HasSubstr("127.0.0.1:2379 resolves to 127.0.0.1"));
  EXPECT_THAT(rdzv[1], HasSubstr("localhost:2380 resolves to"));
}

TEST(DoctorChecks, NativeLibrariesOfAProgram) {
  // This test binary links no CUDA library; ldd runs on it and says so.
  auto fs = checkNativeLibraries("/proc/self/exe", 10);
  ASSERT_EQ(fs.size(), 1u);
  EXPECT_EQ(fs[0].verdict, Verdict::kOk);
  EXPECT_THAT(fs[0].value, HasSubstr("links no CUDA"));
}

TEST(DoctorChecks, JsonRoundTripsAndSaysOk) {
  std::vector<Finding> fs = {{"a", Verdict::kOk, "1", ""}, {"b", Verdict::kFail, "2", "do x"}};
  auto j = nlohmann::json::parse(findingsJson(fs));
  EXPECT_EQ(j["ok"], false);
  ASSERT_EQ(j["checks"].size(), 2u);
  EXPECT_EQ(j["checks"][1]["verdict"], "fail");
  EXPECT_EQ(j["checks"][1]["advice"], "do x");
  auto back = findingsFromJson(findingsJson(fs));
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back[1].verdict, Verdict::kFail);
  EXPECT_EQ(back[1].value, "2");
}

// ---- `launch doctor` itself.

const std::string kLaunch = std::string(DDPL_BIN_DIR) + "/launch";

TEST(DoctorCommand, ThisMachineWithoutAGpuGivesACleanReport) {
  ddpl::testing::RunOptions o;
  o.unset_env = {"CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                 "NCCL_IB_HCA", "MASTER_ADDR", "LD_LIBRARY_PATH"};
  auto r = ddpl::testing::run({kLaunch, "doctor", "--json"}, o);
  ASSERT_EQ(r.exit_code, 0) << r.all();
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["ok"], true);
  std::set<std::string> checks;
  for (const auto& c : j["checks"]) {
    checks.insert(c["check"].get<std::string>());
    EXPECT_TRUE(c["verdict"] == "ok" || c["verdict"] == "warn") << c.dump();
    EXPECT_TRUE(c.contains("value") && c.contains("advice")) << c.dump();
  }
  for (const char* c : {"driver", "/dev/shm", "memlock", "open files", "threads"})
    EXPECT_TRUE(checks.count(c)) << c << " missing from " << r.out;
}

// Issue 33: `launch doctor` alone showed machine checks and nothing about torch. It checks the
// interpreter `launch train.py` would use; one without torch is a warning there, not a failure.
TEST(DoctorCommand, WithoutAProgramItChecksTheInterpreterLaunchWouldRun) {
  std::string dir = ddpl::testing::makeTempDir("doctor_default_python");
  std::string with = dir + "/with_torch", without = dir + "/without_torch";
  std::ofstream(with) << "#!/bin/sh\nprintf 'torch=2.4.0\\ncuda=\\ncuda_available=0\\n"
                         "device_count=0\\narch_list=\\n'\n";
  std::ofstream(without) << "#!/bin/sh\nprintf \"error=No module named 'torch'\\n\"\n";
  chmod(with.c_str(), 0755);
  chmod(without.c_str(), 0755);
  auto check = [&](const std::string& python, const std::string& name) {
    ddpl::testing::RunOptions o;
    o.env = {{"PYTHON_EXEC", python}};
    o.unset_env = {"CUDA_VISIBLE_DEVICES", "NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME",
                   "NCCL_IB_HCA", "MASTER_ADDR", "LD_LIBRARY_PATH"};
    auto r = ddpl::testing::run({kLaunch, "doctor", "--json"}, o);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    auto j = nlohmann::json::parse(r.out);
    for (const auto& c : j["checks"])
      if (c["check"] == name) return c;
    ADD_FAILURE() << name << " missing from " << r.out;
    return nlohmann::json();
  };
  auto torch = check(with, "torch");
  EXPECT_EQ(torch["verdict"], "ok");
  EXPECT_EQ(torch["value"], "2.4.0");
  EXPECT_THAT(check(with, "python")["value"].get<std::string>(), HasSubstr(with));
  auto missing = check(without, "torch");
  EXPECT_EQ(missing["verdict"], "warn") << missing.dump();
  EXPECT_THAT(missing["value"].get<std::string>(), HasSubstr("No module named 'torch'"));
  fs::remove_all(dir);
}

TEST(DoctorCommand, FakeDriverBadGpuAndBogusInterfaceFailWithExitOne) {
  std::string dir = ddpl::testing::makeTempDir("doctor_cmd");
  std::ofstream(dir + "/nvml.conf") << kTwoGpus << "gpu1.ecc_volatile 0 4\n";
  std::string py = dir + "/python";
  std::ofstream(py) << "#!/bin/sh\nprintf 'torch=2.4.0\\ncuda=12.1\\ncuda_available=1\\n"
                       "device_count=2\\narch_list=sm_80\\n'\n";
  chmod(py.c_str(), 0755);
  std::string fake = FAKE_NVML;
  ddpl::testing::RunOptions o;
  o.env = {{"FAKE_NVML_CONFIG", dir + "/nvml.conf"},
           {"LD_LIBRARY_PATH", fake.substr(0, fake.rfind('/'))},
           {"NCCL_SOCKET_IFNAME", "nosuchif0"}};
  auto r = ddpl::testing::run({kLaunch, "doctor", "--python", py}, o);
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_THAT(r.out, HasSubstr("550.54.15 (supports CUDA up to 12.4)"));
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(fail +gpu1 +NVIDIA H100)"))) << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(fail +torch.arch gpu1 .*no kernel image)")))
      << r.out;
  EXPECT_TRUE(std::regex_search(r.out, std::regex(R"(fail +NCCL_SOCKET_IFNAME +'nosuchif0')")))
      << r.out;
  EXPECT_THAT(r.out, HasSubstr("failure(s)"));
  fs::remove_all(dir);
}

}  // namespace

// ---- The run manifest and preflight.
namespace {

TEST(Manifest, SecretsAreMaskedAndDiffPutsTheDriverFirst) {
  ddpl::launcher::ManifestFacts f;
  f.version = "0.1.0";
  f.env = {{"HF_TOKEN", "hf_abc"}, {"aws_secret_access_key", "x"}, {"DB_PASSWORD", "p"},
           {"GCP_CREDENTIALS", "c"}, {"MY_API_KEY", "k"}, {"LR", "0.1"}};
  f.nproc = 4;
  f.options.nnodes_min = f.options.nnodes_max = 2;
  auto a = nlohmann::json::parse(manifestJson(f));
  for (const char* k : {"HF_TOKEN", "aws_secret_access_key", "DB_PASSWORD", "GCP_CREDENTIALS",
                        "MY_API_KEY"})
    EXPECT_EQ(a["environment"][k], kMasked) << k;
  EXPECT_EQ(a["environment"]["LR"], "0.1");
  EXPECT_EQ(a["world_size"], 8);
  for (const char* k : {"launch_version", "command_line", "options", "host", "cpus", "gpus",
                        "python", "git", "environment"})
    EXPECT_TRUE(a.contains(k)) << k;
  nlohmann::json b = a;
  b["environment"]["LR"] = "0.2";
  b["gpus"] = {{"driver", "550.54.15"}};
  a["gpus"] = {{"driver", "535.104.05"}};
  auto d = diffManifests(a.dump(), b.dump());
  ASSERT_EQ(d.size(), 2u) << ::testing::PrintToString(d);
  EXPECT_EQ(d[0], "gpus.driver: 535.104.05 -> 550.54.15");
  EXPECT_EQ(d[1], "environment LR: 0.1 -> 0.2");
  EXPECT_TRUE(diffManifests(a.dump(), a.dump()).empty());
  EXPECT_THROW(diffManifests("{", a.dump()), ddpl::InvalidArgument);
}


// Issue 33: names and values the first rule (TOKEN, KEY, SECRET) let through.
TEST(Manifest, PasswordsPatsAuthAndUrlCredentialsAreMaskedPathIsNot) {
  ddpl::Environment env = {{"DATABASE_URL", "postgres://app:s3cret@db.internal:5432/prod"},
                           {"GITHUB_PAT", "ghp_x"},
                           {"MY_PASSWD", "p"},
                           {"NETRC_AUTH", "a"},
                           {"DB_PWD", "p"},
                           {"SMTP_PASS", "p"},
                           {"PATH", "/usr/bin"},
                           {"PWD", "/home/u"},
                           {"PYTHONPATH", "/src"},
                           {"MIRROR", "https://pypi.example/simple"},
                           {"TOKENIZERS_PARALLELISM", "false"},
                           {"MAX_TOKENS", "4096"},
                           {"HF_TOKEN", "hf_x"}};
  auto m = maskEnvironment(env);
  for (const char* k : {"GITHUB_PAT", "MY_PASSWD", "NETRC_AUTH", "DB_PWD", "SMTP_PASS"})
    EXPECT_EQ(m[k], kMasked) << k;
  EXPECT_EQ(m["DATABASE_URL"], std::string("postgres://app:") + kMasked + "@db.internal:5432/prod");
  EXPECT_EQ(m["PATH"], "/usr/bin");
  EXPECT_EQ(m["PWD"], "/home/u");
  EXPECT_EQ(m["PYTHONPATH"], "/src");
  EXPECT_EQ(m["MIRROR"], "https://pypi.example/simple");
  EXPECT_EQ(m["TOKENIZERS_PARALLELISM"], "false");
  EXPECT_EQ(m["MAX_TOKENS"], "4096");
  EXPECT_EQ(m["HF_TOKEN"], kMasked);
  auto c = maskCommandLine({"launch", "train.py", "--db-password", "hunter2", "--api-key=k1",
                            "--data", "s3://user:pw@bucket/x", "--lr", "0.1", "--max-tokens",
                            "512"});
  std::vector<std::string> want = {"launch", "train.py", "--db-password", kMasked,
                                   std::string("--api-key=") + kMasked, "--data",
                                   std::string("s3://user:") + kMasked + "@bucket/x", "--lr", "0.1",
                                   "--max-tokens", "512"};
  EXPECT_EQ(c, want);
}

// Issue 44: a word of dashes only ("----", a separator line a worker prints) was taken for an
// option with a name starting at npos, and substr threw: the dashboard, which masks each rank's
// last line, ended the job. Such words, and the other odd ones, are text like any other.
TEST(Manifest, WordsOfDashesOnlyAreNotOptions) {
  std::vector<std::string> odd = {
      "---",   "----",     "------------------------------------------------",
      "-",     "--",       "",
      "---=x", "--=x",     "-=",
      "- -",   "-\xff\xfe"};
  EXPECT_EQ(maskCommandLine(odd), odd);
  // Still an option after any number of dashes; the word after it is its value.
  EXPECT_EQ(maskCommandLine({"----", "---password", "hunter2", "----"}),
            (std::vector<std::string>{"----", "---password", kMasked, "----"}));
  EXPECT_EQ(maskCommandLine({"----token=abc"}),
            (std::vector<std::string>{std::string("----token=") + kMasked}));
}

TEST(Manifest, TextAWorkerPrintsIsMaskedWordForWordAndOtherwiseKept) {
  // What workers print: separator lines, tqdm bars, ANSI colours, tracebacks, invalid UTF-8.
  const std::vector<std::string> kept = {
      "---- epoch 1 ----",
      "----\n---- epoch 2 ----\n----",
      "------------------------------------------------------------",
      "============================================================",
      "",
      "\n",
      " ",
      "  -- ---  ",
      "\r 50%|\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88\xe2\x96\x88     | 5/10 "
      "[00:01<00:01,  4.99it/s]",
      "\x1b[31m----\x1b[0m \x1b[1m---- bold ----\x1b[0m",
      "Traceback (most recent call last):\n  File \"train.py\", line 3, in <module>\n"
      "    raise ValueError(\"--\")\nValueError: --",
      "\xff\xfe\x80 -- \xc3",
      "a://b/ c://d@e/ ://@: :// @"};
  for (const auto& t : kept) EXPECT_EQ(maskSecretsInText(t), t) << t;
  EXPECT_EQ(maskSecretsInText("---- --password hunter2 ----"),
            std::string("---- --password ") + kMasked + " ----");
  EXPECT_EQ(
      maskSecretsInText("\xff\xfe --api-key=abc ----\nDB_PASSWORD=x ----"),
      std::string("\xff\xfe --api-key=") + kMasked + " ----\nDB_PASSWORD=" + kMasked + " ----");
  EXPECT_EQ(maskSecretsInText("---- https://u:pw@host/x ----"),
            std::string("---- https://u:") + kMasked + "@host/x ----");
}

// `launch manifest-diff` reads manifests from elsewhere: one nested 200,000 deep was flattened
// recursively and overflowed the stack (a segfault); now it is not a manifest, said so.
TEST(Manifest, AManifestNestedDeepIsRefusedNotFlattened) {
  const std::string deep = std::string(200000, '[') + std::string(200000, ']');
  try {
    diffManifests(R"({"gpus": )" + deep + "}", "{}");
    ADD_FAILURE() << "took it for a manifest";
  } catch (const ddpl::InvalidArgument& e) {
    EXPECT_THAT(e.what(), HasSubstr("nested deeper than"));
  }
}

// fuzz_manifest: JSON that is not an object flattened to the key "", and the name of the
// difference was substr(1) of it: std::out_of_range, not the documented InvalidArgument.
TEST(Manifest, JsonThatIsNotAnObjectIsNotAManifest) {
  for (const char* text : {"12", "\"text\"", "[1, 2]", "null", "true"}) {
    try {
      diffManifests(text, "13");
      ADD_FAILURE() << "took " << text << " for a manifest";
    } catch (const ddpl::InvalidArgument& e) {
      EXPECT_THAT(e.what(), HasSubstr("not a manifest")) << text;
    }
  }
  EXPECT_THROW(diffManifests("{}", "[]"), ddpl::InvalidArgument);
}

// The manifest holds the command line and the environment as given: neither is necessarily
// UTF-8, and a manifest of either must still be written (strict JSON output threw).
TEST(Manifest, ACommandLineOfDashesAndBytesThatAreNotUtf8StillMakeAManifest) {
  ManifestFacts f;
  f.command_line = {"launch", "----", "train.py", "--name=caf\xe9"};
  f.env = {{"LATIN1_DIR", "/data/caf\xe9"}, {"SEP", "----"}};
  const std::string text = manifestJson(f);
  auto j = nlohmann::json::parse(text);
  EXPECT_EQ(j["command_line"][1], "----");
  EXPECT_EQ(j["command_line"][3], "--name=caf\xef\xbf\xbd");  // U+FFFD for the lone byte
  EXPECT_EQ(j["environment"]["LATIN1_DIR"], "/data/caf\xef\xbf\xbd");
  EXPECT_EQ(j["environment"]["SEP"], "----");
}

// Worker text can be a line of 64 KiB: masking it costs its length, not its length squared (a
// search of the whole line from each "://", a copy of the rest of a word at each "TOKENS_").
// 512 KiB of each took about 20 s before; well under a second now, even under a sanitizer.
TEST(Manifest, MaskingALongLineOfSchemesOrTokenWordsTakesLinearTime) {
  std::string schemes, tokens = "--";
  while (schemes.size() < (512u << 10)) schemes += "a://b/";
  while (tokens.size() < (512u << 10)) tokens += "TOKENS_";
  tokens += "=1";
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(maskSecretsInText(schemes), schemes);
  EXPECT_EQ(maskCommandLine({tokens}).front(), tokens);
  double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  EXPECT_LT(took, 3.0);
}

}  // namespace
namespace {

// A real run: manifest.json beside the logs with the secret masked; the probe child fills in
// git and the interpreter's torch; manifest-diff of two runs names the changed variable.
TEST(ManifestEndToEnd, LaunchWritesItAndDiffFindsAChangedVariable) {
  std::string dir = ddpl::testing::makeTempDir("manifest_e2e");
  auto runWith = [&](const std::string& id, const std::string& value) {
    ddpl::testing::RunOptions o;
    o.env = {{"PYTHON_EXEC", DDPL_PYTHON}, {"MY_SECRET_TOKEN", "hunter2"}, {"CHANGED", value}};
    o.cwd = DDPL_SOURCE_DIR;
    o.timeout = std::chrono::seconds(120);
    // The worker stays until the probe is done: the probe is killed with the run.
    auto r = ddpl::testing::run(
        {kLaunch, "--log-dir", dir, "--rdzv-id", id,
         std::string(DDPL_SOURCE_DIR) + "/tests/integration/programs/wait_for_manifest.py",
         dir + "/" + id + "/manifest.json"},
        o);
    EXPECT_EQ(r.exit_code, 0) << r.all();
    return dir + "/" + id;
  };
  std::string a = runWith("a", "1"), b = runWith("b", "2");
  auto m = nlohmann::json::parse(ddpl::testing::readFile(a + "/manifest.json"));
  EXPECT_EQ(m["environment"]["MY_SECRET_TOKEN"], kMasked);
  EXPECT_EQ(ddpl::testing::readFile(a + "/manifest.json").find("hunter2"), std::string::npos);
  EXPECT_EQ(m["world_size"], 1);
  EXPECT_TRUE(m["gpus"].is_object()) << m.dump(2);
  EXPECT_TRUE(m["git"].is_object() || m["git"] == "not a repository") << m.dump(2);
  ASSERT_TRUE(m["python"].is_object()) << m.dump(2);
  EXPECT_NE(m["python"]["torch"], kNotProbed) << m.dump(2);
  auto r = ddpl::testing::run({kLaunch, "manifest-diff", a, b});
  EXPECT_EQ(r.exit_code, 1) << r.all();
  EXPECT_THAT(r.out, HasSubstr("environment CHANGED: 1 -> 2"));
  fs::remove_all(dir);
}

TEST(Preflight, StrictStopsANodeWithAFatalFindingWarnLetsItRun) {
  ddpl::testing::RunOptions o;
  o.env = {{"NCCL_SOCKET_IFNAME", "nosuchif0"}};
  auto strict = ddpl::testing::run({kLaunch, "--preflight=strict", "/bin/true"}, o);
  EXPECT_EQ(strict.exit_code, 1) << strict.all();
  EXPECT_THAT(strict.err, HasSubstr("NCCL_SOCKET_IFNAME: 'nosuchif0' selects no interface"));
  EXPECT_THAT(strict.err, HasSubstr("--preflight=strict: not starting"));
  EXPECT_THAT(strict.err, ::testing::Not(HasSubstr("starting 1 worker")));
  auto warn = ddpl::testing::run({kLaunch, "/bin/true"}, o);
  EXPECT_EQ(warn.exit_code, 0) << warn.all();
  EXPECT_THAT(warn.err, HasSubstr("preflight: fail"));
  auto off = ddpl::testing::run({kLaunch, "--preflight=off", "/bin/true"}, o);
  EXPECT_EQ(off.exit_code, 0) << off.all();
  EXPECT_THAT(off.err, ::testing::Not(HasSubstr("preflight")));
}

}  // namespace
