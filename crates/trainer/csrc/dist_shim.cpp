// The c10d shim: libtorch's real distributed engine (TCPStore, ProcessGroupGloo, optionally
// ProcessGroupNCCL) behind a handful of `extern "C"` functions for src/dist.rs.
//
// What crosses: one `LssaDistInit` struct (strings, rank, size, timeout, Gloo device choice) to
// create a process group; an opaque `LssaDistPg*` handle afterwards; one `at::Tensor*` per
// collective (tch's `Tensor::as_ptr()`: tch's tensors are heap `at::Tensor`s), which the collective
// reads and writes in place. Scalars only otherwise.
//
// Memory: the handle is `new`ed here and released by `lssa_dist_free` (Rust's Drop). Tensors stay
// owned by tch; the shim copies the `at::Tensor` handle (a reference count) for the duration of one
// call and waits for the work to finish before returning, so nothing refers to Rust-owned memory
// afterwards.
//
// Errors: every function that can fail returns NULL on success or a `malloc`ed message (released
// with `lssa_dist_free_error`). Every C++ exception is caught here; none crosses into Rust. For
// `c10::Error` the message is `what_without_backtrace()`, so the Rust error stays one line.
//
// Timeouts: the Gloo context (connect, send, receive) and every `Work::wait` use the timeout given at
// creation; the TCPStore uses it for connecting and for key waits. A peer that dies closes its
// sockets, which Gloo reports at once; a peer that hangs is reported after the timeout.
//
// Build: see ../build.rs (flags from torch-build's cpp_settings, -DUSE_C10D_GLOO, the declaration
// headers in gloo-decl/, and -DUSE_C10D_NCCL -DUSE_CUDA -DLSSA_DIST_NCCL when the CUDA and NCCL
// headers are present).

#include <c10/util/Exception.h>
#include <lssa_ffi_guard.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#ifdef LSSA_DIST_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

extern "C" {

// Mirrored by `ffi::Init` in src/dist.rs (#[repr(C)]; its size is compared on first use).
struct LssaDistInit {
  const char* master_addr;  // TCPStore host
  const char* store_prefix;  // key prefix on the TCPStore ("" or torchrun's "/worker/attempt_N")
  const char* gloo_device_arg;  // hostname or interface for gloo_device_kind 1 and 2
  int64_t timeout_ms;
  int32_t rank;
  int32_t world_size;
  int32_t host_store;  // 1: this rank runs the TCPStore server (rank 0 unless torchrun hosts it)
  int32_t gloo_device_kind;  // 0: createDefaultDevice, 1: createDeviceForHostname, 2: ForInterface
  uint16_t master_port;
};

struct LssaDistPg;

size_t lssa_dist_init_size(void);
int32_t lssa_dist_has_nccl(void);
char* lssa_dist_new(const LssaDistInit* init, LssaDistPg** out);
void lssa_dist_free(LssaDistPg* pg);
char* lssa_dist_broadcast(LssaDistPg* pg, const void* tensor, int32_t root);
char* lssa_dist_all_reduce_sum(LssaDistPg* pg, const void* tensor);
char* lssa_dist_barrier(LssaDistPg* pg);
void lssa_dist_free_error(char* msg);

}  // extern "C"

struct LssaDistPg {
  c10::intrusive_ptr<c10d::Store> store;  // the TCPStore under torchrun's prefix, if any
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
  std::chrono::milliseconds timeout;
  int rank;
  int size;
#ifdef LSSA_DIST_NCCL
  std::mutex nccl_mutex;
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;  // created by the first CUDA collective
#endif
};

namespace {

using lssa_ffi::guarded;

// The backend that owns `t`'s device: Gloo for CPU tensors, NCCL (created on first use, at the same
// point on every rank because collectives run in the same order everywhere) for CUDA tensors.
c10::intrusive_ptr<c10d::Backend> backend_for(LssaDistPg* pg, const at::Tensor& t) {
  if (!t.is_cuda()) return pg->gloo;
#ifdef LSSA_DIST_NCCL
  std::lock_guard<std::mutex> lock(pg->nccl_mutex);
  if (!pg->nccl) {
    auto opts = c10d::ProcessGroupNCCL::Options::create();
    opts->timeout = pg->timeout;
    auto store = c10::make_intrusive<c10d::PrefixStore>("lssa_pg/nccl", pg->store);
    pg->nccl = c10::make_intrusive<c10d::ProcessGroupNCCL>(store, pg->rank, pg->size, opts);
  }
  return pg->nccl;
#else
  TORCH_CHECK(false, "built without NCCL: a CUDA tensor needs the c10d shim compiled with the CUDA and "
              "NCCL headers (see crates/trainer/build.rs)");
#endif
}

void wait(const c10::intrusive_ptr<c10d::Work>& work, std::chrono::milliseconds timeout) {
  work->wait(timeout);
}

}  // namespace

