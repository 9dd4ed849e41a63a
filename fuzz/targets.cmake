# The fuzz targets, named once for both the libFuzzer build (CMakeLists.txt) and the replay
# build (replay.cmake). Each has fuzz/<name>.cpp defining LLVMFuzzerTestOneInput and a seed
# corpus in fuzz/corpus/<name>/.
set(CUSTOS_FUZZ_TARGETS fuzz_plan_json fuzz_canonical_decode)
