#include "rendezvous/protocol/tcpstore_format.h"

#include <fmt/format.h>

#include <cstring>

namespace ddpl::rdzv::tcpstore {
namespace {

const char* const kNames[] = {"VALIDATE",  "SET",       "COMPARE_SET", "GET",        "ADD",
                              "CHECK",     "WAIT",      "GETNUMKEYS",  "DELETE_KEY", "APPEND",
                              "MULTI_GET", "MULTI_SET", "CANCEL_WAIT", "PING",       "QUEUE_PUSH",
                              "QUEUE_POP", "QUEUE_LEN", "LIST_KEYS",   "BARRIER"};
static_assert(sizeof(kNames) / sizeof(kNames[0]) == kLastQuery + 1);

// Reads fields in order from one buffer; any read past its end means "not whole yet", and a
// length past the limits stops at once (`error`), before anything is reserved for it.
class Reader {
 public:
  // `dry`: only measures (nothing is copied), so that a query arriving in many reads is
  // copied once, when it is whole.
  Reader(const char* p, size_t n, const Limits& l, bool dry) : p_(p), n_(n), limits_(l), dry_(dry) {}

  bool u8(uint8_t* v) { return raw(v, 1); }
  bool u32(uint32_t* v) { return raw(v, 4); }
  bool u64(uint64_t* v) { return raw(v, 8); }
  bool i64(int64_t* v) { return raw(v, 8); }

  bool key(std::string* out) {
    uint64_t len;
    if (!u64(&len)) return false;
    if (len > limits_.max_key_bytes)
      return tooLarge(fmt::format("a key of {} bytes (at most {})", len, limits_.max_key_bytes));
    if (!fits(len)) return false;
    if (!dry_) out->assign(p_ + at_, len);
    at_ += len;
    return true;
  }

  bool bytes(std::vector<uint8_t>* out) {
    uint64_t len;
    if (!u64(&len)) return false;
    if (len > limits_.max_value_bytes)
      return tooLarge(
          fmt::format("a value of {} bytes (at most {})", len, limits_.max_value_bytes));
    if (!fits(len)) return false;
    if (!dry_)
      out->assign(reinterpret_cast<const uint8_t*>(p_ + at_),
                  reinterpret_cast<const uint8_t*>(p_ + at_ + len));
    at_ += len;
    return true;
  }

  bool count(uint64_t* n) {
    if (!u64(n)) return false;
    if (*n > limits_.max_keys)
      return tooLarge(fmt::format("{} keys in one query (at most {})", *n, limits_.max_keys));
    return true;
  }

  size_t at() const { return at_; }
  const std::string& error() const { return error_; }

 private:
  bool raw(void* v, size_t len) {
    if (!fits(len)) return false;
    std::memcpy(v, p_ + at_, len);
    at_ += len;
    return true;
  }
  bool fits(uint64_t len) {
    if (at_ + len > limits_.max_query_bytes && error_.empty())
      return tooLarge(
          fmt::format("a query of more than {} bytes (at most {})", at_ + len,
                      limits_.max_query_bytes));
    return error_.empty() && len <= n_ - at_;
  }
  bool tooLarge(std::string why) {
    error_ = std::move(why);
    return false;
  }

