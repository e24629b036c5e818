// The CPU emulation of CUDA behind cuda_emulation.hpp: fibers for the threads of a block,
// exact block and warp barriers, warp shuffles and mma.sync as warp collectives.
#include "emulation/cuda/cuda_emulation.hpp"

#include "util/dtype.hpp"

#include <ucontext.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

// Switching fibers: on x86-64 a few instructions (callee-saved registers and the stack
// pointer); elsewhere swapcontext, which also saves the signal mask with a system call.
#if defined(__x86_64__)
extern "C" void cuda_emulation_switch(void** save_sp, void* load_sp);
asm(R"(
.text
.globl cuda_emulation_switch
.type cuda_emulation_switch,@function
cuda_emulation_switch:
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
.size cuda_emulation_switch, .-cuda_emulation_switch
)");
#define CUDA_EMULATION_FAST_SWITCH 1
#endif

namespace cuda_emulation {
namespace {

constexpr size_t kStackBytes = 128 * 1024;
constexpr size_t kDefaultSharedLimit = 48 * 1024;
int g_major = 9, g_minor = 0;  // the emulated compute capability
// The block maximum of dynamic shared memory: sm_80's, sm_90's (and newer).
size_t opt_in_shared_limit() { return g_major >= 9 ? 232448 : 166912; }

// Threads that meet at a barrier: the whole block, or one warp.
struct Group {
  int live = 0;
  int arrived = 0;
  uint64_t generation = 0;
};

struct WarpExchange {
  float values[2][32];  // alternating: a lane may write the next shuffle's value before all read this one
  const unsigned char* rows[2][32];  // ldmatrix row addresses, alternating likewise
  uint32_t a[32][4];
  uint32_t b[32][2];
  float c[32][4];
  float d[32][4];
};

// Fiber stacks, kept from block to block.
std::vector<std::unique_ptr<char[]>>& stacks() {
  static std::vector<std::unique_ptr<char[]>> pool;
  return pool;
}

struct AsyncCopy {
  void* dst;
  const void* src;
  size_t bytes;
};

struct Fiber {
  std::vector<AsyncCopy> open_group;              // cp.async issued, not committed
  std::vector<std::vector<AsyncCopy>> in_flight;  // committed groups, oldest first
  ucontext_t context{};
  void* sp = nullptr;  // saved stack pointer (fast switch)
  Coordinates coords;
  bool done = false;
  Group* waiting = nullptr;
  uint64_t wait_generation = 0;
};

struct Block {
  std::vector<Fiber> fibers;
  Group block;
  std::vector<Group> warps;
  std::vector<WarpExchange> exchange;
  std::vector<int> shuffle_parity;  // per lane: which of the two shuffle buffers is next
  std::vector<int> matrix_parity;   // per lane: which of the two ldmatrix address buffers is next
  ucontext_t scheduler{};
  void* scheduler_sp = nullptr;
  int current = -1;
  const std::function<void()>* body = nullptr;
  std::exception_ptr error;
};

Block* g_block = nullptr;

void to_scheduler(Fiber& f) {
#if defined(CUDA_EMULATION_FAST_SWITCH)
  cuda_emulation_switch(&f.sp, g_block->scheduler_sp);
#else
  swapcontext(&f.context, &g_block->scheduler);
#endif
}

void to_fiber(Block& b, Fiber& f) {
#if defined(CUDA_EMULATION_FAST_SWITCH)
  cuda_emulation_switch(&b.scheduler_sp, f.sp);
#else
  swapcontext(&b.scheduler, &f.context);
#endif
}
const Coordinates g_outside{};
const Coordinates* g_coords = &g_outside;
cudaError_t g_last_error = cudaSuccess;
std::map<const void*, int> g_shared_opt_in;
std::vector<unsigned char*>& shared_buffers() {
  static std::vector<unsigned char*> buffers;
  return buffers;
}

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("CUDA emulation: " + what); }

Fiber& current_fiber() {
  if (!g_block || g_block->current < 0) fail("a device function was called outside a kernel");
  return g_block->fibers[size_t(g_block->current)];
}

int thread_index() { return int(current_fiber().coords.thread.x); }

void release(Group& g) {
  g.arrived = 0;
  ++g.generation;
}

void wait_at(Group& g) {
  Fiber& f = current_fiber();
  const uint64_t generation = g.generation;
  if (++g.arrived == g.live) {
    release(g);
    return;
  }
  f.waiting = &g;
  f.wait_generation = generation;
  to_scheduler(f);  // back here once the group is released
  f.waiting = nullptr;
}

void fiber_main() {
  Block& b = *g_block;
  try {
    (*b.body)();
  } catch (...) {
    if (!b.error) b.error = std::current_exception();
  }
  Fiber& f = b.fibers[size_t(b.current)];
  f.done = true;
  // An exited thread no longer takes part in barriers; but a warp-synchronous operation that
  // some lanes wait in while another lane exits is a bug (undefined on the GPU).
  Group& warp = b.warps[size_t(f.coords.thread.x / 32)];
  if (warp.arrived > 0 && !b.error)
    b.error =
        std::make_exception_ptr(std::runtime_error("CUDA emulation: a thread exited while its warp waits in "
                                                   "__syncwarp, a shuffle or mma.sync"));
  if (b.block.arrived > 0 && !b.error)
    b.error =
        std::make_exception_ptr(std::runtime_error("CUDA emulation: a thread exited while others wait in "
                                                   "__syncthreads"));
  for (Group* g : {&b.block, &warp}) {
    --g->live;
    if (g->live > 0 && g->arrived == g->live) release(*g);
  }
#if defined(CUDA_EMULATION_FAST_SWITCH)
  to_scheduler(f);  // never resumed
  std::abort();
#endif
  // Returning resumes the scheduler (uc_link).
}

void run_block(const std::function<void()>& body, dim3 grid, dim3 block, uint3 block_index) {
  const int threads = int(block.x * block.y * block.z);
  Block b;
  b.body = &body;
  b.fibers.resize(size_t(threads));
  b.block.live = threads;
  const int warps = (threads + 31) / 32;
  b.warps.resize(size_t(warps));
  b.exchange.resize(size_t(warps));
  b.shuffle_parity.assign(size_t(threads), 0);
  b.matrix_parity.assign(size_t(threads), 0);
  for (int w = 0; w < warps; ++w) b.warps[size_t(w)].live = std::min(32, threads - 32 * w);
  Block* outer = g_block;
  g_block = &b;
  for (int t = 0; t < threads; ++t) {
    Fiber& f = b.fibers[size_t(t)];
    f.coords.thread = uint3{unsigned(t % int(block.x)), unsigned((t / int(block.x)) % int(block.y)),
                            unsigned(t / int(block.x * block.y))};
    f.coords.block = block_index;
    f.coords.block_dim = block;
    f.coords.grid_dim = grid;
    if (stacks().size() <= size_t(t)) stacks().emplace_back(new char[kStackBytes]);
#if defined(CUDA_EMULATION_FAST_SWITCH)
    // The initial frame that cuda_emulation_switch pops: six registers, then fiber_main as the
    // return address, placed so that fiber_main starts with the stack alignment of a call.
    uintptr_t top = reinterpret_cast<uintptr_t>(stacks()[size_t(t)].get() + kStackBytes) & ~uintptr_t(15);
    void** frame = reinterpret_cast<void**>(top - 16);
    frame[0] = reinterpret_cast<void*>(&fiber_main);
    f.sp = frame - 6;
    for (int r = 0; r < 6; ++r) static_cast<void**>(f.sp)[r] = nullptr;
#else
    getcontext(&f.context);
    f.context.uc_stack.ss_sp = stacks()[size_t(t)].get();
    f.context.uc_stack.ss_size = kStackBytes;
    f.context.uc_link = &b.scheduler;
    makecontext(&f.context, fiber_main, 0);
#endif
  }
  for (;;) {
    bool all_done = true, progressed = false;
    for (int t = 0; t < threads; ++t) {
      Fiber& f = b.fibers[size_t(t)];
      if (f.done) continue;
      all_done = false;
      if (f.waiting && f.waiting->generation == f.wait_generation) continue;  // still held at a barrier
      b.current = t;
      g_coords = &f.coords;
      to_fiber(b, f);
      progressed = true;
      if (b.error) break;
    }
    if (all_done || b.error) break;
    if (!progressed) {
      b.error = std::make_exception_ptr(
          std::runtime_error("CUDA emulation: deadlock: threads of a block wait at different barriers"));
      break;
    }
  }
  g_block = outer;
  g_coords = &g_outside;
  if (b.error) std::rethrow_exception(b.error);
}

}  // namespace

