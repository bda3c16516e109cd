#pragma once
// --numa-binding: which CPUs and NUMA memory nodes each local rank is bound to, read from sysfs
// (no libnuma). Pure over a sysfs root, so tests drive it with a fake tree.
#include <string>
#include <vector>

#include "launcher/cli/options.h"

namespace ddpl::launcher {

struct NumaPlacement {
  std::vector<int> cpus;       // empty: not bound
  std::vector<int> mem_nodes;  // empty: default memory policy
};

// One placement per local rank. As torchrun, local rank i drives visible GPU i; `gpu_indices`
// maps visible GPU i to its physical index (from CUDA_VISIBLE_DEVICES), empty when it names
// none. GPUs are NVIDIA PCI display devices in bus order. Without GPUs, ranks are spread over
// the NUMA nodes in contiguous blocks. Modes as torchrun 2.9: node (the node's CPUs), socket
// (every node of that socket), exclusive (a disjoint share of the node's CPUs for each rank on
// it), core-complex (the CPUs of one L3 cache on the node, a different one per rank where there
// are enough). Returns an empty vector and sets `why_not` when sysfs shows no NUMA topology.
std::vector<NumaPlacement> planNumaBinding(NumaBinding mode, int nproc,
                                           const std::string& sysfs_root,
                                           const std::vector<int>& gpu_indices,
                                           std::string* why_not);

// CPUs this process may run on (its affinity mask), at least 1.
int usableCpus();

// "0-3,8,10-11" -> {0,1,2,3,8,10,11}; malformed parts are skipped.
std::vector<int> parseCpuList(const std::string& text);
std::string formatCpuList(const std::vector<int>& cpus);

}  // namespace ddpl::launcher
