// The Store service's unary calls, one per operation of store_ops.h, and the entry point of
// its Session stream (store_session.cc).
//
// Threads: each handler runs on the gRPC callback thread that received the call. A parked
// call (ParkedCall) then finishes on whichever thread decides it (see ParkedOp) and is
// deleted on the gRPC thread that runs OnDone, or at the end of start(), whichever is last.
#include "rendezvous/protocol/store_ops.h"
#include "rendezvous/server/service_core.h"

namespace ddpl::rdzv::grpc_detail {

namespace {

// A unary get, wait or multiGet that parked. Deleted when both gRPC is done with it and
// start() has returned.
class ParkedCall : public grpc::ServerUnaryReactor {
 public:
  template <typename Resp>
  ParkedCall(Core* core, grpc::CallbackServerContext* ctx, ops::Park park, Duration timeout,
             Resp* resp, std::string peer, std::shared_ptr<Core::ConnectionUse> connection)
      : core_(core),
        ctx_(ctx),
        peer_(std::move(peer)),
        connection_(std::move(connection)),
        op_(std::make_shared<ParkedOp>(
            core, std::move(park), timeout,
            [this, resp](const grpc::Status& s, KvSpace::Values& values) {
              if (s.ok()) ops::fill(resp, values);
              Finish(s);
            })) {}

  void start() {
    op_->start();
    if (ctx_->IsCancelled()) op_->cancel();
    unref();
  }

  void OnCancel() override { op_->cancel(); }
  void OnDone() override { unref(); }

 private:
  void unref() {
    if (--refs_ != 0) return;
    core_->closeSession(peer_, connection_);
    // What its call held goes back to the system with the others' (a client that parked
    // thousands and left: issue 33).
    core_->released(Core::kStreamOverheadBytes);
    delete this;
  }

  Core* core_;
  grpc::CallbackServerContext* ctx_;
  std::string peer_;
  std::shared_ptr<Core::ConnectionUse> connection_;  // this call counts in its connection's
  std::shared_ptr<ParkedOp> op_;
  std::atomic<int> refs_{2};  // gRPC (until OnDone) and start()
};

class StoreService final : public pb::Store::CallbackService {
 public:
  explicit StoreService(Core* core) : core_(core) {}

  // One line each: the work is in call<Op>, shared through the operation list.
  grpc::ServerUnaryReactor* Ping(grpc::CallbackServerContext* ctx, const pb::PingRequest* req,
                                 pb::PingResponse* resp) override {
    return call<PingOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* Set(grpc::CallbackServerContext* ctx, const pb::SetRequest* req,
                                pb::SetResponse* resp) override {
    return call<SetOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* Get(grpc::CallbackServerContext* ctx, const pb::GetRequest* req,
                                pb::GetResponse* resp) override {
    return call<GetOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* Add(grpc::CallbackServerContext* ctx, const pb::AddRequest* req,
                                pb::AddResponse* resp) override {
    return call<AddOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* CompareSet(grpc::CallbackServerContext* ctx,
                                       const pb::CompareSetRequest* req,
                                       pb::CompareSetResponse* resp) override {
    return call<CompareSetOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* Check(grpc::CallbackServerContext* ctx, const pb::CheckRequest* req,
                                  pb::CheckResponse* resp) override {
    return call<CheckOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* Wait(grpc::CallbackServerContext* ctx, const pb::WaitRequest* req,
                                 pb::WaitResponse* resp) override {
    return call<WaitOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* DeleteKey(grpc::CallbackServerContext* ctx,
                                      const pb::DeleteKeyRequest* req,
                                      pb::DeleteKeyResponse* resp) override {
    return call<DeleteKeyOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* NumKeys(grpc::CallbackServerContext* ctx, const pb::NumKeysRequest* req,
                                    pb::NumKeysResponse* resp) override {
    return call<NumKeysOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* MultiGet(grpc::CallbackServerContext* ctx,
                                     const pb::MultiGetRequest* req,
                                     pb::MultiGetResponse* resp) override {
    return call<MultiGetOp>(ctx, req, resp);
  }
  grpc::ServerUnaryReactor* MultiSet(grpc::CallbackServerContext* ctx,
                                     const pb::MultiSetRequest* req,
                                     pb::MultiSetResponse* resp) override {
    return call<MultiSetOp>(ctx, req, resp);
  }

  grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse>* Session(
      grpc::CallbackServerContext* ctx) override {
    return newStoreSession(core_, ctx);
  }

 private:
  template <typename Op>
  grpc::ServerUnaryReactor* call(grpc::CallbackServerContext* ctx, const typename Op::Request* req,
                                 typename Op::Response* resp) {
    if constexpr (Op::kKind == OpKind::kImmediate) {
      return core_->unary(ctx, [&] { ops::apply(*core_, *req, resp); });
    } else {
      ops::Park p = ops::park(*req);
      Duration timeout{};
      grpc::Status s = core_->guard(ctx, [&] {
        timeout = core_->waitTimeout(p.timeout_ms);
        core_->admitPark();
      });
      // A parked call pins gRPC's call state: it counts against its connection's limit of
      // long-lived calls, as a Session stream does (issue 33).
      std::string peer = ctx->peer();
      std::shared_ptr<Core::ConnectionUse> connection;
      if (s.ok()) connection = core_->admitLongCall(peer, "a parked call", &s);
      if (!s.ok()) {
        auto* r = ctx->DefaultReactor();
        r->Finish(s);
        return r;
      }
      auto* c = new ParkedCall(core_, ctx, std::move(p), timeout, resp, std::move(peer),
                               std::move(connection));
      c->start();
      return c;
    }
  }

  Core* core_;
};

}  // namespace

std::unique_ptr<grpc::Service> makeStoreService(Core* core) {
  return std::make_unique<StoreService>(core);
}

}  // namespace ddpl::rdzv::grpc_detail
