// --numa-binding over a fake sysfs: two NUMA nodes on two sockets, two L3 complexes per node,
// two NVIDIA GPUs (one per node, listed out of bus order) and a network card.
#include "launcher/agent/numa.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tests/common/subprocess.h"

using namespace ddpl::launcher;
namespace fs = std::filesystem;

namespace {
void put(const fs::path& p, const std::string& text) {
  fs::create_directories(p.parent_path());
  std::ofstream(p) << text << "\n";
}

std::string fakeSysfs(bool with_gpus) {
  fs::path root = ddpl::testing::makeTempDir("fake-sysfs");
  put(root / "devices/system/node/node0/cpulist", "0-3");
  put(root / "devices/system/node/node1/cpulist", "4-7");
  put(root / "devices/system/node/possible", "0-1");  // not a node directory
  for (int c = 0; c < 8; ++c) {
    fs::path cpu = root / "devices/system/cpu" / ("cpu" + std::to_string(c));
    put(cpu / "topology/physical_package_id", c < 4 ? "0" : "1");
    put(cpu / "cache/index2/level", "2");
    put(cpu / "cache/index2/shared_cpu_list", std::to_string(c));
    put(cpu / "cache/index3/level", "3");
    int first = c / 2 * 2;
    put(cpu / "cache/index3/shared_cpu_list",
        std::to_string(first) + "-" + std::to_string(first + 1));
  }
  if (with_gpus) {
    fs::path pci = root / "bus/pci/devices";
    put(pci / "0000:81:00.0/vendor", "0x10de");
    put(pci / "0000:81:00.0/class", "0x030200");
    put(pci / "0000:81:00.0/numa_node", "1");
    put(pci / "0000:01:00.0/vendor", "0x10de");
    put(pci / "0000:01:00.0/class", "0x030000");
    put(pci / "0000:01:00.0/numa_node", "0");
    put(pci / "0000:41:00.0/vendor", "0x15b3");  // a NIC on node 1
    put(pci / "0000:41:00.0/class", "0x020000");
    put(pci / "0000:41:00.0/numa_node", "1");
  }
  return root.string();
}

using V = std::vector<int>;
}  // namespace

TEST(Numa, CpuLists) {
  EXPECT_EQ(parseCpuList("0-3,8,10-11"), (V{0, 1, 2, 3, 8, 10, 11}));
  EXPECT_EQ(parseCpuList(""), V{});
  EXPECT_EQ(parseCpuList("3,x,1"), (V{1, 3}));
  EXPECT_EQ(formatCpuList({0, 1, 2, 5, 7, 8}), "0-2,5,7-8");
}

TEST(Numa, NodeBindingFollowsEachRanksGpu) {
  std::string root = fakeSysfs(true);
  auto p = planNumaBinding(NumaBinding::kNode, 2, root, {}, nullptr);
  ASSERT_EQ(p.size(), 2u);
  EXPECT_EQ(p[0].cpus, (V{0, 1, 2, 3}));  // GPU 0 is bus 01, on node 0
  EXPECT_EQ(p[0].mem_nodes, V{0});
  EXPECT_EQ(p[1].cpus, (V{4, 5, 6, 7}));
  EXPECT_EQ(p[1].mem_nodes, V{1});
  // CUDA_VISIBLE_DEVICES=1,0 swaps them.
  p = planNumaBinding(NumaBinding::kNode, 2, root, {1, 0}, nullptr);
  EXPECT_EQ(p[0].mem_nodes, V{1});
  EXPECT_EQ(p[1].mem_nodes, V{0});
}

TEST(Numa, SocketExclusiveAndCoreComplex) {
  std::string root = fakeSysfs(true);
  auto socket = planNumaBinding(NumaBinding::kSocket, 2, root, {}, nullptr);
  EXPECT_EQ(socket[1].cpus, (V{4, 5, 6, 7}));
  EXPECT_EQ(socket[1].mem_nodes, V{1});
  // Two ranks on GPU 0's node (visible devices 0,0 is what a shared GPU looks like).
  auto excl = planNumaBinding(NumaBinding::kExclusive, 2, root, {0, 0}, nullptr);
  EXPECT_EQ(excl[0].cpus, (V{0, 1}));
  EXPECT_EQ(excl[1].cpus, (V{2, 3}));
  EXPECT_EQ(excl[1].mem_nodes, V{0});
  auto ccx = planNumaBinding(NumaBinding::kCoreComplex, 2, root, {0, 0}, nullptr);
  EXPECT_EQ(ccx[0].cpus, (V{0, 1}));
  EXPECT_EQ(ccx[1].cpus, (V{2, 3}));
}

TEST(Numa, WithoutGpusRanksSpreadOverNodes) {
  std::string root = fakeSysfs(false);
  auto p = planNumaBinding(NumaBinding::kNode, 4, root, {}, nullptr);
  ASSERT_EQ(p.size(), 4u);
  EXPECT_EQ(p[0].mem_nodes, V{0});
  EXPECT_EQ(p[1].mem_nodes, V{0});
  EXPECT_EQ(p[2].mem_nodes, V{1});
  EXPECT_EQ(p[3].mem_nodes, V{1});
  auto excl = planNumaBinding(NumaBinding::kExclusive, 4, root, {}, nullptr);
  EXPECT_EQ(excl[0].cpus, (V{0, 1}));
  EXPECT_EQ(excl[1].cpus, (V{2, 3}));
  EXPECT_EQ(excl[3].cpus, (V{6, 7}));
}

TEST(Numa, NoTopologyMeansNoBindingAndSaysWhy) {
  std::string why;
  auto p =
      planNumaBinding(NumaBinding::kNode, 2, ddpl::testing::makeTempDir("empty-sysfs"), {}, &why);
  EXPECT_TRUE(p.empty());
  EXPECT_NE(why.find("no NUMA nodes"), std::string::npos);
}
