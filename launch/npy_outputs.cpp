#include "launch/npy_outputs.hpp"

#include <optional>

#include "launch/job_control.hpp"

namespace ringattn {

void write_outputs(comm::Communicator& comm, const std::vector<OutputRows>& files) {
  std::vector<std::optional<NpyOutput>> outs(files.size());
  agreed_phase(comm, [&] {
    if (comm.rank() == 0)
      for (size_t i = 0; i < files.size(); ++i)
        outs[i] = NpyOutput::create(files[i].path, files[i].label, files[i].shape);
  });
  for (size_t i = 0; i < files.size(); ++i) {
    std::string temp = comm.rank() == 0 ? outs[i]->temp_path() : std::string();
    uint64_t n = temp.size();
    comm.broadcast(&n, sizeof n, 0);
    temp.resize(n);
    comm.broadcast(temp.data(), n, 0);
    if (comm.rank() != 0) outs[i].emplace(NpyOutput::open(files[i].path, temp, files[i].label, files[i].shape));
  }
  agreed_phase(comm, [&] {
    for (size_t i = 0; i < files.size(); ++i) {
      outs[i]->write_rows(files[i].rows, files[i].data);
      outs[i]->finish();
    }
  });
  agreed_phase(comm, [&] {
    if (comm.rank() == 0)
      for (auto& out : outs) out->commit();
  });
}

}  // namespace ringattn
