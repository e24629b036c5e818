// The last rank calls abort(3) while the others wait for a message that never comes: mpirun
// must end them all and exit with 3. ctest runs it as comm_mpi_abort_np*, expecting exit code 3
// within the test's time limit, which is well below the others' timeout (an hour): only the
// abort can end them in time, however busy the machine.
#include <mpi.h>

#include <cstdint>

#include "comm/mpi_communicator.hpp"

int main(int argc, char** argv) {
  int provided = 0;
  MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
  using namespace ringattn::comm;
  std::unique_ptr<Communicator> comm = make_mpi_communicator(MPI_COMM_WORLD);
  comm->set_timeout(3600.0);
  const int last = comm->size() - 1;
  if (comm->rank() == last) comm->abort(3);
  uint8_t byte = 0;
  Request never = comm->irecv(&byte, 1, last, 0);
  comm->wait(never, "a message that never comes");
  MPI_Finalize();
  return 0;
}
