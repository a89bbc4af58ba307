// A CPU emulator of the CUDA subset that attn-kernels' kernel sources use, so that the kernels'
// logic (fragment layouts, pipelines, masking, reductions, barriers) is tested on machines with no
// GPU. Prepended to the same concatenated source NVRTC compiles, with LSSA_EMU defined; built by
// the host C++ compiler into a shared library (src/cuda/emu.rs). Slow (about a million times slower
// than the GPU), exact in what it checks, meant for tests at small sizes.
//
// Model: a launch runs its blocks one after another. Every thread of a block is a fiber on one OS
// thread (an x86-64 stack switch of our own, ucontext elsewhere), and a deterministic scheduler
// runs each fiber until it reaches a barrier:
//   __syncthreads          all live threads of the block (exited threads count as arrived);
//   warp collectives       all 32 lanes of the warp at the same collective (shfl, mma.sync, ldmatrix);
//                          a lane that exited or waits elsewhere is reported as a deadlock, as a
//                          divergent __shfl_sync would hang or misbehave on the GPU;
//   warpgroup collectives  all 128 threads of the warpgroup (wgmma.fence, wgmma.mma_async, its
//                          commit and wait), likewise.
// __shared__ variables are function statics (one block runs at a time); the dynamic shared memory is
// refilled with a NaN pattern before every block, so reading bytes no one wrote shows up as NaN.
// cp.async copies are queued per thread and land only at the cp.async.wait_group that waits for
// their group, so reading a stage before waiting for it reads stale data, as it may on the GPU.
// ldmatrix and cp.async check the 16-byte alignment the hardware requires. wgmma.mma_async is
// asynchronous on the GPU: it may read its operands and write its accumulators at any time between
// its issue and the wgmma.wait_group that covers it. The emulator computes it at the wait and
// rejects every program whose result could depend on that timing (see "Warpgroup collectives"
// below): accumulators in flight hold a poison NaN and must not be written; registers a wgmma reads
// must not be written after the thread's last wgmma.fence; shared memory it reads must not change
// before its wait and must have been fenced (fence.proxy.async) by its writer. Hopper's pipeline
// machinery (TMA copies, mbarriers, named barriers, setmaxnreg) has its own section and rules below.
// Threads run from the first to the last between barriers, or (Lab::reverse on the Rust side) from
// the last to the first.
// Arithmetic: f32 as on the GPU (no fused multiply-add contraction guarantees); mma.sync multiplies
// the 16-bit operands exactly and accumulates in f32; 16-bit conversions round to nearest even.

#include <ucontext.h>

#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <mutex>
#include <string>
#include <vector>

#define __global__
#define __device__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static
#define __align__(n) __attribute__((aligned(n)))
#define __grid_constant__

struct emu_dim3 {
    unsigned x, y, z;
};

