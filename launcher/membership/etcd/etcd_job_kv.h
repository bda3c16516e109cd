#pragma once
// The job's health keys (multi_node_rendezvous.h's JobKv) in etcd, under the job's prefix.
#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "launcher/membership/etcd/etcd_client.h"
#include "launcher/membership/multi_node_rendezvous.h"

namespace ddpl::launcher::etcd_detail {

std::unique_ptr<JobKv> makeEtcdJobKv(EtcdClient* etcd, std::string prefix);

// Returns the key's value once it exists, or nothing after `timeout`.
std::optional<std::string> waitForEtcdKey(EtcdClient* etcd, const std::string& key,
                                          std::chrono::milliseconds timeout);

}  // namespace ddpl::launcher::etcd_detail
