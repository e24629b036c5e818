// The loops of the tensor-core kernels over the tiles a CTA visits, double-buffered in shared
// memory: while the warps compute on one tile, the next visible tile is copied (cp.async) into
// the other buffer. Tiles the mask hides are skipped before anything is loaded.
//
//   KeyBlocks:    the key blocks a query tile sees (forward): K, V and key positions.
//   QueryTiles:   the query tiles of every query head of a KV group that see a key block (backward):
//                 Q, dO and the rows' statistics (element mask, LSE offset, delta), last tile first,
//                 each with the key block that adds to its dQ before this one (dq_order.cuh).
//
// Usage: start() finds the first visible tile and issues its copies (false: nothing to do);
// run(body) then calls body(...) once per visible tile in order, with all its data in shared
// memory; between bodies every thread passes two barriers, so the body may use all threads.
#pragma once

#include "kernels/cuda/common.cuh"
#include "kernels/cuda/dq_order.cuh"
#include "kernels/cuda/mma.cuh"
#include "kernels/cuda/params.cuh"
#include "kernels/cuda/row_statistics.cuh"
#include "kernels/mask/tile_plan.hpp"

namespace ringattn::kernels::gpu {

// What the dK/dV/dQ loop knows of a visible query tile besides its kind: the key block that adds
// to the tile's dQ just before this CTA's (dq_order.cuh; -1: none).
struct QueryTileInfo {
  TileKind kind = TileKind::empty;
  int previous = -1;
};
__device__ __forceinline__ TileKind kind_of(TileKind k) { return k; }
__device__ __forceinline__ TileKind kind_of(const QueryTileInfo& i) { return i.kind; }

// What the next kThreads tiles (or items) of a CTA's list are (Info: a TileKind, or a
// QueryTileInfo), worked out once per CTA, one tile per thread, into shared memory; the loops
// then read them from there instead of every thread classifying every tile. Every thread calls
// next() at the same points (it has barriers).
template <int kThreads, class Info>
struct TileList {
  Info* infos;    // [kThreads] in shared memory
  int first = 0;  // the item infos[0] describes
  int count = 0;  // items described (0: none yet)

  // The first item in [from, items) that is not empty (what it is in `info`), or -1.
  template <class Describe>
  __device__ int next(int from, int items, Info& info, int tid, Describe&& describe) {
    for (int item = from; item < items; ++item) {
      if (item < first || item >= first + count) {
        __syncthreads();  // every thread is done reading the previous chunk
        if (item + tid < items) infos[tid] = describe(item + tid);
        first = item;
        count = kThreads;
        __syncthreads();
      }
      info = infos[item - first];
      if (kind_of(info) != TileKind::empty) return item;
    }
    return -1;
  }
};

// The double-buffered loop shared by both: `source` provides next_visible(from, info),
// issue(item, buffer) and call(body, item, info, buffer); `current`/`info` hold the first
// visible item, already issued into buffer 0.
template <class Source, class Body>
__device__ __forceinline__ void run_pipeline(Source& source, int& current, typename Source::Info& info, Body& body) {
  for (int buf = 0; current >= 0; buf ^= 1) {
    typename Source::Info next_info;
    const int next = source.next_visible(current + 1, next_info);
    if (next >= 0) {
      source.issue(next, buf ^ 1);  // that buffer was last read before the previous iteration's final barrier
      copy_async_wait<1>();         // this thread's copies of the current item have landed
    } else {
      copy_async_wait<0>();
    }
    __syncthreads();  // and every thread's
    source.call(body, current, info, buf);
    __syncthreads();  // every warp is done with this buffer before it is refilled
    current = next;
    info = next_info;
  }
}

template <int D, int kKeys, int kThreads>
struct KeyBlocks {
  static constexpr int LD = D + 8;
  using Info = TileKind;
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
  TileList<kThreads, TileKind> kinds;
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

// A visible query tile as the dK/dV/dQ loop's body sees it.
struct QueryTile {
  RowSpan span;     // its rows
  int64_t head;     // query head
  int64_t index;    // tile index among the call's query tiles
  TileKind kind;
  int previous;     // the key block that adds to its dQ just before this CTA's (-1: none)
};

// Query tiles are visited from the last to the first, and for each tile every query head of the
// group in turn (item = t * group + g: tile range.last - 1 - t, head kvh * group + g). The
// descending order lets the ordered dQ additions flow without waiting: under a causal mask the
// CTA of key block kb and that of kb - 1 visit the same tiles in the same order, kb one step
// behind (dq_order.cuh).
template <int D, int kRows, int kKeys, int kThreads>
struct QueryTiles {
  static constexpr int LD = D + 8;
  using Info = QueryTileInfo;
  // Shared memory: Q [2][kRows][LD], dO likewise (uint16), row masks [2][kRows], LSE offsets
  // and delta [2][kRows] each, the tiles' descriptions [kThreads].
  __host__ __device__ static constexpr size_t shared_bytes() {
    return sizeof(uint16_t) * 4 * size_t(kRows) * LD + sizeof(RowMask) * 2 * kRows + sizeof(float) * 4 * kRows +
           sizeof(QueryTileInfo) * kThreads;
  }

