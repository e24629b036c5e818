# Builds with -DRINGATTN_CUDA_EMULATION=ON: the NCCL communicator and the whole program on the
# emulated CUDA and NCCL (emulation/). Label nccl_emulation; launch/test.sh builds only these
# targets (ringattn, ringattn_nccl_emulated_tests) and runs only this label.
add_executable(ringattn_nccl_emulated_tests ${CMAKE_CURRENT_SOURCE_DIR}/comm/test_nccl_emulated.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/api/test_context_nccl_emulated.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/api/test_kv_cache_nccl_emulated.cpp)
target_link_libraries(ringattn_nccl_emulated_tests PRIVATE ringattn::ringattn ringattn_comm ringattn_mpi_test_main)
target_compile_options(ringattn_nccl_emulated_tests PRIVATE -Wall -Wextra)
foreach(np 1 2 4)  # communicators per rank must not grow with P
  ringattn_mpi_test(nccl_emulated_np${np} ringattn_nccl_emulated_tests ${np})
  set_tests_properties(nccl_emulated_np${np} PROPERTIES LABELS "mpi;nccl_emulation")
endforeach()

# Inference on the CUDA backend (the KV cache in device memory, the CUDA decode kernel, the merge
# on the device): ringattn_inference_tests at P = 1-4 over NCCL and at 2 over host-staged MPI,
# every output against fp64; `ringattn decode --backend cuda --comm nccl --check` (chunked prefill
# by the rule, a window, speculative tokens, bf16, uneven shares at 3 ranks) and its bad input.
foreach(np 1 2 3 4)
  ringattn_mpi_test(inference_nccl_emulated_np${np} ringattn_inference_tests ${np})
  set_tests_properties(inference_nccl_emulated_np${np} PROPERTIES LABELS "mpi;nccl_emulation" ENVIRONMENT
    "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;RINGATTN_TEST_BACKEND=cuda;RINGATTN_TEST_COMM=nccl")
endforeach()
ringattn_mpi_test(inference_cuda_mpi_emulated_np2 ringattn_inference_tests 2)
set_tests_properties(inference_cuda_mpi_emulated_np2 PROPERTIES LABELS "mpi;nccl_emulation" ENVIRONMENT
  "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;RINGATTN_TEST_BACKEND=cuda;RINGATTN_TEST_COMM=mpi")
ringattn_mpi_test(decode_cli_cuda_emulated_np1 ringattn 1 ARGS decode --backend cuda --comm nccl --seq-len 700
                  --heads 8 --kv-heads 2 --head-dim 64 --new-tokens 3 --threads 1 --check)
ringattn_mpi_test(decode_cli_cuda_emulated_np3 ringattn 3 ARGS decode --backend cuda --comm nccl --seq-len 601
                  --batch 2 --heads 8 --kv-heads 2 --head-dim 32 --new-tokens 3 --tokens-per-step 2
                  --prefill-chunk 200 --window 150,0 --dtype bf16 --interleave 2 --threads 1 --check)
ringattn_mpi_test(decode_cli_cuda_emulated_fill_np2 ringattn 2 ARGS decode --backend cuda --comm nccl --seq-len 3000
                  --heads 4 --kv-heads 1 --head-dim 64 --prefill-method none --new-tokens 3 --threads 1 --check)
ringattn_mpi_test(decode_cli_cuda_emulated_capacity_np2 ringattn 2 EXIT_CODE 2 ARGS decode --backend cuda --comm nccl
                  --seq-len 500 --heads 4 --head-dim 32 --prefill-method none --capacity 255 --new-tokens 20
                  --threads 1)
set_tests_properties(decode_cli_cuda_emulated_np1 decode_cli_cuda_emulated_np3 decode_cli_cuda_emulated_fill_np2
  decode_cli_cuda_emulated_capacity_np2 PROPERTIES LABELS "mpi;nccl_emulation")

# The LoRA layer on --backend cuda --comm nccl against its fp64 reference: GEMMs through the
# emulated cuBLAS (served by the CPU GEMM), RoPE, biases and bf16 rounding as kernels on the
# emulated GPU, parameter gathers and the gradient reduce-scatter through the emulated NCCL; fp32
# and bf16, training steps equal to one process's. At P = 2 the CPU suite's cases but the widest
# sweeps (every mask x layout x schedule; the 40-step demo), which the emulated kernels make slow;
# at P = 3 (parameters cut unevenly: padded reduce-scatter blocks) a few.
ringattn_mpi_test(lora_nccl_emulated_np2 ringattn_lora_tests 2 ARGS
                  --gtest_filter=-*EveryLayoutScheduleAndMask*:*DemoLossCurve*)
ringattn_mpi_test(lora_nccl_emulated_np3 ringattn_lora_tests 3 ARGS
                  --gtest_filter=*PartialLoraMqa*:*SgdStep*:*Bf16*)
set_tests_properties(lora_nccl_emulated_np2 lora_nccl_emulated_np3 PROPERTIES LABELS "mpi;nccl_emulation" ENVIRONMENT
  "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;RINGATTN_TEST_BACKEND=cuda;RINGATTN_TEST_COMM=nccl")

if(RINGATTN_PYTHON)
  foreach(group attention layer faults)
    add_test(NAME nccl_emulated_cli_${group}
             COMMAND ${RINGATTN_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/comm/nccl_emulated_cli.py
                     --ringattn $<TARGET_FILE:ringattn> --mpiexec ${MPIEXEC_EXECUTABLE} ${group})
    set_tests_properties(nccl_emulated_cli_${group} PROPERTIES LABELS "cli;mpi;nccl_emulation" PROCESSORS 2
      TIMEOUT 900 ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  endforeach()
endif()
