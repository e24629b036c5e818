// The MPI communicator on 1 to 4 ranks: point-to-point transfers (sizes 0 to MiBs, messages split
// into chunks, hundreds outstanding, progress while computing), every collective with every data
// type and uneven sizes, sub-communicators and the counters.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>
#include <string>
#include <thread>

#include <time.h>

#include "util/stopwatch.hpp"
#include "tests/comm/step_exchange.hpp"
#include "tests/support/mpi_test_util.hpp"

namespace ringattn::comm::testing {
namespace {

TEST_F(MpiTest, FactoryMakesAHostCommunicatorOverTheWorld) {
  std::unique_ptr<Communicator> c = make_mpi_communicator(MPI_COMM_WORLD);
  int world_rank = 0, world_size = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &world_size);
  EXPECT_EQ(c->rank(), world_rank);
  EXPECT_EQ(c->size(), world_size);
  EXPECT_STREQ(c->name(), "mpi");
  EXPECT_EQ(c->memory(), MemorySpace::host);
  EXPECT_EQ(c->timeout(), 300.0);
}

TEST_F(MpiTest, RingExchangeDeliversDistinctPayloads) {
  const size_t sizes[] = {0, 1, 7, 4096, 100003, size_t(1) << 20, (size_t(1) << 20) + 13};
  int tag = 0;
  for (size_t bytes : sizes) ring_exchange(*comm, bytes, tag++);
  EXPECT_EQ(comm->outstanding(), 0u);
}

// Steps posted back to back match by posting order, and do not meet point-to-point messages
// posted meanwhile with any tag.
TEST_F(MpiTest, StepsMatchInPostingOrder) {
  std::vector<uint8_t> out = payload(64, rank(), 9), in(64, 0);
  Request recv = comm->irecv(in.data(), in.size(), previous_rank(*comm), Communicator::kStepTag - 1);
  const double waited_before = comm->wait_seconds();
  step_exchange(*comm, 7);
  Request send = comm->isend(out.data(), out.size(), next_rank(*comm), Communicator::kStepTag - 1);
  comm->wait(recv, "a message between steps");
  comm->wait(send, "a message between steps");
  EXPECT_TRUE(in == payload(64, previous_rank(*comm), 9));
  EXPECT_GE(comm->wait_seconds(), waited_before);
  EXPECT_EQ(comm->outstanding(), 0u);
}

// Messages larger than one MPI message (2 GiB in production) go in chunks; a 1000-byte chunk
// limit exercises the same code on every boundary case.
TEST_F(MpiTest, MessagesLargerThanAChunkArriveWhole) {
  MpiCommunicator chunked(MPI_COMM_WORLD, 1000);
  int tag = 0;
  for (size_t bytes : {0, 1, 999, 1000, 1001, 2000, 12345}) ring_exchange(chunked, bytes, tag++);
}

TEST_F(MpiTest, AReceiveOfTheWrongSizeIsACommError) {
  std::vector<uint8_t> out(100, 1), in(200, 0);
  Request recv = comm->irecv(in.data(), in.size(), previous_rank(*comm), 5);
  Request send = comm->isend(out.data(), out.size(), next_rank(*comm), 5);
  try {
    comm->wait(recv, "short message");
    ADD_FAILURE() << "a 100-byte message satisfied a 200-byte receive";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("received 100 bytes"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(recv.valid());
  comm->wait(send, "short message");
  EXPECT_EQ(comm->outstanding(), 0u);

  // Too long: MPI truncates. Met inside progress(), the error waits for wait() (a compute loop
  // in an OpenMP region must not see an exception). Open MPI 4.1 truncates a message to oneself
  // silently, so this needs a second rank.
  if (size() == 1) return;
  Request truncated = comm->irecv(out.data(), out.size(), previous_rank(*comm), 6);
  send = comm->isend(in.data(), in.size(), next_rank(*comm), 6);
  for (const Stopwatch watch; watch.seconds() < 0.05;) EXPECT_NO_THROW(comm->progress());
  try {
    comm->wait(truncated, "long message");
    ADD_FAILURE() << "a 200-byte message fitted a 100-byte receive";
  } catch (const CommError& e) {
    EXPECT_NE(std::string(e.what()).find("MPI_ERR_TRUNCATE"), std::string::npos) << e.what();
  }
  comm->wait(send, "long message");
}

TEST_F(MpiTest, BadPeersAndTagsAreCommErrors) {
  uint8_t byte = 0;
  EXPECT_THROW(comm->isend(&byte, 1, size(), 0), CommError);
  EXPECT_THROW(comm->irecv(&byte, 1, -1, 0), CommError);
  EXPECT_THROW(comm->isend(&byte, 1, 0, -3), CommError);
  Request unknown{12345};
  EXPECT_THROW(comm->test(unknown), CommError);
}

// Every rank posts 24 messages to every rank (itself included) on one tag, then waits for them
// out of order: they must arrive in posting order, each in its own buffer.
TEST_F(MpiTest, ManyOutstandingRequestsCompleteInAnyOrder) {
  const int per_peer = 24, tag = 3;
  auto bytes_of = [](int i) { return size_t(i) * 1031 % 7000; };
  std::vector<std::vector<uint8_t>> out, in;
  std::vector<Request> requests;
  for (int peer = 0; peer < size(); ++peer)
    for (int i = 0; i < per_peer; ++i) {
      in.emplace_back(bytes_of(i));
      out.push_back(payload(bytes_of(i), rank(), i));
    }
  for (int peer = 0; peer < size(); ++peer)
    for (int i = 0; i < per_peer; ++i) {
      std::vector<uint8_t>& buf = in[size_t(peer * per_peer + i)];
      requests.push_back(comm->irecv(buf.data(), buf.size(), peer, tag));
    }
  for (int peer = 0; peer < size(); ++peer)
    for (int i = 0; i < per_peer; ++i) {
      const std::vector<uint8_t>& buf = out[size_t(peer * per_peer + i)];
      requests.push_back(comm->isend(buf.data(), buf.size(), peer, tag));
    }
  EXPECT_EQ(comm->outstanding(), requests.size());
  for (size_t k = requests.size(); k-- > 0;)
    if (k % 2 == 0) comm->wait(requests[k], "many outstanding");
  comm->wait_all(requests, "many outstanding");
  EXPECT_EQ(comm->outstanding(), 0u);
  for (int peer = 0; peer < size(); ++peer)
    for (int i = 0; i < per_peer; ++i)
      EXPECT_TRUE(in[size_t(peer * per_peer + i)] == payload(bytes_of(i), peer, i)) << "from " << peer << " #" << i;
}

// CPU time this thread has run, in seconds: unlike the wall clock, it advances only while the
// thread runs, so a loop bounded by it does the same work however busy the machine is.
double thread_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return double(t.tv_sec) + 1e-9 * double(t.tv_nsec);
}

// A 16 MiB message needs MPI's rendezvous protocol, which moves only inside MPI calls: a busy
// loop that calls progress() must leave it finished without a single test() or wait(). Each rank
// loops for 0.5 s of its own CPU time (the transfer needs a few ms of it): the scheduler shares
// the cores fairly, so the peer has run its loop about as long, on a quiet or a loaded machine.
// (What progress() costs per call is measured by ringattn_comm_progress_bench,
// docs/benchmarks.md.)
TEST_F(MpiTest, ProgressAdvancesLargeTransfersDuringABusyLoop) {
  const size_t bytes = size_t(16) << 20;
  const std::vector<uint8_t> out = payload(bytes, rank(), 1);
  std::vector<uint8_t> in(bytes);
  Request recv = comm->irecv(in.data(), bytes, previous_rank(*comm), 1);
  Request send = comm->isend(out.data(), bytes, next_rank(*comm), 1);
  double sink = 0.0;
  for (const double start = thread_cpu_seconds(); thread_cpu_seconds() - start < 0.5;) {
    for (int i = 0; i < 2000; ++i) sink += std::sqrt(double(i) + sink * 1e-9);
    comm->progress();
  }
  EXPECT_GT(sink, 0.0);
  EXPECT_TRUE(comm->test(recv)) << "the receive did not advance during the busy loop";
  EXPECT_TRUE(comm->test(send)) << "the send did not advance during the busy loop";
  comm->wait(recv, "after busy loop");
  comm->wait(send, "after busy loop");
  EXPECT_TRUE(in == payload(bytes, previous_rank(*comm), 1));
}

// progress() with a transfer outstanding runs and leaves it to complete (its cost per call is a
// benchmark's: ringattn_comm_progress_bench).
TEST_F(MpiTest, ProgressLeavesAnOutstandingTransferToComplete) {
  uint8_t byte = 0, one = 1;
  Request recv = comm->irecv(&byte, 1, previous_rank(*comm), 10);
  for (int i = 0; i < 2000; ++i) comm->progress();
  comm->barrier();  // every receive is posted and polled before the sends
  Request send = comm->isend(&one, 1, next_rank(*comm), 10);
  comm->wait(recv, "progress");
  comm->wait(send, "progress");
  EXPECT_EQ(byte, 1);
}

int thread_level() {
  int level = MPI_THREAD_SINGLE;
  MPI_Query_thread(&level);
  return level;
}

// MPI_THREAD_FUNNELED: a compute thread may call progress() (it does nothing there) but nothing else.
TEST_F(MpiTest, OnlyTheOwningThreadCallsMpi) {
  if (thread_level() >= MPI_THREAD_SERIALIZED) GTEST_SKIP() << "MPI runs at SERIALIZED: another thread may take over";
  uint8_t byte = 0;
  bool progress_threw = false, isend_threw = false;
  std::thread worker([&] {
    try {
      comm->progress();
    } catch (const CommError&) {
      progress_threw = true;
    }
    try {
      comm->isend(&byte, 1, rank(), 0);
    } catch (const CommError&) {
      isend_threw = true;
    }
  });
  worker.join();
  EXPECT_FALSE(progress_threw);
  EXPECT_TRUE(isend_threw);
  EXPECT_EQ(comm->outstanding(), 0u);
}

// MPI_THREAD_SERIALIZED (the Python module's level; comm_mpi_np2_serialized runs these): another
// thread takes over while nothing is outstanding, and the first may take it back.
TEST_F(MpiTest, AnotherThreadTakesOverWhenNothingIsOutstanding) {
  if (thread_level() < MPI_THREAD_SERIALIZED) GTEST_SKIP() << "MPI runs at FUNNELED";
  int value = rank();
  std::string error;
  std::thread other([&] {
    try {
      comm->allreduce(&value, 1, DType::i32, ReduceOp::sum);
    } catch (const CommError& e) {
      error = e.what();
    }
  });
  other.join();
  EXPECT_EQ(error, "");
  EXPECT_EQ(value, size() * (size() - 1) / 2);
  comm->barrier();
}

// Two threads inside calls at once would overlap MPI calls, which no thread level below
// MULTIPLE allows: the second is refused before it reaches MPI, also on a communicator split
// from the first (MPI's rule is per process). Rank 0's thread waits in a barrier that rank 1
// joins 2 s late; a second thread of rank 0 calls in once the first is inside. (Before calls in
// progress were tracked, SERIALIZED handed the communicator over there, as no transfer was
// outstanding, and the second call entered MPI beside the barrier.)
TEST_F(MpiTest, OverlappingCallsFromTwoThreadsAreRefused) {
  if (size() < 2) GTEST_SKIP() << "needs a peer that holds the barrier open";
  std::unique_ptr<Communicator> half = comm->split(0, rank());  // every rank, one group
  ASSERT_TRUE(half);
  if (rank() == 0) {
    std::string error, split_error;
    std::thread second([&] {
      const Stopwatch waited;
      while (!comm->call_in_progress() && waited.seconds() < 5.0) std::this_thread::yield();
      int x = 0;
      try {
        comm->allreduce(&x, 1, DType::i32, ReduceOp::sum);
      } catch (const CommError& e) {
        error = e.what();
      }
      try {
        half->barrier();
      } catch (const CommError& e) {
        split_error = e.what();
      }
    });
    comm->barrier();
    second.join();
    for (const std::string* e : {&error, &split_error})
      EXPECT_NE(e->find("called from a second thread while another thread is inside a call"), std::string::npos)
          << *e;
  } else {
    if (rank() == 1) std::this_thread::sleep_for(std::chrono::seconds(2));
    comm->barrier();
  }
  comm->barrier();
}

// ---- collectives ----

template <class T>
void check_allreduce(MpiCommunicator& c, DType type) {
  const int n = 5;
  // Small values of both signs (unsigned stays positive), exact in every type and sum.
  auto value = [&](int rank, int e) {
    const int v = (rank * 7 + e * 3) % 11 - (std::is_unsigned_v<T> ? 0 : 5);
    return T(v);
  };
  for (ReduceOp op : {ReduceOp::sum, ReduceOp::max, ReduceOp::min}) {
    std::vector<T> buf(n);
    for (int e = 0; e < n; ++e) buf[e] = value(c.rank(), e);
    c.allreduce(buf.data(), n, type, op);
    for (int e = 0; e < n; ++e) {
      T expect = value(0, e);
      for (int r = 1; r < c.size(); ++r) {
        const T v = value(r, e);
        expect = op == ReduceOp::sum ? T(expect + v) : op == ReduceOp::max ? std::max(expect, v) : std::min(expect, v);
      }
      EXPECT_EQ(buf[e], expect) << "type " << int(type) << " op " << int(op) << " element " << e;
    }
  }
}

TEST_F(MpiTest, AllreduceSumMaxMinForEveryDataType) {
  check_allreduce<uint8_t>(*comm, DType::u8);
  check_allreduce<int32_t>(*comm, DType::i32);
  check_allreduce<int64_t>(*comm, DType::i64);
  check_allreduce<float>(*comm, DType::f32);
  check_allreduce<double>(*comm, DType::f64);
  comm->allreduce(nullptr, 0, DType::f32, ReduceOp::sum);  // empty is fine
}

TEST_F(MpiTest, BroadcastFromEveryRoot) {
  for (int root = 0; root < size(); ++root) {
    std::vector<uint8_t> buf = rank() == root ? payload(1000, root, 9) : std::vector<uint8_t>(1000, 0);
    comm->broadcast(buf.data(), buf.size(), root);
    EXPECT_TRUE(buf == payload(1000, root, 9)) << "root " << root;
  }
}

TEST_F(MpiTest, AllgatherCollectsEveryRanksBlock) {
  const size_t block = 37;
  std::vector<uint8_t> all(block * size_t(size())), expect;
  for (int r = 0; r < size(); ++r) {
    const std::vector<uint8_t> p = payload(block, r, 4);
    expect.insert(expect.end(), p.begin(), p.end());
  }
  comm->allgather(payload(block, rank(), 4).data(), all.data(), block);
  EXPECT_TRUE(all == expect);
  // In place: this rank's block already sits where it belongs.
  std::vector<uint8_t> in_place(all.size(), 0);
  std::copy_n(expect.begin() + rank() * block, block, in_place.begin() + rank() * block);
  comm->allgather(in_place.data() + rank() * block, in_place.data(), block);
  EXPECT_TRUE(in_place == expect);
}

TEST_F(MpiTest, AllgathervWithUnevenSizes) {
  std::vector<size_t> sizes(size());
  for (int r = 0; r < size(); ++r) sizes[r] = r == 1 ? 0 : size_t(r) * 1000 + 3;  // rank 1 sends nothing
  std::vector<uint8_t> expect;
  for (int r = 0; r < size(); ++r) {
    const std::vector<uint8_t> p = payload(sizes[r], r, 6);
    expect.insert(expect.end(), p.begin(), p.end());
  }
  std::vector<uint8_t> all(expect.size(), 0);
  comm->allgatherv(payload(sizes[rank()], rank(), 6).data(), all.data(), sizes);
  EXPECT_TRUE(all == expect);

  const size_t offset = std::accumulate(sizes.begin(), sizes.begin() + rank(), size_t(0));
  std::vector<uint8_t> in_place(expect.size(), 0);
  std::copy_n(expect.begin() + offset, sizes[rank()], in_place.begin() + offset);
  comm->allgatherv(in_place.data() + offset, in_place.data(), sizes);
  EXPECT_TRUE(in_place == expect);

  EXPECT_THROW(comm->allgatherv(all.data(), all.data(), std::span<const size_t>(sizes).first(0)), CommError);
}

TEST_F(MpiTest, ReduceScatterWithUnevenCounts) {
  std::vector<size_t> counts(size());
  for (int r = 0; r < size(); ++r) counts[r] = size_t(r) * 2 + (r % 2);  // rank 0 receives nothing
  const size_t total = std::accumulate(counts.begin(), counts.end(), size_t(0));
  const size_t offset = std::accumulate(counts.begin(), counts.begin() + rank(), size_t(0));
  auto value = [](int rank, size_t e) { return double(rank * 10) - double(e); };
  std::vector<double> send(total);
  std::vector<int64_t> send_i(total);
  for (size_t e = 0; e < total; ++e) {
    send[e] = value(rank(), e);
    send_i[e] = int64_t(value(rank(), e));
  }
  std::vector<double> sum(counts[rank()], -1.0);
  std::vector<int64_t> max(counts[rank()], -1);
  comm->reduce_scatter(send.data(), sum.data(), counts, DType::f64, ReduceOp::sum);
  comm->reduce_scatter(send_i.data(), max.data(), counts, DType::i64, ReduceOp::max);
  for (size_t e = 0; e < counts[rank()]; ++e) {
    double expect = 0.0;
    for (int r = 0; r < size(); ++r) expect += value(r, offset + e);
    EXPECT_EQ(sum[e], expect) << "element " << e;
    EXPECT_EQ(max[e], int64_t(value(size() - 1, offset + e))) << "element " << e;
  }
}

// ---- sub-communicators ----

// Rank 0 alone, the others together in reverse order; with 3 ranks or more the last one stays out.
TEST_F(MpiTest, SplitMakesSubCommunicatorsThatInheritSettings) {
  comm->set_timeout(7.0);
  const bool stays_out = size() >= 3 && rank() == size() - 1;
  const int color = stays_out ? -1 : rank() == 0 ? 0 : 1;
  std::unique_ptr<Communicator> sub = comm->split(color, -rank());
  if (stays_out) {
    EXPECT_EQ(sub, nullptr);
    return;
  }
  ASSERT_NE(sub, nullptr);
  const int members = rank() == 0 ? 1 : size() - 1 - (size() >= 3 ? 1 : 0);
  EXPECT_EQ(sub->size(), members);
  EXPECT_EQ(sub->rank(), rank() == 0 ? 0 : members - rank());  // ordered by key = -rank
  EXPECT_EQ(sub->timeout(), 7.0);

  int64_t world_rank_sum = rank();
  sub->allreduce(&world_rank_sum, 1, DType::i64, ReduceOp::sum);
  const int64_t expect = rank() == 0 ? 0 : int64_t(members) * (members + 1) / 2;
  EXPECT_EQ(world_rank_sum, expect);
  ring_exchange(*sub, 5000, 2);
  sub->barrier();
}

// ---- counters ----

TEST_F(MpiTest, BytesSentCountsSendPayloadsOnly) {
  EXPECT_EQ(comm->bytes_sent(), 0u);
  ring_exchange(*comm, 1000, 1);
  ring_exchange(*comm, 0, 2);
  ring_exchange(*comm, 24, 3);
  EXPECT_EQ(comm->bytes_sent(), 1024u);
  uint64_t gathered = 0;
  comm->allgather(&gathered, std::vector<uint64_t>(size()).data(), sizeof gathered);
  comm->allreduce(&gathered, 1, DType::i64, ReduceOp::sum);
  EXPECT_EQ(comm->bytes_sent(), 1024u) << "collectives are not counted";
  comm->reset_counters();
  EXPECT_EQ(comm->bytes_sent(), 0u);
  EXPECT_EQ(comm->wait_seconds(), 0.0);
}

// wait_seconds is the time compute waited for data; time in collectives is not counted.
TEST_F(MpiTest, WaitSecondsCountsPointToPointWaitsOnly) {
  if (rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  comm->barrier();
  EXPECT_EQ(comm->wait_seconds(), 0.0);

  // Rank 1 waits for a byte that rank 0 sends 50 ms late.
  uint8_t in = 0, out = 1;
  Request recv = comm->irecv(&in, 1, previous_rank(*comm), 8);
  if (rank() == 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
  Request send = comm->isend(&out, 1, next_rank(*comm), 8);
  comm->wait(recv, "late byte");
  comm->wait(send, "late byte");
  if (rank() == 1) {
    EXPECT_GE(comm->wait_seconds(), 0.04);
  }
  EXPECT_EQ(in, 1);
}

}  // namespace
}  // namespace ringattn::comm::testing
