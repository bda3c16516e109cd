// Process-group bootstrap as a user feels it (issue 17): N ranks, from the moment each rank
// starts to the first barrier every rank has completed, with our store and with TCPStore, both
// behind c10d's own classes (c10d::Store, c10d::PrefixStore, c10d::ProcessGroupGloo).
//
//   rdzv_bootstrap_bench [--ranks 8,64,256,1024] [--repeat 3] [--gloo-max 64]
//                        [--impls socket,grpc,tcpstore,agent] [--start staggered|together]
//
// socket: our store on the server's plain socket (the default client); grpc: our store on the
// gRPC Session stream (GrpcStoreOptions::socket = false); tcpstore: torch's; agent: torch's
// own client (c10d::TCPStore) against our server's TCPStore protocol, the store launch's agent
// hosts for Python jobs (issue 28): the pair tcpstore/agent differs only in the server.
//
// Ranks are threads of this process, each with its own store client (its own TCPStore socket;
// its own GrpcStore, whose channels to one server share gRPC's one connection inside a
// process). The store's host runs in this process too, started before the clock: the
// launcher's agent (ours) or rank 0's TCPStore master (torch) is up before ranks start.
// For each N and each store, interleaved, `repeat` runs:
//
//   mode=store  what init_process_group does on the store for an NCCL job: connect, the
//               store-based barrier of init_process_group (TORCH_DIST_INIT_BARRIER=1: add,
//               add 0, the last rank sets the key everyone waits for), then the unique-id
//               exchange of the first NCCL collective (rank 0 sets 128 bytes, the others get
//               them). The NCCL collective itself needs GPUs and does not touch the store.
//   mode=gloo   (N <= --gloo-max) connect, a real c10d::ProcessGroupGloo over a PrefixStore
//               (Gloo's full mesh is built through the store), then barrier()->wait(). Every
//               rank opens a socket to every other: N = 256 would need 65k sockets here.
//
// --start staggered (the default): the clock starts before the first rank thread is created and
// each rank starts as soon as its thread runs. --start together: every rank thread is created
// first and waits on one futex; the clock starts when one wake-up releases them all, so every
// rank's connect and barrier land on the store in one burst (a real job's worst moment: its
// processes reach init_process_group within moments of each other) and thread creation is
// out of the measurement.
//
// One line per run: impl=socket|grpc|tcpstore mode=store|gloo start=staggered|together ranks=N
// ms=<start to last rank done>
// rank_p50_ms=<a rank's own time, median> connect_p50_ms / connect_max_ms=<its store client's
// construction> errors=E spawned_ms=<the last rank thread started> after_barrier_ms=<the first
// rank out of the barrier to the end> cpu_ms=<the process's user + system CPU over the run,
// every thread>. On this 2-core machine most of a staggered run is the harness creating its
// threads (spawned_ms), the same for both stores; after_barrier_ms is the store alone
// releasing N waiters and serving their last get.
#include <linux/futex.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstdio>
#include <mutex>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include "common/parse.h"
#include "rendezvous/client/grpc_store.h"
#include "rendezvous/server/server.h"
#include "worker/store_adapter.h"

void benchLogWarningsOnly();  // rdzv_bootstrap_log.cc

namespace {

using Clock = std::chrono::steady_clock;
constexpr std::chrono::milliseconds kTimeout{std::chrono::seconds(300)};

// kAgent: torch's own TCPStore client against our server's TCPStore protocol (the agent
// store launch hosts), where kTcp is the same client against torch's own server.
enum class Impl { kSocket, kGrpc, kTcp, kAgent };

const char* implName(Impl i) {
  return i == Impl::kSocket ? "socket"
         : i == Impl::kGrpc ? "grpc"
         : i == Impl::kTcp  ? "tcpstore"
                            : "agent";
}
enum class Mode { kStore, kGloo };

// The host side, up before the ranks start.
struct Host {
  std::unique_ptr<ddpl::rdzv::RendezvousServer> server;
  c10::intrusive_ptr<c10d::TCPStore> master;
  std::string endpoint;
  uint16_t port = 0;
};

c10::intrusive_ptr<c10d::Store> connect(Impl impl, const Host& h, const std::string& run) {
  if (impl != Impl::kTcp && impl != Impl::kAgent) {
    ddpl::rdzv::GrpcStoreOptions o;
    o.endpoint = h.endpoint;
    o.prefix = run + "/";
    o.socket = impl == Impl::kSocket;
    return c10::make_intrusive<ddpl::worker::RdzvC10dStore>(
        std::shared_ptr<ddpl::rdzv::Store>(ddpl::rdzv::connectGrpcStore(o)), kTimeout);
  }
  c10d::TCPStoreOptions o;
  o.port = impl == Impl::kTcp ? h.port : static_cast<uint16_t>(h.server->port());
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = kTimeout;
  auto s = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", o);
  return c10::make_intrusive<c10d::PrefixStore>(run, s);
}

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// When a run's phases ended, shared by its rank threads.
struct Phases {
  std::atomic<int64_t> last_start_ns{0};
  std::atomic<int64_t> first_release_ns{INT64_MAX};

