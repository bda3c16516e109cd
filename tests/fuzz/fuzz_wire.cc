// libFuzzer target: the store socket's server (wire_server.cc) on raw bytes, one connection
// per input (socket_fuzz.h has the harness and what it finds). Each input is what a client
// sends after the magic; besides socket_fuzz.h's findings, a whole frame from the server that
// is not a StoreResponse traps.
#include "tests/fuzz/socket_fuzz.h"

using namespace ddpl;
using namespace ddpl::rdzv;
using namespace ddpl::rdzv::grpc_detail;

namespace {

// Takes the whole frames off the front of `in`; traps on one that is not a StoreResponse.
void checkFrames(std::string& in) {
  size_t off = 0;
  while (in.size() - off >= kFrameHeaderBytes) {
    uint32_t len = readFrameHeader(in.data() + off);
    if (in.size() - off - kFrameHeaderBytes < len) break;
    pb::StoreResponse resp;
    if (!resp.ParseFromArray(in.data() + off + kFrameHeaderBytes, static_cast<int>(len)))
      __builtin_trap();
    off += kFrameHeaderBytes + len;
  }
  in.erase(0, off);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string out(kWireMagic, kWireMagicBytes);
  out.append(reinterpret_cast<const char*>(data), size);
  fuzz::fuzzConnection([](WireServer& w, int fd) { return w.adopt(fd, "fuzz"); }, out,
                       checkFrames);
  return 0;
}