namespace emu {

typedef unsigned int u32;
typedef unsigned short u16;
typedef unsigned long long u64;

enum State { READY, AT_BLOCK, AT_WARP, AT_WG, AT_MBAR, AT_NAMED, AT_NREG, DONE, FAILED };

struct Copy {
    void* dst;
    const void* src;
    bool pred;
    int bytes; // 16 (cp.async.cg) or 4 (cp.async.ca)
};

// Switching fibers. glibc's swapcontext saves and restores the signal mask with a system call on
// every switch, which made it a third of the emulator's time; on x86-64 a switch is the System V
// callee-saved registers, the SSE and x87 control words and the stack pointer (LSSA_EMU_UCONTEXT
// forces the portable path).
#if defined(__x86_64__) && !defined(LSSA_EMU_UCONTEXT)
extern "C" void lssa_emu_switch(void** save_sp, void* load_sp);
__asm__(".text\n"
        ".globl lssa_emu_switch\n"
        ".hidden lssa_emu_switch\n"
        ".type lssa_emu_switch,@function\n"
        ".p2align 4\n"
        "lssa_emu_switch:\n"
        "  pushq %rbp\n"
        "  pushq %rbx\n"
        "  pushq %r12\n"
        "  pushq %r13\n"
        "  pushq %r14\n"
        "  pushq %r15\n"
        "  subq $8, %rsp\n"
        "  stmxcsr (%rsp)\n"
        "  fnstcw 4(%rsp)\n"
        "  movq %rsp, (%rdi)\n"
        "  movq %rsi, %rsp\n"
        "  ldmxcsr (%rsp)\n"
        "  fldcw 4(%rsp)\n"
        "  addq $8, %rsp\n"
        "  popq %r15\n"
        "  popq %r14\n"
        "  popq %r13\n"
        "  popq %r12\n"
        "  popq %rbx\n"
        "  popq %rbp\n"
        "  ret\n"
        ".size lssa_emu_switch, .-lssa_emu_switch\n");
struct Context {
    void* sp;
};
#else
struct Context {
    ucontext_t uc;
};
#endif

// One wgmma.mma_async of one thread, queued until the wgmma.wait_group that covers it: the A
// fragments of the thread's whole warp (copied at issue, as the hardware may read them any time
// before the wait), the B descriptor, and where the accumulators live.
struct WgOp {
    float* d;
    int n;
    bool scale_d, tnsp, f16;
    u64 desc;
    bool a_smem, tnsp_a; // A from shared memory (desc_a), else the registers in a
    u64 desc_a;
    u32 a[32][4];
    // The 16-bit operand values this thread's share of the product reads (its two rows of A, then
    // B for its columns), as read at issue: at the wait they must be unchanged.
    std::vector<u16> operands;
};

// Accumulators of in-flight wgmma: while any wgmma on them is in flight the thread's copy holds
// POISON, and their value lives here. Several wgmma of the same shape may chain on the same
// accumulators without a wait between them (the ISA orders them); `pending` counts them.
struct Acc {
    float* d;
    int n;                   // f32 values
    std::vector<float> live; // the value the chain has computed so far
    int pending;
};

// A signalling NaN: a copy keeps its bits, any arithmetic on it sets the quiet bit, so an
// accumulator that was read and rewritten while in flight no longer holds it.
static const u32 POISON = 0x7f80badd;

struct Thread {
    Context ctx;
    State state;
    int op; // which collective the lane waits at (warp and warpgroup barriers)
    std::vector<Copy> open;                 // cp.async not yet committed
    std::vector<std::vector<Copy>> groups;  // committed, oldest first
    std::vector<WgOp> wg_open;              // wgmma not yet committed
    std::vector<std::vector<WgOp>> wg_groups;
    std::vector<size_t> unfenced;           // dynamic shared memory this thread's cp.async wrote, not yet
                                            // fenced for the async proxy (offsets of 16-byte chunks)
    std::vector<Acc> accs;                  // accumulators of wgmma in flight
    // The thread's registers at its last wgmma.fence: its fiber's live stack from `regs_lo` to the
    // stack's top (the emulated kernel's locals are its registers). Empty before the first fence.
    std::vector<unsigned char> regs;
    uintptr_t regs_lo;
    // mbarrier waits: the barrier and phase index this thread waits for (AT_MBAR), and for every
    // barrier the last phase index it has waited for (-2: none yet).
    const void* wait_bar;
    long long wait_phase;
    std::vector<std::pair<const void*, long long>> observed;
};

// One warp's exchange area for collectives: 64 bytes per lane.
struct WarpX {
    alignas(16) unsigned char slot[32][64];
};

// What a launch did, for comparing kernel versions without a GPU (a deterministic work count, not
// a timing): warp-level tensor-core and shared-memory operations, shuffles, block barriers (once per
// block), cp.async bytes, and special-function calls (ex2 / lg2 / rcp: __expf, __logf, the v5-v7
// ex2, __fdividef) per thread; bytes copied by TMA, and mbarrier waits (per thread, blocking or not).
// Must match `Profile` in emu.rs.
struct Counts {
    unsigned long long mma, ldmatrix, shfl, barriers, cp_async_bytes, special, tma_bytes, mbar_waits;
};
static Counts counts;

static std::vector<Thread> threads;
static std::vector<WarpX> warpx;
static std::vector<char> stacks;
static const size_t STACK = 256 * 1024;
static Context sched;
static int cur = 0;
static std::string error;
static std::vector<unsigned char> dyn;
// Per 16-byte chunk of dyn: written by a cp.async whose thread has not yet executed
// fence.proxy.async since (wgmma, in the async proxy, may not see it).
static std::vector<unsigned char> unfenced;
static emu_dim3 g_tid, g_bid, g_bdim, g_gdim;
static void (*g_kernel)(const void*) = nullptr;
static bool g_reverse = false; // run a block's threads from the last to the first between barriers
static const void* g_params = nullptr;

static void to_scheduler();

static void fail(const std::string& why) {
    if (error.empty()) {
        char where[96];
        snprintf(where, sizeof where, " (block %u,%u thread %d)", g_bid.x, g_bid.y, cur);
        error = why + where;
    }
    threads[cur].state = FAILED;
    to_scheduler();
    abort(); // a failed fiber is never resumed
}

// A generic-proxy write of dynamic shared memory by the current thread (cp.async, or a store the
// kernel routes through sts32): not visible to wgmma until the thread's next fence.proxy.async.
static void generic_write(const void* p) {
    const unsigned char* d = (const unsigned char*)p;
    if (d >= dyn.data() && d < dyn.data() + dyn.size()) {
        const size_t chunk = (size_t)(d - dyn.data()) / 16;
        unfenced[chunk] = 1;
        threads[cur].unfenced.push_back(chunk);
    }
}

static void do_copy(const Copy& c) {
    if (c.pred)
        memcpy(c.dst, c.src, c.bytes);
    else
        memset(c.dst, 0, c.bytes);
    generic_write(c.dst);
}

static void flush_all(Thread& t) {
    for (auto& g : t.groups)
        for (auto& c : g) do_copy(c);
    for (auto& c : t.open) do_copy(c);
    t.groups.clear();
    t.open.clear();
}

static void trampoline() {
    g_kernel(g_params);
    if (!threads[cur].wg_open.empty() || !threads[cur].wg_groups.empty() || !threads[cur].accs.empty())
        fail("exited with wgmma.mma_async not waited for (wgmma.wait_group)");
    flush_all(threads[cur]);
    threads[cur].state = DONE;
    to_scheduler();
    abort(); // a finished fiber is never resumed
}

#if defined(__x86_64__) && !defined(LSSA_EMU_UCONTEXT)
static void to_scheduler() { lssa_emu_switch(&threads[cur].ctx.sp, sched.sp); }
static void to_fiber(int i) { lssa_emu_switch(&sched.sp, threads[i].ctx.sp); }
// A fresh fiber's stack as lssa_emu_switch leaves one: control words, six registers, and the return
// address `trampoline` (entered with the stack aligned as after a call).
static void start_fiber(Context& c, char* stack, size_t size) {
    uintptr_t top = ((uintptr_t)stack + size) & ~(uintptr_t)15;
    void** sp = (void**)top;
    *--sp = nullptr; // trampoline's own return address: never used
    *--sp = (void*)&trampoline;
    for (int r = 0; r < 6; r++) *--sp = nullptr;
    --sp;
    unsigned csr;
    unsigned short cw;
    __asm__ volatile("stmxcsr %0" : "=m"(csr));
    __asm__ volatile("fnstcw %0" : "=m"(cw));
    memcpy((char*)sp, &csr, 4);
    memcpy((char*)sp + 4, &cw, 2);
    c.sp = sp;
}
#else
static void to_scheduler() { swapcontext(&threads[cur].ctx.uc, &sched.uc); }
static void to_fiber(int i) { swapcontext(&sched.uc, &threads[i].ctx.uc); }
static void start_fiber(Context& c, char* stack, size_t size) {
    getcontext(&c.uc);
    c.uc.uc_stack.ss_sp = stack;
    c.uc.uc_stack.ss_size = size;
    c.uc.uc_link = nullptr;
    makecontext(&c.uc, trampoline, 0);
}
#endif

static inline int lane() { return cur & 31; }
static inline WarpX& wx() { return warpx[cur >> 5]; }

static void block_barrier() {
    if (cur == 0) counts.barriers++;
    threads[cur].state = AT_BLOCK;
    to_scheduler();
}

static void warp_barrier(int op) {
    threads[cur].state = AT_WARP;
    threads[cur].op = op;
    to_scheduler();
}

// All 128 threads of the calling thread's warpgroup (sm_90 wgmma collectives).
static void wg_barrier(int op) {
    threads[cur].state = AT_WG;
    threads[cur].op = op;
    to_scheduler();
}

enum Op { OP_SHFL = 1, OP_MMA, OP_LDSM, OP_LDSMT, OP_WGMMA, OP_WGFENCE, OP_WGCOMMIT, OP_WGWAIT, OP_NREG };

static const char* op_name(int op) {
    switch (op) {
    case OP_SHFL: return "shfl";
    case OP_MMA: return "mma.sync";
    case OP_LDSM: return "ldmatrix";
    case OP_LDSMT: return "ldmatrix.trans";
    case OP_WGMMA: return "wgmma.mma_async";
    case OP_WGFENCE: return "wgmma.fence";
    case OP_WGCOMMIT: return "wgmma.commit_group";
    case OP_WGWAIT: return "wgmma.wait_group";
    case OP_NREG: return "setmaxnreg";
    }
    return "?";
}

// ---------------------------------------------------------------------------------------------
// Hopper's asynchronous machinery, as the scheduler sees it (the kernels' entry points are further
// down): mbarriers, TMA copies in flight, named barriers and the register file that setmaxnreg moves
// between warpgroups.
//
// mbarrier (PTX ISA, "Parallel synchronization and communication instructions: mbarrier"): a phase
// completes when its pending arrivals reach 0 and its transaction count is 0; then the next phase
// begins with the arrival count of its init. Phases are numbered 0, 1, 2, ...; `try_wait.parity p`
// succeeds once the phase of parity p that is current or just before has completed, so a wait names
// a phase: the current one when its parity is p, else the one before it (index -1 before the first
// completes: the "producer start" idiom). A thread that waits for a phase it has already waited
// for (its parity bit not flipped) is refused: on the GPU it would return at once and read a stage
// whose next fill it did not wait for.
struct MBar {
    const void* addr;
    int count;            // arrivals per phase (init)
    int pending;          // arrivals still missing in the current phase
    long long tx;         // transaction bytes expected minus delivered in the current phase
    long long phase;      // index of the current (incomplete) phase
};
static std::vector<MBar> mbars;

// A TMA tensor map as the emulator holds it (the GPU's is an opaque CUtensorMap made on the host by
// cuTensorMapEncodeTiled): a tiled map of 16-bit elements of up to 4 dimensions (1 in the unused
// ones), which a kernel keeps in the 128 bytes of a CUtensorMap (`TmaDesc`, lab/hopper.cuh).
struct TensorMap {
    const void* base;
    u64 dim[4];      // elements: [0] the contiguous dimension, then rows, ...
    u64 stride[3];   // bytes between consecutive indices of dimensions 1, 2, 3 in global memory
    u32 box[4];      // the box a copy moves
    u32 swizzle;     // bytes of the swizzle pattern: 0 (none), 32, 64 or 128
};

// A TMA copy in flight: lands when the copy engine runs (when no thread can move), completes its
// bytes on its mbarrier's current phase (the chunks it writes record which: ChunkTag).
struct TmaCopy {
    size_t dst;       // offset in the dynamic shared memory
    TensorMap map;
    long long at[4];  // the box's first index in each dimension (may lie outside: zeros there)
    const void* bar;
};
static std::vector<TmaCopy> tma_flight;

// Per 16-byte chunk of the dynamic shared memory: what TMA last did to it, for the rules a wgmma's
// read checks (a stage read before its phase, or overwritten before its readers were done, or read
// with another swizzle than it was written with).
struct ChunkTag {
    unsigned char state;     // 0 never written by TMA, 1 a copy in flight, 2 landed
    unsigned char swizzle;   // the writing map's swizzle (bytes / 16: 0, 2, 4, 8)
    const void* bar;         // the copy's mbarrier and phase
    long long phase;
    const void* prev_bar;    // the landing before it (state 1 over a landed chunk)
    long long prev_phase;
};
static std::vector<ChunkTag> tma_tags;

// Named barriers (bar.sync / bar.arrive with an id and a thread count); id 0 is __syncthreads'.
struct Named {
    int expected; // 0: idle
    int arrived;
};
static Named named[16];

// Registers per thread of each warpgroup (setmaxnreg), from the launch's even split of the 64K.
static std::vector<int> wg_regs;
static const int REGISTER_FILE = 65536;

static MBar* mbar_find(const void* bar) {
    for (auto& b : mbars)
        if (b.addr == bar) return &b;
    return nullptr;
}

// The phase of `b` completes if nothing is missing; an over-delivery (more TMA bytes than expect_tx)
// is refused once the arrivals are in. Returns false with `error` set.
static bool mbar_settle(MBar& b) {
    if (b.pending > 0) return true;
    if (b.tx < 0) {
        char m[200];
        snprintf(m, sizeof m, "mbarrier at shared offset %ld, phase %lld: TMA copies delivered %lld bytes more than its expect_tx",
                 (long)((const unsigned char*)b.addr - dyn.data()), b.phase, -b.tx);
        if (error.empty()) error = m;
        return false;
    }
    if (b.tx > 0) return true;
    b.phase++;
    b.pending = b.count;
    b.tx = 0;
    return true;
}

// Byte offset (in the dynamic shared memory) of byte `o` of a region written or read with a swizzle
// of `swz` bytes (0: none): the 16-byte chunk index within each swz-byte row is XORed with the row
// index mod swz / 16 (bits 4.. of the address with bits 7..), the pattern TMA writes and a wgmma
// descriptor of the same mode reads (on the absolute shared address).
static size_t swizzled(size_t o, u32 swz) {
    if (swz == 0) return o;
    const size_t mask = swz / 16 - 1; // 1, 3 or 7
    return o ^ (((o >> 7) & mask) << 4);
}

static size_t box_bytes(const TensorMap& m) { return (size_t)m.box[0] * m.box[1] * m.box[2] * m.box[3] * 2; }

// Writes the box row by row (the contiguous dimension first), each element at its swizzled offset.
static void tma_land_one(const TmaCopy& c) {
    const TensorMap& m = c.map;
    size_t e = 0; // the element's index within the box
    for (u32 w = 0; w < m.box[3]; w++)
        for (u32 z = 0; z < m.box[2]; z++)
            for (u32 y = 0; y < m.box[1]; y++)
                for (u32 x = 0; x < m.box[0]; x++, e++) {
                    const long long g[4] = {c.at[0] + x, c.at[1] + y, c.at[2] + z, c.at[3] + w};
                    bool inside = true;
                    u64 src = 0;
                    for (int k = 0; k < 4; k++) {
                        inside = inside && g[k] >= 0 && (u64)g[k] < m.dim[k];
                        if (inside) src += k == 0 ? (u64)g[0] * 2 : (u64)g[k] * m.stride[k - 1];
                    }
                    u16 v = 0;
                    if (inside) memcpy(&v, (const unsigned char*)m.base + src, 2);
                    const size_t off = swizzled(c.dst + e * 2, m.swizzle);
                    memcpy(dyn.data() + off, &v, 2);
                    tma_tags[off / 16].state = 2;
                }
}

// The copy engine: lands every copy in flight and completes its bytes. True when it moved anything.
static bool tma_land() {
    if (tma_flight.empty()) return false;
    std::vector<TmaCopy> now;
    now.swap(tma_flight);
    for (auto& c : now) {
        tma_land_one(c);
        // Its issue found the barrier initialised, and a block's barriers stay until it ends.
        MBar& b = *mbar_find(c.bar);
        b.tx -= (long long)box_bytes(c.map);
        if (!mbar_settle(b)) return true;
    }
    return true;
}

static long long& observed_phase(Thread& t, const void* bar) {
    for (auto& o : t.observed)
        if (o.first == bar) return o.second;
    t.observed.push_back({bar, -2});
    return t.observed.back().second;
}

static long long block_registers(int except_wg, int with_regs) {
    long long total = 0;
    for (size_t w = 0; w < wg_regs.size(); w++) total += 128LL * ((int)w == except_wg ? with_regs : wg_regs[w]);
    return total;
}

static void hopper_reset(int nthreads) {
    mbars.clear();
    tma_flight.clear();
    tma_tags.assign(dyn.size() / 16 + 1, ChunkTag{0, 0, nullptr, 0, nullptr, 0});
    for (auto& n : named) n = Named{0, 0};
    int split = REGISTER_FILE / (nthreads > 0 ? nthreads : 1);
    split = split > 255 ? 255 : split;
    wg_regs.assign((size_t)(nthreads + 127) / 128, split & ~7);
    for (int i = 0; i < nthreads; i++) {
        threads[i].wait_bar = nullptr;
        threads[i].wait_phase = 0;
        threads[i].observed.clear();
    }
}

// Wakes the threads whose mbarrier phase completed and the setmaxnreg.inc the register file can now
// give (a named barrier wakes its waiters at its last arrival). True when any thread moved.
static bool hopper_release(int nthreads) {
    bool moved = false;
    for (int i = 0; i < nthreads; i++) {
        Thread& t = threads[i];
        if (t.state != AT_MBAR) continue;
        const MBar* b = mbar_find(t.wait_bar);
        if (b && b->phase > t.wait_phase) {
            t.state = READY;
            moved = true;
        }
    }
    for (int i = 0; i < nthreads; i++) {
        Thread& t = threads[i];
        if (t.state != AT_NREG) continue;
        const int w = i / 128;
        if (wg_regs[w] != t.op && block_registers(w, t.op) > REGISTER_FILE) continue;
        wg_regs[w] = t.op;
        t.state = READY;
        moved = true;
    }
    return moved;
}

// Why no thread can move, when one waits at a Hopper barrier (empty when none does): the root cause
// first (a warpgroup the register file cannot serve, then an mbarrier phase that has all its
// arrivals but misses transaction bytes), else the first thread that waits.
static std::string hopper_deadlock(int nthreads) {
    char m[320];
    for (int i = 0; i < nthreads; i++) {
        const Thread& t = threads[i];
        if (t.state != AT_NREG) continue;
        snprintf(m, sizeof m,
                 "deadlock: setmaxnreg.inc to %d registers in warpgroup %d: the block's warpgroups would hold %lld "
                 "registers, more than the %d of the register file",
                 t.op, i / 128, block_registers(i / 128, t.op), REGISTER_FILE);
        return m;
    }
    for (int pass = 0; pass < 2; pass++)
        for (int i = 0; i < nthreads; i++) {
            const Thread& t = threads[i];
            if (t.state == AT_NAMED && pass == 1) {
                snprintf(m, sizeof m, "deadlock: thread %d waits at named barrier %d: %d of %d threads arrived", i, t.op,
                         named[t.op].arrived, named[t.op].expected);
                return m;
            }
            if (t.state != AT_MBAR) continue;
            const MBar* b = mbar_find(t.wait_bar);
            if (pass == 0 && !(b && b->pending == 0 && b->tx > 0)) continue;
            snprintf(m, sizeof m,
                     "deadlock: thread %d waits for phase %lld of the mbarrier at shared offset %ld, whose phase %lld "
                     "misses %d arrivals and %lld transaction bytes (an expect_tx larger than its copies, or an arrival "
                     "that never comes)",
                     i, t.wait_phase, (long)((const unsigned char*)t.wait_bar - dyn.data()), b ? b->phase : -1,
                     b ? b->pending : 0, b ? b->tx : 0);
            return m;
        }
    return "";
}

// Runs one block to completion; false (with `error` set) on a deadlock or a failed check.
static bool run_block(int nthreads) {
    for (int i = 0; i < nthreads; i++) {
        Thread& t = threads[i];
        t.state = READY;
        t.open.clear();
        t.groups.clear();
        t.wg_open.clear();
        t.wg_groups.clear();
        t.unfenced.clear();
        t.accs.clear();
        t.regs.clear();
        t.regs_lo = 0;
        start_fiber(t.ctx, stacks.data() + (size_t)i * STACK, STACK);
    }
    memset(dyn.data(), 0xff, dyn.size()); // NaN in f32, f16 and bf16
    unfenced.assign(dyn.size() / 16 + 1, 0);
    hopper_reset(nthreads);
    const int nwarps = (nthreads + 31) / 32;
    for (;;) {
        for (int k = 0; k < nthreads; k++) {
            const int i = g_reverse ? nthreads - 1 - k : k;
            if (threads[i].state != READY) continue;
            cur = i;
            g_tid = {(unsigned)i, 0, 0};
            to_fiber(i);
            if (threads[i].state == FAILED) return false;
        }
        bool released = false;
        int live = 0, at_block = 0;
        for (int w = 0; w < nwarps; w++) {
            int lo = w * 32, hi = lo + 32 < nthreads ? lo + 32 : nthreads;
            int waiting = 0, op = 0;
            bool same = true;
            for (int i = lo; i < hi; i++) {
                if (threads[i].state == AT_WARP) {
                    if (waiting && threads[i].op != op) same = false;
                    op = threads[i].op;
                    waiting++;
                }
            }
            if (waiting == hi - lo) {
                if (!same) {
                    error = "warp " + std::to_string(w) + ": lanes wait at different collectives";
                    return false;
                }
                for (int i = lo; i < hi; i++) threads[i].state = READY;
                released = true;
            }
        }
        for (int lo = 0; lo + 128 <= nthreads; lo += 128) {
            int waiting = 0, op = threads[lo].op;
            bool same = true;
            for (int i = lo; i < lo + 128; i++) {
                if (threads[i].state == AT_WG) {
                    waiting++;
                    same = same && threads[i].op == op;
                }
            }
            if (waiting == 128) {
                if (!same) {
                    error = "warpgroup " + std::to_string(lo / 128) + ": threads wait at different wgmma collectives";
                    return false;
                }
                for (int i = lo; i < lo + 128; i++) threads[i].state = READY;
                released = true;
            }
        }
        released = hopper_release(nthreads) || released;
        // A named barrier's last arrival wakes its waiters from inside a fiber: those the loop above
        // had already passed run in the next round.
        for (int i = 0; i < nthreads; i++) released = released || threads[i].state == READY;
        for (int i = 0; i < nthreads; i++) {
            if (threads[i].state != DONE) live++;
            if (threads[i].state == AT_BLOCK) at_block++;
        }
        if (live == 0) return true;
        if (released) continue;
        if (at_block == live) {
            for (int i = 0; i < nthreads; i++)
                if (threads[i].state == AT_BLOCK) threads[i].state = READY;
            continue;
        }
        // The copy engine runs last, when no thread can move: the latest a TMA copy may land, so a
        // stage read before its phase completes reads the poison its copy left at issue.
        if (tma_land()) {
            if (!error.empty()) return false;
            continue;
        }
        {
            const std::string why = hopper_deadlock(nthreads);
            if (!why.empty()) {
                error = why;
                return false;
            }
        }
        // Nothing can move: describe the first warp that waits at a collective.
        for (int w = 0; w < nwarps; w++) {
            int lo = w * 32, hi = lo + 32 < nthreads ? lo + 32 : nthreads;
            int waiting = 0, done = 0, blocked = 0, op = 0;
            for (int i = lo; i < hi; i++) {
                waiting += threads[i].state == AT_WARP;
                done += threads[i].state == DONE;
                blocked += threads[i].state == AT_BLOCK;
                if (threads[i].state == AT_WARP) op = threads[i].op;
            }
            int at_wg = 0;
            for (int i = lo; i < hi; i++) at_wg += threads[i].state == AT_WG;
            if (at_wg) {
                int wop = 0;
                for (int i = lo; i < hi; i++)
                    if (threads[i].state == AT_WG) wop = threads[i].op;
                char msg[200];
                snprintf(msg, sizeof msg,
                         "deadlock in block (%u,%u), warp %d: %d threads at %s (a warpgroup collective needs all 128 "
                         "threads of the warpgroup), %d exited, %d at __syncthreads",
                         g_bid.x, g_bid.y, w, at_wg, op_name(wop), done, blocked);
                error = msg;
                return false;
            }
            if (waiting) {
                char msg[200];
                snprintf(msg, sizeof msg,
                         "deadlock in block (%u,%u), warp %d: %d lanes at %s, %d exited, %d at __syncthreads",
                         g_bid.x, g_bid.y, w, waiting, op_name(op), done, blocked);
                error = msg;
                return false;
            }
        }
        error = "deadlock: no thread can move";
        return false;
    }
}

// ---------------------------------------------------------------------------------------------
// Warp collectives.

template <class T> static T shfl(unsigned mask, T v, int src) {
    static_assert(sizeof(T) <= 8, "shfl of a wide type");
    if (mask != 0xffffffffu) fail("__shfl_sync with a partial mask is not emulated");
    if (lane() == 0) counts.shfl++;
    memcpy(wx().slot[lane()], &v, sizeof(T));
    warp_barrier(OP_SHFL);
    T r;
    memcpy(&r, wx().slot[src & 31], sizeof(T));
    warp_barrier(OP_SHFL);
    return r;
}

static inline float bits_f(u32 u) {
    float f;
    memcpy(&f, &u, 4);
    return f;
}
static inline u32 f_bits(float f) {
    u32 u;
    memcpy(&u, &f, 4);
    return u;
}

static float f16_to_f32(u16 h) {
    u32 sign = (u32)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff;
    if (e == 0) return bits_f(sign) + (sign ? -1.f : 1.f) * ldexpf((float)m, -24);
    if (e == 31) return bits_f(sign | 0x7f800000 | (m << 13));
    return bits_f(sign | ((e + 112) << 23) | (m << 13));
}

static u16 f32_to_f16(float f) {
    u32 x = f_bits(f), sign = (x >> 16) & 0x8000;
    x &= 0x7fffffff;
    if (x >= 0x7f800000) return (u16)(sign | (x > 0x7f800000 ? 0x7e00 : 0x7c00));
    if (x >= 0x477ff000) return (u16)(sign | 0x7c00); // rounds to infinity (>= 65520)
    if (x < 0x38800000) return (u16)(sign | (u32)rintf(bits_f(x) * 16777216.f)); // subnormal or zero
    x += 0xfff + ((x >> 13) & 1);
    return (u16)(sign | ((x - 0x38000000) >> 13));
}

static float bf16_to_f32(u16 h) { return bits_f((u32)h << 16); }

static u16 f32_to_bf16(float f) {
    u32 x = f_bits(f);
    if ((x & 0x7fffffff) > 0x7f800000) return (u16)((x >> 16) | 0x40);
    x += 0x7fff + ((x >> 16) & 1);
    return (u16)(x >> 16);
}

// mma.sync.m16n8k16.row.col, f32 accumulation; `f16` picks the operand type (else bf16).
static void mma16816(float* c, const u32* a, u32 b0, u32 b1, bool f16) {
    struct Frag {
        u32 a[4], b[2];
        float c[4];
    };
    static_assert(sizeof(Frag) <= 64, "fragment slot");
    if (lane() == 0) counts.mma++;
    Frag mine = {{a[0], a[1], a[2], a[3]}, {b0, b1}, {c[0], c[1], c[2], c[3]}};
    memcpy(wx().slot[lane()], &mine, sizeof mine);
    warp_barrier(OP_MMA);
    auto half = [&](u32 reg, int hi) -> float {
        u16 v = (u16)(hi ? reg >> 16 : reg & 0xffff);
        return f16 ? f16_to_f32(v) : bf16_to_f32(v);
    };
    const Frag* s = (const Frag*)&wx().slot[0][0];
    auto frag = [&](int l) -> const Frag& { return *(const Frag*)((const unsigned char*)s + l * 64); };
    // A[r][k]: lane (r % 8) * 4 + (k % 8) / 2, register (r >= 8) + 2 (k >= 8), half k & 1.
    // B[k][n]: lane n * 4 + (k % 8) / 2, register (k >= 8), half k & 1.
    const int g = lane() >> 2, t = lane() & 3;
    float d[4];
    for (int e = 0; e < 4; e++) {
        int r = g + (e >= 2 ? 8 : 0), n = 2 * t + (e & 1);
        float acc = c[e];
        for (int k = 0; k < 16; k++) {
            float x = half(frag((r % 8) * 4 + (k % 8) / 2).a[(r >= 8) + 2 * (k >= 8)], k & 1);
            float y = half(frag(n * 4 + (k % 8) / 2).b[k >= 8], k & 1);
            acc += x * y;
        }
        d[e] = acc;
    }
    warp_barrier(OP_MMA);
    for (int e = 0; e < 4; e++) c[e] = d[e];
}

// ldmatrix.sync.aligned.m8n8.x4(.trans).shared.b16: lanes 8m..8m+7 address the rows of matrix m.
static void ldsm4(u32* r, const u16* p, bool trans) {
    if ((uintptr_t)p % 16) fail("ldmatrix row address not 16-byte aligned");
    if (lane() == 0) counts.ldmatrix++;
    memcpy(wx().slot[lane()], &p, sizeof p);
    const int op = trans ? OP_LDSMT : OP_LDSM;
    warp_barrier(op);
    auto row = [&](int m, int i) -> const u16* {
        const u16* q;
        memcpy(&q, wx().slot[8 * m + i], sizeof q);
        return q;
    };
    const int l = lane();
    u32 out[4];
    for (int m = 0; m < 4; m++) {
        u16 lo, hi;
        if (!trans) {
            lo = row(m, l / 4)[2 * (l % 4)];
            hi = row(m, l / 4)[2 * (l % 4) + 1];
        } else {
            lo = row(m, 2 * (l % 4))[l / 4];
            hi = row(m, 2 * (l % 4) + 1)[l / 4];
        }
        out[m] = (u32)lo | ((u32)hi << 16);
    }
    warp_barrier(op);
    for (int m = 0; m < 4; m++) r[m] = out[m];
}

static void cp_async16(void* dst, const void* src, bool pred) {
    if ((uintptr_t)dst % 16 || (pred && (uintptr_t)src % 16)) fail("cp.async address not 16-byte aligned");
    threads[cur].open.push_back({dst, src, pred, 16});
    counts.cp_async_bytes += 16;
}
static void cp_async4(void* dst, const void* src, bool pred) {
    if ((uintptr_t)dst % 4 || (pred && (uintptr_t)src % 4)) fail("cp.async address not 4-byte aligned");
    threads[cur].open.push_back({dst, src, pred, 4});
    counts.cp_async_bytes += 4;
}
static void cp_commit() {
    Thread& t = threads[cur];
    t.groups.push_back(t.open);
    t.open.clear();
}
static void cp_wait(int n) {
    Thread& t = threads[cur];
    while ((int)t.groups.size() > n) {
        for (auto& c : t.groups.front()) do_copy(c);
        t.groups.erase(t.groups.begin());
    }
}

// ---------------------------------------------------------------------------------------------
// Warpgroup collectives (sm_90a): wgmma.mma_async m64nNk16 with A from registers or from shared
// memory, B from shared memory, through matrix descriptors, f32 accumulation. Warp w % 4 of the warpgroup owns rows
// 16 (w % 4) .. + 15; its A fragment and accumulator layouts are mma.sync m16n8k16's (accumulator i:
// row g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 t + (i & 1)). The descriptor (PTX ISA, "matrix
// descriptor"): bits 0-13 start address >> 4, 16-29 leading byte offset >> 4, 32-45 stride byte
// offset >> 4, 49-51 base offset, 62-63 swizzle. Only the no-swizzle ("interleave") canonical
// layouts are emulated: core matrices of 8 rows x 16 bytes, stored contiguously (128 bytes); the
// leading byte offset steps between core matrices along K, the stride byte offset along M/N. With B
// K-major (tnsp 0) a core matrix's rows are 8 values of N, 8 values of K each; MN-major (tnsp 1),
// 8 values of K, 8 values of N each; likewise for A from shared memory with M for N (its descriptor
// covers the warpgroup's 64 rows). Shared addresses are offsets into the dynamic shared memory.
//
// Timing. The GPU may read a wgmma's operands and write its accumulators at any moment between its
// issue and the wgmma.wait_group that covers it; the emulator computes it at the wait and enforces
// the PTX ISA's rules (wgmma.mma_async, wgmma.fence, wgmma.wait_group, async proxy), so that a
// program whose result depends on the timing fails here:
//   (a) the accumulators of an in-flight wgmma hold POISON (a signalling NaN) from its issue to its
//       wait: reading them early gives NaN, and writing them (or reading and rewriting them) is
//       reported at the wait. wgmma of the same shape may chain on the same accumulators;
//   (b) registers a wgmma reads (its A fragments, and its accumulators when it adds to them) must
//       not have been written by the thread since its last wgmma.fence: the fence snapshots the
//       thread's registers (the emulated kernel's locals on its fiber stack), the issue compares;
//   (c) shared memory a wgmma reads (B, and A from shared memory) must be the same at its wait as at
//       its issue (a store or a landing cp.async in between is reported), and at its issue no
//       cp.async or sts32 write of it may be unfenced (fence.proxy.async by the writer);
//   and every wgmma is waited for before the thread exits. LAB.md lists what is not checked.

static u32 smem_offset(const void* p) {
    const unsigned char* c = (const unsigned char*)p;
    if (c < dyn.data() || c >= dyn.data() + dyn.size()) fail("wgmma operand outside the dynamic shared memory");
    return (u32)(c - dyn.data());
}

static void wg_check_shape() {
    if (g_bdim.x % 128) fail("a warpgroup collective in a block whose size is not a multiple of 128");
}

// The current thread's fiber stack, [lo, hi): where its registers (the kernel's locals) live.
static void stack_of(uintptr_t& lo, uintptr_t& hi) {
    lo = (uintptr_t)(stacks.data() + (size_t)cur * STACK);
    hi = lo + STACK;
}

// wgmma.fence's snapshot of the thread's registers: its live stack above this frame (noinline, so
// every frame of the kernel lies above it).
__attribute__((noinline)) static void snapshot_regs() {
    volatile char here = 0;
    uintptr_t lo, hi;
    stack_of(lo, hi);
    const uintptr_t from = (uintptr_t)&here;
    if (from < lo || from >= hi) fail("emulator: wgmma.fence off the thread's stack");
    Thread& t = threads[cur];
    t.regs_lo = from;
    t.regs.assign((const unsigned char*)from, (const unsigned char*)hi);
}

// Registers that a wgmma (not the thread) wrote: the snapshot follows, so they do not count as the
// thread's writes.
static void regs_written_by_wgmma(const void* p, size_t bytes) {
    Thread& t = threads[cur];
    const uintptr_t a = (uintptr_t)p;
    if (t.regs.empty() || a < t.regs_lo || a + bytes > t.regs_lo + t.regs.size()) return;
    memcpy(t.regs.data() + (a - t.regs_lo), p, bytes);
}

// Rule (b): `bytes` of registers at `p` that a wgmma is about to read.
static void check_fenced(const void* p, size_t bytes, const char* what) {
    uintptr_t lo, hi;
    stack_of(lo, hi);
    const uintptr_t a = (uintptr_t)p;
    if (a < lo || a + bytes > hi) return; // not the thread's registers: nothing to compare
    const Thread& t = threads[cur];
    const std::string w = std::string("wgmma.mma_async reads ") + what;
    if (t.regs.empty()) fail(w + " with no wgmma.fence before it");
    if (a < t.regs_lo) fail(w + " defined after the thread's last wgmma.fence");
    if (memcmp(t.regs.data() + (a - t.regs_lo), p, bytes) != 0)
        fail(w + " written since the thread's last wgmma.fence (a wgmma.fence must come between a register's last "
                 "write and the wgmma that reads it)");
}

// The rules of a wgmma's read of shared memory that TMA wrote (checked at its issue): the stage's
// copy has landed and this thread has waited for the mbarrier phase it completed; a copy issued over
// it since is a producer that did not wait for its readers; and the read uses the copy's swizzle.
static void check_tma_read(size_t off, u32 swz) {
    const ChunkTag& c = tma_tags[off / 16];
    if (c.state == 0) return;
    Thread& t = threads[cur];
    if (c.state == 1) {
        if (c.prev_bar && observed_phase(t, c.prev_bar) >= c.prev_phase)
            fail("a TMA copy overwrote a stage this thread still reads (the producer did not wait for the stage's "
                 "release)");
        fail("wgmma reads a stage before the mbarrier phase its TMA copy completes (no wait, or a wait for another "
             "phase)");
    }
    if (observed_phase(t, c.bar) < c.phase)
        fail("wgmma reads a TMA-written stage before this thread waited for the mbarrier phase that completed it");
    if ((u32)c.swizzle * 16 != swz) {
        char m[160];
        snprintf(m, sizeof m, "swizzle mismatch: TMA wrote the stage with a %u-byte swizzle, the wgmma descriptor reads it "
                 "with %u", (unsigned)c.swizzle * 16, swz);
        fail(m);
    }
}

// The 16-bit value of element (mn, k) of an operand in shared memory, by its descriptor; `issue`:
// read at the wgmma's issue, when its writer must have fenced it for the async proxy (or, written by
// TMA, published by its mbarrier).
//
// Layouts (PTX ISA, "Shared memory matrix layout", as read here; `wgmma_probe` and the TMA probe
// check them on a GPU). No swizzle: core matrices of 8 rows x 16 bytes, contiguous; the leading byte
// offset steps between core matrices along K, the stride byte offset along M/N. Swizzled (bits 62-63:
// 1 = 128-byte, 2 = 64-byte, 3 = 32-byte): rows of S bytes (S the swizzle), 8 rows an atom; K-major:
// a row is one M/N index with S / 2 values of K, the stride byte offset steps between atoms of 8
// rows; MN-major: a row is one K index with S / 2 values of M/N, the stride byte offset steps between
// atoms of 8 K and the leading byte offset between atoms along M/N. The address is then swizzled as
// TMA writes it (`swizzled`).
static u16 desc_bits(u64 desc, bool tnsp, int k, int mn, bool issue) {
    if (((desc >> 49) & 7) != 0) fail("only wgmma descriptors with base offset 0 are emulated");
    const u32 mode = (u32)(desc >> 62), swz = mode == 0 ? 0 : mode == 1 ? 128 : mode == 2 ? 64 : 32;
    const size_t start = (size_t)(desc & 0x3fff) << 4, lbo = (size_t)((desc >> 16) & 0x3fff) << 4,
                 sbo = (size_t)((desc >> 32) & 0x3fff) << 4;
    size_t off;
    if (swz == 0) {
        off = tnsp ? start + (k / 8) * lbo + (mn / 8) * sbo + (k % 8) * 16 + (mn % 8) * 2
                   : start + (mn / 8) * sbo + (k / 8) * lbo + (mn % 8) * 16 + (k % 8) * 2;
    } else {
        const size_t per_row = swz / 2;
        const size_t logical = tnsp ? start + (k % 8) * swz + (mn % per_row) * 2 + (mn / per_row) * lbo + (k / 8) * sbo
                                    : start + (mn % 8) * swz + (k % per_row) * 2 + (k / per_row) * lbo + (mn / 8) * sbo;
        off = swizzled(logical, swz);
    }
    if (off + 2 > dyn.size()) fail("wgmma operand past the end of the dynamic shared memory");
    if (issue && unfenced[off / 16]) fail("wgmma reads shared memory written since the writer's last fence.proxy.async");
    if (issue) check_tma_read(off, swz);
    u16 v;
    memcpy(&v, dyn.data() + off, 2);
    return v;
}

// The operand values this thread's share of `op` reads, in wg_run's order: A's 16 values for each
// of its two rows (g, g + 8 of its warp's 16), then B's 16 for each of its columns; `issue` as for
// desc_bits.
static std::vector<u16> operand_values(const WgOp& op, bool issue) {
    const int wrow = 16 * ((cur >> 5) & 3); // the warp's first row of the 64
    const int g = lane() >> 2, t = lane() & 3;
    std::vector<u16> v;
    v.reserve(32 + op.n / 4 * 16);
    for (int h = 0; h < 2; h++) {
        const int r = g + 8 * h;
        for (int k = 0; k < 16; k++) {
            if (op.a_smem) {
                v.push_back(desc_bits(op.desc_a, op.tnsp_a, k, wrow + r, issue));
            } else {
                const u32 reg = op.a[(r % 8) * 4 + (k % 8) / 2][(r >= 8) + 2 * (k >= 8)];
                v.push_back((u16)((k & 1) ? reg >> 16 : reg & 0xffff));
            }
        }
    }
    for (int c = 0; c < op.n / 8; c++)
        for (int e = 0; e < 2; e++)
            for (int k = 0; k < 16; k++) v.push_back(desc_bits(op.desc, op.tnsp, k, 8 * c + 2 * t + e, issue));
    return v;
}

// What every thread of a warpgroup must give one wgmma.mma_async alike (`.sync.aligned`): the shape,
// the flags and the descriptors.
struct WgUniform {
    u64 desc, desc_a;
    int n;
    bool scale_d, tnsp, f16, a_smem, tnsp_a;
    bool operator!=(const WgUniform& o) const {
        return desc != o.desc || desc_a != o.desc_a || n != o.n || scale_d != o.scale_d || tnsp != o.tnsp ||
               f16 != o.f16 || a_smem != o.a_smem || tnsp_a != o.tnsp_a;
    }
};
static_assert(16 + sizeof(WgUniform) <= 64, "exchange slot");

static void wgmma_issue(WgOp op, const u32* a) {
    wg_check_shape();
    const int nacc = op.n / 2;
    if (threads[cur].regs.empty()) fail("wgmma.mma_async with no wgmma.fence before it in the thread");
    if (a) check_fenced(a, 16, "A fragment registers");
    // Rule (a): the accumulators go into flight, or join the chain already in flight on them.
    Thread& t = threads[cur];
    Acc* chain = nullptr;
    for (auto& c : t.accs) {
        if (!(op.d < c.d + c.n && c.d < op.d + nacc)) continue;
        if (c.d != op.d || c.n != nacc)
            fail("wgmma.mma_async on accumulators that overlap an in-flight wgmma's without being the same");
        chain = &c;
    }
    if (!chain) {
        if (op.scale_d) check_fenced(op.d, (size_t)nacc * 4, "accumulator registers");
        t.accs.push_back(Acc{op.d, nacc, std::vector<float>(op.d, op.d + nacc), 0});
        chain = &t.accs.back();
        for (int i = 0; i < nacc; i++) memcpy(&op.d[i], &POISON, 4);
        regs_written_by_wgmma(op.d, (size_t)nacc * 4);
    }
    chain->pending++;
    if (lane() == 0) counts.mma += op.n / 8; // in m16n8k16 units per warp
    const WgUniform mine = {op.desc, op.desc_a, op.n, op.scale_d, op.tnsp, op.f16, op.a_smem, op.tnsp_a};
    if (a) memcpy(wx().slot[lane()], a, 16);
    memcpy(wx().slot[lane()] + 16, &mine, sizeof mine);
    wg_barrier(OP_WGMMA);
    if (a)
        for (int l = 0; l < 32; l++) memcpy(op.a[l], wx().slot[l], 16);
    for (int w = 0; w < 4; w++) { // lane 0 of each warp of the warpgroup
        WgUniform theirs;
        memcpy(&theirs, warpx[((cur >> 5) & ~3) + w].slot[0] + 16, sizeof theirs);
        if (theirs != mine) fail("the threads of a warpgroup issue wgmma.mma_async with different shapes, flags or descriptors");
    }
    wg_barrier(OP_WGMMA);
    op.operands = operand_values(op, true);
    threads[cur].wg_open.push_back(op);
}

static WgOp wg_op(float* d, u64 desc, int n, bool scale_d, bool tnsp, bool f16) {
    WgOp op;
    op.d = d;
    op.n = n;
    op.scale_d = scale_d;
    op.tnsp = tnsp;
    op.f16 = f16;
    op.desc = desc;
    op.a_smem = op.tnsp_a = false;
    op.desc_a = 0;
    return op;
}

// A from registers.
static void wgmma(float* d, const u32* a, u64 desc, int n, bool scale_d, bool tnsp, bool f16) {
    wgmma_issue(wg_op(d, desc, n, scale_d, tnsp, f16), a);
}

// A from shared memory.
static void wgmma_ss(float* d, u64 desc_a, u64 desc, int n, bool scale_d, bool tnsp_a, bool tnsp, bool f16) {
    WgOp op = wg_op(d, desc, n, scale_d, tnsp, f16);
    op.a_smem = true;
    op.tnsp_a = tnsp_a;
    op.desc_a = desc_a;
    wgmma_issue(op, nullptr);
}

// Runs `op` on the chain's value `acc` at its wait (rule (c): on the operands it read at issue).
static void wg_run(const WgOp& op, float* acc) {
    if (operand_values(op, false) != op.operands)
        fail("shared memory that an in-flight wgmma.mma_async reads was written before the wgmma.wait_group that "
             "covers it");
    auto val = [&](u16 v) -> float { return op.f16 ? f16_to_f32(v) : bf16_to_f32(v); };
    for (int i = 0; i < op.n / 2; i++) {
        // Accumulator i: row g + 8 ((i >> 1) & 1), column 8 (i >> 2) + 2 t + (i & 1).
        const u16* av = &op.operands[16 * ((i >> 1) & 1)];
        const u16* bv = &op.operands[32 + 16 * (2 * (i >> 2) + (i & 1))];
        float s = op.scale_d ? acc[i] : 0.f;
        for (int k = 0; k < 16; k++) s += val(av[k]) * val(bv[k]);
        acc[i] = s;
    }
}

// Completes one wgmma; the last of a chain hands its accumulators back (rule (a)).
static void wg_complete(const WgOp& op) {
    Thread& t = threads[cur];
    size_t c = 0;
    while (c < t.accs.size() && t.accs[c].d != op.d) c++;
    if (c == t.accs.size()) fail("emulator: a wgmma's accumulators are not in flight");
    Acc& a = t.accs[c];
    wg_run(op, a.live.data());
    if (--a.pending > 0) return;
    for (int i = 0; i < a.n; i++)
        if (memcmp(&a.d[i], &POISON, 4) != 0)
            fail("the accumulator registers of an in-flight wgmma.mma_async were written (or read and rewritten) "
                 "before the wgmma.wait_group that covers it");
    memcpy(a.d, a.live.data(), (size_t)a.n * 4);
    regs_written_by_wgmma(a.d, (size_t)a.n * 4);
    t.accs.erase(t.accs.begin() + (long)c);
}

// fence.proxy.async.shared::cta: this thread's completed cp.async writes and sts32 stores become
// visible to the async proxy (to wgmma, after a barrier). Plain stores are not tracked.
static void fence_proxy_async() {
    Thread& t = threads[cur];
    for (size_t c : t.unfenced) unfenced[c] = 0;
    t.unfenced.clear();
}

static void wg_fence() {
    wg_check_shape();
    snapshot_regs();
    wg_barrier(OP_WGFENCE);
}
static void wg_commit() {
    wg_check_shape();
    Thread& t = threads[cur];
    t.wg_groups.push_back(t.wg_open);
    t.wg_open.clear();
    wg_barrier(OP_WGCOMMIT);
}
static void wg_wait(int n) {
    wg_check_shape();
    wg_barrier(OP_WGWAIT);
    Thread& t = threads[cur];
    while ((int)t.wg_groups.size() > n) {
        for (auto& op : t.wg_groups.front()) wg_complete(op);
        t.wg_groups.erase(t.wg_groups.begin());
    }
}

// ---------------------------------------------------------------------------------------------
// Hopper's asynchronous machinery, the kernels' side (see "Hopper's asynchronous machinery" above).

static MBar& mbar_of(const void* bar, const char* what) {
    MBar* b = mbar_find(bar);
    if (!b) fail(std::string(what) + " on an mbarrier that is not initialised (mbarrier.init)");
    return *b;
}

// mbarrier.init: `count` arrivals a phase.
static void mbar_init(void* bar, int count) {
    if (count < 1) fail("mbarrier.init with a count below 1");
    if (mbar_find(bar)) fail("mbarrier.init of an mbarrier already initialised in this block");
    mbars.push_back(MBar{bar, count, count, 0, 0});
}

static void mbar_arrive_tx(void* bar, long long bytes) {
    MBar& b = mbar_of(bar, "mbarrier.arrive");
    if (b.pending == 0) fail("mbarrier.arrive on a phase whose arrivals are all in (more arrivals than its count)");
    b.tx += bytes;
    b.pending--;
    if (!mbar_settle(b)) fail(error);
}
// mbarrier.arrive.
static void mbar_arrive(void* bar) { mbar_arrive_tx(bar, 0); }
// mbarrier.arrive.expect_tx: this phase also waits for `bytes` of TMA transactions.
static void mbar_arrive_expect_tx(void* bar, u32 bytes) { mbar_arrive_tx(bar, bytes); }

// mbarrier.try_wait.parity in a loop: returns once the phase of parity `parity` that is current or
// just before has completed. Blocks the fiber meanwhile.
static void mbar_wait(void* bar, int parity) {
    MBar& b = mbar_of(bar, "mbarrier.try_wait");
    counts.mbar_waits++;
    const long long target = (b.phase & 1) == (parity & 1) ? b.phase : b.phase - 1;
    Thread& t = threads[cur];
    long long& seen = observed_phase(t, bar);
    if (target <= seen) {
        char m[200];
        snprintf(m, sizeof m, "mbarrier wait for phase %lld (parity %d), which this thread has already waited for: its "
                 "phase bit was not flipped after the last wait", target, parity & 1);
        fail(m);
    }
    seen = target;
    if (b.phase > target) return;
    t.wait_bar = bar;
    t.wait_phase = target;
    t.state = AT_MBAR;
    to_scheduler();
}

// cp.async.bulk.tensor.Nd.shared::cluster.global.mbarrier::complete_tx::bytes: the box at index `at`
// of `map` into `dst` (zeros outside the tensor), completing its bytes on `bar`. In flight until the
// copy engine runs; the destination holds poison (NaN) meanwhile.
static void tma_load(void* dst, const TensorMap* map, const long long* at, void* bar) {
    const unsigned char* d = (const unsigned char*)dst;
    if (d < dyn.data() || d >= dyn.data() + dyn.size()) fail("TMA destination outside the dynamic shared memory");
    const size_t off = (size_t)(d - dyn.data());
    const u32 swz = map->swizzle;
    if (swz != 0 && swz != 32 && swz != 64 && swz != 128) fail("TMA tensor map with a swizzle other than 0, 32, 64, 128");
    if (off % (swz ? (size_t)swz * 8 : 128))
        fail("TMA destination not aligned to its swizzle's repeat (128 bytes unswizzled, 8 rows of the swizzle)");
    if (swz && map->box[0] * 2 != swz) fail("TMA box rows of another width than the swizzle (not emulated)");
    for (int k = 0; k < 4; k++)
        if (map->box[k] < 1 || map->box[k] > 256 || map->dim[k] < 1) fail("TMA tensor map with an empty or oversized box");
    MBar& b = mbar_of(bar, "a TMA copy");
    const size_t bytes = box_bytes(*map);
    if (off + bytes > dyn.size()) fail("TMA destination past the end of the dynamic shared memory");
    for (size_t o = 0; o < bytes; o += 16) {
        ChunkTag& c = tma_tags[(off + o) / 16];
        if (c.state == 2) {
            c.prev_bar = c.bar;
            c.prev_phase = c.phase;
        }
        c.state = 1;
        c.swizzle = (unsigned char)(swz / 16);
        c.bar = bar;
        c.phase = b.phase;
    }
    memset(dyn.data() + off, 0xff, bytes);
    counts.tma_bytes += bytes;
    TmaCopy c{off, *map, {at[0], at[1], at[2], at[3]}, bar};
    tma_flight.push_back(c);
}
// The 2-D form: the box at element x of row y.
static void tma_load_2d(void* dst, const TensorMap* map, int x, int y, void* bar) {
    const long long at[4] = {x, y, 0, 0};
    tma_load(dst, map, at, bar);
}

static void named_arrival(int id, int count, bool wait) {
    if (id < 1 || id > 15) fail("named barrier id outside 1..15 (0 is __syncthreads')");
    if (count < 32 || count % 32 || count > (int)g_bdim.x) fail("named barrier thread count not a multiple of 32 within the block");
    Named& n = named[id];
    if (n.expected && n.expected != count) fail("named barrier " + std::to_string(id) + ": threads arrive with different counts");
    n.expected = count;
    if (++n.arrived < count) {
        if (!wait) return;
        threads[cur].state = AT_NAMED;
        threads[cur].op = id;
        to_scheduler();
        return;
    }
    // The last arrival completes the barrier: its waiters go on, and the next arrival starts anew.
    for (size_t i = 0; i < threads.size(); i++)
        if (threads[i].state == AT_NAMED && threads[i].op == id) threads[i].state = READY;
    n = Named{0, 0};
}
// bar.sync id, count.
static void named_sync(int id, int count) { named_arrival(id, count, true); }
// bar.arrive id, count.
static void named_arrive(int id, int count) { named_arrival(id, count, false); }

// setmaxnreg.{inc,dec}.sync.aligned.u32 n: the warpgroup's registers per thread. A decrease returns
// registers to the block's file at once; an increase waits until the file has them.
static void setmaxnreg(int n, bool inc) {
    wg_check_shape();
    if (n < 24 || n > 256 || n % 8) fail("setmaxnreg: the count must be a multiple of 8 in [24, 256]");
    memcpy(wx().slot[lane()], &n, 4);
    wg_barrier(OP_NREG);
    for (int w = 0; w < 4; w++) {
        int theirs;
        memcpy(&theirs, warpx[((cur >> 5) & ~3) + w].slot[0], 4);
        if (theirs != n) fail("the threads of a warpgroup give setmaxnreg different counts");
    }
    wg_barrier(OP_NREG);
    const int w = cur / 128;
    if (!inc) {
        if (n > wg_regs[w]) fail("setmaxnreg.dec to more registers than the warpgroup holds");
        wg_regs[w] = n;
        return;
    }
    if (n < wg_regs[w]) fail("setmaxnreg.inc to fewer registers than the warpgroup holds");
    if (wg_regs[w] == n || block_registers(w, n) <= REGISTER_FILE) {
        wg_regs[w] = n;
        return;
    }
    threads[cur].state = AT_NREG;
    threads[cur].op = n;
    to_scheduler();
}

static std::mutex launch_mutex;

} // namespace emu

