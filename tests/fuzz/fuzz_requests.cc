// libFuzzer target: the server's request handling without sockets. The input is a sequence of
// records, each a kind byte, a 2-byte length and that many bytes of a serialized request:
// StoreRequest (every store operation, through the same visitStoreOp/ops:: path as both
// server dispatchers), JoinRequest/HeartbeatRequest/LeaveRequest (through joinSpecFromWire and
// the RendezvousState the service drives), a watch stream breaking, or the clock moving on.
// Parked gets and waits are registered in KvSpace and cancelled at the end, as a client going
// away would. Anything thrown other than the errors the service maps to a status is a finding;
// so is any sanitizer report.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

#include "common/errors.h"
#include "rendezvous/protocol/store_ops.h"
#include "rendezvous/server/service_core.h"

using namespace ddpl;
using namespace ddpl::rdzv;
using namespace ddpl::rdzv::grpc_detail;

namespace {

enum Kind : uint8_t { kStore, kJoin, kHeartbeat, kLeave, kWatchBroke, kAdvance, kKinds };

ServiceConfig config() {
  ServiceConfig c;
  c.max_value_bytes = 4096;
  c.run_retention = std::chrono::seconds(5);
  c.heartbeat_window = std::chrono::seconds(3);
  c.stats_interval = Duration(0);
  return c;
}

void runStore(Core& core, const pb::StoreRequest& req, std::vector<KvSpace::WaitId>& parked) {
  pb::StoreResponse resp;
  grpc::Status s;
  visitStoreOp(req.op_case(), [&](auto op) {
    using Op = decltype(op);
    if constexpr (Op::kKind == OpKind::kImmediate) {
      s = core.run([&] { ops::apply(core, Op::request(req), Op::response(resp)); });
    } else {
      s = core.run([&] {
        ops::Park p = ops::park(Op::request(req));
        core.waitTimeout(p.timeout_ms);
        // Answered later by a set of this input (on this thread), as a parked op would be.
        auto st = core.kv.waitFor(p.keys, p.want_values, [](std::vector<Bytes> v) {
          pb::StoreResponse r;
          ops::fill(Op::response(r), v);
        });
        if (st.ready)
          ops::fill(Op::response(resp), st.values);
        else
          parked.push_back(st.id);
      });
    }
  });
  // The codes a Session stream would send back.
  if (!s.ok() && s.error_code() != grpc::INVALID_ARGUMENT &&
      s.error_code() != grpc::FAILED_PRECONDITION && s.error_code() != grpc::RESOURCE_EXHAUSTED)
    __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // A fresh Core (key space) and state machine per input, so that inputs replay alike.
  auto core = std::make_unique<Core>(config());
  RendezvousState state(RendezvousStateOptions{std::chrono::seconds(3), std::chrono::seconds(5)});
  TimePoint now = TimePoint{} + std::chrono::hours(1);
  std::vector<KvSpace::WaitId> parked;
  Effects fx;
  size_t pos = 0;
  while (pos + 3 <= size) {
    uint8_t kind = data[pos] % kKinds;
    size_t len = static_cast<size_t>(data[pos + 1]) | static_cast<size_t>(data[pos + 2]) << 8;
    pos += 3;
    len = std::min(len, size - pos);
    const uint8_t* raw = data + pos;
    const auto* body = reinterpret_cast<const char*>(raw);
    pos += len;
    switch (kind) {
      case kStore: {
        pb::StoreRequest req;
        if (!req.ParseFromArray(body, static_cast<int>(len))) break;
        runStore(*core, req, parked);
        break;
      }
      case kJoin: {
        pb::JoinRequest req;
        if (!req.ParseFromArray(body, static_cast<int>(len))) break;
        JoinSpec spec;
        if (joinSpecFromWire(req, &spec).ok()) state.join(spec, now, fx);
        break;
      }
      case kHeartbeat: {
        pb::HeartbeatRequest req;
        if (!req.ParseFromArray(body, static_cast<int>(len))) break;
        state.heartbeat(req.run_id(), req.node_id(), req.round(), now);
        break;
      }
      case kLeave: {
        pb::LeaveRequest req;
        if (!req.ParseFromArray(body, static_cast<int>(len))) break;
        state.leave(req.run_id(), req.node_id(), now, fx);
        break;
      }
      case kWatchBroke: {
        pb::WatchRequest req;
        if (!req.ParseFromArray(body, static_cast<int>(len))) break;
        if (state.checkMember(req.run_id(), req.node_id(), req.round()).ok())
          state.nodeLost(req.run_id(), req.node_id(), req.round(), "fuzz", now, fx);
        break;
      }
      case kAdvance: {
        uint16_t ms = 0;
        if (len >= 2) ms = static_cast<uint16_t>(raw[0] | raw[1] << 8);
        now += Duration(ms);
        state.tick(now, fx);
        break;
      }
    }
    // Invariants of every completed round: ranks and world sizes as the service sends them.
    for (const auto& o : fx.joins) {
      if (!o.status.ok()) continue;
      const auto& m = *o.round;
      if (m.world_size < static_cast<int32_t>(m.nodes.size()) || o.group_rank < 0 ||
          o.group_rank >= static_cast<int32_t>(m.nodes.size()))
        __builtin_trap();
      if (m.rank_offsets[o.group_rank] < 0) __builtin_trap();
    }
    fx = Effects{};
    if (auto next = state.nextDeadline(); next && *next < now) __builtin_trap();
  }
  for (auto id : parked) core->kv.cancelWait(id);
  return 0;
}
