#include "kernels/cpu/workspace.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <new>

namespace ringattn::kernels::cpu {

namespace {

constexpr size_t kLine = 64;                // a cache line, and the widest vector
constexpr size_t kHugePage = size_t{2} << 20;
constexpr size_t kPage = 4096;

size_t round_up(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

// bytes (a multiple of kPage) mapped at a kHugePage boundary, its whole huge-page extents
// advised as huge pages. Returns null when the system refuses the mapping.
void* map_huge_aligned(size_t bytes) {
  const size_t span = bytes + kHugePage;
  void* raw = mmap(nullptr, span, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (raw == MAP_FAILED) return nullptr;
  const auto start = reinterpret_cast<uintptr_t>(raw);
  const uintptr_t aligned = round_up(start, kHugePage);
  if (aligned > start) munmap(raw, aligned - start);  // the unaligned head
  const uintptr_t end = aligned + bytes;
  if (start + span > end) munmap(reinterpret_cast<void*>(end), start + span - end);  // the tail
  const size_t huge = bytes / kHugePage * kHugePage;
  if (huge > 0) madvise(reinterpret_cast<void*>(aligned), huge, MADV_HUGEPAGE);  // advice only
  return reinterpret_cast<void*>(aligned);
}

}  // namespace

void* Workspace::take_bytes(size_t bytes) {
  regions_.reserve(regions_.size() + 1);  // so that recording the region cannot throw and leak it
  if (bytes >= kHugePage) {
    const size_t mapped = round_up(bytes, kPage);
    if (void* p = map_huge_aligned(mapped)) {
      regions_.push_back(Region{p, mapped, true});
      return p;
    }
  }
  void* p = std::aligned_alloc(kLine, round_up(bytes == 0 ? 1 : bytes, kLine));
  if (!p) throw std::bad_alloc();
  regions_.push_back(Region{p, bytes, false});
  return p;
}

Workspace::~Workspace() {
  for (const Region& r : regions_) {
    if (r.mapped)
      munmap(r.base, r.bytes);
    else
      std::free(r.base);
  }
}

}  // namespace ringattn::kernels::cpu
