# cmake -P: runs the built custos to print its completion scripts and man pages into OUT_DIR, in
# the layout they are installed in (share/...); the man pages also gzipped (-n: no name or time
# stamp, so the same binary gives the same bytes). Called by the custos_shell_docs target.
# Variables: CUSTOS_BINARY, OUT_DIR, GZIP.
foreach(var CUSTOS_BINARY OUT_DIR GZIP)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "GenerateShellDocs.cmake needs -D${var}=...")
  endif()
endforeach()
# A sanitizer build's leak check at exit has nothing to say about a generator.
set(ENV{ASAN_OPTIONS} "detect_leaks=0")

function(generate out)
  get_filename_component(dir "${OUT_DIR}/${out}" DIRECTORY)
  file(MAKE_DIRECTORY "${dir}")
  execute_process(COMMAND "${CUSTOS_BINARY}" ${ARGN} OUTPUT_FILE "${OUT_DIR}/${out}"
                  RESULT_VARIABLE rc ERROR_VARIABLE err)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "custos ${ARGN} failed (${rc}): ${err}")
  endif()
endfunction()

function(generate_man out)
  generate(${out} ${ARGN})
  execute_process(COMMAND "${GZIP}" -9 -n -c "${OUT_DIR}/${out}" OUTPUT_FILE "${OUT_DIR}/${out}.gz"
                  RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "gzip ${out} failed (${rc})")
  endif()
endfunction()

generate(share/bash-completion/completions/custos completion bash)
generate(share/zsh/vendor-completions/_custos completion zsh)
generate(share/fish/vendor_completions.d/custos.fish completion fish)
generate_man(share/man/man1/custos.1 manpage custos)
generate_man(share/man/man8/custos-daemon.8 manpage custos-daemon)
generate_man(share/man/man5/custos.toml.5 manpage custos.toml)