// ---------------------------------------------------------------------------------------------
// The CUDA names the kernels use.

#define threadIdx (emu::g_tid)
#define blockIdx (emu::g_bid)
#define blockDim (emu::g_bdim)
#define gridDim (emu::g_gdim)

static inline void __syncthreads() { emu::block_barrier(); }
template <class T> static inline T __shfl_xor_sync(unsigned mask, T v, int m) {
    return emu::shfl(mask, v, emu::lane() ^ m);
}
template <class T> static inline T __shfl_sync(unsigned mask, T v, int src) { return emu::shfl(mask, v, src); }

// Special functions, counted (glibc declares its own __expf and __logf, hence the macros).
static inline float emu_expf(float x) {
    emu::counts.special++;
    return expf(x);
}
static inline float emu_logf(float x) {
    emu::counts.special++;
    return logf(x);
}
static inline float emu_ex2(float x) {
    emu::counts.special++;
    return exp2f(x);
}
#define __expf emu_expf
#define __logf emu_logf
static inline float __fdividef(float a, float b) {
    emu::counts.special++;
    return a / b;
}
static inline float __int_as_float(int i) { return emu::bits_f((unsigned)i); }
static inline float __uint_as_float(unsigned u) { return emu::bits_f(u); }
static inline int __float_as_int(float f) { return (int)emu::f_bits(f); }

