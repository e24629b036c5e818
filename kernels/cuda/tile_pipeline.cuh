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

// The kinds of the next kThreads tiles (or items) of a CTA's list, classified once per CTA, one
// tile per thread, into shared memory; the loops then read them from there instead of every
// thread classifying every tile. Every thread calls next() at the same points (it has barriers).
template <int kThreads>
struct TileKinds {
  TileKind* kinds;  // [kThreads] in shared memory
  int first = 0;    // the item kinds[0] describes
  int count = 0;    // items classified (0: none yet)

  // The first item in [from, items) that is not empty (its kind in k), or -1.
  template <class Classify>
  __device__ int next(int from, int items, TileKind& k, int tid, Classify&& classify) {
    for (int item = from; item < items; ++item) {
      if (item < first || item >= first + count) {
        __syncthreads();  // every thread is done reading the previous chunk
        if (item + tid < items) kinds[tid] = classify(item + tid);
        first = item;
        count = kThreads;
        __syncthreads();
      }
      k = kinds[item - first];
      if (k != TileKind::empty) return item;
    }
    return -1;
  }
};

// The double-buffered loop shared by both: `source` provides next_visible(from, kind),
// issue(item, buffer) and call(body, item, kind, buffer); `current`/`kind` hold the first
// visible item, already issued into buffer 0.
template <class Source, class Body>
__device__ __forceinline__ void run_pipeline(Source& source, int& current, TileKind& kind, Body& body) {
  for (int buf = 0; current >= 0; buf ^= 1) {
    TileKind next_kind = TileKind::empty;
    const int next = source.next_visible(current + 1, next_kind);
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
  // Shared memory: K [2][kKeys][LD], V likewise (uint16), key positions [2][kKeys], the tile kinds
  // [kThreads] (padded to 16 bytes).
  __host__ __device__ static constexpr size_t shared_bytes() {
    return sizeof(uint16_t) * 4 * size_t(kKeys) * LD + sizeof(int64_t) * 2 * kKeys + (kThreads + 15) / 16 * 16;
  }

  const AttentionParams& p;
  RowSpan qspan;
  TileRange range;
  int64_t b, kvh;
  uint16_t* ks;
  uint16_t* vs;
  int64_t* kpos;
  TileKinds<kThreads> kinds;
  int tid;
  int current = -1;  // a block index relative to range.first
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
        kinds{reinterpret_cast<TileKind*>(kpos + 2 * kKeys)},
        tid(thread) {}

  __device__ int blocks() const { return int(range.last - range.first); }

  __device__ int next_visible(int from, TileKind& k) {
    return kinds.next(from, blocks(), k, tid, [&](int item) {
      return classify_tile_32(p.mask, qspan, row_span(p.k_pos, p.k_rows, kKeys, range.first + item));
    });
  }

  __device__ void issue(int item, int buf) {
    const RowSpan kspan = row_span(p.k_pos, p.k_rows, kKeys, range.first + item);
    const int64_t row0 = b * p.k_rows + kspan.row0;
    load_rows_to_shared_async<D>(ks + buf * kKeys * LD, LD, kKeys, p.k, row0, kspan.count, p.kv_heads, kvh, tid,
                                 kThreads);
    load_rows_to_shared_async<D>(vs + buf * kKeys * LD, LD, kKeys, p.v, row0, kspan.count, p.kv_heads, kvh, tid,
                                 kThreads);
    for (int j = tid; j < kKeys; j += kThreads) kpos[buf * kKeys + j] = j < kspan.count ? p.k_pos[kspan.row0 + j] : 0;
    copy_async_commit();
  }

  __device__ bool start() {
    current = next_visible(0, kind);
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
  __device__ void call(Body& body, int item, TileKind k, int buf) const {
    body(row_span(p.k_pos, p.k_rows, kKeys, range.first + item), k, static_cast<const uint16_t*>(ks + buf * kKeys * LD),
         static_cast<const uint16_t*>(vs + buf * kKeys * LD), static_cast<const int64_t*>(kpos + buf * kKeys));
  }
};

template <int D, int kRows, int kThreads>
struct QueryTiles {
  static constexpr int LD = D + 8;
  // Shared memory: Q [2][kRows][LD], dO likewise (uint16), row masks [2][kRows], LSE offsets
  // and delta [2][kRows] each.
  __host__ __device__ static constexpr size_t shared_bytes() {
    return sizeof(uint16_t) * 4 * size_t(kRows) * LD + sizeof(RowMask) * 2 * kRows + sizeof(float) * 4 * kRows +
           (kThreads + 15) / 16 * 16;
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
  TileKinds<kThreads> kinds;
  int tid;
  int tiles = 0;     // query tiles in range
  int current = -1;  // item = g * tiles + qt: query head kvh * group + g, query tile range.first + qt
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
        kinds{reinterpret_cast<TileKind*>(dlt + 2 * kRows)},
        tid(thread),
        tiles(int(range.last - range.first)) {}

  // 32-bit divisions (the tile count fits: the launch checks it).
  __device__ int64_t head(int item) const { return kvh * p.group() + item / tiles; }
  __device__ RowSpan span(int item) const { return row_span(p.q_pos, p.q_rows, kRows, range.first + item % tiles); }

  // Every query head of the group sees the same positions: classify the tiles once (as items
  // of head 0) and reuse the kinds for the other heads.
  __device__ int next_visible(int from, TileKind& k) {
    const int items = p.group() * tiles;
    for (int item = from; item < items; ++item) {
      const int g = item / tiles, qt = item - g * tiles;
      const int next = kinds.next(qt, tiles, k, tid, [&](int t) { return classify_tile_32(p.mask, span(t), kspan); });
      if (next >= 0) return g * tiles + next;
      item = g * tiles + tiles - 1;  // nothing left for this head: on to the next one
    }
    return -1;
  }

  __device__ void issue(int item, int buf) {
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
  __device__ void call(Body& body, int item, TileKind k, int buf) const {
    body(span(item), k, static_cast<const uint16_t*>(qs + buf * kRows * LD),
         static_cast<const uint16_t*>(dos + buf * kRows * LD), static_cast<const RowMask*>(rmask + buf * kRows),
         static_cast<const float*>(lse2 + buf * kRows), static_cast<const float*>(dlt + buf * kRows));
  }
};

}  // namespace ringattn::kernels::gpu
