# examples/torch_ppo (the PyTorch PPO league) through agentctl run, with the
# real controller, bus, mpirun and signals; skipped where /usr/bin/python3 has
# no torch. Serial: each run trains five ranks on this machine's cores, and the
# heartbeat scenarios need them not starved by another suite.
foreach(scenario league sigkill sigstop tampered)
  agentrt_script_test(NAME example_torch_ppo_${scenario}
    COMMAND ${AGENTRT_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/torch_ppo_test.py ${scenario}
    LABELS torch fault
    TIMEOUT 400)
  set_tests_properties(example_torch_ppo_${scenario} PROPERTIES SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
endforeach()