static inline int min(int a, int b) { return a < b ? a : b; }
static inline int max(int a, int b) { return a > b ? a : b; }
static inline long long min(long long a, long long b) { return a < b ? a : b; }
static inline long long max(long long a, long long b) { return a > b ? a : b; }

// One block runs at a time on one OS thread, so shared-memory atomics are plain updates.
static inline int atomicOr(int* a, int v) {
    int o = *a;
    *a = o | v;
    return o;
}
static inline int atomicMin(int* a, int v) {
    int o = *a;
    *a = o < v ? o : v;
    return o;
}
static inline float atomicAdd(float* a, float v) {
    float o = *a;
    *a = o + v;
    return o;
}
static inline int atomicMax(int* a, int v) {
    int o = *a;
    *a = o > v ? o : v;
    return o;
}

// The launch entry point, called from Rust (src/cuda/emu.rs). `kernel` is one of the kernels of the
// source (looked up by the generated `emu_kernel` table); `params` points at the KParams; `reverse`
// runs each block's threads from the last to the first between barriers (between two barriers the
// GPU may run them in any order, so a result that depends on the order is a missing barrier).
// Returns 0, or 1 with a message in `err`.
// The library is compiled with hidden visibility (emu.rs) and exports these two only. Everything
// else must stay private to it: several specialisations are loaded at once, and a default-visibility
// static inside an inline or template function (a __shared__ array in a templated kernel body) is
// bound process-wide by the dynamic linker (STB_GNU_UNIQUE), so two libraries running at the same
// time on two threads would share, and corrupt, each other's shared memory.
#define EMU_EXPORT __attribute__((visibility("default")))
extern "C" EMU_EXPORT void* emu_kernel(const char* name);