const Coordinates& coordinates() { return *g_coords; }

void sync_block() {
  current_fiber();
  wait_at(g_block->block);
}

void sync_warp() {
  current_fiber();
  wait_at(g_block->warps[size_t(thread_index() / 32)]);
}

float shuffle(float value, int source_lane) {
  const int t = thread_index();
  WarpExchange& ex = g_block->exchange[size_t(t / 32)];
  int& parity = g_block->shuffle_parity[size_t(t)];
  float* values = ex.values[parity];
  parity ^= 1;
  values[t % 32] = value;
  sync_warp();  // a lane can then write the other buffer, but this one only after the next barrier
  return values[source_lane & 31];
}

unsigned ballot(bool predicate) {
  const int t = thread_index();
  if (g_block->warps[size_t(t / 32)].live != 32) fail("__ballot_sync over a full mask needs all 32 lanes of the warp");
  WarpExchange& ex = g_block->exchange[size_t(t / 32)];
  int& parity = g_block->shuffle_parity[size_t(t)];  // the shuffles' alternating buffers
  float* values = ex.values[parity];
  parity ^= 1;
  values[t % 32] = predicate ? 1.0f : 0.0f;
  sync_warp();
  unsigned bits = 0;
  for (int l = 0; l < 32; ++l)
    if (values[l] != 0.0f) bits |= 1u << l;
  return bits;
}