  static int64_t now() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch())
        .count();
  }
  static void raise(std::atomic<int64_t>& a, int64_t v) {
    for (int64_t o = a.load(); v > o && !a.compare_exchange_weak(o, v);) {
    }
  }
  static void lower(std::atomic<int64_t>& a, int64_t v) {
    for (int64_t o = a.load(); v < o && !a.compare_exchange_weak(o, v);) {
    }
  }
};

// The release of `together`: one system call wakes every waiting rank, no lock to queue on.
long futex(std::atomic<int>* word, int op, int val) {
  return syscall(SYS_futex, reinterpret_cast<int*>(word), op, val, nullptr, nullptr, 0);
}

// User and system CPU time of the whole process (every thread: ranks, both stores' hosts).
double processCpuMs() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto ms = [](const timeval& t) { return t.tv_sec * 1e3 + t.tv_usec / 1e3; };
  return ms(u.ru_utime) + ms(u.ru_stime);
}

// torch.distributed's _store_based_barrier, key for key.
void storeBasedBarrier(c10d::Store& store, int world, Phases& phases) {
  const std::string key = "store_based_barrier_key:0";
  store.add(key, 1);
  if (store.add(key, 0) == world) store.set(key + ":last_worker", bytes("1"));
  store.wait({key + ":last_worker"}, kTimeout);
  Phases::lower(phases.first_release_ns, Phases::now());
}

void rank(Impl impl, Mode mode, const Host& h, const std::string& run, int r, int world,
          double* connect_ms, Phases& phases) {
  auto start = Clock::now();
  auto base = connect(impl, h, run);
  *connect_ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
  auto store = c10::make_intrusive<c10d::PrefixStore>("0", base);  // the default group's prefix
  if (mode == Mode::kStore) {
    storeBasedBarrier(*store, world, phases);
    // ProcessGroupNCCL::broadcastUniqueNCCLID for the first collective.
    if (r == 0)
      store->set("0", std::vector<uint8_t>(128, 0x5a));
    else
      store->get("0");
    return;
  }
  auto options = c10d::ProcessGroupGloo::Options::create(kTimeout);
  options->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  auto pg = c10::make_intrusive<c10d::ProcessGroupGloo>(store, r, world, options);
  pg->barrier()->wait(kTimeout);
}

