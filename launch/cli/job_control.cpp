#include "launch/cli/job_control.hpp"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <new>
#include <vector>

#include "launch/cli/argument_names.hpp"
#include "runtime/errors.hpp"
#include "runtime/io/temp_files.hpp"

namespace ringattn {

int exit_code_of(const std::exception& e) {
  if (const auto* f = dynamic_cast<const JobFailed*>(&e)) return f->code();
  if (dynamic_cast<const ArgumentError*>(&e)) return kExitUsage;
  if (dynamic_cast<const CheckFailure*>(&e)) return kExitCheckFailed;
  return kExitFault;  // Fault (comm::CommError among them), bad_alloc, anything unexpected
}

std::string message_of(const std::exception& e) { return message_in_flags(e); }

void print_error(const std::string& message) {
  std::fprintf(stderr, "ringattn: error: %s\n", message.c_str());
  std::fflush(stderr);
}

void agreed_phase(comm::Communicator& comm, const std::function<void()>& phase) {
  int code = 0;
  std::string message;
  try {
    phase();
  } catch (const JobFailed& e) {
    code = e.code();  // reported already (nested phase)
  } catch (const std::exception& e) {
    code = exit_code_of(e);
    message = message_of(e);
  }
  int worst = code;
  comm.allreduce(&worst, 1, DType::i32, comm::ReduceOp::max);
  if (worst == 0) return;

  // Share the messages (bounded length) so rank 0 prints each distinct one once.
  constexpr size_t kLen = 1024;
  std::vector<char> mine(kLen, 0), all(kLen * static_cast<size_t>(comm.size()));
  std::strncpy(mine.data(), message.c_str(), kLen - 1);
  comm.allgather(mine.data(), all.data(), kLen);
  if (comm.rank() == 0) {
    std::map<std::string, std::vector<int>> ranks_by_message;
    for (int r = 0; r < comm.size(); ++r) {
      std::string m(&all[kLen * static_cast<size_t>(r)]);
      if (!m.empty()) ranks_by_message[m].push_back(r);
    }
    for (const auto& [m, ranks] : ranks_by_message) {
      if (static_cast<int>(ranks.size()) == comm.size()) {
        print_error(m);
      } else {
        std::string who = "rank " + std::to_string(ranks[0]);
        if (ranks.size() > 1) who += " (and " + std::to_string(ranks.size() - 1) + " more)";
        print_error(who + ": " + m);
      }
    }
  }
  throw JobFailed(worst);
}

void fail_now(comm::Communicator& comm, const std::exception& e) {
  const int code = exit_code_of(e);
  const std::string message = message_of(e), rank = "rank " + std::to_string(comm.rank());
  // A JobFailed was reported by the agreed phase that failed. Communication errors name the rank
  // already ("rank 3: timed out ...").
  if (dynamic_cast<const JobFailed*>(&e) == nullptr) {
    if (comm.size() > 1 && message.rfind(rank + ":", 0) != 0 && message.rfind(rank + " ", 0) != 0)
      print_error(rank + ": " + message);
    else
      print_error(message);
  }
  // MPI_Abort ends this process without unwinding: remove its unfinished outputs first (a
  // peer's failure can reach this rank before mpirun's signal does).
  temp_files::remove_all();
  comm.abort(code);
  std::_Exit(code);  // not reached: abort() ends the process
}

}  // namespace ringattn
