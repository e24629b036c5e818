# Sourced by the launch scripts: the environment mpirun needs here.
# Open MPI refuses to run as root unless told it is intended (containers, CI).
if [ "$(id -u)" -eq 0 ]; then
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
fi
# Some environments pin OpenBLAS to an older core type (e.g. Haswell on an AVX-512 machine), which
# halves its sgemm; our benchmark compares against sgemm, so let OpenBLAS pick the real core.
unset OPENBLAS_CORETYPE
export OMPI_MCA_btl_vader_single_copy_mechanism=${OMPI_MCA_btl_vader_single_copy_mechanism:-none}
# The Python module ringattn, built by launch/build.sh into build/python (docs/python.md).
ringattn_root=$(cd "$(dirname "${BASH_SOURCE[0]:-$0}")/.." && pwd)
case ":${PYTHONPATH:-}:" in
  *":$ringattn_root/build/python:"*) ;;
  *) export PYTHONPATH="$ringattn_root/build/python${PYTHONPATH:+:$PYTHONPATH}" ;;
esac
unset ringattn_root
