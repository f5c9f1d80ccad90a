//! memc CUDA host shim: lets g++ compile the generated kernel sources (the exact text NVRTC
//! compiles) as C++17 and run them on the CPU.
//!
//! Execution model: the blocks of a launch run one after another; within a block every CUDA
//! thread is a fiber on one OS thread (switched by a few instructions on x86-64, by ucontext
//! elsewhere, whose every switch is a system call for the signal mask), so `__syncthreads` is a real barrier over
//! the block's live threads and the warp shuffles exchange values through a per-warp buffer
//! between two warp barriers. `__shared__` is `static`: one copy shared by a block's threads,
//! reused by the next block (blocks never overlap). A barrier that can never complete (a
//! divergent `__syncthreads` or shuffle) aborts with a message instead of hanging.
//!
//! `memc_sim::run_main` is the launcher: `prog ARENA gx gy gz bx by bz ARG...` loads the arena
//! file, launches the entry once with the arena base and the u64 arguments, writes it back.
//! With `MEMC_SIM_REVERSE` set in the environment, blocks and the threads within a block run
//! in reverse order, which changes the result of a kernel with a race between threads (a
//! missing barrier) or between blocks (overlapping non-atomic writes).
#pragma once
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <ucontext.h>

// ---- CUDA qualifiers ---------------------------------------------------------------------
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __shared__ static

// ---- vector types and launch coordinates -------------------------------------------------
struct uint3 {
    unsigned x, y, z;
};
struct dim3 {
    unsigned x = 1, y = 1, z = 1;
};
struct float2 {
    float x, y;
};
inline float2 make_float2(float x, float y) { return float2{x, y}; }

inline uint3 threadIdx, blockIdx;
inline dim3 blockDim, gridDim;

// ---- float intrinsics ----------------------------------------------------------------------
// The bits of `v` read as a `To` of the same size.
template <typename To, typename From> inline To memc_bit_cast(From v) {
    static_assert(sizeof(To) == sizeof(From), "bit casts keep the size");
    To t;
    memcpy(&t, &v, sizeof t);
    return t;
}
inline float __int_as_float(int v) { return memc_bit_cast<float>(v); }
inline int __float_as_int(float f) { return memc_bit_cast<int>(f); }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __logf(float x) { return logf(x); }
inline float __fdividef(float a, float b) { return a / b; }
// Round-to-nearest arithmetic that NVCC never fuses; x86-64 SSE rounds each operation alike.
inline float __fadd_rn(float a, float b) { return a + b; }
inline float __fsub_rn(float a, float b) { return a - b; }
inline float __fmul_rn(float a, float b) { return a * b; }
inline float __fdiv_rn(float a, float b) { return a / b; }
inline float __fsqrt_rn(float a) { return sqrtf(a); }

// ---- 16-bit floats: storage types with round-to-nearest-even conversions -------------------
struct __half {
    uint16_t bits;
};
struct __nv_bfloat16 {
    uint16_t bits;
};

