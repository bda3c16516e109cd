#include "launcher/agent/numa.h"

#include <fmt/format.h>
#include <sched.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "common/parse.h"

namespace fs = std::filesystem;

namespace ddpl::launcher {
namespace {

std::string readFirstLine(const fs::path& p) {
  std::ifstream in(p);
  std::string line;
  std::getline(in, line);
  return line;
}

struct Topology {
  std::map<int, std::vector<int>> node_cpus;  // node -> CPUs
  std::map<int, int> cpu_socket;
  std::map<int, std::vector<int>> cpu_l3;  // cpu -> CPUs sharing its L3
};

Topology readTopology(const fs::path& sys) {
  Topology t;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(sys / "devices/system/node", ec)) {
    std::string name = e.path().filename().string();
    if (name.rfind("node", 0) != 0 || name.size() == 4) continue;
    try {
      int id = static_cast<int>(parseInteger("node", name.substr(4), 0, 1 << 20));
      auto cpus = parseCpuList(readFirstLine(e.path() / "cpulist"));
      if (!cpus.empty()) t.node_cpus[id] = cpus;
    } catch (const InvalidArgument&) {
    }
  }
  for (const auto& [node, cpus] : t.node_cpus) {
    for (int c : cpus) {
      fs::path cpu = sys / "devices/system/cpu" / ("cpu" + std::to_string(c));
      std::string socket = readFirstLine(cpu / "topology/physical_package_id");
      t.cpu_socket[c] = socket.empty() ? 0 : std::atoi(socket.c_str());
      for (const auto& idx : fs::directory_iterator(cpu / "cache", ec)) {
        if (readFirstLine(idx.path() / "level") != "3") continue;
        t.cpu_l3[c] = parseCpuList(readFirstLine(idx.path() / "shared_cpu_list"));
      }
    }
  }
  return t;
}

// NUMA node of each NVIDIA GPU, in PCI bus order (-1 when the firmware gives none).
std::vector<int> gpuNodes(const fs::path& sys) {
  std::vector<std::pair<std::string, int>> gpus;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(sys / "bus/pci/devices", ec)) {
    if (readFirstLine(e.path() / "vendor") != "0x10de") continue;
    std::string cls = readFirstLine(e.path() / "class");
    if (cls.rfind("0x0300", 0) != 0 && cls.rfind("0x0302", 0) != 0) continue;
    std::string node = readFirstLine(e.path() / "numa_node");
    gpus.emplace_back(e.path().filename().string(), node.empty() ? -1 : std::atoi(node.c_str()));
  }
  std::sort(gpus.begin(), gpus.end());
  std::vector<int> out;
  for (const auto& g : gpus) out.push_back(g.second);
  return out;
}

}  // namespace

int usableCpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return CPU_COUNT(&set);
  long n = sysconf(_SC_NPROCESSORS_ONLN);
  return n > 0 ? static_cast<int>(n) : 1;
}

std::vector<int> parseCpuList(const std::string& text) {
  std::set<int> cpus;
  for (const auto& part : splitList(text, ',')) {
    try {
      auto dash = part.find('-');
      int lo = static_cast<int>(parseInteger("cpulist", part.substr(0, dash), 0, 1 << 20));
      int hi = dash == std::string::npos
                   ? lo
                   : static_cast<int>(parseInteger("cpulist", part.substr(dash + 1), lo, 1 << 20));
      for (int c = lo; c <= hi; ++c) cpus.insert(c);
    } catch (const InvalidArgument&) {
    }
  }
  return {cpus.begin(), cpus.end()};
}

std::string formatCpuList(const std::vector<int>& cpus) {
  std::string out;
  for (size_t i = 0; i < cpus.size();) {
    size_t j = i;
    while (j + 1 < cpus.size() && cpus[j + 1] == cpus[j] + 1) ++j;
    out += (out.empty() ? "" : ",") +
           (i == j ? std::to_string(cpus[i]) : fmt::format("{}-{}", cpus[i], cpus[j]));
    i = j + 1;
  }
  return out;
}

