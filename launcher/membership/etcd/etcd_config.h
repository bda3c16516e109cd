#pragma once
// --rdzv-backend=etcd: the etcd rendezvous's settings from the command line's --rdzv-conf keys
// (docs/rendezvous.md lists them). The --rdzv-conf parser (launcher/cli) knows the keys and
// keeps them as given (RdzvConf::etcd); their values are checked here, in `launch` itself; the
// etcd client is in the plugin.
#include "common/environment.h"
#include "launcher/cli/options.h"
#include "launcher/membership/etcd/etcd_rendezvous.h"

namespace ddpl::launcher {

// `env` supplies DDPL_ETCD_PASSWORD when no password_file is given. Throws UsageError for a
// bad key or value and AuthError for an unreadable secret file.
EtcdRendezvousConfig etcdRendezvousConfig(const LaunchOptions& options, const RoundsConfig& rounds,
                                          const Environment& env);

}  // namespace ddpl::launcher
