#pragma once
// torch's TCPStore protocol, as torch's client (c10d::TCPStore, which Python's
// torch.distributed.TCPStore wraps) speaks it, 2.6 to 2.15: what the server's TCPStore transport
// (server/wire_server_tcpstore.cc) parses and answers. Pure byte handling, no I/O, so that
// it is unit-tested and fuzzed on its own (docs/rendezvous.md, "torch's TCPStore protocol").
//
// A connection opens with VALIDATE and the 32-bit magic, then PING with a nonce that the
// server echoes. Every query is one byte of type, then its fields in host (little-endian)
// order: strings and byte vectors as a uint64 length and the bytes, numbers as int64 or
// uint32, key lists as a uint64 count and the keys. Answers are in the order of the queries
// that have one; a WAIT is answered (STOP_WAITING) only when its keys exist, and a
// CANCEL_WAIT always gets WAIT_CANCELED, after the wait's answer if that was already due.
// The protocol has no version field and no token: the query types are torch's internal enum,
// which only grows at its end, so a type this parser does not know is reported (kUnknown) with
// its number.
//
// Types 0-18, through BARRIER: every type of torch 2.6 to 2.15 (docs/rendezvous.md has the
// table of which version added which). Tested with the pinned 2.9.1 (0-16) and 2.15.0 (0-18),
// whose clients send the same bytes for types 0-16.
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ddpl::rdzv::tcpstore {

inline constexpr uint32_t kValidationMagic = 0x3C85F7CE;
// The newest torch whose protocol this is: named in the message for an unknown type.
inline constexpr const char* kTestedTorch = "2.15.0";

enum class Query : uint8_t {
  kValidate = 0,
  kSet,
  kCompareSet,
  kGet,
  kAdd,
  kCheck,
  kWait,
  kGetNumKeys,
  kDeleteKey,
  kAppend,
  kMultiGet,
  kMultiSet,
  kCancelWait,
  kPing,
  kQueuePush,
  kQueuePop,
  kQueueLen,
  kListKeys,  // new since 2.9 (2.11.0 has it)
  kBarrier,   // new since 2.11 (2.15.0 has it)
};
inline constexpr uint8_t kLastQuery = static_cast<uint8_t>(Query::kBarrier);
const char* queryName(uint8_t type);  // "SET", ...; "unknown" past kLastQuery

inline constexpr uint8_t kCheckReady = 0, kCheckNotReady = 1;
inline constexpr uint8_t kStopWaiting = 0, kWaitCanceled = 1;

// The first bytes of every torch client's connection: VALIDATE and the magic.
inline constexpr size_t kHelloBytes = 5;
inline constexpr unsigned char kHello[kHelloBytes] = {0x00, 0xCE, 0xF7, 0x85, 0x3C};

struct Limits {
  uint64_t max_key_bytes = 64 << 10;
  uint64_t max_value_bytes = 64 << 20;
  uint64_t max_keys = 128 << 10;  // in one CHECK, WAIT, MULTI_GET or MULTI_SET
  // One query whole (MULTI_SET's keys and values together), so that a query is never more
  // than this in the server's memory before it is handled.
  uint64_t max_query_bytes = (64 << 20) + (1 << 20);
};

struct Request {
  Query type = Query::kValidate;
  std::vector<std::string> keys;                 // key, or keys in order
  std::vector<std::vector<uint8_t>> values;      // set/append/push: 1; compare_set: expected,
                                                 // desired; multi_set: one per key
  int64_t number = 0;                            // ADD's delta, BARRIER's world size
  uint32_t u32 = 0;                              // VALIDATE's magic, PING's nonce
};

enum class Parse {
  kNeedMore,  // the query is not whole yet: read more and parse again from the same place
  kOk,        // `out` holds it; `consumed` bytes were its
  kUnknown,   // its type byte is past kLastQuery (`type` says which)
  kTooLarge,  // a length or count past the limits (`error` names it): never buffered
};

struct ParseResult {
  Parse status = Parse::kNeedMore;
  size_t consumed = 0;
  uint8_t type = 0;
  std::string error;
};

ParseResult parseQuery(const char* data, size_t size, const Limits& limits, Request* out);

// Answers.
void appendU8(std::string& out, uint8_t v);
void appendU32(std::string& out, uint32_t v);
void appendI64(std::string& out, int64_t v);
// A byte vector's length; its bytes follow (the caller writes them, or hands them over).
void appendLength(std::string& out, uint64_t n);

// The client's side, for tests and the fuzzer's seeds: a query as torch's client sends it.
std::string encodeQuery(const Request& r);

}  // namespace ddpl::rdzv::tcpstore
