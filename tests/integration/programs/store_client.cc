// A worker that uses the store `launch --standalone` hands it (DDPL_STORE_ADDR, _TOKEN,
// _PREFIX): every rank publishes a key, waits for all of them, and bumps a shared counter.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "rendezvous/client/grpc_store.h"

int main() {
  using namespace ddpl::rdzv;
  const char* addr = getenv("DDPL_STORE_ADDR");
  const char* token = getenv("DDPL_STORE_TOKEN");
  const char* prefix = getenv("DDPL_STORE_PREFIX");
  if (!addr || !token || !prefix) {
    fprintf(stderr, "DDPL_STORE_ADDR/TOKEN/PREFIX not set\n");
    return 10;
  }
  int rank = atoi(getenv("RANK")), world = atoi(getenv("WORLD_SIZE"));
  try {
    GrpcStoreOptions o;
    o.endpoint = addr;
    o.token = token;
    o.prefix = prefix;
    o.connect_timeout = std::chrono::seconds(20);
    auto store = connectGrpcStore(o);
    store->set("rank/" + std::to_string(rank), toBytes("hello from " + std::to_string(rank)));
    std::vector<std::string> keys;
    for (int r = 0; r < world; ++r) keys.push_back("rank/" + std::to_string(r));
    store->wait(keys, std::chrono::seconds(20));
    int64_t n = store->add("arrived", 1);
    std::string peer = toString(store->get("rank/" + std::to_string((rank + 1) % world),
                                           std::chrono::seconds(5)));
    printf("rank %d saw '%s' arrived=%lld prefix=%s\n", rank, peer.c_str(),
           static_cast<long long>(n), prefix);
    if (getenv("FAIL_ONCE") && atoi(getenv("TORCHELASTIC_RESTART_COUNT")) == 0 && rank == 0)
      return 9;
  } catch (const std::exception& e) {
    fprintf(stderr, "store error: %s\n", e.what());
    return 11;
  }
  return 0;
}
