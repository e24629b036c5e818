#include "launch/cli/npy_outputs.hpp"

#include <optional>

#include "launch/cli/job_control.hpp"

namespace ringattn {

void write_outputs(comm::Communicator& comm, const std::vector<OutputRows>& files,
                   const std::function<void()>& after_write) {
  std::vector<std::optional<NpyOutput>> outs(files.size());
  agreed_phase(comm, [&] {
    if (comm.rank() == 0)
      for (size_t i = 0; i < files.size(); ++i)
        outs[i] = NpyOutput::create(files[i].path, files[i].label, files[i].shape);
  });
  std::vector<std::string> temps(files.size());
  for (size_t i = 0; i < files.size(); ++i) {
    if (comm.rank() == 0) temps[i] = outs[i]->temp_path();
    uint64_t n = temps[i].size();
    comm.broadcast(&n, sizeof n, 0);
    temps[i].resize(n);
    comm.broadcast(temps[i].data(), n, 0);
  }
  agreed_phase(comm, [&] {
    for (size_t i = 0; i < files.size(); ++i) {
      // Opened inside the phase: a rank that cannot open it fails with the others, reported once.
      if (comm.rank() != 0) outs[i].emplace(NpyOutput::open(files[i].path, temps[i], files[i].label, files[i].shape));
      outs[i]->write_rows(files[i].rows, files[i].data);
      outs[i]->finish();
    }
    if (after_write) after_write();
  });
  agreed_phase(comm, [&] {
    if (comm.rank() == 0)
      for (auto& out : outs) out->commit();
  });
}

}  // namespace ringattn