std::vector<NumaPlacement> planNumaBinding(NumaBinding mode, int nproc,
                                           const std::string& sysfs_root,
                                           const std::vector<int>& gpu_indices,
                                           std::string* why_not) {
  std::vector<NumaPlacement> out;
  if (mode == NumaBinding::kNone || nproc <= 0) return out;
  fs::path sys(sysfs_root);
  Topology topo = readTopology(sys);
  if (topo.node_cpus.empty()) {
    if (why_not)
      *why_not = "no NUMA nodes with CPUs under " + (sys / "devices/system/node").string();
    return out;
  }
  std::vector<int> nodes;
  for (const auto& [n, cpus] : topo.node_cpus) nodes.push_back(n);

  // The node each local rank belongs to.
  std::vector<int> rank_node(static_cast<size_t>(nproc));
  std::vector<int> gpus = gpuNodes(sys);
  for (int lr = 0; lr < nproc; ++lr) {
    int node = -1;
    if (!gpus.empty()) {
      int physical = lr < static_cast<int>(gpu_indices.size()) ? gpu_indices[lr] : lr;
      if (physical >= 0 && physical < static_cast<int>(gpus.size())) node = gpus[physical];
    }
    if (node < 0 || !topo.node_cpus.count(node))
      node = nodes[static_cast<size_t>(lr) * nodes.size() / static_cast<size_t>(nproc)];
    rank_node[lr] = node;
  }

  std::map<int, std::vector<int>> ranks_on_node;
  for (int lr = 0; lr < nproc; ++lr) ranks_on_node[rank_node[lr]].push_back(lr);

  for (int lr = 0; lr < nproc; ++lr) {
    int node = rank_node[lr];
    const auto& node_cpus = topo.node_cpus[node];
    const auto& peers = ranks_on_node[node];
    size_t idx = static_cast<size_t>(std::find(peers.begin(), peers.end(), lr) - peers.begin());
    NumaPlacement p;
    switch (mode) {
      case NumaBinding::kNode:
        p.cpus = node_cpus;
        p.mem_nodes = {node};
        break;
      case NumaBinding::kSocket: {
        int socket = topo.cpu_socket[node_cpus.front()];
        for (const auto& [n, cpus] : topo.node_cpus) {
          if (topo.cpu_socket[cpus.front()] != socket) continue;
          p.cpus.insert(p.cpus.end(), cpus.begin(), cpus.end());
          p.mem_nodes.push_back(n);
        }
        std::sort(p.cpus.begin(), p.cpus.end());
        break;
      }
      case NumaBinding::kExclusive: {
        // Contiguous, disjoint shares; with more ranks than CPUs some CPUs are shared.
        size_t n = node_cpus.size(), k = peers.size();
        size_t begin = idx * n / k, end = std::max((idx + 1) * n / k, begin + 1);
        for (size_t i = begin; i < end && i < n; ++i) p.cpus.push_back(node_cpus[i]);
        if (p.cpus.empty()) p.cpus.push_back(node_cpus[idx % n]);
        p.mem_nodes = {node};
        break;
      }
      case NumaBinding::kCoreComplex: {
        std::vector<std::vector<int>> complexes;
        for (int c : node_cpus) {
          auto it = topo.cpu_l3.find(c);
          std::vector<int> l3;
          if (it != topo.cpu_l3.end())
            for (int x : it->second)
              if (std::binary_search(node_cpus.begin(), node_cpus.end(), x)) l3.push_back(x);
          if (l3.empty()) l3 = node_cpus;
          if (std::find(complexes.begin(), complexes.end(), l3) == complexes.end())
            complexes.push_back(l3);
        }
        p.cpus = complexes[idx % complexes.size()];
        p.mem_nodes = {node};
        break;
      }
      case NumaBinding::kNone:
        break;
    }
    out.push_back(std::move(p));
  }
  return out;
}

}  // namespace ddpl::launcher
