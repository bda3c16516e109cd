// Store throughput and latency for the NCCL-bootstrap pattern: every client, every round,
// sets its own key, bumps a shared counter, gets its right neighbour's key (blocking until
// that peer has set it) and waits for its left neighbour's. Same pattern as
// rdzv_tcpstore_bench.py runs against torch.distributed.TCPStore.
//
//   rdzv_store_bench --clients 64 --rounds 200 [--value-bytes 128] [--endpoint host:port]
//                    [--unary]   (one unary call per operation instead of the Session stream)
//                    [--confirmed-sets]   (every set waits for the server's answer)
//                    [--grpc-stream]   (the gRPC Session stream instead of the store socket)
// Besides the totals it prints each operation's p50/p99 (the `op=` lines, on stderr).
// Without --endpoint it embeds a server in this process, as TCPStore's master does in the
// Python driver.
#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "common/log.h"
#include "common/parse.h"
#include "rendezvous/client/grpc_store.h"
#include "rendezvous/server/server.h"

using namespace ddpl::rdzv;

int main(int argc, char** argv) {
  int clients = 16, rounds = 200, value_bytes = 128;
  std::string endpoint;
  bool unary = false, confirmed_sets = false, grpc_stream = false;
  for (int i = 1; i < argc; i += 2) {
    std::string a = argv[i];
    if (a == "--unary" || a == "--confirmed-sets" || a == "--grpc-stream") {
      (a == "--unary" ? unary : a == "--grpc-stream" ? grpc_stream : confirmed_sets) = true;
      --i;
      continue;
    }
    if (i + 1 >= argc) {
      std::fprintf(stderr, "rdzv_store_bench: %s needs a value\n", a.c_str());
      return 2;
    }
    std::string v = argv[i + 1];
    try {
      if (a == "--clients")
        clients = static_cast<int>(ddpl::parseInteger(a, v, 1, 100000));
      else if (a == "--rounds")
        rounds = static_cast<int>(ddpl::parseInteger(a, v, 1, 100000000));
      else if (a == "--value-bytes")
        value_bytes = static_cast<int>(ddpl::parseInteger(a, v, 0, 1 << 30));
      else if (a == "--endpoint")
        endpoint = v;
      else {
        std::fprintf(stderr, "rdzv_store_bench: unknown flag %s\n", a.c_str());
        return 2;
      }
    } catch (const ddpl::InvalidArgument& e) {
      std::fprintf(stderr, "rdzv_store_bench: %s\n", e.what());
      return 2;
    }
  }
  ddpl::log::init({"bench"}, spdlog::level::warn);
  std::unique_ptr<RendezvousServer> server;
  if (endpoint.empty()) {
    server = std::make_unique<RendezvousServer>(ServerOptions{});
    endpoint = server->endpoint();
  }
  std::vector<std::unique_ptr<Store>> stores;
  for (int i = 0; i < clients; ++i) {
    GrpcStoreOptions o;
    o.endpoint = endpoint;
    o.prefix = "bench/";
    o.use_session = !unary;
    o.quiet_sets = !confirmed_sets;
    o.socket = !grpc_stream;
    stores.push_back(connectGrpcStore(o));
  }
  Bytes value(static_cast<size_t>(value_bytes), 0xab);
  std::vector<std::vector<double>> lat(static_cast<size_t>(clients));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false};
  auto timed = [](std::vector<double>& out, auto&& fn) {
    auto t0 = Clock::now();
    fn();
    out.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
  };
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c)
    threads.emplace_back([&, c] {
      Store& s = *stores[static_cast<size_t>(c)];
      auto& l = lat[static_cast<size_t>(c)];
      l.reserve(static_cast<size_t>(rounds) * 4);
      ++ready;
      while (!go.load()) std::this_thread::yield();
      for (int r = 0; r < rounds; ++r) {
        std::string base = fmt::format("r{}/", r);
        timed(l, [&] { s.set(base + std::to_string(c), value); });
        timed(l, [&] { s.add(base + "n", 1); });
        timed(l,
              [&] { s.get(base + std::to_string((c + 1) % clients), std::chrono::seconds(60)); });
        timed(l, [&] {
          s.wait({base + std::to_string((c + clients - 1) % clients)}, std::chrono::seconds(60));
        });
      }
    });
  while (ready.load() < clients) std::this_thread::yield();
  auto t0 = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  auto pct = [](const std::vector<double>& v, double p) {
    return v[std::min(v.size() - 1, static_cast<size_t>(p * v.size()))];
  };
  const char* names[] = {"set", "add", "get", "wait"};
  for (size_t op = 0; op < 4; ++op) {  // latencies are stored set, add, get, wait per round
    std::vector<double> v;
    for (auto& l : lat)
      for (size_t i = op; i < l.size(); i += 4) v.push_back(l[i]);
    std::sort(v.begin(), v.end());
    std::fprintf(stderr, "op=%s p50_us=%.1f p99_us=%.1f\n", names[op], pct(v, 0.5), pct(v, 0.99));
  }
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  std::printf(
      "impl=%s clients=%d rounds=%d ops=%zu secs=%.3f ops_per_s=%.0f p50_us=%.0f p99_us=%.0f\n",
      unary ? "grpc-unary"
            : (grpc_stream ? (confirmed_sets ? "grpc-confirmed-sets" : "grpc")
                           : (confirmed_sets ? "socket-confirmed-sets" : "socket")),
      clients, rounds,
      all.size(), secs, all.size() / secs, pct(all, 0.50), pct(all, 0.99));
  return 0;
}
