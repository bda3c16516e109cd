// WireServer's second protocol: torch's TCPStore (rendezvous/protocol/tcpstore_format.h), for
// workers that connect as c10d::TCPStore clients to the store their agent hosts. The
// transport (the loop, reading, output, back-pressure, closing) is wire_server.cc's; this
// file is what differs: who may connect, the attempt's namespace, and the queries.
//
// Every key a torch client names lives under the namespace of the attempt it connected in
// ("tcpstore/<n>/"). beginTorchAttempt opens a new one: the old attempt's connections are
// shut down (the loop closes them) and any query of theirs still read is refused, and its
// keys are deleted, so that a restarted group never sees a key of the group before it
// (torch 2.9's own shared store keeps them: a restart could read the dead ranks' Gloo
// addresses).
//
// A BARRIER counts its arrivals in its key, as torch's libuv server does (the key is the
// client's: GET reads the count, LIST_KEYS and GETNUMKEYS see it), and the arrivals that
// must wait park, as a WAIT does, on a release key beside the namespace
// ("tcpstore-barrier/<n>/<key>", which no client can name), set by the arrival that
// completes it. So a parked barrier is bounded, timed, cancelled by CANCEL_WAIT and dropped
// with its connection exactly as a WAIT is, and a new attempt deletes its release keys with
// the rest. Its steps are not one atomic step of the store, but every query of the torch
// clients runs on the loop thread, one after the other, so none falls between them.
#include <fmt/format.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

#include "common/log.h"
#include "common/net.h"
#include "rendezvous/protocol/grpc_common.h"
#include "rendezvous/protocol/tcpstore_format.h"
#include "rendezvous/server/service_core.h"
#include "rendezvous/server/wire_conn.h"
#include "rendezvous/server/wire_server.h"

namespace ddpl::rdzv::grpc_detail {
namespace {


// "ipv4:10.0.0.2:5000" -> "10.0.0.2", "ipv6:[::1]:5000" -> "::1" (the gate's peer names).
std::string peerIp(const std::string& peer) {
  auto colon = peer.find(':');
  if (colon == std::string::npos) return peer;
  std::string rest = peer.substr(colon + 1);
  if (!rest.empty() && rest[0] == '[') {
    auto close = rest.find(']');
    return close == std::string::npos ? rest : rest.substr(1, close - 1);
  }
  auto last = rest.rfind(':');
  return last == std::string::npos ? rest : rest.substr(0, last);
}

std::string oneByte(uint8_t v) { return std::string(1, static_cast<char>(v)); }

std::string keysNs(uint64_t serial) { return fmt::format("tcpstore/{}/", serial); }
std::string barriersNs(uint64_t serial) { return fmt::format("tcpstore-barrier/{}/", serial); }

// What a LIST_KEYS answer costs besides its keys' bytes: its count, and each key's length.
constexpr uint64_t kListHeaderBytes = 8, kListPerKeyBytes = 8;

}  // namespace

bool WireServer::adoptTorch(int fd, const std::string& peer) {
  std::string why;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopped_ || stopping_) return false;
    std::string ip = peerIp(peer);
    if (!torch_.open) {
      why = "the job's store has no attempt open yet (its workers are not started)";
    } else if (!(torch_.loopback && isLoopback(ip)) &&
               std::find(torch_.peers.begin(), torch_.peers.end(), ip) == torch_.peers.end()) {
      why = fmt::format("{} is not one of the job's nodes ({}{})", ip,
                        fmt::join(torch_.peers, ", "),
                        torch_.loopback ? (torch_.peers.empty() ? "loopback" : ", loopback") : "");
    } else {
      int one = 1;
      setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
      auto c = std::make_shared<Conn>();
      c->fd = fd;
      c->peer = peer;
      c->torch = true;
      c->ns = torch_.ns;
      c->scope = torch_serial_.load();
      c->authed = true;  // admitted by its address: its input counts with the others'
      c->id = next_id_++;
      conns_.emplace(c->id, c);
      ++stats_.accepted;
      ++core_->sessions;
      loop_.add(fd, EPOLLIN | EPOLLRDHUP, c->id);
      why.clear();
    }
    if (!why.empty()) ++stats_.torch_refused;
  }
  if (why.empty()) {
    // Admitted: the gate spares it when it must make room, as it spares a peer with a token.
    if (core_->cfg.on_token_checked) core_->cfg.on_token_checked(peer, true);
    return true;
  }
  warnTorch(fmt::format("refused a torch TCPStore client from {}: {}", peer, why));
  return false;
}

