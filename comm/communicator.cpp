#include "comm/communicator.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstring>

namespace ringattn::comm {

StepHandle Communicator::post_step(std::span<const StepTransfer> transfers) {
  std::vector<Request> requests;
  requests.reserve(transfers.size());
  // Receives first, so that every receive of the step is posted before its peers' sends arrive.
  for (const StepTransfer& t : transfers)
    if (t.kind == StepTransfer::Kind::recv) requests.push_back(irecv(t.buf, t.bytes, t.peer, kStepTag));
  for (const StepTransfer& t : transfers)
    if (t.kind == StepTransfer::Kind::send) requests.push_back(isend(t.buf, t.bytes, t.peer, kStepTag));
  const StepHandle handle{steps_posted_++};
  open_steps_.emplace_back(handle.id, std::move(requests));
  return handle;
}

void Communicator::wait_step(StepHandle& step, const std::string& what) {
  if (!step.valid()) return;
  auto it = std::find_if(open_steps_.begin(), open_steps_.end(), [&](const auto& s) { return s.first == step.id; });
  if (it == open_steps_.end())
    throw CommError("wait_step of step " + std::to_string(step.id) + ", which this communicator does not hold");
  std::vector<Request> requests = std::move(it->second);
  open_steps_.erase(it);
  step.id = -1;
  wait_all(requests, what);
}

void Communicator::alltoallv(const void* send, std::span<const size_t> send_bytes, void* recv,
                             std::span<const size_t> recv_bytes) {
  const int n = size();
  if (send_bytes.size() != size_t(n) || recv_bytes.size() != size_t(n))
    throw CommError("rank " + std::to_string(rank()) + ": alltoallv given " + std::to_string(send_bytes.size()) +
                    " send and " + std::to_string(recv_bytes.size()) + " receive sizes for a communicator of " +
                    std::to_string(n) + " ranks");
  std::vector<size_t> recv_offset(size_t(n) + 1, 0), send_offset(size_t(n) + 1, 0);
  for (int i = 0; i < n; ++i) {
    recv_offset[size_t(i) + 1] = recv_offset[size_t(i)] + recv_bytes[size_t(i)];
    send_offset[size_t(i) + 1] = send_offset[size_t(i)] + send_bytes[size_t(i)];
  }
  std::vector<Request> requests;
  requests.reserve(2 * size_t(n));
  // Receives first, so no send waits for its receive to be posted; empty blocks are not sent.
  // Rank r sends to r + 1, r + 2, ... and receives from r - 1, r - 2, ...: at each turn every
  // rank sends to a different one, so no rank's link is everyone's first stop (with messages
  // queued on each rank's link, as on a network port, posting in rank order would serialise
  // every first message on rank 0, every second on rank 1, ...).
  const int me = rank();
  for (int s = 0; s < n; ++s) {
    const size_t i = size_t((me - s + n) % n);
    if (recv_bytes[i] > 0)
      requests.push_back(irecv(static_cast<char*>(recv) + recv_offset[i], recv_bytes[i], int(i), kAlltoallTag));
  }
  for (int s = 0; s < n; ++s) {
    const size_t j = size_t((me + s) % n);
    if (send_bytes[j] > 0)
      requests.push_back(isend(static_cast<const char*>(send) + send_offset[j], send_bytes[j], int(j), kAlltoallTag));
  }
  wait_all(requests, "alltoallv");
}

std::vector<int> Communicator::node_of_ranks() {
  constexpr size_t kName = 256;
  char mine[kName] = {};
  gethostname(mine, kName - 1);
  const int n = size();
  std::vector<char> names(kName * size_t(n));
  allgather(mine, names.data(), kName);
  std::vector<int> node(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    node[size_t(r)] = r;
    for (int q = 0; q < r; ++q)
      if (std::strncmp(&names[kName * size_t(q)], &names[kName * size_t(r)], kName) == 0) {
        node[size_t(r)] = q;
        break;
      }
  }
  return node;
}

}  // namespace ringattn::comm
