// The floor of a store round trip over gRPC on this machine, whatever the store does: a
// Store.Session stream whose server answers every request at once with a constant (no map,
// no lock, no parking), measured with three server designs and a client that drives its own
// completion queue (gRPC's synchronous client API plucks its call's events on the calling
// thread: no hand-off on the client side at all).
//
//   grpc_floor_bench [--server callback|sync|async] [--clients 1] [--ops 20000]
//                    [--connection own|shared]
//
// callback: the callback API, as rendezvous/server/store_session.cc uses it (every reaction of a
//           stream runs on a gRPC callback thread: gRPC 1.51 never runs them inline).
// sync:     the synchronous API: one thread per stream blocks in Read and Write.
// async:    the completion-queue API with two polling threads, handling each event inline.
// Each client thread has its own channel and stream (by default its own connection too, as
// separate processes would) and runs ops round trips, one at a time.
#include <grpcpp/grpcpp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "proto/rendezvous.grpc.pb.h"

namespace pb = ::ddpl::rendezvous::v1;
using Clock = std::chrono::steady_clock;

namespace {

void answer(const pb::StoreRequest& req, pb::StoreResponse* resp) {
  resp->Clear();
  resp->set_id(req.id());
  resp->mutable_add()->set_value(static_cast<int64_t>(req.id()));
}

class SyncService final : public pb::Store::Service {
  grpc::Status Session(grpc::ServerContext*,
                       grpc::ServerReaderWriter<pb::StoreResponse, pb::StoreRequest>* s) override {
    pb::StoreRequest req;
    pb::StoreResponse resp;
    while (s->Read(&req)) {
      answer(req, &resp);
      if (!s->Write(resp)) break;
    }
    return grpc::Status::OK;
  }
};

class CallbackService final : public pb::Store::CallbackService {
  class Reactor : public grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse> {
   public:
    Reactor() { StartRead(&req_); }
    void OnReadDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::OK);
      answer(req_, &resp_);
      StartWrite(&resp_);
    }
    void OnWriteDone(bool ok) override {
      if (!ok) return Finish(grpc::Status::OK);
      StartRead(&req_);
    }
    void OnDone() override { delete this; }

   private:
    pb::StoreRequest req_;
    pb::StoreResponse resp_;
  };
  grpc::ServerBidiReactor<pb::StoreRequest, pb::StoreResponse>* Session(
      grpc::CallbackServerContext*) override {
    return new Reactor();
  }
};

// One call's state machine on the completion queue: accept, then read, write, read...
class AsyncCall {
 public:
  AsyncCall(pb::Store::AsyncService* svc, grpc::ServerCompletionQueue* cq)
      : svc_(svc), cq_(cq), stream_(&ctx_) {
    svc_->RequestSession(&ctx_, &stream_, cq_, cq_, this);
  }
  void proceed(bool ok) {
    if (state_ == kFinishing) return delete this;
    if (state_ == kAccepting) {
      if (!ok) return delete this;  // the server is shutting down
      new AsyncCall(svc_, cq_);
    } else if (!ok) {  // the client closed its side, or the stream broke
      state_ = kFinishing;
      stream_.Finish(grpc::Status::OK, this);
      return;
    } else if (state_ == kReading) {
      answer(req_, &resp_);
      state_ = kWriting;
      stream_.Write(resp_, this);
      return;
    }
    state_ = kReading;  // accepted, or the answer written: read the next request
    stream_.Read(&req_, this);
  }

 private:
  enum State { kAccepting, kReading, kWriting, kFinishing };
  pb::Store::AsyncService* svc_;
  grpc::ServerCompletionQueue* cq_;
  grpc::ServerContext ctx_;
  grpc::ServerAsyncReaderWriter<pb::StoreResponse, pb::StoreRequest> stream_;
  pb::StoreRequest req_;
  pb::StoreResponse resp_;
  State state_ = kAccepting;
};

}  // namespace