extern "C" EMU_EXPORT int emu_launch(const char* kernel, unsigned gx, unsigned gy, unsigned block, size_t smem,
                          const void* params, int reverse, emu::Counts* counts_out, char* err,
                                     size_t errlen) {
    std::lock_guard<std::mutex> lock(emu::launch_mutex);
    void* k = emu_kernel(kernel);
    auto out = [&](const std::string& m) {
        snprintf(err, errlen, "%s", m.c_str());
        return 1;
    };
    if (!k) return out(std::string("no kernel ") + kernel + " in this specialisation");
    if (block == 0 || block > 1024 || gx == 0 || gy == 0) return out("bad launch shape");
    emu::threads.assign(block, emu::Thread());
    emu::warpx.assign((block + 31) / 32, emu::WarpX());
    if (emu::stacks.size() < (size_t)block * emu::STACK) emu::stacks.resize((size_t)block * emu::STACK);
    emu::dyn.assign(smem + 16, 0);
    emu::error.clear();
    emu::g_kernel = (void (*)(const void*))k;
    emu::g_params = params;
    emu::g_reverse = reverse != 0;
    emu::counts = emu::Counts();
    emu::g_bdim = {block, 1, 1};
    emu::g_gdim = {gx, gy, 1};
    for (unsigned y = 0; y < gy; y++)
        for (unsigned x = 0; x < gx; x++) {
            emu::g_bid = {x, y, 0};
            if (!emu::run_block((int)block)) return out(emu::error);
        }
    *counts_out = emu::counts;
    return 0;
}

static inline void* emu_dyn_smem() {
    // 16-byte aligned start (std::vector<unsigned char> storage is malloc-aligned).
    return emu::dyn.data();
}