void load_matrix(uint32_t* out, int matrices, bool transpose, const void* row_address) {
  const int t = thread_index(), lane = t % 32;
  if (g_block->warps[size_t(t / 32)].live != 32) fail("ldmatrix needs all 32 lanes of the warp");
  if (matrices != 1 && matrices != 2 && matrices != 4) fail("ldmatrix loads 1, 2 or 4 matrices");
  const auto* address = static_cast<const unsigned char*>(row_address);
  if (lane < 8 * matrices) {
    if (reinterpret_cast<uintptr_t>(address) % 16 != 0) fail("ldmatrix row address not 16-byte aligned");
    bool inside = false;
    for (unsigned char* s : shared_buffers())
      inside = inside || (address >= s && address + 16 <= s + kSharedBytes);
    if (!inside) fail("ldmatrix row address outside shared memory");
  }
  WarpExchange& ex = g_block->exchange[size_t(t / 32)];
  int& parity = g_block->matrix_parity[size_t(t)];
  const unsigned char* const* rows = ex.rows[parity];
  ex.rows[parity][lane] = address;
  parity ^= 1;
  sync_warp();  // every lane's address is in; this buffer is rewritten only after the next barrier
  const int r = lane / 4, c = 2 * (lane % 4);
  auto element = [&](int matrix, int row, int col) {
    uint16_t v;
    std::memcpy(&v, rows[8 * matrix + row] + 2 * col, 2);
    return uint32_t(v);
  };
  for (int i = 0; i < matrices; ++i)
    out[i] = transpose ? element(i, c, r) | (element(i, c + 1, r) << 16) : element(i, r, c) | (element(i, r, c + 1) << 16);
}

