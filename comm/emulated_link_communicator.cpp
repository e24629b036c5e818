#include "comm/emulated_link_communicator.hpp"

#include <algorithm>
#include <chrono>
#include <limits>
#include <thread>

#include "util/stopwatch.hpp"

namespace ringattn::comm {

namespace {

constexpr double kForever = std::numeric_limits<double>::infinity();

}  // namespace

double EmulatedLinkCommunicator::Port::book(double now, size_t bytes, const LinkEmulation& link, double* start) {
  const double begin = std::max(now, free_at);
  if (start) *start = begin;
  free_at = begin + (link.gbps > 0.0 ? double(bytes) / (link.gbps * 1e9) : 0.0);
  return free_at + link.latency_us * 1e-6;
}

EmulatedLinkCommunicator::EmulatedLinkCommunicator(Communicator& inner, const LinkEmulation& link)
    : inner_(&inner), link_(link), ports_(std::make_shared<Ports>()) {
  set_timeout(inner.timeout());
}

EmulatedLinkCommunicator::EmulatedLinkCommunicator(std::unique_ptr<Communicator> inner, const LinkEmulation& link)
    : EmulatedLinkCommunicator(std::move(inner), link, std::make_shared<Ports>()) {}

EmulatedLinkCommunicator::EmulatedLinkCommunicator(std::unique_ptr<Communicator> inner, const LinkEmulation& link,
                                                   std::shared_ptr<Ports> ports)
    : owned_(std::move(inner)), inner_(owned_.get()), link_(link), ports_(std::move(ports)) {
  set_timeout(inner_->timeout());
}

Request EmulatedLinkCommunicator::isend(const void* buf, size_t bytes, int peer, int tag) {
  return post(const_cast<void*>(buf), bytes, peer, tag, true);
}

Request EmulatedLinkCommunicator::irecv(void* buf, size_t bytes, int peer, int tag) {
  return post(buf, bytes, peer, tag, false);
}

Request EmulatedLinkCommunicator::post(void* buf, size_t bytes, int peer, int tag, bool is_send) {
  inner_->set_timeout(timeout());
  Transfer t;
  t.is_send = is_send;
  t.bytes = bytes;
  // A message to oneself never crosses the network: not delayed. Otherwise the start time goes
  // ahead of the payload on the same tag, and the receive books its port when it arrives.
  if (peer != inner_->rank()) {
    if (is_send) {
      t.done_at = ports_->outgoing.book(now_seconds(), bytes, link_, t.start.get());
      t.departure = inner_->isend(t.start.get(), sizeof(double), peer, tag);
    } else {
      t.posted_at = now_seconds();
      t.done_at = kForever;
      t.departure = inner_->irecv(t.start.get(), sizeof(double), peer, tag);
    }
  }
  t.payload = is_send ? inner_->isend(buf, bytes, peer, tag) : inner_->irecv(buf, bytes, peer, tag);
  if (is_send) bytes_sent_ += bytes;
  const int64_t id = next_id_++;
  transfers_.emplace(id, std::move(t));
  return Request{id};
}

void EmulatedLinkCommunicator::arrived(Transfer& t) {
  if (!t.is_send && t.done_at == kForever)
    t.done_at = ports_->incoming.book(std::max(*t.start, t.posted_at), t.bytes, link_);
}

std::map<int64_t, EmulatedLinkCommunicator::Transfer>::iterator EmulatedLinkCommunicator::find(const Request& r,
                                                                                              const char* call) {
  auto it = transfers_.find(r.id);
  if (it == transfers_.end())
    throw CommError(std::string("emulated link: ") + call + " of request " + std::to_string(r.id) +
                    ", which this communicator does not hold");
  return it;
}

void EmulatedLinkCommunicator::forget(std::map<int64_t, Transfer>::iterator it, Request& r, bool failed) {
  if (failed) abandoned_.push_back(std::move(it->second.start));  // the inner one may still write it
  transfers_.erase(it);
  r.id = -1;
}

bool EmulatedLinkCommunicator::test(Request& r) {
  if (!r.valid()) return true;
  auto it = find(r, "test");
  Transfer& t = it->second;
  bool done = false;
  try {
    if (t.departure.valid() && inner_->test(t.departure)) arrived(t);
    done = !t.departure.valid() && inner_->test(t.payload) && now_seconds() >= t.done_at;
  } catch (const CommError&) {
    forget(it, r, true);
    throw;
  }
  if (done) forget(it, r, false);
  return done;
}

void EmulatedLinkCommunicator::wait(Request& r, const std::string& what) {
  if (!r.valid()) return;
  auto it = find(r, "wait");
  Transfer& t = it->second;
  inner_->set_timeout(timeout());
  const Stopwatch blocked;
  try {
    // Each inner wait is bounded by the timeout; what is left after them is emulated time,
    // known and finite.
    if (t.departure.valid()) {
      inner_->wait(t.departure, what);
      arrived(t);
    }
    inner_->wait(t.payload, what);
  } catch (const CommError&) {
    forget(it, r, true);
    throw;
  }
  const double left = t.done_at - now_seconds();
  if (left > 0) std::this_thread::sleep_for(std::chrono::duration<double>(left));
  wait_seconds_ += blocked.seconds();
  forget(it, r, false);
}

std::unique_ptr<Communicator> EmulatedLinkCommunicator::split(int color, int key) {
  std::unique_ptr<Communicator> part = inner_->split(color, key);
  if (!part) return nullptr;
  // (The constructor taking the ports is private: make_unique cannot reach it.)
  std::unique_ptr<Communicator> emulated(new EmulatedLinkCommunicator(std::move(part), link_, ports_));
  emulated->set_timeout(timeout());
  return emulated;
}

}  // namespace ringattn::comm
