// The large temporaries of one CPU kernel call: K/V copies, V^T blocks, gradient accumulators and
// dQ partials.
//
// Fresh memory costs a page fault (and the kernel's zeroing) per page on first touch: with 4 KiB
// pages that was 10% of a backward call at L = 2048 (measured). Arrays of 2 MiB and more are
// therefore mapped 2 MiB-aligned and advised as transparent huge pages (MADV_HUGEPAGE; honoured
// when the system's THP setting is `always` or `madvise`), and only whole 2 MiB extents are
// advised, so no array commits more memory than it touches.
//
// Huge pages alone were not enough: where the kernel's THP defrag setting is `madvise` (Debian's
// default), an advised fault that finds no free 2 MiB page compacts memory synchronously, and on
// a machine whose memory is fragmented that made packing K and V^T 5-10x slower at L = 8192
// (0.09-0.25 s a call instead of 0.04 s, measured). So the mappings a call frees are kept for the
// next call, as PyTorch's caching allocators keep device memory: a ring step's calls ask for the
// same sizes, and reuse costs neither faults nor compaction. The cache never raises the peak:
// a call that finds no cached region of its size (up to a quarter larger) first unmaps every
// cached region it has not taken, so a process holds at most what its largest call used.
// `release_cached_workspace` hands the cache back to the system.
#pragma once

#include <cstddef>
#include <vector>

namespace ringattn::kernels::cpu {

class Workspace {
 public:
  Workspace() = default;
  ~Workspace();  // mapped arrays go to the cache, the rest back to the heap
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // n uninitialised elements of T, 64-byte aligned, valid until the workspace is destroyed.
  template <class T>
  T* take(size_t n) {
    return static_cast<T*>(take_bytes(n * sizeof(T)));
  }

  struct Region {
    void* base;
    size_t bytes;
    bool mapped;  // mmap'd (huge-page candidate, cached when freed) or from aligned_alloc
  };

 private:
  void* take_bytes(size_t bytes);

  std::vector<Region> regions_;
};

// Unmaps every cached region no call is using. Safe at any time, from any thread.
void release_cached_workspace();

// Bytes the cache holds for the next call (mapped, not in use).
size_t cached_workspace_bytes();

}  // namespace ringattn::kernels::cpu
