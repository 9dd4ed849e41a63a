# The fuzz targets, named once for both the libFuzzer build (CMakeLists.txt) and the replay
# build (replay.cmake). Each has fuzz/<name>.cpp defining LLVMFuzzerTestOneInput and a seed
# corpus in fuzz/corpus/<name>/.
# CUSTOS_FUZZ_LIBS_<name> lists a target's libraries (default: custos_core).
set(CUSTOS_FUZZ_TARGETS fuzz_plan_json fuzz_canonical_decode fuzz_engine_response
    fuzz_engine_frames)
set(CUSTOS_FUZZ_LIBS_fuzz_plan_json custos_sandbox)
set(CUSTOS_FUZZ_LIBS_fuzz_canonical_decode custos_sandbox)
set(CUSTOS_FUZZ_LIBS_fuzz_engine_response custos_engine)
set(CUSTOS_FUZZ_LIBS_fuzz_engine_frames custos_engine)