int main(int argc, char** argv) {
  std::string mode = "callback";
  int clients = 1;
  int ops = 20000;
  bool shared = false;
  for (int i = 1; i + 1 < argc; i += 2) {
    std::string a = argv[i], v = argv[i + 1];
    if (a == "--server" && (v == "callback" || v == "sync" || v == "async")) {
      mode = v;
    } else if (a == "--clients") {
      clients = std::clamp(std::atoi(v.c_str()), 1, 1024);
    } else if (a == "--connection" && (v == "own" || v == "shared")) {
      shared = v == "shared";
    } else if (a == "--ops") {
      ops = std::clamp(std::atoi(v.c_str()), 1, 10000000);
    } else {
      std::fprintf(stderr,
                   "usage: grpc_floor_bench [--server callback|sync|async] [--clients N] "
                   "[--ops N] [--connection own|shared]\n");
      return 2;
    }
  }
  SyncService sync_svc;
  CallbackService cb_svc;
  pb::Store::AsyncService async_svc;
  grpc::ServerBuilder b;
  int port = 0;
  b.AddListeningPort("127.0.0.1:0", grpc::InsecureServerCredentials(), &port);
  std::vector<std::unique_ptr<grpc::ServerCompletionQueue>> cqs;
  if (mode == "sync") b.RegisterService(&sync_svc);
  if (mode == "callback") b.RegisterService(&cb_svc);
  if (mode == "async") {
    b.RegisterService(&async_svc);
    for (int i = 0; i < 2; ++i) cqs.push_back(b.AddCompletionQueue());
  }
  auto server = b.BuildAndStart();
  if (!server || port == 0) {
    std::fprintf(stderr, "grpc_floor_bench: the server did not start\n");
    return 1;
  }
  std::vector<std::thread> pollers;
  for (auto& cq : cqs) {
    new AsyncCall(&async_svc, cq.get());
    pollers.emplace_back([q = cq.get()] {
      void* tag;
      bool ok;
      while (q->Next(&tag, &ok)) static_cast<AsyncCall*>(tag)->proceed(ok);
    });
  }

  std::string target = "127.0.0.1:" + std::to_string(port);
  std::vector<std::vector<double>> lat(static_cast<size_t>(clients));
  std::atomic<int> ready{0};
  std::atomic<bool> go{false}, failed{false};
  std::vector<std::thread> threads;
  for (int c = 0; c < clients; ++c) {
    threads.emplace_back([&, c] {
      grpc::ChannelArguments args;
      // A connection of its own, as separate processes would have; `shared`: every client's
      // streams on one connection, as channels to one target within a process are by default.
      if (!shared) args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
      auto stub = pb::Store::NewStub(
          grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args));
      grpc::ClientContext ctx;
      ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::minutes(10));
      auto stream = stub->Session(&ctx);
      pb::StoreRequest req;
      pb::StoreResponse resp;
      auto& out = lat[static_cast<size_t>(c)];
      out.reserve(static_cast<size_t>(ops));
      // One warm-up round trip opens the connection before the clock starts.
      req.set_id(0);
      req.mutable_add()->set_key("n");
      req.mutable_add()->set_delta(1);
      if (!stream->Write(req) || !stream->Read(&resp)) failed = true;
      ++ready;
      while (!go) std::this_thread::yield();
      for (int i = 1; i <= ops && !failed; ++i) {
        auto t = Clock::now();
        req.set_id(static_cast<uint64_t>(i));
        if (!stream->Write(req) || !stream->Read(&resp) || resp.id() != req.id()) {
          failed = true;
          break;
        }
        out.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t).count());
      }
      stream->WritesDone();
      stream->Finish();
    });
  }
  while (ready < clients) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  auto t0 = Clock::now();
  go = true;
  for (auto& t : threads) t.join();
  double secs = std::chrono::duration<double>(Clock::now() - t0).count();
  server->Shutdown(std::chrono::system_clock::now() + std::chrono::seconds(5));
  for (auto& cq : cqs) cq->Shutdown();
  for (auto& p : pollers) p.join();
  if (failed) {
    std::fprintf(stderr, "grpc_floor_bench: a round trip failed\n");
    return 1;
  }
  std::vector<double> all;
  for (auto& l : lat) all.insert(all.end(), l.begin(), l.end());
  std::sort(all.begin(), all.end());
  auto pct = [&](double q) {
    return all[std::min(all.size() - 1, static_cast<size_t>(q * static_cast<double>(all.size())))];
  };
  std::printf(
      "impl=grpc-floor server=%s connection=%s clients=%d ops=%zu secs=%.3f ops_per_s=%.0f "
      "p50_us=%.1f "
      "p99_us=%.1f\n",
      mode.c_str(), shared ? "shared" : "own", clients, all.size(), secs,
      static_cast<double>(all.size()) / secs, pct(0.5), pct(0.99));
  return 0;
}