void mma_m16n8k16(float (&d)[4], const uint32_t (&a)[4], const uint32_t (&b)[2], MmaInput input) {
  const int t = thread_index(), lane = t % 32;
  if (g_block->warps[size_t(t / 32)].live != 32) fail("mma.sync needs all 32 lanes of the warp");
  WarpExchange& ex = g_block->exchange[size_t(t / 32)];
  for (int i = 0; i < 4; ++i) ex.a[lane][i] = a[i], ex.c[lane][i] = d[i];
  for (int i = 0; i < 2; ++i) ex.b[lane][i] = b[i];
  sync_warp();
  if (lane == 0) {
    auto decode = [&](uint32_t reg, int half) {
      const uint16_t bits = uint16_t(reg >> (16 * half));
      if (input == MmaInput::f16) return half_bits_to_float(bits);
      const uint32_t u = uint32_t(bits) << 16;
      float f;
      std::memcpy(&f, &u, 4);
      return f;
    };
    // Fragment layouts of mma.m16n8k16 (PTX ISA, "Matrix Fragments for mma.m16n8k16"):
    // element i of a lane's fragment sits in register i / 2, low half for even i.
    float A[16][16], B[16][8], C[16][8];
    int filled_a[16][16] = {}, filled_b[16][8] = {}, filled_c[16][8] = {};
    for (int l = 0; l < 32; ++l) {
      const int group = l >> 2, q = l & 3;
      for (int i = 0; i < 8; ++i) {
        const int row = (i < 2 || (i >= 4 && i < 6)) ? group : group + 8;
        const int col = q * 2 + (i & 1) + (i >= 4 ? 8 : 0);
        A[row][col] = decode(ex.a[l][i / 2], i & 1);
        ++filled_a[row][col];
      }
      for (int i = 0; i < 4; ++i) {
        const int row = q * 2 + (i & 1) + (i >= 2 ? 8 : 0);
        B[row][group] = decode(ex.b[l][i / 2], i & 1);
        ++filled_b[row][group];
      }
      for (int i = 0; i < 4; ++i) {
        const int row = i < 2 ? group : group + 8, col = q * 2 + (i & 1);
        C[row][col] = ex.c[l][i];
        ++filled_c[row][col];
      }
    }
    for (int r = 0; r < 16; ++r)
      for (int c = 0; c < 16; ++c)
        if (filled_a[r][c] != 1 || (c < 8 && (filled_b[r][c] != 1 || filled_c[r][c] != 1)))
          fail("mma fragment layout is not a bijection");
    for (int l = 0; l < 32; ++l) {
      const int group = l >> 2, q = l & 3;
      for (int i = 0; i < 4; ++i) {
        const int row = i < 2 ? group : group + 8, col = q * 2 + (i & 1);
        float acc = C[row][col];
        for (int k = 0; k < 16; ++k) acc += A[row][k] * B[k][col];
        ex.d[l][i] = acc;
      }
    }
  }
  sync_warp();
  // (No barrier after reading: lane 0 overwrites ex.d only after the next call's first barrier,
  // which every lane reaches after reading.)
  for (int i = 0; i < 4; ++i) d[i] = ex.d[lane][i];
}

void wait_equal(const int* flag, int value) {
  current_fiber();
  if (*flag != value)
    fail("a block waits for a flag to hold " + std::to_string(value) + " but it holds " + std::to_string(*flag) +
         ": the block that sets it has not run before this one (on a GPU the wait may never end)");
}

void async_copy(void* shared_dst, const void* global_src, size_t bytes) {
  current_fiber().open_group.push_back({shared_dst, global_src, bytes});
}

void async_commit() {
  Fiber& f = current_fiber();
  f.in_flight.push_back(std::move(f.open_group));
  f.open_group.clear();
}

void async_wait(int groups_in_flight) {
  Fiber& f = current_fiber();
  while (int(f.in_flight.size()) > groups_in_flight) {
    for (const AsyncCopy& c : f.in_flight.front()) std::memcpy(c.dst, c.src, c.bytes);
    f.in_flight.erase(f.in_flight.begin());
  }
}

void run_grid(const void* kernel, dim3 grid, dim3 block, size_t shared_bytes, const std::function<void()>& body) {
  if (g_block) fail("kernel launched from inside a kernel");
  const size_t threads = size_t(block.x) * block.y * block.z;
  if (threads == 0 || threads > 1024 || grid.x == 0 || grid.y == 0 || grid.z == 0 || grid.y > 65535 || grid.z > 65535) {
    g_last_error = cudaErrorInvalidConfiguration;
    return;
  }
  const auto opt_in = g_shared_opt_in.find(kernel);
  const size_t limit = opt_in == g_shared_opt_in.end() ? kDefaultSharedLimit : size_t(opt_in->second);
  if (shared_bytes > limit || shared_bytes > opt_in_shared_limit()) {
    std::fprintf(stderr, "CUDA emulation: %zu bytes of dynamic shared memory, the kernel's limit is %zu\n",
                 shared_bytes, std::min(limit, opt_in_shared_limit()));
    g_last_error = cudaErrorInvalidValue;
    return;
  }
  for (unsigned z = 0; z < grid.z; ++z)
    for (unsigned y = 0; y < grid.y; ++y)
      for (unsigned x = 0; x < grid.x; ++x) {
        for (unsigned char* buffer : shared_buffers()) std::memset(buffer, 0xff, shared_bytes);  // NaN bytes
        run_block(body, grid, block, uint3{x, y, z});
      }
}