void WireServer::beginTorchAttempt(int64_t attempt, std::vector<std::string> peers,
                                   bool loopback) {
  bool had_old = false;
  uint64_t old_serial = 0;
  std::vector<ConnPtr> old;
  int shut = 0;
  int64_t previous = 0;
  {
    std::lock_guard<std::mutex> lock(mu_);
    had_old = torch_.open;
    old_serial = torch_serial_.load();
    previous = torch_.attempt;
    torch_.open = true;
    torch_.attempt = attempt;
    uint64_t serial = torch_serial_.fetch_add(1) + 1;  // changed only here, under mu_
    torch_.ns = keysNs(serial);
    torch_.peers = std::move(peers);
    torch_.loopback = loopback;
    for (auto& [id, c] : conns_)
      if (c->torch && c->scope != serial) old.push_back(c);
  }
  // A connection's mutex is never taken under mu_ (wire_server.h).
  for (auto& c : old) {
    // The loop closes it when it sees the end (only the loop thread may touch its input);
    // queries of it already read are refused by their scope.
    std::lock_guard<std::mutex> g(c->mu);
    if (!c->closed) {
      ::shutdown(c->fd, SHUT_RDWR);
      ++shut;
    }
  }
  int64_t deleted = had_old ? deleteTorchKeys(old_serial) : 0;
  if (had_old)
    log::info(
        "[{}] torch TCPStore: attempt {} open; attempt {}'s {} connection(s) closed and its {} "
        "key(s) deleted",
        core_->cfg.log_name, attempt, previous, shut, deleted);
}

int64_t WireServer::deleteTorchKeys(uint64_t serial) {
  int64_t n = core_->kv.deletePrefix(keysNs(serial));
  core_->kv.deletePrefix(barriersNs(serial));  // not the client's keys: not counted
  return n;
}

void WireServer::processTorch(const ConnPtr& c) {
  size_t off = 0;
  bool ended = false, paused = false;
  int handled = 0;
  tcpstore::Request q;
  while (handled < kRequestsPerTurn) {
    auto r = tcpstore::parseQuery(c->in.data() + off, c->in.size() - off, torch_limits_, &q);
    if (r.status == tcpstore::Parse::kNeedMore) break;
    if (r.status == tcpstore::Parse::kUnknown) {
      endTorch(c, fmt::format(
                      "query type {}, which torch {}'s TCPStore protocol does not have (it "
                      "has types 0-{}): the client's torch speaks a newer protocol than this "
                      "launcher; run with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 (or --rdzv-conf "
                      "agent_store=0) so that rank 0 hosts torch's own store",
                      r.type, tcpstore::kTestedTorch, tcpstore::kLastQuery));
      ended = true;
      break;
    }
    if (r.status == tcpstore::Parse::kTooLarge) {
      endTorch(c, r.error);
      ended = true;
      break;
    }
    off += r.consumed;
    if (!handleTorch(c, q)) {
      ended = true;
      break;
    }
    ++handled;
    Next next = afterRequest(c);
    if (next == Next::kClosed) return;
    if (next == Next::kPaused) {
      paused = true;
      break;
    }
  }
  if (!ended) consumed(c, off);
  // Possibly a whole query left (the turn's budget spent, or back-pressure): come back to it.
  // Only a partial one: the next turn finds so and reads again.
  bool more = !ended && !c->in.empty() && (paused || handled == kRequestsPerTurn);
  endTurn(c, ended, more);
}

