#pragma once
// The job's health keys (multi_node_rendezvous.h's JobKv) in etcd, under the job's prefix.
#include <memory>
#include <string>

#include "launcher/membership/etcd/etcd_client.h"
#include "launcher/membership/multi_node_rendezvous.h"

namespace ddpl::launcher::etcd_detail {

std::unique_ptr<JobKv> makeEtcdJobKv(EtcdClient* etcd, std::string prefix);

}  // namespace ddpl::launcher::etcd_detail
