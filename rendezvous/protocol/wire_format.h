#pragma once
// The store's plain-socket transport (docs/rendezvous.md, "The store's socket transport"):
// what the client (wire_link.cc) and the server (wire_server.cc) agree on. Internal: included
// only by those two and their tests.
//
// A connection to the rendezvous server's one port that starts with kWireMagic is served by
// WireServer instead of gRPC (the connection gate tells them apart by their first bytes: an
// HTTP/2 client starts with "PRI * HTTP/2.0", a TLS client with a handshake record, 0x16).
// After the magic, both sides send frames: a 4-byte little-endian length, then that many bytes
// of one protobuf message, StoreRequest from the client and StoreResponse from the server,
// with the ids, operations, quiet sets and errors of the gRPC Session stream. The first
// request is a ping with id 0 carrying the token (StoreRequest.token); its answer brings the
// server's value limit, or UNAUTHENTICATED, after which the server closes the connection.
// The connection ends when either side closes it or shuts down its writing side: unlike the
// gRPC stream's half-close, answers not yet written are dropped and parked operations
// cancelled (the client never half-closes; it closes when the store goes).
#include <cstdint>
#include <cstring>
#include <string>

namespace ddpl::rdzv::grpc_detail {

inline constexpr char kWireMagic[8] = {'D', 'D', 'P', 'L', 'S', 'T', 'O', '1'};
inline constexpr size_t kWireMagicBytes = sizeof(kWireMagic);
inline constexpr size_t kFrameHeaderBytes = 4;
// The first request (the ping with the token) may be at most this long: a peer that has not
// shown the token cannot make the server buffer more.
inline constexpr uint32_t kMaxHelloFrameBytes = 64 << 10;

inline void appendFrameHeader(std::string& out, uint32_t len) {
  char h[kFrameHeaderBytes] = {static_cast<char>(len & 0xff), static_cast<char>((len >> 8) & 0xff),
                               static_cast<char>((len >> 16) & 0xff),
                               static_cast<char>((len >> 24) & 0xff)};
  out.append(h, kFrameHeaderBytes);
}

inline uint32_t readFrameHeader(const char* p) {
  auto b = reinterpret_cast<const unsigned char*>(p);
  return uint32_t{b[0]} | uint32_t{b[1]} << 8 | uint32_t{b[2]} << 16 | uint32_t{b[3]} << 24;
}

// Appends `msg` (a protobuf message) as one frame.
template <typename Msg>
void appendFrame(std::string& out, const Msg& msg) {
  size_t len = msg.ByteSizeLong();
  appendFrameHeader(out, static_cast<uint32_t>(len));
  size_t at = out.size();
  out.resize(at + len);
  msg.SerializeWithCachedSizesToArray(reinterpret_cast<uint8_t*>(&out[at]));
}

}  // namespace ddpl::rdzv::grpc_detail