void set_max_dynamic_shared(const void* kernel, int bytes) { g_shared_opt_in[kernel] = bytes; }

void set_compute_capability(int major, int minor) { g_major = major, g_minor = minor; }

cudaError_t take_last_error(bool clear) {
  const cudaError_t e = g_last_error;
  if (clear) g_last_error = cudaSuccess;
  return e;
}

bool register_shared(unsigned char* buffer) {
  shared_buffers().push_back(buffer);
  return true;
}

uint16_t float_to_half_bits(float f) { return ringattn::float_to_fp16(f); }

float half_bits_to_float(uint16_t h) { return ringattn::fp16_to_float(h); }

}  // namespace cuda_emulation

const char* cudaGetErrorString(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "no error";
    case cudaErrorInvalidValue:
      return "invalid argument";
    case cudaErrorMemoryAllocation:
      return "out of memory";
    case cudaErrorInvalidConfiguration:
      return "invalid configuration argument";
    case cudaErrorInvalidPitchValue:
      return "invalid pitch argument";
    case cudaErrorNoDevice:
      return "no CUDA-capable device is detected";
    default:
      return "unspecified launch failure";
  }
}

const char* cudaGetErrorName(cudaError_t e) {
  switch (e) {
    case cudaSuccess:
      return "cudaSuccess";
    case cudaErrorInvalidValue:
      return "cudaErrorInvalidValue";
    case cudaErrorMemoryAllocation:
      return "cudaErrorMemoryAllocation";
    case cudaErrorInvalidConfiguration:
      return "cudaErrorInvalidConfiguration";
    case cudaErrorNoDevice:
      return "cudaErrorNoDevice";
    default:
      return "cudaErrorLaunchFailure";
  }
}

namespace {
// "Device" allocations: start address -> size.
std::map<uintptr_t, size_t>& device_allocations() {
  static std::map<uintptr_t, size_t> allocations;
  return allocations;
}
}  // namespace

cudaError_t cudaMalloc(void** p, size_t bytes) {
  // Exactly `bytes` (a GPU rounds allocations up): under AddressSanitizer an access past the end
  // of a device buffer is reported.
  if (posix_memalign(p, 256, bytes ? bytes : 1) != 0) return cudaErrorMemoryAllocation;
  std::memset(*p, 0xff, bytes);  // device memory starts as garbage: NaN bytes
  device_allocations()[reinterpret_cast<uintptr_t>(*p)] = bytes ? bytes : 1;
  return cudaSuccess;
}
cudaError_t cudaFree(void* p) {
  if (!p) return cudaSuccess;
  if (!device_allocations().erase(reinterpret_cast<uintptr_t>(p))) return cudaErrorInvalidValue;
  std::free(p);
  return cudaSuccess;
}
cudaError_t cudaPointerGetAttributes(cudaPointerAttributes* attributes, const void* p) {
  *attributes = cudaPointerAttributes{};
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  auto it = device_allocations().upper_bound(a);
  if (it != device_allocations().begin()) {
    --it;
    if (a < it->first + it->second) attributes->type = cudaMemoryTypeDevice;
  }
  return cudaSuccess;
}
cudaError_t cudaMallocHost(void** p, size_t bytes) {
  *p = std::malloc(bytes ? bytes : 1);
  return *p ? cudaSuccess : cudaErrorMemoryAllocation;
}
cudaError_t cudaFreeHost(void* p) {
  std::free(p);
  return cudaSuccess;
}
// Devices, streams and events: emulation/cuda/streams.cpp.
cudaError_t cudaGetDeviceProperties(cudaDeviceProp* prop, int) {
  *prop = cudaDeviceProp{};
  prop->major = cuda_emulation::g_major, prop->minor = cuda_emulation::g_minor;
  return cudaSuccess;
}
cudaError_t cudaDeviceGetAttribute(int* value, cudaDeviceAttr attribute, int) {
  switch (attribute) {
    case cudaDevAttrComputeCapabilityMajor:
      *value = cuda_emulation::g_major;
      return cudaSuccess;
    case cudaDevAttrComputeCapabilityMinor:
      *value = cuda_emulation::g_minor;
      return cudaSuccess;
  }
  return cudaErrorInvalidValue;
}