  const char* p_;
  size_t n_;
  size_t at_ = 0;
  const Limits& limits_;
  bool dry_;
  std::string error_;
};

bool readKeys(Reader& r, Request* out) {
  uint64_t n;
  if (!r.count(&n)) return false;
  for (uint64_t i = 0; i < n; ++i) {
    out->keys.emplace_back();
    if (!r.key(&out->keys.back())) return false;
  }
  return true;
}

bool readKeyValues(Reader& r, Request* out, int values) {
  out->keys.emplace_back();
  if (!r.key(&out->keys.back())) return false;
  for (int i = 0; i < values; ++i) {
    out->values.emplace_back();
    if (!r.bytes(&out->values.back())) return false;
  }
  return true;
}

bool readBody(Reader& r, Request* out) {
  switch (out->type) {
    case Query::kValidate:
    case Query::kPing:
      return r.u32(&out->u32);
    case Query::kSet:
    case Query::kAppend:
    case Query::kQueuePush:
      return readKeyValues(r, out, 1);
    case Query::kCompareSet:
      return readKeyValues(r, out, 2);
    case Query::kGet:
    case Query::kDeleteKey:
    case Query::kQueuePop:
    case Query::kQueueLen:
      return readKeyValues(r, out, 0);
    case Query::kAdd:
    case Query::kBarrier:
      return readKeyValues(r, out, 0) && r.i64(&out->number);
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      return readKeys(r, out);
    case Query::kMultiSet: {
      uint64_t n;
      if (!r.count(&n)) return false;
      for (uint64_t i = 0; i < n; ++i)
        if (!readKeyValues(r, out, 1)) return false;
      return true;
    }
    case Query::kGetNumKeys:
    case Query::kCancelWait:
    case Query::kListKeys:
      return true;
  }
  return false;
}

void appendRaw(std::string& out, const void* p, size_t n) {
  out.append(static_cast<const char*>(p), n);
}

}  // namespace

const char* queryName(uint8_t type) { return type <= kLastQuery ? kNames[type] : "unknown"; }

ParseResult parseQuery(const char* data, size_t size, const Limits& limits, Request* out) {
  ParseResult res;
  if (size == 0) return res;
  res.type = static_cast<uint8_t>(data[0]);
  if (res.type > kLastQuery) {
    res.status = Parse::kUnknown;
    return res;
  }
  for (bool dry : {true, false}) {
    *out = Request{};
    out->type = static_cast<Query>(res.type);
    Reader r(data + 1, size - 1, limits, dry);
    if (!readBody(r, out)) {
      if (!r.error().empty()) {
        res.status = Parse::kTooLarge;
        res.error = fmt::format("{}: {}", queryName(res.type), r.error());
      }
      return res;
    }
    res.consumed = 1 + r.at();
  }
  res.status = Parse::kOk;
  return res;
}

void appendU8(std::string& out, uint8_t v) { out.push_back(static_cast<char>(v)); }
void appendU32(std::string& out, uint32_t v) { appendRaw(out, &v, sizeof(v)); }
void appendI64(std::string& out, int64_t v) { appendRaw(out, &v, sizeof(v)); }
void appendLength(std::string& out, uint64_t n) { appendRaw(out, &n, sizeof(n)); }

std::string encodeQuery(const Request& r) {
  std::string out;
  appendU8(out, static_cast<uint8_t>(r.type));
  auto str = [&](const std::string& s) {
    appendLength(out, s.size());
    out += s;
  };
  auto vec = [&](const std::vector<uint8_t>& v) {
    appendLength(out, v.size());
    appendRaw(out, v.data(), v.size());
  };
  switch (r.type) {
    case Query::kValidate:
    case Query::kPing:
      appendU32(out, r.u32);
      break;
    case Query::kSet:
    case Query::kAppend:
    case Query::kQueuePush:
      str(r.keys.at(0));
      vec(r.values.at(0));
      break;
    case Query::kCompareSet:
      str(r.keys.at(0));
      vec(r.values.at(0));
      vec(r.values.at(1));
      break;
    case Query::kGet:
    case Query::kDeleteKey:
    case Query::kQueuePop:
    case Query::kQueueLen:
      str(r.keys.at(0));
      break;
    case Query::kAdd:
    case Query::kBarrier:
      str(r.keys.at(0));
      appendI64(out, r.number);
      break;
    case Query::kCheck:
    case Query::kWait:
    case Query::kMultiGet:
      appendLength(out, r.keys.size());
      for (const auto& k : r.keys) str(k);
      break;
    case Query::kMultiSet:
      appendLength(out, r.keys.size());
      for (size_t i = 0; i < r.keys.size(); ++i) {
        str(r.keys[i]);
        vec(r.values.at(i));
      }
      break;
    case Query::kGetNumKeys:
    case Query::kCancelWait:
    case Query::kListKeys:
      break;
  }
  return out;
}

}  // namespace ddpl::rdzv::tcpstore
