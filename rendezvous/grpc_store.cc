#include "rendezvous/grpc_store.h"

#include <fmt/format.h>

#include "common/errors.h"
#include "proto/rendezvous.grpc.pb.h"
#include "rendezvous/grpc_common.h"

namespace ddpl::rdzv {
namespace {

namespace pb = ::ddpl::rendezvous::v1;
using namespace grpc_detail;

// Time on top of a blocking call's own timeout before the client stops waiting: the
// server answers DEADLINE_EXCEEDED with the key and the numbers first.
constexpr Duration kBlockingGrace{std::chrono::seconds(5)};

class GrpcStore : public Store {
 public:
  explicit GrpcStore(const GrpcStoreOptions& o) : o_(o) {
    channel_ = makeChannel(
        {o.endpoint, o.tls_ca_file, o.tls_cert_file, o.tls_key_file, kDefaultMaxValueBytes});
    stub_ = pb::Store::NewStub(channel_);
    retryConnect(o.endpoint, o.connect_timeout, [&](Duration attempt_timeout) {
      grpc::ClientContext ctx;
      prepare(ctx, o_.token, attempt_timeout);
      ctx.set_wait_for_ready(true);
      pb::PingResponse resp;
      auto s = stub_->Ping(&ctx, pb::PingRequest{}, &resp);
      if (s.ok()) max_value_bytes_ = resp.max_value_bytes();
      return s;
    });
  }

  void set(const std::string& key, const Bytes& value) override {
    checkSize(key, value);
    pb::SetRequest req;
    req.set_key(k(key));
    req.set_value(value.data(), value.size());
    pb::SetResponse resp;
    call("set", key, o_.default_timeout, &pb::Store::Stub::Set, req, resp);
  }

  Bytes get(const std::string& key, Duration timeout) override {
    pb::GetRequest req;
    req.set_key(k(key));
    req.set_timeout_ms(timeout.count());
    pb::GetResponse resp;
    call("get", key, timeout + kBlockingGrace, &pb::Store::Stub::Get, req, resp);
    return bytes(resp.value());
  }

  int64_t add(const std::string& key, int64_t delta) override {
    pb::AddRequest req;
    req.set_key(k(key));
    req.set_delta(delta);
    pb::AddResponse resp;
    call("add", key, o_.default_timeout, &pb::Store::Stub::Add, req, resp);
    return resp.value();
  }

  Bytes compareSet(const std::string& key, const Bytes& expected, const Bytes& desired) override {
    checkSize(key, desired);
    pb::CompareSetRequest req;
    req.set_key(k(key));
    req.set_expected(expected.data(), expected.size());
    req.set_desired(desired.data(), desired.size());
    pb::CompareSetResponse resp;
    call("compareSet", key, o_.default_timeout, &pb::Store::Stub::CompareSet, req, resp);
    return bytes(resp.value());
  }

  bool check(const std::vector<std::string>& keys) override {
    pb::CheckRequest req;
    for (const auto& key : keys) req.add_keys(k(key));
    pb::CheckResponse resp;
    call("check", first(keys), o_.default_timeout, &pb::Store::Stub::Check, req, resp);
    return resp.all_present();
  }

  void wait(const std::vector<std::string>& keys, Duration timeout) override {
    pb::WaitRequest req;
    for (const auto& key : keys) req.add_keys(k(key));
    req.set_timeout_ms(timeout.count());
    pb::WaitResponse resp;
    call("wait", first(keys), timeout + kBlockingGrace, &pb::Store::Stub::Wait, req, resp);
  }

  bool deleteKey(const std::string& key) override {
    pb::DeleteKeyRequest req;
    req.set_key(k(key));
    pb::DeleteKeyResponse resp;
    call("deleteKey", key, o_.default_timeout, &pb::Store::Stub::DeleteKey, req, resp);
    return resp.existed();
  }

  int64_t numKeys() override {
    pb::NumKeysRequest req;
    req.set_prefix(o_.prefix);
    pb::NumKeysResponse resp;
    call("numKeys", "", o_.default_timeout, &pb::Store::Stub::NumKeys, req, resp);
    return resp.count();
  }

  std::vector<Bytes> multiGet(const std::vector<std::string>& keys, Duration timeout) override {
    pb::MultiGetRequest req;
    for (const auto& key : keys) req.add_keys(k(key));
    req.set_timeout_ms(timeout.count());
    pb::MultiGetResponse resp;
    call("multiGet", first(keys), timeout + kBlockingGrace, &pb::Store::Stub::MultiGet, req, resp);
    std::vector<Bytes> out;
    out.reserve(resp.values_size());
    for (const auto& v : resp.values()) out.push_back(bytes(v));
    return out;
  }

  void multiSet(const std::vector<std::string>& keys, const std::vector<Bytes>& values) override {
    if (keys.size() != values.size())
      throw InvalidArgument(
          fmt::format("multiSet: {} keys but {} values", keys.size(), values.size()));
    pb::MultiSetRequest req;
    for (size_t i = 0; i < keys.size(); ++i) {
      checkSize(keys[i], values[i]);
      req.add_keys(k(keys[i]));
      req.add_values(values[i].data(), values[i].size());
    }
    pb::MultiSetResponse resp;
    call("multiSet", first(keys), o_.default_timeout, &pb::Store::Stub::MultiSet, req, resp);
  }

 private:
  std::string k(const std::string& key) const { return o_.prefix + key; }
  static std::string first(const std::vector<std::string>& keys) {
    return keys.empty() ? std::string() : keys.front();
  }
  static Bytes bytes(const std::string& s) { return Bytes(s.begin(), s.end()); }

  void checkSize(const std::string& key, const Bytes& value) const {
    if (static_cast<int64_t>(value.size()) > max_value_bytes_)
      throw StoreError(fmt::format(
          "RESOURCE_EXHAUSTED: value for key '{}' is {} bytes; the server at {} accepts at most "
          "{} bytes",
          key, value.size(), o_.endpoint, max_value_bytes_));
  }

  template <typename Req, typename Resp>
  void call(const char* op, const std::string& key, Duration timeout,
            grpc::Status (pb::Store::Stub::*method)(grpc::ClientContext*, const Req&, Resp*),
            const Req& req, Resp& resp) {
    grpc::ClientContext ctx;
    prepare(ctx, o_.token, timeout);
    grpc::Status s = ((*stub_).*method)(&ctx, req, &resp);
    if (!s.ok())
      throwStatus(s, o_.endpoint, key.empty() ? std::string(op) : fmt::format("{} '{}'", op, key));
  }

  GrpcStoreOptions o_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Store::Stub> stub_;
  int64_t max_value_bytes_ = kDefaultMaxValueBytes;
};

}  // namespace

std::unique_ptr<Store> connectGrpcStore(const GrpcStoreOptions& options) {
  return std::make_unique<GrpcStore>(options);
}

}  // namespace ddpl::rdzv
