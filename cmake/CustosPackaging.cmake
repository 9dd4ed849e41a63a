# CPack: a Debian package with the binary, the systemd units, tmpfiles/sysusers snippets, the
# default configuration and the docs. `cmake --build build/release --target package`.
set(CUSTOS_PKG_DIR "${PROJECT_SOURCE_DIR}/packaging")

install(FILES "${CUSTOS_PKG_DIR}/custos.service" "${CUSTOS_PKG_DIR}/custos.socket"
        DESTINATION lib/systemd/system)
install(FILES "${CUSTOS_PKG_DIR}/custos.tmpfiles" DESTINATION lib/tmpfiles.d RENAME custos.conf)
install(FILES "${CUSTOS_PKG_DIR}/custos.sysusers" DESTINATION lib/sysusers.d RENAME custos.conf)
install(FILES "${CUSTOS_PKG_DIR}/custos.toml" DESTINATION /etc/custos)
foreach(doc api.md openrpc.json configuration.md operations.md metrics.md cli.md)
  if(EXISTS "${PROJECT_SOURCE_DIR}/docs/${doc}")
    install(FILES "${PROJECT_SOURCE_DIR}/docs/${doc}" DESTINATION share/doc/custos)
  endif()
endforeach()

set(CPACK_GENERATOR "DEB")
set(CPACK_PACKAGE_NAME "custos")
set(CPACK_PACKAGE_VERSION "${PROJECT_VERSION}")
set(CPACK_PACKAGE_CONTACT "custos maintainers <custos@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY "${PROJECT_DESCRIPTION}")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "admin")
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "systemd")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${CUSTOS_PKG_DIR}/postinst;${CUSTOS_PKG_DIR}/prerm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
# /etc/custos/custos.toml is a conffile: an upgrade keeps the administrator's edits.
file(WRITE "${CMAKE_BINARY_DIR}/conffiles" "/etc/custos/custos.toml\n")
list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${CMAKE_BINARY_DIR}/conffiles")
include(CPack)
