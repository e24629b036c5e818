// The large temporaries of one CPU kernel call: K/V copies, V^T blocks, gradient accumulators and
// dQ partials, freed when the call ends.
//
// They are fresh memory on every call, and fresh memory costs a page fault (and the kernel's
// zeroing) per page on first touch: with 4 KiB pages that was 10% of a backward call at
// L = 2048 (measured). Arrays of 2 MiB and more are therefore mapped 2 MiB-aligned and advised
// as transparent huge pages (MADV_HUGEPAGE; honoured when the system's THP setting is `always`
// or `madvise`), one fault per 2 MiB. Only whole 2 MiB extents are advised, so no array commits
// more memory than it touches; nothing is kept between calls, so memory stays one call's working
// set.
#pragma once

#include <cstddef>
#include <vector>

namespace ringattn::kernels::cpu {

class Workspace {
 public:
  Workspace() = default;
  ~Workspace();
  Workspace(const Workspace&) = delete;
  Workspace& operator=(const Workspace&) = delete;

  // n uninitialised elements of T, 64-byte aligned, valid until the workspace is destroyed.
  template <class T>
  T* take(size_t n) {
    return static_cast<T*>(take_bytes(n * sizeof(T)));
  }

 private:
  void* take_bytes(size_t bytes);

  struct Region {
    void* base;
    size_t bytes;
    bool mapped;  // mmap'd (huge-page candidate) or from aligned_alloc
  };
  std::vector<Region> regions_;
};

}  // namespace ringattn::kernels::cpu
