# Shell completions and man pages, printed by the built binary itself (`custos completion ...`,
# `custos manpage ...`, both generated from the CLI11 definition) into ${CUSTOS_SHELL_DOCS_DIR},
# laid out as under /usr. Rebuilt whenever custos is relinked; installed by CustosPackaging.
find_program(GZIP_EXECUTABLE gzip REQUIRED)
set(CUSTOS_SHELL_DOCS_DIR "${CMAKE_BINARY_DIR}/shell-docs")
set(CUSTOS_COMPLETIONS
    "${CUSTOS_SHELL_DOCS_DIR}/share/bash-completion/completions/custos"
    "${CUSTOS_SHELL_DOCS_DIR}/share/zsh/vendor-completions/_custos"
    "${CUSTOS_SHELL_DOCS_DIR}/share/fish/vendor_completions.d/custos.fish")
set(CUSTOS_MAN_PAGES
    "${CUSTOS_SHELL_DOCS_DIR}/share/man/man1/custos.1"
    "${CUSTOS_SHELL_DOCS_DIR}/share/man/man8/custos-daemon.8"
    "${CUSTOS_SHELL_DOCS_DIR}/share/man/man5/custos.toml.5")
set(gz_pages)
foreach(page IN LISTS CUSTOS_MAN_PAGES)
  list(APPEND gz_pages "${page}.gz")
endforeach()
add_custom_command(
  OUTPUT ${CUSTOS_COMPLETIONS} ${CUSTOS_MAN_PAGES} ${gz_pages}
  COMMAND "${CMAKE_COMMAND}" "-DCUSTOS_BINARY=$<TARGET_FILE:custos>"
          "-DOUT_DIR=${CUSTOS_SHELL_DOCS_DIR}" "-DGZIP=${GZIP_EXECUTABLE}"
          -P "${PROJECT_SOURCE_DIR}/cmake/GenerateShellDocs.cmake"
  DEPENDS custos "${PROJECT_SOURCE_DIR}/cmake/GenerateShellDocs.cmake"
  COMMENT "Generating shell completions and man pages from custos"
  VERBATIM)
add_custom_target(custos_shell_docs ALL DEPENDS ${CUSTOS_COMPLETIONS} ${gz_pages})

install(FILES "${CUSTOS_SHELL_DOCS_DIR}/share/bash-completion/completions/custos"
        DESTINATION share/bash-completion/completions)
install(FILES "${CUSTOS_SHELL_DOCS_DIR}/share/zsh/vendor-completions/_custos"
        DESTINATION share/zsh/vendor-completions)
install(FILES "${CUSTOS_SHELL_DOCS_DIR}/share/fish/vendor_completions.d/custos.fish"
        DESTINATION share/fish/vendor_completions.d)
foreach(page IN LISTS CUSTOS_MAN_PAGES)
  get_filename_component(dir "${page}" DIRECTORY)
  get_filename_component(mandir "${dir}" NAME)
  install(FILES "${page}.gz" DESTINATION "share/man/${mandir}")
endforeach()
