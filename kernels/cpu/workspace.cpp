#include "kernels/cpu/workspace.hpp"

#include <sys/mman.h>

#include <cstdint>
#include <cstdlib>
#include <mutex>
#include <new>
#include <optional>

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

// The mapped regions that finished calls freed, for the next calls to reuse. One per process,
// shared by every thread that runs kernels.
class RegionCache {
 public:
  // A cached region of at least `bytes` and at most a quarter more (the smallest such), or
  // nothing. On a miss every cached region goes back to the system before the caller maps a new
  // one, so the cache and the new mapping never coexist: peak memory stays what it would be
  // uncached.
  std::optional<Workspace::Region> take(size_t bytes) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto best = free_.end();
    for (auto it = free_.begin(); it != free_.end(); ++it)
      if (it->bytes >= bytes && it->bytes - bytes <= bytes / 4 && (best == free_.end() || it->bytes < best->bytes))
        best = it;
    if (best == free_.end()) {
      unmap_all();
      return std::nullopt;
    }
    const Workspace::Region region = *best;
    free_.erase(best);
    return region;
  }

  void put(const Workspace::Region& region) {
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      free_.push_back(region);
    } catch (const std::bad_alloc&) {  // no room to remember it: give it back instead
      munmap(region.base, region.bytes);
    }
  }

  void release() {
    std::lock_guard<std::mutex> lock(mutex_);
    unmap_all();
  }

  size_t bytes() {
    std::lock_guard<std::mutex> lock(mutex_);
    size_t total = 0;
    for (const auto& r : free_) total += r.bytes;
    return total;
  }

 private:
  void unmap_all() {
    for (const auto& r : free_) munmap(r.base, r.bytes);
    free_.clear();
  }

  std::mutex mutex_;
  std::vector<Workspace::Region> free_;
};

// Never destroyed: calls may still free workspaces while static objects are torn down.
RegionCache& region_cache() {
  static auto* cache = new RegionCache;
  return *cache;
}

}  // namespace

void* Workspace::take_bytes(size_t bytes) {
  regions_.reserve(regions_.size() + 1);  // so that recording the region cannot throw and leak it
  if (bytes >= kHugePage) {
    const size_t mapped = round_up(bytes, kPage);
    if (const std::optional<Region> cached = region_cache().take(mapped)) {
      regions_.push_back(*cached);
      return cached->base;
    }
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
      region_cache().put(r);
    else
      std::free(r.base);
  }
}

void release_cached_workspace() { region_cache().release(); }

size_t cached_workspace_bytes() { return region_cache().bytes(); }

}  // namespace ringattn::kernels::cpu
