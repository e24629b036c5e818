// Roll call: after a timeout, find out which ranks are still answering, so that the error names
// the rank that stopped or died rather than "some rank" (a collective cannot say who is missing)
// or a neighbour that is itself only waiting (in a ring, everyone ends up waiting on someone).
//
// Each MpiCommunicator keeps one on a private duplicate of its MPI communicator, with a receive
// for an "ask" always posted. Any rank that is inside a blocking call of its communicator (a wait,
// a collective, or its own roll call) answers asks at once from its polling loop; a rank that is
// stopped (SIGSTOP), dead, or busy outside communication does not. A rank that times out asks
// every other rank and waits up to `grace` seconds for the answers. Then it stays answering until
// every rank that answered has asked too, for up to `grace` seconds more: ranks rarely time out at
// the same moment, and one that gave up first and left would otherwise be named by the others.
//
// Rounds are numbered: an ask carries its round and the answer repeats it, so an answer that
// arrives after its round gave up is recognised as stale by the next round and not counted.
#pragma once

#include <mpi.h>

#include <functional>
#include <list>
#include <string>
#include <vector>

namespace ringattn::comm {

class RollCall {
 public:
  // Takes ownership of `comm`, a communicator no one else sends on (a duplicate).
  explicit RollCall(MPI_Comm comm);
  ~RollCall();
  RollCall(const RollCall&) = delete;
  RollCall& operator=(const RollCall&) = delete;

  // Answers every ask that has arrived; cheap (one MPI_Test) when none has. Never throws.
  void answer();
  // Asks every other rank and returns those that did not answer within `grace` seconds,
  // answering the others' asks meanwhile (they may be calling the roll at the same moment);
  // returns once those that answered have asked too, or `grace` more seconds have passed.
  std::vector<int> absent(double grace);

 private:
  // An answer on its way; its buffer stays put (a list node) until MPI is done with it.
  struct Reply {
    int round = 0;
    MPI_Request request = MPI_REQUEST_NULL;
  };

  void post_ask_receive();
  void post_answer_receive(int peer, std::vector<MPI_Request>& answers);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0, size_ = 1;
  int round_ = 0;                       // this rank's latest roll call; what its asks carry
  MPI_Request ask_ = MPI_REQUEST_NULL;  // the receive for others' asks, always posted
  int asked_round_ = 0;                 // what that receive takes in: the asker's round
  std::list<Reply> replies_;            // answers sent, not yet known to be delivered
  std::vector<int> answer_rounds_;      // where each peer's answer lands: the round it answers
  std::vector<bool> asked_;             // which peers have asked since this rank's last roll call
};

// What a roll call found, in words for an error message, e.g. "rank 1 did not answer a roll
// call within 2 s (stopped, dead, or busy outside communication)". `describe` names a rank
// ("rank 3 (world rank 5)"); at most a few ranks are named, then a count.
std::string roll_call_text(const std::vector<int>& absent, int size, double grace,
                           const std::function<std::string(int)>& describe);

}  // namespace ringattn::comm