extern "C" {

size_t lssa_dist_init_size(void) { return sizeof(LssaDistInit); }

int32_t lssa_dist_has_nccl(void) {
#ifdef LSSA_DIST_NCCL
  return 1;
#else
  return 0;
#endif
}

char* lssa_dist_new(const LssaDistInit* init, LssaDistPg** out) {
  *out = nullptr;
  return guarded([&] {
    auto pg = std::make_unique<LssaDistPg>();
    pg->timeout = std::chrono::milliseconds(init->timeout_ms);
    pg->rank = init->rank;
    pg->size = init->world_size;

    c10d::TCPStoreOptions store_opts;
    store_opts.port = init->master_port;
    store_opts.isServer = init->host_store != 0;
    store_opts.numWorkers = static_cast<size_t>(init->world_size);
    // As torch.distributed does: every rank counts itself in; the server waits for all of them.
    store_opts.waitWorkers = true;
    store_opts.timeout = pg->timeout;
    c10::intrusive_ptr<c10d::Store> store =
        c10::make_intrusive<c10d::TCPStore>(std::string(init->master_addr), store_opts);
    if (init->store_prefix[0] != '\0') {
      store = c10::make_intrusive<c10d::PrefixStore>(std::string(init->store_prefix), store);
    }
    pg->store = store;

    auto opts = c10d::ProcessGroupGloo::Options::create(pg->timeout);
    switch (init->gloo_device_kind) {
      case 1:
        opts->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForHostname(init->gloo_device_arg));
        break;
      case 2:
        opts->devices.push_back(
            c10d::ProcessGroupGloo::createDeviceForInterface(init->gloo_device_arg));
        break;
      default:
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
    }
    auto gloo_store = c10::make_intrusive<c10d::PrefixStore>("lssa_pg/gloo", store);
    pg->gloo = c10::make_intrusive<c10d::ProcessGroupGloo>(gloo_store, pg->rank, pg->size, opts);
    *out = pg.release();
  });
}

void lssa_dist_free(LssaDistPg* pg) {
  if (pg == nullptr) return;
  try {
#ifdef LSSA_DIST_NCCL
    if (pg->nccl) pg->nccl->shutdown();
#endif
    delete pg;
  } catch (...) {
    // Nothing sensible to report from a destructor; the process is usually exiting.
  }
}

char* lssa_dist_broadcast(LssaDistPg* pg, const void* tensor, int32_t root) {
  return guarded([&] {
    std::vector<at::Tensor> tensors{*static_cast<const at::Tensor*>(tensor)};
    c10d::BroadcastOptions opts;
    opts.rootRank = root;
    opts.timeout = pg->timeout;
    wait(backend_for(pg, tensors[0])->broadcast(tensors, opts), pg->timeout);
  });
}

char* lssa_dist_all_reduce_sum(LssaDistPg* pg, const void* tensor) {
  return guarded([&] {
    std::vector<at::Tensor> tensors{*static_cast<const at::Tensor*>(tensor)};
    c10d::AllreduceOptions opts;
    opts.reduceOp = c10d::ReduceOp::SUM;
    opts.timeout = pg->timeout;
    wait(backend_for(pg, tensors[0])->allreduce(tensors, opts), pg->timeout);
  });
}

char* lssa_dist_barrier(LssaDistPg* pg) {
  return guarded([&] {
    c10d::BarrierOptions opts;
    opts.timeout = pg->timeout;
    wait(pg->gloo->barrier(opts), pg->timeout);
  });
}

void lssa_dist_free_error(char* msg) { std::free(msg); }

}  // extern "C"