  const AttentionParams& p;
  RowSpan kspan;
  int key_block;  // this CTA's key block (kspan's index)
  TileRange range;
  int64_t b, kvh;
  uint16_t* qs;
  uint16_t* dos;
  RowMask* rmask;
  float* lse2;
  float* dlt;
  TileList<kThreads, QueryTileInfo> tiles_seen;
  int tid;
  int tiles = 0;  // query tiles in range
  int group;      // query heads per K/V head
  int current = -1;
  QueryTileInfo info;

  __device__ QueryTiles(const AttentionParams& params, const RowSpan& keys, int key_block_index, int64_t batch,
                        int64_t kv_head, unsigned char* shared, int thread)
      : p(params),
        kspan(keys),
        key_block(key_block_index),
        range(query_tiles_for_keys(params.mask, keys, params.q_pos, params.q_rows, kRows)),
        b(batch),
        kvh(kv_head),
        qs(reinterpret_cast<uint16_t*>(shared)),
        dos(qs + 2 * kRows * LD),
        rmask(reinterpret_cast<RowMask*>(dos + 2 * kRows * LD)),
        lse2(reinterpret_cast<float*>(rmask + 2 * kRows)),
        dlt(lse2 + 2 * kRows),
        tiles_seen{reinterpret_cast<QueryTileInfo*>(dlt + 2 * kRows)},
        tid(thread),
        tiles(int(range.last - range.first)),
        group(params.group()) {}

  // 32-bit divisions (the tile count fits: the launch checks it).
  __device__ int64_t tile_index(int item) const { return range.last - 1 - item / group; }
  __device__ int64_t head(int item) const { return kvh * group + item % group; }
  __device__ RowSpan span(int item) const { return row_span(p.q_pos, p.q_rows, kRows, tile_index(item)); }

  // Every query head of the group sees the same positions: each tile is described once (for its
  // first item) and the description reused for the other heads.
  __device__ int next_visible(int from, QueryTileInfo& found) {
    const int t = from / group;
    const int next = tiles_seen.next(t, tiles, found, tid, [&](int u) {
      const RowSpan q = row_span(p.q_pos, p.q_rows, kRows, range.last - 1 - u);
      QueryTileInfo d;
      d.kind = classify_tile_32(p.mask, q, kspan);
      if (d.kind != TileKind::empty)
        d.previous = previous_visitor(p.mask, p.q_pos, q, p.k_pos, p.k_rows, kKeys, key_block);
      return d;
    });
    if (next < 0) return -1;
    return next == t ? from : next * group;
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
    current = next_visible(0, info);
    if (current < 0) return false;
    issue(current, 0);
    return true;
  }

  // body(tile, Q tile, dO tile, row masks, LSE offsets, delta) for every visible item, in order.
  template <class Body>
  __device__ void run(Body&& body) {
    run_pipeline(*this, current, info, body);
  }

  template <class Body>
  __device__ void call(Body& body, int item, const QueryTileInfo& d, int buf) const {
    body(QueryTile{span(item), head(item), tile_index(item), d.kind, d.previous},
         static_cast<const uint16_t*>(qs + buf * kRows * LD), static_cast<const uint16_t*>(dos + buf * kRows * LD),
         static_cast<const RowMask*>(rmask + buf * kRows), static_cast<const float*>(lse2 + buf * kRows),
         static_cast<const float*>(dlt + buf * kRows));
  }
};

}  // namespace ringattn::kernels::gpu
