#pragma once
// A small etcd v3 client over our own gRPC stack (proto/etcd/: etcd v3.4's API), for the etcd
// rendezvous. Lives in the gRPC plugin; no gRPC in this header.
//
// Endpoints are tried in turn: a call that cannot reach one (or that one has no leader) moves
// on to the next, within the call's deadline, so a cluster that loses a member (even its
// leader) keeps serving. Errors name every endpoint tried.
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ddpl::launcher {

struct EtcdOptions {
  std::vector<std::string> endpoints;  // host:port, at least one
  // TLS when ca_file is set; cert_file and key_file: a client certificate (etcd's
  // --client-cert-auth).
  std::string ca_file, cert_file, key_file;
  // etcd's user/password auth (Auth/Authenticate), when user is set.
  std::string user, password;
  std::chrono::milliseconds connect_timeout{std::chrono::seconds(10)};
  std::chrono::milliseconds call_timeout{std::chrono::seconds(10)};
};

struct EtcdKv {
  std::string key, value;
  int64_t create_revision = 0, mod_revision = 0, version = 0, lease = 0;
};

struct EtcdEvent {
  enum class Type { kPut, kDelete };
  Type type = Type::kPut;
  EtcdKv kv;  // for a delete: the key and the revision of the delete
};

// One comparison of a transaction (etcd's Compare): the key's mod revision, create revision
// or value against `number` / `value`. A missing key has revision 0 and version 0. With
// range_end, every key in [key, range_end) must pass (etcd 3.3 on); an empty range passes.
struct EtcdCompare {
  enum class Target { kMod, kCreate, kVersion, kValue };
  enum class Result { kEqual, kNotEqual, kLess, kGreater };
  std::string key;
  Target target = Target::kMod;
  int64_t number = 0;
  std::string value;
  Result result = Result::kEqual;
  std::string range_end;
};

// A read of [key, range_end) (range_end empty: the one key) with etcd's options, for reads
// that must not grow with the number of keys: count only, keys only, the first created, or
// only what changed since a revision.
struct EtcdRange {
  std::string key, range_end;
  int64_t limit = 0;  // 0: no limit
  bool count_only = false, keys_only = false;
  bool oldest_first = false;     // sorted by create revision, ascending
  int64_t min_mod_revision = 0;  // only keys modified at or after it
};

struct EtcdRangeResult {
  std::vector<EtcdKv> kvs;
  int64_t count = 0;     // keys in the range (all of them, whatever the limit and filters)
  int64_t revision = 0;  // the store's revision at the read
};

struct EtcdOp {
  enum class Kind { kPut, kDelete, kDeletePrefix };
  Kind kind = Kind::kPut;
  std::string key, value;
  int64_t lease = 0;
};

struct EtcdTxnResult {
  bool succeeded = false;
  int64_t revision = 0;  // the store's revision after the transaction
};

// The end of etcd's range for every key that starts with `prefix`.
std::string etcdPrefixEnd(const std::string& prefix);

class EtcdWatch {
 public:
  virtual ~EtcdWatch() = default;  // stops the watch; no callback runs after it returns
};

// One lease kept alive over one long-lived LeaseKeepAlive stream, as etcd's own clients do (see
// EtcdClient::keepAlive).
class EtcdLeaseKeeper {
 public:
  // Cancels the stream and stops the keeper's thread (at once: nothing in it waits on etcd);
  // no callback runs after it returns. Destroy it before its client.
  virtual ~EtcdLeaseKeeper() = default;
  // From now on keeps lease `id` (granted just now with `ttl`) instead: a fresh lease after
  // the last one expired. Any thread but the `expired` callback's (which returns it instead).
  virtual void keep(int64_t id, std::chrono::seconds ttl) = 0;
};

// Lets another thread end a client's waits at once (an agent shutting down).
class EtcdCancel {
 public:
  // The wait in flight and every later one given this EtcdCancel return at once (false).
  void cancel();
  bool cancelled();

 private:
  friend class EtcdClient;
  std::mutex mu_;
  bool cancelled_ = false;
  std::function<void()> abort_;  // ends the wait in flight, if any
};

class EtcdClient {
 public:
  // Checks that an endpoint answers (and authenticates) within connect_timeout. Throws
  // NetworkError naming every endpoint tried and why, AuthError for wrong credentials,
  // InvalidArgument for unreadable TLS files.
  explicit EtcdClient(EtcdOptions options);
  ~EtcdClient();
  EtcdClient(const EtcdClient&) = delete;
  EtcdClient& operator=(const EtcdClient&) = delete;

  // `revision`: the store's revision at the read, for a watch that must miss nothing after.
  std::optional<EtcdKv> get(const std::string& key, int64_t* revision = nullptr);
  std::vector<EtcdKv> getPrefix(const std::string& prefix, int64_t* revision = nullptr);
  EtcdRangeResult range(const EtcdRange& r);
  int64_t put(const std::string& key, const std::string& value, int64_t lease = 0);
  int64_t deletePrefix(const std::string& prefix);  // returns the number deleted
  EtcdTxnResult txn(const std::vector<EtcdCompare>& compare, const std::vector<EtcdOp>& success,
                    const std::vector<EtcdOp>& failure = {});
  // Adds `delta` to the decimal counter at `key` (missing: 0) with compare-and-swap; returns
  // the new value.
  int64_t add(const std::string& key, int64_t delta);

  // Returns the lease's id; etcd may raise a TTL below its minimum.
  int64_t grantLease(std::chrono::seconds ttl);
  void revokeLease(int64_t id);
  // One keep-alive of the lease on a stream of its own; returns its remaining TTL in seconds,
  // 0 when it has expired.
  int64_t keepAliveOnce(int64_t id);
  // Keeps lease `id` (granted just now with `ttl`) alive from a thread of its own, over one
  // LeaseKeepAlive stream for as long as it works: a keep-alive every TTL/3 after etcd's last
  // answer (answers come in order on a stream: each tells when etcd renewed the lease). A
  // stream that breaks is reopened at once on the next endpoint (backing off to 1 s between
  // tries) and the keep-alive sent again; one that stops answering while the lease may still
  // be alive is given up for the next endpoint after 2 s when there are several, after a
  // TTL when there is one (a live stream delivers in order: re-sending on it, or on a new
  // stream to the same member, gets no earlier answer). `expired` runs on the keeper's thread
  // when etcd answers that the lease no longer exists, and returns the lease to keep from
  // then on (granted with the same TTL; the same id or 0: none yet, etcd is asked again in a
  // second). `fence`, if given, runs on the keeper's thread once per outage when no
  // keep-alive has been answered for 2/3 of the TTL, counted from the send of the last one
  // answered (etcd renewed the lease after it, so it cannot expire before TTL after it): the
  // argument is that silence. With it, keep-alives go every TTL/6 instead of TTL/3.
  std::unique_ptr<EtcdLeaseKeeper> keepAlive(
      int64_t id, std::chrono::seconds ttl, std::function<int64_t(int64_t id)> expired,
      std::function<void(std::chrono::milliseconds silent)> fence = {});

  // Events on [key, range_end) from `start_revision` on, delivered in order on a thread of the
  // watch's own. A broken stream resumes on any endpoint from the revision after the last
  // event; `failed` runs once (and no event after it) when no endpoint serves the watch
  // within connect_timeout, or the revisions were compacted away.
  std::unique_ptr<EtcdWatch> watch(const std::string& key, const std::string& range_end,
                                   int64_t start_revision,
                                   std::function<void(const std::vector<EtcdEvent>&)> events,
                                   std::function<void(const std::string&)> failed);
  // The same on several ranges (one stream, one thread), each from `start_revision`.
  std::unique_ptr<EtcdWatch> watch(const std::vector<std::pair<std::string, std::string>>& ranges,
                                   int64_t start_revision,
                                   std::function<void(const std::vector<EtcdEvent>&)> events,
                                   std::function<void(const std::string&)> failed);

  // Blocks until an event on [key, range_end) at or after `start_revision`, or `timeout`.
  // Returns false on timeout. Throws NetworkError when no endpoint serves the watch.
  // With `cancel`: returns false at once when it is cancelled, before or during the wait.
  bool waitForEvent(const std::string& key, const std::string& range_end, int64_t start_revision,
                    std::chrono::milliseconds timeout, EtcdCancel* cancel = nullptr);
  // The same on several ranges at once (one stream): returns at the first event on any.
  bool waitForEvent(const std::vector<std::pair<std::string, std::string>>& ranges,
                    int64_t start_revision, std::chrono::milliseconds timeout,
                    EtcdCancel* cancel = nullptr);

  std::string endpoints() const;  // "a:2379, b:2379"
  const EtcdOptions& options() const { return options_; }

  struct Impl;

 private:
  EtcdOptions options_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace ddpl::launcher
