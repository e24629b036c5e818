# --check must be able to fail. Each check_fails_on_* test runs the job with RINGATTN_TEST_FAULT
# (launch/cli/test_hook.hpp): the ring computes with a slightly wrong mask, scale, head mapping or
# output, --check judges against the true ones, and the job must exit 3. The sizes make sampled
# rows see thousands of keys, where a one-key error is a small relative change. The
# check_passes_* tests are the controls: the same jobs without a fault pass.
set(ringattn_check_job --seq-len 4096 --heads 4 --kv-heads 2 --head-dim 16 --causal --check --threads 1)
set(ringattn_check_faults
  "output_element:output-element:"
  "window_off_by_one:window-off-by-one:--window|2048,-1"
  "document_boundary_off_by_one:document-off-by-one:--doc-lens|2048,2048"
  "causal_diagonal_excluded:causal-diagonal:"
  "wrong_softmax_scale:softmax-scale:"
  "swapped_gqa_head:gqa-head:")
foreach(entry ${ringattn_check_faults})
  string(REPLACE ":" ";" parts "${entry}")  # NAME:FAULT:EXTRA ARGS separated by |
  string(REPLACE "|" ";" parts "${parts}")
  list(GET parts 0 name)
  list(GET parts 1 fault)
  list(LENGTH parts n)
  set(extra "")
  if(n GREATER 2)
    list(SUBLIST parts 2 -1 extra)
  endif()
  # fp32, and bf16: the bound follows the rounding of the kernels that ran, so a fault fails in both.
  foreach(dtype fp32 bf16)
    set(test check_fails_on_${name})
    if(dtype STREQUAL bf16)
      set(test check_fails_on_${name}_bf16)
    endif()
    ringattn_mpi_test(${test} ringattn 2 EXIT_CODE 3 ARGS ${ringattn_check_job} ${extra} --dtype ${dtype})
    set_tests_properties(${test} PROPERTIES TIMEOUT 600 ENVIRONMENT
      "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;RINGATTN_TEST_FAULT=${fault}")
  endforeach()
endforeach()
# The controls, forward and backward (dK/dV with fp64 LSE recomputed), fp32 and bf16.
ringattn_mpi_test(check_passes_without_fault ringattn 2 ARGS ${ringattn_check_job} --window 2048,-1 --backward)
ringattn_mpi_test(check_passes_without_fault_documents_bf16 ringattn 2 ARGS ${ringattn_check_job}
                  --doc-lens 2048,2048 --backward --dtype bf16)
# A fault that does not apply to the job is bad usage, on every rank.
ringattn_mpi_test(check_fault_needs_its_mask ringattn 2 EXIT_CODE 2 ARGS ${ringattn_check_job})
set_tests_properties(check_fault_needs_its_mask PROPERTIES ENVIRONMENT
  "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;RINGATTN_TEST_FAULT=window-off-by-one")
