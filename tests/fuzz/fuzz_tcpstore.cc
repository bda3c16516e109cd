// libFuzzer target: torch's TCPStore protocol on our server (protocol/tcpstore_format.cc,
// server/wire_server_tcpstore.cc) on raw bytes, one connection per input after torch's
// VALIDATE (socket_fuzz.h has the harness and what it finds: crashes, hangs, bounds not given
// back). Answers have no framing to check: what matters is that the server answers or closes,
// and lets go of everything. Each input runs in a fresh attempt, whose opening also deletes the
// previous input's keys.
#include "rendezvous/protocol/tcpstore_format.h"
#include "tests/fuzz/socket_fuzz.h"

using namespace ddpl;
using namespace ddpl::rdzv;
using namespace ddpl::rdzv::grpc_detail;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string out(reinterpret_cast<const char*>(tcpstore::kHello), tcpstore::kHelloBytes);
  out.append(reinterpret_cast<const char*>(data), size);
  fuzz::fuzzConnection(
      [](WireServer& w, int fd) {
        w.beginTorchAttempt(0, {}, /*loopback=*/true);
        return w.adoptTorch(fd, "ipv4:127.0.0.1:1");
      },
      out, [](std::string& in) { in.clear(); });
  return 0;
}
