// A slower network on one machine: a Communicator decorator that delays the point-to-point
// transfers of the one it wraps as a link of a given bandwidth and latency would (benchmarks: how
// the ring's overlap behaves when the network is the bottleneck). As HostStagedCommunicator
// stages device memory, this one adds time, and the communicators underneath know nothing of it.
//
// The model. Each rank has one emulated link per direction (a network port), shared by all its
// peers and by the communicators split from this one. A message of n bytes posted at t waits for
// the link to carry the messages booked before it, start = max(t, link free), holds it
// n / bandwidth, and arrives `latency` later: done = start + n / bandwidth + latency. Latency does
// not hold the link (a long wire carries several messages at once). A transfer is complete once
// the inner one is and its emulated time has come, on both sides. The sender books its outgoing
// link when it posts the send and sends the start time ahead of the payload (one double on the
// same tag, so MPI's ordering keeps them together); the receiver books its incoming link when that
// arrives, from max(that start, when it posted the receive), so a receive posted long before its
// send completes no earlier than the send could have arrived (the start times compare the ranks'
// steady clocks: emulate on one machine). A send completes on its own link's time, without
// waiting for the receive. Messages to oneself and collectives are not delayed; steps and the
// all-to-all are made of point-to-point transfers here (the base Communicator's), so the link
// delays them.
//
// Counters: bytes_sent() counts payloads (not the start times); wait_seconds() the time blocked
// in wait(), emulated time included.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "comm/communicator.hpp"

namespace ringattn::comm {

class EmulatedLinkCommunicator final : public Communicator {
 public:
  // Wraps `inner` (not owned; it must outlive this object).
  EmulatedLinkCommunicator(Communicator& inner, const LinkEmulation& link);
  // Wraps and owns `inner`.
  EmulatedLinkCommunicator(std::unique_ptr<Communicator> inner, const LinkEmulation& link);
  ~EmulatedLinkCommunicator() override = default;
  EmulatedLinkCommunicator(const EmulatedLinkCommunicator&) = delete;
  EmulatedLinkCommunicator& operator=(const EmulatedLinkCommunicator&) = delete;

  const LinkEmulation& link() const { return link_; }

  int rank() const override { return inner_->rank(); }
  int size() const override { return inner_->size(); }
  const char* name() const override { return inner_->name(); }
  MemorySpace memory() const override { return inner_->memory(); }

  Request isend(const void* buf, size_t bytes, int peer, int tag) override;
  Request irecv(void* buf, size_t bytes, int peer, int tag) override;
  bool test(Request& r) override;
  void wait(Request& r, const std::string& what) override;
  void progress() override { inner_->progress(); }

  void allreduce(void* buf, size_t count, DType type, ReduceOp op) override {
    inner_->allreduce(buf, count, type, op);
  }
  void broadcast(void* buf, size_t bytes, int root) override { inner_->broadcast(buf, bytes, root); }
  void allgather(const void* send, void* recv, size_t bytes_per_rank) override {
    inner_->allgather(send, recv, bytes_per_rank);
  }
  void allgatherv(const void* send, void* recv, std::span<const size_t> recv_bytes) override {
    inner_->allgatherv(send, recv, recv_bytes);
  }
  void reduce_scatter(const void* send, void* recv, std::span<const size_t> counts, DType type,
                      ReduceOp op) override {
    inner_->reduce_scatter(send, recv, counts, type, op);
  }
  void barrier() override { inner_->barrier(); }
  [[noreturn]] void abort(int exit_code) override { inner_->abort(exit_code); }
  // The part of the split is emulated too, on this rank's same ports.
  std::unique_ptr<Communicator> split(int color, int key) override;
  std::vector<int> node_of_ranks() override { return inner_->node_of_ranks(); }

  Communicator& inner() { return *inner_; }

  // One direction of a rank's port: messages queue for it and are carried one at a time.
  struct Port {
    double free_at = 0.0;  // when the port has carried every message booked so far
    // Books `bytes` posted at `now`; returns when they have arrived, and in `start` when the
    // port took them.
    double book(double now, size_t bytes, const LinkEmulation& link, double* start = nullptr);
  };

 private:
  struct Ports {
    Port outgoing, incoming;
  };
  struct Transfer {
    Request departure, payload;  // the inner transfers: the start time, then the data
    std::unique_ptr<double> start = std::make_unique<double>(0.0);
    bool is_send = false;
    size_t bytes = 0;
    double posted_at = 0.0;
    double done_at = 0.0;  // infinite for a receive until its departure time arrived
  };
  EmulatedLinkCommunicator(std::unique_ptr<Communicator> inner, const LinkEmulation& link,
                           std::shared_ptr<Ports> ports);
  Request post(void* buf, size_t bytes, int peer, int tag, bool is_send);
  // Books a receive's incoming port once its departure time is in.
  void arrived(Transfer& t);
  std::map<int64_t, Transfer>::iterator find(const Request& r, const char* call);
  // Drops a transfer done (or failed: its start time is kept for the inner communicator).
  void forget(std::map<int64_t, Transfer>::iterator it, Request& r, bool failed);

  std::unique_ptr<Communicator> owned_;
  Communicator* inner_;
  LinkEmulation link_;
  std::shared_ptr<Ports> ports_;
  std::map<int64_t, Transfer> transfers_;
  // The start times of transfers given up after an error: the inner communicator may still
  // write them (forget).
  std::vector<std::unique_ptr<double>> abandoned_;
  int64_t next_id_ = 0;
};

}  // namespace ringattn::comm