bool WireServer::handleTorch(const ConnPtr& c, tcpstore::Request& q) {
  using tcpstore::Query;
  const char* name = tcpstore::queryName(static_cast<uint8_t>(q.type));
  if (c->magic_seen == 0) {
    // The gate routed it for its VALIDATE: anything else first is not torch's client.
    if (q.type != Query::kValidate || q.u32 != tcpstore::kValidationMagic) {
      endTorch(c, fmt::format("first query {} (magic {:#x}): torch's client starts with "
                              "VALIDATE and magic {:#x}",
                              name, q.u32, tcpstore::kValidationMagic));
      return false;
    }
    c->magic_seen = 1;
    return true;
  }
  if (c->scope != torch_serial_.load()) {
    endTorch(c, fmt::format("{} from a connection of a previous attempt of the job", name));
    return false;
  }
  KvSpace& kv = core_->kv;
  auto key = [&](size_t i) { return c->ns + q.keys.at(i); };
  auto keys = [&] {
    std::vector<std::string> all;
    all.reserve(q.keys.size());
    for (const auto& k : q.keys) all.push_back(c->ns + k);
    return all;
  };
  std::string out;
  try {
    switch (q.type) {
      case Query::kValidate:
        endTorch(c, "a second VALIDATE");
        return false;
      case Query::kPing:
        tcpstore::appendU32(out, q.u32);
        break;
      case Query::kSet:
        core_->checkValue(q.keys[0], q.values[0].size());
        kv.set(key(0), std::move(q.values[0]));
        return true;
      case Query::kCompareSet: {
        core_->checkValue(q.keys[0], q.values[1].size());
        Bytes now = kv.compareSet(key(0), q.values[0], std::move(q.values[1]));
        tcpstore::appendLength(out, now.size());
        out.append(reinterpret_cast<const char*>(now.data()), now.size());
        break;
      }
      case Query::kGet:
      case Query::kMultiGet:
        // torch's client waits for the keys first; a missing one reads as empty, as in torch's
        // own server.
        for (size_t i = 0; i < q.keys.size(); ++i) {
          KvSpace::Value v = kv.getShared(key(i));
          std::string len;
          tcpstore::appendLength(len, v ? v->size() : 0);
          replyTorch(c, std::move(len), std::move(v));
        }
        return true;
      case Query::kAdd:
        tcpstore::appendI64(out, kv.add(key(0), q.number));
        break;
      case Query::kCheck:
        tcpstore::appendU8(out, kv.check(keys()) ? tcpstore::kCheckReady
                                                 : tcpstore::kCheckNotReady);
        break;
      case Query::kWait:
        return parkTorch(c, keys(), "WAIT");
      case Query::kGetNumKeys:
        tcpstore::appendI64(out, kv.numKeys(c->ns));
        break;
      case Query::kDeleteKey:
        tcpstore::appendI64(out, kv.deleteKey(key(0)) ? 1 : 0);
        break;
      case Query::kAppend:
        kv.append(key(0), q.values[0], static_cast<size_t>(core_->cfg.max_value_bytes));
        return true;
      case Query::kMultiSet:
        for (size_t i = 0; i < q.keys.size(); ++i) core_->checkValue(q.keys[i], q.values[i].size());
        kv.multiSet(keys(), std::move(q.values));
        return true;
      case Query::kCancelWait:
        cancelTorchWaits(c);
        return true;
      case Query::kQueuePush:
        core_->checkValue(q.keys[0], q.values[0].size());
        kv.queuePush(key(0), std::move(q.values[0]));
        return true;
      case Query::kQueuePop: {
        KvSpace::Popped p = kv.queuePop(key(0));
        tcpstore::appendI64(out, p.length_before);
        if (p.value) {
          tcpstore::appendLength(out, p.value->size());
          replyTorch(c, std::move(out), std::move(p.value));
          return true;
        }
        break;
      }
      case Query::kQueueLen:
        tcpstore::appendI64(out, kv.queueLen(key(0)));
        break;
      case Query::kListKeys:
        return listKeysTorch(c);
      case Query::kBarrier:
        return barrierTorch(c, q);
    }
  } catch (const RpcError& e) {
    endTorch(c, fmt::format("{}: {}", name, e.message));
    return false;
  } catch (const std::exception& e) {
    // torch's own server ends the connection too (e.g. ADD on a value that is not a number).
    endTorch(c, fmt::format("{}: {}", name, e.what()));
    return false;
  }
  replyTorch(c, std::move(out));
  return true;
}

void WireServer::replyTorch(const ConnPtr& c, std::string bytes, KvSpace::Value value) {
  std::lock_guard<std::mutex> lock(c->mu);
  replyTorchLocked(*c, std::move(bytes), std::move(value));
}

void WireServer::replyTorchLocked(Conn& c, std::string bytes, KvSpace::Value value) {
  if (c.closed) return;
  int64_t before = c.outBytes();
  tailLocked(c) += bytes;
  c.out_bytes += static_cast<int64_t>(bytes.size());
  if (value && !value->empty()) {
    c.out_bytes += static_cast<int64_t>(value->size());
    c.out.back().value = std::move(value);
  }
  accountOutLocked(c, before);
  if (!c.batching && !c.want_write) flushLocked(c);
}

bool WireServer::listKeysTorch(const ConnPtr& c) {
  // Held to the size of the largest query (max_value_bytes + 1 MiB): a namespace may hold any
  // number of keys, and torch's client reads the answer whole. Past it there is no answer the
  // protocol could give but the end of the connection.
  uint64_t limit = torch_limits_.max_query_bytes;
  KvSpace::KeyList list = core_->kv.listKeys(c->ns, limit - kListHeaderBytes, kListPerKeyBytes);
  if (!list.complete) {
    endTorch(c, fmt::format("LIST_KEYS: the job's store holds {} keys, {} bytes as an answer; "
                            "an answer is at most {} bytes (max_value_bytes + 1 MiB)",
                            list.count, list.bytes + kListHeaderBytes, limit));
    return false;
  }
  std::string out;
  out.reserve(kListHeaderBytes + list.bytes);
  tcpstore::appendI64(out, list.count);
  for (const auto& k : list.keys) {
    tcpstore::appendLength(out, k.size());
    out += k;
  }
  replyTorch(c, std::move(out));
  return true;
}

