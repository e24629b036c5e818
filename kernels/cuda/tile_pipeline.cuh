// The loops of the tensor-core kernels over the tiles a CTA visits, double-buffered in shared
// memory: while the warps compute on one tile, the next visible tile is copied (cp.async) into
// the other buffer. Tiles the mask hides are skipped before anything is loaded.
//
//   KeyBlocks:    the key blocks a query tile sees (forward, dQ): K, V and key positions.
//   QueryTiles:   the query tiles of every query head of a KV group that see a key block (dK/dV):
//                 Q, dO and the rows' statistics (element mask, LSE offset, delta).
//
// Usage: start() finds the first visible tile and issues its copies (false: nothing to do);
// run(body) then calls body(...) once per visible tile in order, with all its data in shared
// memory; between bodies every thread passes two barriers, so the body may use all threads.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/params.cuh"
#include "kernels/cuda/row_statistics.cuh"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::gpu {

// The double-buffered loop shared by both: `source` provides next_visible(from, kind),
// issue(item, buffer) and call(body, item, kind, buffer); `current`/`kind` hold the first
// visible item, already issued into buffer 0.
template <class Source, class Body>
__device__ __forceinline__ void run_pipeline(Source& source, int64_t& current, TileKind& kind, Body& body) {
  for (int buf = 0; current >= 0; buf ^= 1) {
    TileKind next_kind = TileKind::empty;
    const int64_t next = source.next_visible(current + 1, next_kind);
    if (next >= 0) {
      source.issue(next, buf ^ 1);  // that buffer was last read before the previous iteration's final barrier
      copy_async_wait<1>();         // this thread's copies of the current item have landed
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();  // and every thread's
    source.call(body, current, kind, buf);
    __syncthreads();  // every warp is done with this buffer before it is refilled
    current = next;
    kind = next_kind;
  }
}

template <int D, int kKeys, int kThreads>
struct KeyBlocks {
  static constexpr int LD = D + 8;
  // Shared memory: K [2][kKeys][LD], V likewise (uint16), key positions [2][kKeys].
  __host__ __device__ static constexpr size_t shared_bytes() {
    return sizeof(uint16_t) * 4 * size_t(kKeys) * LD + sizeof(int64_t) * 2 * kKeys;
  }

  const AttentionParams& p;
  RowSpan qspan;
  TileRange range;
  int64_t b, kvh;
  uint16_t* ks;
  uint16_t* vs;
  int64_t* kpos;
  int tid;
  int64_t current = -1;
  TileKind kind = TileKind::empty;

  __device__ KeyBlocks(const AttentionParams& params, const RowSpan& queries, int64_t batch, int64_t kv_head,
                       unsigned char* shared, int thread)
      : p(params),
        qspan(queries),
        range(key_blocks_for_queries(params.mask, queries, params.k_pos, params.k_rows, kKeys)),
        b(batch),
        kvh(kv_head),
        ks(reinterpret_cast<uint16_t*>(shared)),
        vs(ks + 2 * kKeys * LD),
        kpos(reinterpret_cast<int64_t*>(vs + 2 * kKeys * LD)),
        tid(thread) {}

  __device__ int64_t next_visible(int64_t from, TileKind& k) const {
    for (int64_t kb = from; kb < range.last; ++kb) {
      k = classify_tile(p.mask, qspan, row_span(p.k_pos, p.k_rows, kKeys, kb));
      if (k != TileKind::empty) return kb;
    }
    return -1;
  }

  __device__ void issue(int64_t kb, int buf) {
    const RowSpan kspan = row_span(p.k_pos, p.k_rows, kKeys, kb);
    const int64_t row0 = b * p.k_rows + kspan.row0;
    load_rows_to_shared_async<D>(ks + buf * kKeys * LD, LD, kKeys, p.k, row0, kspan.count, p.kv_heads, kvh, tid,
                                 kThreads);
    load_rows_to_shared_async<D>(vs + buf * kKeys * LD, LD, kKeys, p.v, row0, kspan.count, p.kv_heads, kvh, tid,
                                 kThreads);
    for (int j = tid; j < kKeys; j += kThreads) kpos[buf * kKeys + j] = j < kspan.count ? p.k_pos[kspan.row0 + j] : 0;
    copy_async_commit();
  }

  __device__ bool start() {
    current = next_visible(range.first, kind);
    if (current < 0) return false;
    issue(current, 0);
    return true;
  }

  // body(kspan, kind, K tile, V tile, key positions) for every visible block, in order.
  template <class Body>
  __device__ void run(Body&& body) {
    run_pipeline(*this, current, kind, body);
  }

  template <class Body>
  __device__ void call(Body& body, int64_t kb, TileKind k, int buf) const {
    body(row_span(p.k_pos, p.k_rows, kKeys, kb), k, static_cast<const uint16_t*>(ks + buf * kKeys * LD),
         static_cast<const uint16_t*>(vs + buf * kKeys * LD), static_cast<const int64_t*>(kpos + buf * kKeys));
  }
};

template <int D, int kRows, int kThreads>
struct QueryTiles {
  static constexpr int LD = D + 8;
  // Shared memory: Q [2][kRows][LD], dO likewise (uint16), row masks [2][kRows], LSE offsets
  // and delta [2][kRows] each.
  __host__ __device__ static constexpr size_t shared_bytes() {
    return sizeof(uint16_t) * 4 * size_t(kRows) * LD + sizeof(RowMask) * 2 * kRows + sizeof(float) * 4 * kRows;
  }

  const AttentionParams& p;
  RowSpan kspan;
  TileRange range;
  int64_t b, kvh;
  uint16_t* qs;
  uint16_t* dos;
  RowMask* rmask;
  float* lse2;
  float* dlt;
  int tid;
  int64_t current = -1;  // item = g * tiles + qt: query head kvh * group + g, query tile qt
  TileKind kind = TileKind::empty;

  __device__ QueryTiles(const AttentionParams& params, const RowSpan& keys, int64_t batch, int64_t kv_head,
                        unsigned char* shared, int thread)
      : p(params),
        kspan(keys),
        range(query_tiles_for_keys(params.mask, keys, params.q_pos, params.q_rows, kRows)),
        b(batch),
        kvh(kv_head),
        qs(reinterpret_cast<uint16_t*>(shared)),
        dos(qs + 2 * kRows * LD),
        rmask(reinterpret_cast<RowMask*>(dos + 2 * kRows * LD)),
        lse2(reinterpret_cast<float*>(rmask + 2 * kRows)),
        dlt(lse2 + 2 * kRows),
        tid(thread) {}

  __device__ int64_t tiles() const { return range.last - range.first; }
  __device__ int64_t head(int64_t item) const { return kvh * p.group() + item / tiles(); }
  __device__ RowSpan span(int64_t item) const {
    return row_span(p.q_pos, p.q_rows, kRows, range.first + item % tiles());
  }

  __device__ int64_t next_visible(int64_t from, TileKind& k) const {
    const int64_t items = p.group() * tiles();
    for (int64_t item = from; item < items; ++item) {
      k = classify_tile(p.mask, span(item), kspan);
      if (k != TileKind::empty) return item;
    }
    return -1;
  }

  __device__ void issue(int64_t item, int buf) {
    const RowSpan qspan = span(item);
    const int64_t h = head(item), row0 = b * p.q_rows + qspan.row0;
    load_rows_to_shared_async<D>(qs + buf * kRows * LD, LD, kRows, p.q, row0, qspan.count, p.heads, h, tid, kThreads);
    load_rows_to_shared_async<D>(dos + buf * kRows * LD, LD, kRows, p.dout, row0, qspan.count, p.heads, h, tid,
                                 kThreads);
    load_row_statistics(p, qspan, b, h, kRows, rmask + buf * kRows, lse2 + buf * kRows, dlt + buf * kRows, tid,
                        kThreads);
    copy_async_commit();
  }

  __device__ bool start() {
    if (range.empty()) return false;
    current = next_visible(0, kind);
    if (current < 0) return false;
    issue(current, 0);
    return true;
  }

  // body(qspan, kind, Q tile, dO tile, row masks, LSE offsets, delta) for every visible tile, in order.
  template <class Body>
  __device__ void run(Body&& body) {
    run_pipeline(*this, current, kind, body);
  }

  template <class Body>
  __device__ void call(Body& body, int64_t item, TileKind k, int buf) const {
    body(span(item), k, static_cast<const uint16_t*>(qs + buf * kRows * LD),
         static_cast<const uint16_t*>(dos + buf * kRows * LD), static_cast<const RowMask*>(rmask + buf * kRows),
         static_cast<const float*>(lse2 + buf * kRows), static_cast<const float*>(dlt + buf * kRows));
  }
};

}  // namespace ringattn::kernels::gpu
