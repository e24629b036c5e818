# Builds with -DRINGATTN_CUDA_EMULATION=ON: the NCCL communicator and the whole program on the
# emulated CUDA and NCCL (emulation/). Label nccl_emulation; launch/test.sh builds only these
# targets (ringattn, ringattn_nccl_emulated_tests) and runs only this label.
add_executable(ringattn_nccl_emulated_tests ${CMAKE_CURRENT_SOURCE_DIR}/comm/test_nccl_emulated.cpp
  ${CMAKE_CURRENT_SOURCE_DIR}/runtime/api/test_context_nccl_emulated.cpp)
target_link_libraries(ringattn_nccl_emulated_tests PRIVATE ringattn::ringattn ringattn_comm ringattn_mpi_test_main)
target_compile_options(ringattn_nccl_emulated_tests PRIVATE -Wall -Wextra)
foreach(np 1 2 4)  # communicators per rank must not grow with P
  ringattn_mpi_test(nccl_emulated_np${np} ringattn_nccl_emulated_tests ${np})
  set_tests_properties(nccl_emulated_np${np} PROPERTIES LABELS "mpi;nccl_emulation")
endforeach()

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
    set_tests_properties(nccl_emulated_cli_${group} PROPERTIES LABELS "cli;mpi;nccl_emulation" RUN_SERIAL TRUE
      TIMEOUT 600 ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1")
  endforeach()
endif()