bool WireServer::barrierTorch(const ConnPtr& c, const tcpstore::Request& q) {
  // torch's server: the count is the key's value plus one (a key that is no number ends the
  // connection), and an arrival that brings it to the world size or past releases everyone
  // (a world size of 1 or less at once; later arrivals too: a barrier's key is for one use).
  KvSpace& kv = core_->kv;
  const std::string counter = c->ns + q.keys[0];
  const std::string release = barriersNs(c->scope) + q.keys[0];
  int64_t count = kv.add(counter, 1);  // throws StoreError: handleTorch ends the connection
  // A count that starts again (a new key, or one deleted or set to 0 since) is a new barrier:
  // the release of the one before is not its.
  if (count == 1) kv.deleteKey(release);
  if (count >= q.number) {
    kv.set(release, {});  // wakes the arrivals parked on it
    replyTorch(c, oneByte(tcpstore::kStopWaiting));
    return true;
  }
  return parkTorch(c, {release}, "BARRIER");
}

bool WireServer::parkTorch(const ConnPtr& c, std::vector<std::string> keys, const char* op) {
  try {
    core_->admitPark();
  } catch (const RpcError& e) {
    endTorch(c, fmt::format("{}: {}", op, e.message));
    return false;
  }
  ops::Park park;
  park.keys = std::move(keys);
  park.op = op;
  uint64_t slot;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    slot = c->next_slot++;
  }
  // torch's client keeps its own deadline and cancels (CANCEL_WAIT); the server's bound is
  // its max wait, past which the connection ends (the protocol has no error to send).
  auto parked = std::make_shared<ParkedOp>(
      core_, std::move(park), core_->cfg.max_wait,
      [this, c, slot, op](const grpc::Status& st, KvSpace::Values&) {
        std::lock_guard<std::mutex> lock(c->mu);
        if (st.ok()) {
          replyTorchLocked(*c, oneByte(tcpstore::kStopWaiting));
        } else if (st.error_code() == grpc::DEADLINE_EXCEEDED && !c->closed) {
          log::warn(
              "[{}] torch TCPStore client {}: a {} parked longer than this server's "
              "max wait ({}); connection closed",
              core_->cfg.log_name, c->peer, op, describe(core_->cfg.max_wait));
          ::shutdown(c->fd, SHUT_RDWR);  // the loop closes it
        }
        c->parked.erase(slot);
        if (c->cancel_pending && c->parked.empty()) {
          // After the wait's own answer, as torch's client expects.
          c->cancel_pending = false;
          replyTorchLocked(*c, oneByte(tcpstore::kWaitCanceled));
        }
        maybeResumeLocked(*c);
      });
  startParked(c, slot, std::move(parked));
  return true;
}

void WireServer::cancelTorchWaits(const ConnPtr& c) {
  std::vector<std::shared_ptr<ParkedOp>> ops;
  {
    std::lock_guard<std::mutex> lock(c->mu);
    for (auto& [slot, op] : c->parked) ops.push_back(op);
  }
  for (auto& op : ops) op->cancel();
  std::lock_guard<std::mutex> lock(c->mu);
  // A wait being answered on another thread still holds its place: WAIT_CANCELED follows its
  // STOP_WAITING (parkTorch's callback writes it).
  if (c->parked.empty())
    replyTorchLocked(*c, oneByte(tcpstore::kWaitCanceled));
  else
    c->cancel_pending = true;
}

void WireServer::endTorch(const ConnPtr& c, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    ++stats_.torch_errors;
  }
  warnTorch(fmt::format("torch TCPStore client {}: {}; connection closed", c->peer, why));
  close(c);
}

void WireServer::warnTorch(const std::string& what) {
  int64_t skipped = 0;
  if (!torch_warnings_.admit(&skipped)) return;
  if (skipped > 0)
    log::warn("[{}] ({} more torch TCPStore refusals or errors in the last 10s)",
              core_->cfg.log_name, skipped);
  log::warn("[{}] {}", core_->cfg.log_name, what);
}

}  // namespace ddpl::rdzv::grpc_detail
