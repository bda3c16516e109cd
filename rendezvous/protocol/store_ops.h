#pragma once
// Internal to the gRPC layer: the one list of store operations. The server's two dispatchers
// (the unary StoreService and the Session stream) and the client's unary fallback all reach an
// operation through visitStoreOp(), so an operation added to StoreRequest's oneof and to this
// list is served and sent everywhere at once; one added to the proto but not here fails to
// compile where -Wswitch is on and fails store_ops_test (which walks the proto's descriptors).
#include "proto/rendezvous.grpc.pb.h"

namespace ddpl::rdzv::grpc_detail {

namespace pb = ::ddpl::rendezvous::v1;

// How the server answers an operation: at once, or parked until its keys exist (get, wait,
// multiGet), with a timeout.
enum class OpKind { kImmediate, kParked };

// One entry of the list: the oneof case, the request and response messages, where they sit
// in StoreRequest / StoreResponse, the unary RPC the client falls back to, and how it runs.
template <pb::StoreRequest::OpCase Case, typename Req, typename Resp,
          const Req& (pb::StoreRequest::*Get)() const, Resp* (pb::StoreResponse::*Mut)(), auto Stub,
          OpKind Kind>
struct StoreOp {
  using Request = Req;
  using Response = Resp;
  static constexpr pb::StoreRequest::OpCase kCase = Case;
  static constexpr OpKind kKind = Kind;
  static constexpr auto kStubMethod = Stub;
  static const Req& request(const pb::StoreRequest& r) { return (r.*Get)(); }
  static Resp* response(pb::StoreResponse& r) { return (r.*Mut)(); }
};

namespace op_list {
using S = pb::Store::Stub;
using R = pb::StoreRequest;
using A = pb::StoreResponse;
using PingOp = StoreOp<R::kPing, pb::PingRequest, pb::PingResponse, &R::ping, &A::mutable_ping,
                       &S::Ping, OpKind::kImmediate>;
using SetOp = StoreOp<R::kSet, pb::SetRequest, pb::SetResponse, &R::set, &A::mutable_set, &S::Set,
                      OpKind::kImmediate>;
using GetOp = StoreOp<R::kGet, pb::GetRequest, pb::GetResponse, &R::get, &A::mutable_get, &S::Get,
                      OpKind::kParked>;
using AddOp = StoreOp<R::kAdd, pb::AddRequest, pb::AddResponse, &R::add, &A::mutable_add, &S::Add,
                      OpKind::kImmediate>;
using CompareSetOp =
    StoreOp<R::kCompareSet, pb::CompareSetRequest, pb::CompareSetResponse, &R::compare_set,
            &A::mutable_compare_set, &S::CompareSet, OpKind::kImmediate>;
using CheckOp = StoreOp<R::kCheck, pb::CheckRequest, pb::CheckResponse, &R::check,
                        &A::mutable_check, &S::Check, OpKind::kImmediate>;
using WaitOp = StoreOp<R::kWait, pb::WaitRequest, pb::WaitResponse, &R::wait, &A::mutable_wait,
                       &S::Wait, OpKind::kParked>;
using DeleteKeyOp =
    StoreOp<R::kDeleteKey, pb::DeleteKeyRequest, pb::DeleteKeyResponse, &R::delete_key,
            &A::mutable_delete_key, &S::DeleteKey, OpKind::kImmediate>;
using NumKeysOp = StoreOp<R::kNumKeys, pb::NumKeysRequest, pb::NumKeysResponse, &R::num_keys,
                          &A::mutable_num_keys, &S::NumKeys, OpKind::kImmediate>;
using MultiGetOp = StoreOp<R::kMultiGet, pb::MultiGetRequest, pb::MultiGetResponse, &R::multi_get,
                           &A::mutable_multi_get, &S::MultiGet, OpKind::kParked>;
using MultiSetOp = StoreOp<R::kMultiSet, pb::MultiSetRequest, pb::MultiSetResponse, &R::multi_set,
                           &A::mutable_multi_set, &S::MultiSet, OpKind::kImmediate>;
}  // namespace op_list
using op_list::AddOp, op_list::CheckOp, op_list::CompareSetOp, op_list::DeleteKeyOp, op_list::GetOp,
    op_list::MultiGetOp, op_list::MultiSetOp, op_list::NumKeysOp, op_list::PingOp, op_list::SetOp,
    op_list::WaitOp;

// Calls f(XxxOp{}) for the operation `c` names and returns true; false for OP_NOT_SET (or a
// case this build does not know). No default label: -Wswitch names a case left out.
template <typename F>
bool visitStoreOp(pb::StoreRequest::OpCase c, F&& f) {
  using R = pb::StoreRequest;
  switch (c) {
    case R::kPing:
      f(PingOp{});
      return true;
    case R::kSet:
      f(SetOp{});
      return true;
    case R::kGet:
      f(GetOp{});
      return true;
    case R::kAdd:
      f(AddOp{});
      return true;
    case R::kCompareSet:
      f(CompareSetOp{});
      return true;
    case R::kCheck:
      f(CheckOp{});
      return true;
    case R::kWait:
      f(WaitOp{});
      return true;
    case R::kDeleteKey:
      f(DeleteKeyOp{});
      return true;
    case R::kNumKeys:
      f(NumKeysOp{});
      return true;
    case R::kMultiGet:
      f(MultiGetOp{});
      return true;
    case R::kMultiSet:
      f(MultiSetOp{});
      return true;
    case R::OP_NOT_SET:
      return false;
  }
  return false;
}

}  // namespace ddpl::rdzv::grpc_detail