inline float __half2float(__half h) {
    const uint32_t sign = (uint32_t)(h.bits & 0x8000u) << 16;
    const uint32_t exp = (h.bits >> 10) & 0x1fu, mant = h.bits & 0x3ffu;
    uint32_t bits;
    if (exp == 0) {
        bits = memc_bit_cast<uint32_t>(ldexpf((float)mant, -24));
    } else if (exp == 31) {
        bits = 0x7f800000u | (mant << 13);
    } else {
        bits = ((exp + 112u) << 23) | (mant << 13);
    }
    return memc_bit_cast<float>(bits | sign);
}
inline __half __float2half_rn(float f) {
    const uint32_t x = memc_bit_cast<uint32_t>(f);
    const uint16_t sign = (uint16_t)((x >> 16) & 0x8000u);
    const uint32_t ax = x & 0x7fffffffu;
    if (ax > 0x7f800000u) return __half{(uint16_t)(sign | 0x7e00u | ((ax >> 13) & 0x3ffu))};
    if (ax >= 0x477ff000u) return __half{(uint16_t)(sign | 0x7c00u)};  // >= 65520: inf
    if (ax < 0x38800000u) {                                               // subnormal half
        const float a = memc_bit_cast<float>(ax);
        return __half{(uint16_t)(sign | (uint16_t)nearbyintf(a * 16777216.0f))};
    }
    uint32_t h = ((((ax >> 23) - 112u) << 10) | ((ax >> 13) & 0x3ffu));
    const uint32_t rem = ax & 0x1fffu;
    if (rem > 0x1000u || (rem == 0x1000u && (h & 1u))) ++h;
    return __half{(uint16_t)(sign | h)};
}
inline float __bfloat162float(__nv_bfloat16 b) { return memc_bit_cast<float>((uint32_t)b.bits << 16); }
inline unsigned short __half_as_ushort(__half h) { return h.bits; }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 b) { return b.bits; }
inline __nv_bfloat16 __float2bfloat16_rn(float f) {
    const uint32_t x = memc_bit_cast<uint32_t>(f);
    if ((x & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(uint16_t)((x >> 16) | 0x40u)};
    return __nv_bfloat16{(uint16_t)((x + 0x7fffu + ((x >> 16) & 1u)) >> 16)};
}

// ---- the block scheduler -------------------------------------------------------------------
namespace memc_sim {

enum class State { Ready, AtBlockBarrier, AtWarpBarrier, Done };

// ---- fiber switching ------------------------------------------------------------------------
// A fiber's saved context: on x86-64 its stack pointer, with the callee-saved registers and
// the resume address pushed below it (memc_sim_switch); elsewhere a ucontext.
#if defined(__x86_64__)
struct Context {
    void* sp;
};
extern "C" void memc_sim_switch(void** save_sp, void* load_sp);
// Saves the callee-saved registers and the return address on the current stack and its
// pointer at *save_sp, then resumes the context whose stack pointer is load_sp.
asm(R"(
    .text
    .globl memc_sim_switch
    .type memc_sim_switch, @function
memc_sim_switch:
    pushq %rbp
    pushq %rbx
    pushq %r12
    pushq %r13
    pushq %r14
    pushq %r15
    movq %rsp, (%rdi)
    movq %rsi, %rsp
    popq %r15
    popq %r14
    popq %r13
    popq %r12
    popq %rbx
    popq %rbp
    ret
    .size memc_sim_switch, .-memc_sim_switch
)");
#else
struct Context {
    ucontext_t uc;
};
#endif

struct Fiber {
    Context ctx;
    char* stack;
    uint3 tid;
    unsigned linear;
    State state;
};

constexpr size_t kStackBytes = 256 * 1024;
constexpr unsigned kMaxThreads = 1024;

inline Context scheduler;
inline Fiber* fibers;
inline Fiber* current;
inline unsigned nthreads;
// Run blocks, and the ready threads of a block, in reverse order: a race-free kernel gives
// bit-identical results either way.
inline bool reverse_order;
inline void (*body)(void*);
inline void* body_arg;
// Values in flight through a warp shuffle: [warp][lane], 8 bytes each.
inline unsigned char shuffle_buf[kMaxThreads / 32][32][8];

[[noreturn]] inline void fail(const char* what) {
    fprintf(stderr, "cuda_sim: %s (block %u,%u,%u)\n", what, blockIdx.x, blockIdx.y, blockIdx.z);
    exit(70);
}

// Saves the running context in `from` and resumes `to`.
inline void switch_to(Context& from, Context& to) {
#if defined(__x86_64__)
    memc_sim_switch(&from.sp, to.sp);
#else
    if (swapcontext(&from.uc, &to.uc) != 0) fail("swapcontext failed");
#endif
}

inline void wait(State s) {
    current->state = s;
    switch_to(current->ctx, scheduler);
}

// A fiber's first frame: runs the kernel body, then returns to the scheduler for good.
inline void fiber_entry() {
    body(body_arg);
    current->state = State::Done;
    switch_to(current->ctx, scheduler);
    fail("a finished thread was resumed");
}

// Sets up f's context to start in fiber_entry on its own stack.
inline void start(Fiber& f) {
#if defined(__x86_64__)
    // Six zeroed callee-saved registers, then fiber_entry as the return address, so that
    // after memc_sim_switch's `ret` the stack pointer is 8 below a 16-byte boundary, as at
    // any function's entry.
    const uintptr_t top = ((uintptr_t)f.stack + kStackBytes) & ~(uintptr_t)15;
    void** sp = (void**)(top - 64);
    for (int i = 0; i < 6; ++i) sp[i] = nullptr;
    sp[6] = (void*)&fiber_entry;
    sp[7] = nullptr;
    f.ctx.sp = sp;
#else
    if (getcontext(&f.ctx.uc) != 0) fail("getcontext failed");
    f.ctx.uc.uc_stack.ss_sp = f.stack;
    f.ctx.uc.uc_stack.ss_size = kStackBytes;
    f.ctx.uc.uc_link = &scheduler.uc;
    makecontext(&f.ctx.uc, fiber_entry, 0);
#endif
}

// Completes the barriers every live participant has reached; false when none could.
inline bool release() {
    bool progress = false;
    for (unsigned w = 0; w * 32 < nthreads; ++w) {
        const unsigned lo = w * 32, hi = lo + 32 < nthreads ? lo + 32 : nthreads;
        bool all = true, any = false;
        for (unsigned t = lo; t < hi; ++t) {
            if (fibers[t].state == State::Done) continue;
            any = true;
            all = all && fibers[t].state == State::AtWarpBarrier;
        }
        if (any && all) {
            for (unsigned t = lo; t < hi; ++t)
                if (fibers[t].state == State::AtWarpBarrier) fibers[t].state = State::Ready;
            progress = true;
        }
    }
    if (progress) return true;
    bool all = true, any = false;
    for (unsigned t = 0; t < nthreads; ++t) {
        if (fibers[t].state == State::Done) continue;
        any = true;
        all = all && fibers[t].state == State::AtBlockBarrier;
    }
    if (any && all)
        for (unsigned t = 0; t < nthreads; ++t)
            if (fibers[t].state == State::AtBlockBarrier) fibers[t].state = State::Ready;
    return any && all;
}

// Runs one block: every thread until it finishes, completing barriers as they fill.
inline void run_block() {
    for (unsigned t = 0; t < nthreads; ++t) {
        Fiber& f = fibers[t];
        start(f);
        f.state = State::Ready;
    }
    for (;;) {
        bool live = false;
        for (unsigned i = 0; i < nthreads; ++i) {
            Fiber& f = fibers[reverse_order ? nthreads - 1 - i : i];
            if (f.state != State::Ready) {
                live = live || f.state != State::Done;
                continue;
            }
            current = &f;
            threadIdx = f.tid;
            switch_to(scheduler, f.ctx);
            live = live || f.state != State::Done;
        }
        if (!live) return;
        if (!release()) fail("deadlock: threads wait at barriers that cannot complete");
    }
}

// Launches `fn(arg)` over the grid, blocks in order (reversed under reverse_order).
inline void launch(dim3 grid, dim3 block, void (*fn)(void*), void* arg) {
    nthreads = block.x * block.y * block.z;
    if (nthreads == 0 || nthreads > kMaxThreads) fail("block size must be 1..1024");
    gridDim = grid;
    blockDim = block;
    body = fn;
    body_arg = arg;
    fibers = static_cast<Fiber*>(calloc(nthreads, sizeof(Fiber)));
    if (!fibers) fail("out of memory");
    for (unsigned t = 0; t < nthreads; ++t) {
        fibers[t].stack = static_cast<char*>(malloc(kStackBytes));
        if (!fibers[t].stack) fail("out of memory");
        fibers[t].linear = t;
        fibers[t].tid = uint3{t % block.x, (t / block.x) % block.y, t / (block.x * block.y)};
    }
    const unsigned long long blocks = (unsigned long long)grid.x * grid.y * grid.z;
    for (unsigned long long i = 0; i < blocks; ++i) {
        const unsigned long long b = reverse_order ? blocks - 1 - i : i;
        blockIdx = uint3{(unsigned)(b % grid.x), (unsigned)(b / grid.x % grid.y), (unsigned)(b / grid.x / grid.y)};
        run_block();
    }
    for (unsigned t = 0; t < nthreads; ++t) free(fibers[t].stack);
    free(fibers);
    fibers = nullptr;
}

// Warp shuffle: publishes v, waits for the warp, reads lane `src` (own value when out of
// range), waits again so the buffer can be reused.
template <typename T> inline T shuffle(T v, int src) {
    static_assert(sizeof(T) <= 8, "shuffle of at most 8 bytes");
    const unsigned lane = current->linear & 31u, warp = current->linear >> 5;
    memcpy(shuffle_buf[warp][lane], &v, sizeof(T));
    wait(State::AtWarpBarrier);
    T r = v;
    if (src >= 0 && src < 32 && warp * 32 + (unsigned)src < nthreads) memcpy(&r, shuffle_buf[warp][src], sizeof(T));
    wait(State::AtWarpBarrier);
    return r;
}

inline unsigned lane() { return current->linear & 31u; }

// Registers in flight through a tensor-core MMA: [warp][lane], a0..a3 then b0, b1.
inline unsigned mma_buf[kMaxThreads / 32][32][6];

// The value of one 16-bit half of an MMA register.
inline float mma_half(unsigned reg, unsigned hi, __half) { return __half2float(__half{(uint16_t)(reg >> (16 * hi))}); }
inline float mma_half(unsigned reg, unsigned hi, __nv_bfloat16) {
    return __bfloat162float(__nv_bfloat16{(uint16_t)(reg >> (16 * hi))});
}

// `mma.sync.aligned.m16n8k16.row.col.f32.{T}.{T}.f32` with d as both C and D: every lane of
// the warp publishes its A and B registers, waits for the warp, then adds to its four
// accumulators the products of the whole tile (exact in fp32), summed in k order; waits again
// so the buffer can be reused. Fragment layout as the PTX ISA states it (lane = 4 g + t).
template <typename T> inline void mma_16816(float (&d)[4], const unsigned (&a)[4], const unsigned (&b)[2]) {
    const unsigned me = lane(), warp = current->linear >> 5;
    unsigned* mine = mma_buf[warp][me];
    for (int i = 0; i < 4; ++i) mine[i] = a[i];
    mine[4] = b[0];
    mine[5] = b[1];
    wait(State::AtWarpBarrier);
    const unsigned(*regs)[6] = mma_buf[warp];
    const unsigned g = me >> 2, t = me & 3u;
    for (int c = 0; c < 4; ++c) {
        const unsigned row = g + 8u * (unsigned)(c >> 1), col = 2u * t + (unsigned)(c & 1);
        float sum = 0.0f;
        for (unsigned k = 0; k < 16; ++k) {
            // A(row, k): lane 4 (row % 8) + (k % 8) / 2, reg (row / 8) + 2 (k / 8), half k % 2.
            const float x = mma_half(regs[4 * (row % 8) + (k % 8) / 2][(row / 8) + 2 * (k / 8)], k % 2, T{});
            // B(k, col): lane 4 col + (k % 8) / 2, reg 4 + k / 8, half k % 2.
            const float y = mma_half(regs[4 * col + (k % 8) / 2][4 + k / 8], k % 2, T{});
            sum += x * y;
        }
        d[c] += sum;
    }
    wait(State::AtWarpBarrier);
}

// `prog ARENA gx gy gz bx by bz ARG...`: runs `entry(arena, args)` on the arena file in
// place. `nargs` is the number of u64 arguments the entry takes after the arena.
inline int run_main(int argc, char** argv, int nargs, void (*entry)(char*, const unsigned long long*)) {
    if (argc != 8 + nargs) {
        fprintf(stderr, "usage: %s ARENA gx gy gz bx by bz (%d u64 arguments)\n", argv[0], nargs);
        return 64;
    }
    FILE* f = fopen(argv[1], "rb");
    if (!f) fail("cannot open the arena file");
    fseek(f, 0, SEEK_END);
    const long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char* arena = static_cast<char*>(aligned_alloc(256, ((size_t)size + 255) / 256 * 256 + 256));
    if (!arena || fread(arena, 1, (size_t)size, f) != (size_t)size) fail("cannot read the arena file");
    fclose(f);
    reverse_order = getenv("MEMC_SIM_REVERSE") != nullptr;
    dim3 grid, block;
    grid.x = (unsigned)strtoul(argv[2], nullptr, 10);
    grid.y = (unsigned)strtoul(argv[3], nullptr, 10);
    grid.z = (unsigned)strtoul(argv[4], nullptr, 10);
    block.x = (unsigned)strtoul(argv[5], nullptr, 10);
    block.y = (unsigned)strtoul(argv[6], nullptr, 10);
    block.z = (unsigned)strtoul(argv[7], nullptr, 10);
    unsigned long long* args = static_cast<unsigned long long*>(calloc((size_t)nargs + 1, 8));
    if (!args) fail("out of memory");
    for (int i = 0; i < nargs; ++i) args[i] = strtoull(argv[8 + i], nullptr, 10);
    struct Call {
        void (*entry)(char*, const unsigned long long*);
        char* arena;
        const unsigned long long* args;
    } call{entry, arena, args};
    launch(grid, block, [](void* p) { const Call* c = static_cast<const Call*>(p); c->entry(c->arena, c->args); }, &call);
    f = fopen(argv[1], "wb");
    if (!f || fwrite(arena, 1, (size_t)size, f) != (size_t)size || fclose(f) != 0) fail("cannot write the arena file");
    free(args);
    free(arena);
    return 0;
}

}  // namespace memc_sim

inline void __syncthreads() { memc_sim::wait(memc_sim::State::AtBlockBarrier); }
inline void __syncwarp(unsigned = 0xffffffffu) { memc_sim::wait(memc_sim::State::AtWarpBarrier); }
template <typename T> inline T __shfl_sync(unsigned, T v, int src, int = 32) { return memc_sim::shuffle(v, src & 31); }
template <typename T> inline T __shfl_xor_sync(unsigned, T v, int mask, int = 32) {
    return memc_sim::shuffle(v, (int)(memc_sim::lane() ^ (unsigned)mask));
}
template <typename T> inline T __shfl_down_sync(unsigned, T v, unsigned delta, int = 32) {
    return memc_sim::shuffle(v, (int)(memc_sim::lane() + delta));
}
template <typename T> inline T __shfl_up_sync(unsigned, T v, unsigned delta, int = 32) {
    return memc_sim::shuffle(v, (int)memc_sim::lane() - (int)delta);
}
// Only one fiber runs at a time, so read-modify-write is atomic.
template <typename T> inline T atomicAdd(T* p, T v) {
    const T old = *p;
    *p = old + v;
    return old;
}
// Blocks run one after another, so every write is visible to the blocks after it.
inline void __threadfence() {}
template <typename T> inline T __ldcg(const T* p) { return *p; }
template <typename T> inline T atomicMax(T* p, T v) {
    const T old = *p;
    if (v > old) *p = v;
    return old;
}
