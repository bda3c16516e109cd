// Rendezvous scale: N agents (concurrent clients in this process, joinAsync) join one round
// of an embedded server; reports the time from the first join sent to full membership
// known by every agent.
//
//   rdzv_scale_bench [--agents 64,256,1024,4096] [--channels 16] [--endpoint HOST:PORT]
//
// --endpoint: the agents join a server already serving there (a standalone rdzv-server, as a
// cluster runs it; give it --max-streams-per-connection above the largest N) instead of one
// embedded in this process. In one process, the server's calls and the agents' share gRPC's
// one callback queue, whose debug checks in Debian's build scan every outstanding call on
// each completion (docs/bench-rendezvous.md §9).
//
// Every channel of one process shares gRPC's one connection, and a server takes at most
// ConnectionLimits::max_streams_per_connection (8,192) calls at once on a connection: the
// benchmark raises that cap to its largest N, since real agents (one process each) come on a
// connection each. A server with the defaults takes 16,384 agents on distinct connections only
// with max_connections raised too (4,096 by default) and 16,384 free file descriptors.
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdlib>
#include <mutex>
#include <sstream>

#include "common/log.h"
#include "common/parse.h"
#include "rendezvous/client/rendezvous_client.h"
#include "rendezvous/server/server.h"

using namespace ddpl::rdzv;

int main(int argc, char** argv) {
  std::vector<int> sizes = {64, 256, 1024, 4096};
  int channels = 16;
  std::string endpoint;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    try {
      if (a == "--agents") {
        sizes.clear();
        for (const auto& x : ddpl::splitList(v, ','))
          sizes.push_back(static_cast<int>(ddpl::parseInteger(a, x, 1, 1 << 20)));
      } else if (a == "--endpoint") {
        endpoint = v;
      } else if (a == "--channels") {
        channels = static_cast<int>(ddpl::parseInteger(a, v, 1, 4096));
      } else {
        std::fprintf(stderr, "rdzv_scale_bench: unknown flag %s\n", a.c_str());
        return 2;
      }
    } catch (const ddpl::InvalidArgument& e) {
      std::fprintf(stderr, "rdzv_scale_bench: %s\n", e.what());
      return 2;
    }
  }
  ddpl::log::init({"bench"}, spdlog::level::warn);
  ServerOptions so;
  for (int n : sizes)
    so.connections.max_streams_per_connection =
        std::max(so.connections.max_streams_per_connection, n + 64);
  std::unique_ptr<RendezvousServer> server;
  if (endpoint.empty()) {
    server = std::make_unique<RendezvousServer>(so);
    endpoint = server->endpoint();
  }
  // Agents share a few client objects: in one process every channel to the same target
  // shares gRPC's connection anyway; more clients would only add threads.
  std::vector<std::unique_ptr<RendezvousClient>> clients;
  for (int i = 0; i < channels; ++i) {
    RendezvousClientOptions o;
    o.endpoint = endpoint;
    clients.push_back(std::make_unique<RendezvousClient>(o));
  }
  for (int n : sizes) {
    std::mutex mu;
    std::condition_variable cv;
    int done = 0, errors = 0;
    std::string first_error;
    auto t0 = Clock::now();
    for (int i = 0; i < n; ++i) {
      JoinOptions j;
      j.run_id = fmt::format("scale-{}-{}", getpid(), n);  // a standalone server outlives us
      j.node_id = fmt::format("node-{:05d}", i);
      j.local_world_size = 8;
      j.min_nodes = n;
      j.max_nodes = n;
      j.join_timeout = std::chrono::seconds(120);
      clients[static_cast<size_t>(i % channels)]->joinAsync(
          j, [&, n](RoundAssignment a, std::exception_ptr e) {
            std::lock_guard<std::mutex> l(mu);
            if (e) {
              if (!errors++) {
                try {
                  std::rethrow_exception(e);
                } catch (const std::exception& x) {
                  first_error = x.what();
                }
              }
            } else if (a.group_world_size != n) {
              ++errors;
            }
            if (++done == n) cv.notify_all();
          });
    }
    std::unique_lock<std::mutex> l(mu);
    cv.wait(l, [&] { return done == n; });
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
    std::printf("impl=grpc server=%s agents=%d ms=%.1f errors=%d%s\n",
                server ? "embedded" : "standalone", n, ms, errors,
                first_error.empty() ? "" : (" first_error=" + first_error).c_str());
    std::fflush(stdout);
  }
  return 0;
}