void runOnce(Impl impl, Mode mode, const Host& h, int world, int attempt, bool together) {
  // Its own keys: the socket and gRPC clients share one server, and a run that found the
  // keys of the one before (the barrier's last_worker, Gloo's addresses) measured nothing.
  std::string run = std::string(mode == Mode::kStore ? "store" : "gloo") + "-" +
                    std::to_string(world) + "-" + std::to_string(attempt) + "-" + implName(impl);
  std::vector<double> rank_ms(static_cast<size_t>(world)), connect_ms(rank_ms.size());
  std::atomic<int> errors{0};
  std::mutex mu;
  std::string first_error;
  std::vector<std::thread> threads;
  threads.reserve(static_cast<size_t>(world));
  Phases phases;
  // together: every rank thread exists before the clock starts and they leave one gate at
  // once, as processes of a real job reach init_process_group within moments of each other.
  std::atomic<int> ready{0};
  std::atomic<int> go{together ? 0 : 1};
  double cpu0_ms = processCpuMs();
  int64_t t0_ns = Phases::now();
  for (int r = 0; r < world; ++r)
    threads.emplace_back([&, r] {
      if (!go.load()) {
        ++ready;
        while (!go.load()) futex(&go, FUTEX_WAIT_PRIVATE, 0);
      }
      auto start = Clock::now();
      Phases::raise(phases.last_start_ns, Phases::now());
      try {
        rank(impl, mode, h, run, r, world, &connect_ms[static_cast<size_t>(r)], phases);
      } catch (const std::exception& e) {
        if (errors++ == 0) {
          std::lock_guard<std::mutex> l(mu);
          first_error = e.what();
        }
      }
      rank_ms[static_cast<size_t>(r)] =
          std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    });
  if (together) {
    while (ready.load() < world) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // the last ones reach the wait
    cpu0_ms = processCpuMs();
    t0_ns = Phases::now();
    go = 1;
    futex(&go, FUTEX_WAKE_PRIVATE, INT_MAX);
  }
  for (auto& t : threads) t.join();
  int64_t end_ns = Phases::now();
  double cpu_ms = processCpuMs() - cpu0_ms;
  double ms = (end_ns - t0_ns) / 1e6;
  double spawned_ms = (phases.last_start_ns - t0_ns) / 1e6;
  // Gloo runs have no store-based barrier: 0.
  double after_barrier_ms =
      phases.first_release_ns == INT64_MAX ? 0.0 : (end_ns - phases.first_release_ns) / 1e6;
  std::sort(rank_ms.begin(), rank_ms.end());
  std::sort(connect_ms.begin(), connect_ms.end());
  std::printf(
      "impl=%s mode=%s start=%s ranks=%d ms=%.1f rank_p50_ms=%.1f connect_p50_ms=%.1f "
      "connect_max_ms=%.1f errors=%d spawned_ms=%.1f after_barrier_ms=%.1f cpu_ms=%.1f%s%s\n",
      implName(impl), mode == Mode::kStore ? "store" : "gloo", together ? "together" : "staggered",
      world, ms, rank_ms[rank_ms.size() / 2], connect_ms[connect_ms.size() / 2], connect_ms.back(),
      errors.load(), spawned_ms, after_barrier_ms, cpu_ms,
      first_error.empty() ? "" : " first_error=", first_error.substr(0, 300).c_str());
  std::fflush(stdout);
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> sizes = {8, 64, 256, 1024};
  int repeat = 3, gloo_max = 64;
  bool together = false;
  std::vector<Impl> impls = {Impl::kSocket, Impl::kGrpc, Impl::kTcp};
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    try {
      if (a == "--ranks") {
        sizes.clear();
        for (const auto& x : ddpl::splitList(v, ','))
          sizes.push_back(static_cast<int>(ddpl::parseInteger(a, x, 1, 1 << 16)));
      } else if (a == "--repeat") {
        repeat = static_cast<int>(ddpl::parseInteger(a, v, 1, 1000));
      } else if (a == "--impls") {
        impls.clear();
        for (const auto& x : ddpl::splitList(v, ',')) {
          if (x == "socket")
            impls.push_back(Impl::kSocket);
          else if (x == "grpc")
            impls.push_back(Impl::kGrpc);
          else if (x == "tcpstore")
            impls.push_back(Impl::kTcp);
          else if (x == "agent")
            impls.push_back(Impl::kAgent);
          else
            throw ddpl::InvalidArgument("--impls: '" + x + "' is not socket, grpc, tcpstore or agent");
        }
      } else if (a == "--start") {
        if (v != "staggered" && v != "together")
          throw ddpl::InvalidArgument("--start: '" + v + "' is not staggered or together");
        together = v == "together";
      } else if (a == "--gloo-max") {
        gloo_max = static_cast<int>(ddpl::parseInteger(a, v, 0, 1 << 16));
      } else {
        std::fprintf(stderr, "rdzv_bootstrap_bench: unknown flag %s\n", a.c_str());
        return 2;
      }
    } catch (const ddpl::InvalidArgument& e) {
      std::fprintf(stderr, "rdzv_bootstrap_bench: %s\n", e.what());
      return 2;
    }
  }
  benchLogWarningsOnly();
  Host h;
  // Every rank thread's gRPC store shares this process's one connection to the server, whose
  // limit of long-lived calls per connection (1,024 by default) a real job never meets: one
  // rank per process. Raised above the largest N, as rdzv_scale_bench does.
  ddpl::rdzv::ServerOptions so;
  so.tcpstore = true;  // the agent store: torch's protocol, its attempt open, loopback admitted
  so.tcpstore_attempt = 0;
  so.connections.max_connections_from_file_limit = true;
  for (int n : sizes)
    so.connections.max_streams_per_connection =
        std::max(so.connections.max_streams_per_connection, n + 64);
  h.server = std::make_unique<ddpl::rdzv::RendezvousServer>(so);
  h.endpoint = h.server->endpoint();
  c10d::TCPStoreOptions mo;
  mo.port = 0;
  mo.isServer = true;
  mo.waitWorkers = false;
  mo.timeout = kTimeout;
  mo.useLibUV = true;
  h.master = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", mo);
  h.port = h.master->getPort();
  for (int n : sizes)
    for (Mode mode : {Mode::kStore, Mode::kGloo}) {
      if (mode == Mode::kGloo && n > gloo_max) continue;
      for (int a = 0; a < repeat; ++a)
        for (Impl impl : impls) runOnce(impl, mode, h, n, a, together);
    }
  return 0;
}
