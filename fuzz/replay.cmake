# Replay executables: each fuzz target linked with a plain main (replay_main.cpp) that runs every
# file of its checked-in corpus, registered with ctest as fuzz_replay_<name> where <name> is the
# target without its fuzz_ prefix (fuzz_replay_plan_json, fuzz_replay_canonical_decode). Include this from
# tests/CMakeLists.txt so the corpus runs in every normal (sanitizer) test run.
include("${CMAKE_CURRENT_LIST_DIR}/targets.cmake")
set(_custos_fuzz_dir "${CMAKE_CURRENT_LIST_DIR}")
foreach(_t IN LISTS CUSTOS_FUZZ_TARGETS)
  if(TARGET replay_${_t})
    continue()
  endif()
  add_executable(replay_${_t} "${_custos_fuzz_dir}/${_t}.cpp" "${_custos_fuzz_dir}/replay_main.cpp")
  set(_libs custos_core)
  if(DEFINED CUSTOS_FUZZ_LIBS_${_t})
    set(_libs ${CUSTOS_FUZZ_LIBS_${_t}})
  endif()
  target_link_libraries(replay_${_t} PRIVATE ${_libs} custos_flags)
  string(REGEX REPLACE "^fuzz_" "" _name "${_t}")
  add_test(NAME fuzz_replay_${_name} COMMAND replay_${_t} "${_custos_fuzz_dir}/corpus/${_t}")
  set_tests_properties(fuzz_replay_${_name} PROPERTIES LABELS "fuzz;core" TIMEOUT 120)
endforeach()
