#include "comm/roll_call.hpp"

#include <algorithm>
#include <sstream>
#include <thread>

#include "util/stopwatch.hpp"

namespace ringattn::comm {
namespace {

constexpr int kAskTag = 1;
constexpr int kAnswerTag = 2;
// Ranks named in a message before the rest are only counted: at scale, a whole node's worth of
// absent ranks is one line, not eight hundred.
constexpr size_t kRanksNamed = 8;

}  // namespace

RollCall::RollCall(MPI_Comm comm) : comm_(comm) {
  // Failures (a dead peer) are answers too: they must come back as codes, not abort the job here.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  answer_rounds_.resize(size_t(size_));
  asked_.assign(size_t(size_), false);
  post_ask_receive();
}

RollCall::~RollCall() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (ask_ != MPI_REQUEST_NULL) {
    MPI_Cancel(&ask_);
    MPI_Request_free(&ask_);
  }
  for (Reply& reply : replies_)
    if (reply.request != MPI_REQUEST_NULL) MPI_Request_free(&reply.request);  // 4 bytes: sent eagerly
  MPI_Comm_free(&comm_);
}

void RollCall::post_ask_receive() {
  if (MPI_Irecv(&asked_round_, 1, MPI_INT, MPI_ANY_SOURCE, kAskTag, comm_, &ask_) != MPI_SUCCESS)
    ask_ = MPI_REQUEST_NULL;  // this rank stops answering; the job is failing anyway
}

void RollCall::answer() {
  // Forget the answers that have left.
  std::erase_if(replies_, [](Reply& reply) {
    int done = 0;
    return MPI_Test(&reply.request, &done, MPI_STATUS_IGNORE) != MPI_SUCCESS || done;
  });
  while (ask_ != MPI_REQUEST_NULL) {
    int arrived = 0;
    MPI_Status status;
    if (MPI_Test(&ask_, &arrived, &status) != MPI_SUCCESS) {
      ask_ = MPI_REQUEST_NULL;
      return;
    }
    if (!arrived) return;
    asked_[size_t(status.MPI_SOURCE)] = true;
    Reply& reply = replies_.emplace_back();
    reply.round = asked_round_;
    if (MPI_Isend(&reply.round, 1, MPI_INT, status.MPI_SOURCE, kAnswerTag, comm_, &reply.request) != MPI_SUCCESS)
      replies_.pop_back();
    post_ask_receive();
  }
}

void RollCall::post_answer_receive(int peer, std::vector<MPI_Request>& answers) {
  // A peer whose receive cannot even be posted (its process is gone) simply never answers.
  if (MPI_Irecv(&answer_rounds_[size_t(peer)], 1, MPI_INT, peer, kAnswerTag, comm_, &answers[size_t(peer)]) != MPI_SUCCESS)
    answers[size_t(peer)] = MPI_REQUEST_NULL;
}

std::vector<int> RollCall::absent(double grace) {
  ++round_;
  std::vector<MPI_Request> answers(size_t(size_), MPI_REQUEST_NULL), asks;
  std::vector<bool> answered(size_t(size_), false);
  answered[size_t(rank_)] = true;
  for (int peer = 0; peer < size_; ++peer) {
    if (peer == rank_) continue;
    post_answer_receive(peer, answers);
    MPI_Request ask;
    if (MPI_Isend(&round_, 1, MPI_INT, peer, kAskTag, comm_, &ask) == MPI_SUCCESS) asks.push_back(ask);
  }
  const Stopwatch waited;
  size_t missing = size_t(size_) - 1;
  while (missing > 0 && waited.seconds() < grace) {
    answer();
    for (int peer = 0; peer < size_; ++peer) {
      MPI_Request& req = answers[size_t(peer)];
      if (answered[size_t(peer)] || req == MPI_REQUEST_NULL) continue;
      int arrived = 0;
      if (MPI_Test(&req, &arrived, MPI_STATUS_IGNORE) != MPI_SUCCESS) {
        req = MPI_REQUEST_NULL;  // a failed peer: it stays unanswered
      } else if (arrived && answer_rounds_[size_t(peer)] == round_) {
        answered[size_t(peer)] = true;
        --missing;
      } else if (arrived) {
        post_answer_receive(peer, answers);  // a late answer to an earlier round
      }
    }
    // Others' answers come from their own polling loops; no need to hold the core meanwhile.
    if (missing > 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  for (MPI_Request& ask : asks) MPI_Request_free(&ask);  // 4 bytes: sent eagerly

  // Stay for the roll calls of the ranks that answered: they may time out a little later.
  auto everyone_asked = [&] {
    for (int peer = 0; peer < size_; ++peer)
      if (peer != rank_ && answered[size_t(peer)] && !asked_[size_t(peer)]) return false;
    return true;
  };
  const Stopwatch stayed;
  for (answer(); !everyone_asked() && stayed.seconds() < grace; answer())
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  asked_.assign(size_t(size_), false);

  std::vector<int> absent;
  for (int peer = 0; peer < size_; ++peer) {
    if (answered[size_t(peer)]) continue;
    absent.push_back(peer);
    if (MPI_Request& req = answers[size_t(peer)]; req != MPI_REQUEST_NULL) {
      MPI_Cancel(&req);
      MPI_Request_free(&req);
    }
  }
  return absent;
}

std::string roll_call_text(const std::vector<int>& absent, int size, double grace,
                           const std::function<std::string(int)>& describe) {
  std::ostringstream out;
  if (absent.empty()) {
    out << "a roll call found all " << size << " ranks alive: one is late, or waiting on something else";
    return out.str();
  }
  out << (absent.size() == 1 ? describe(absent[0]) : std::to_string(absent.size()) + " ranks")
      << " did not answer a roll call within " << grace << " s (stopped, dead, or busy outside communication)";
  if (absent.size() > 1) {
    out << ": ";
    for (size_t i = 0; i < std::min(absent.size(), kRanksNamed); ++i) out << (i ? ", " : "") << describe(absent[i]);
    if (absent.size() > kRanksNamed) out << " and " << absent.size() - kRanksNamed << " more";
  }
  return out.str();
}

}  // namespace ringattn::comm
