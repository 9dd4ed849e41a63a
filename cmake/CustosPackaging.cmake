# CPack: the Debian package custos_<version>_<arch>.deb (scripts/package builds it from the
# release preset). Laid out as Debian 12 expects: the binary in /usr/bin, the units in
# /lib/systemd/system, tmpfiles/sysusers snippets in /usr/lib (where postinst reads them), the
# configuration in /etc (a conffile), completions and man pages under /usr/share
# (cmake/CustosShellDocs.cmake) and the docs in /usr/share/doc/custos.
set(CUSTOS_PKG_DIR "${PROJECT_SOURCE_DIR}/packaging")

install(FILES "${CUSTOS_PKG_DIR}/custos.service" "${CUSTOS_PKG_DIR}/custos.socket"
        DESTINATION /lib/systemd/system)
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
set(CPACK_DEBIAN_PACKAGE_DESCRIPTION
    "${PROJECT_DESCRIPTION}\n custos owns every process it launches, from authorization to one\n terminal record. custos daemon is the supervisor (custos.service, custos.socket);\n every other subcommand of custos is a client of it over a Unix socket.")
# The units and the configuration have absolute destinations: stage them through DESTDIR so
# that cpack never writes to the host's /lib or /etc. The prefix is /usr whatever the build
# tree's CMAKE_INSTALL_PREFIX is.
set(CPACK_SET_DESTDIR ON)
set(CPACK_INSTALL_PREFIX "/usr")
set(CPACK_PACKAGING_INSTALL_PREFIX "/usr")
# The binary is shipped stripped, as Debian does (a debug build's would be ~300 MB).
set(CPACK_STRIP_FILES ON)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION "admin")
set(CPACK_DEBIAN_PACKAGE_PRIORITY "optional")
# Depends: the shared libraries the binary links (dpkg-shlibdeps), plus systemd for the units,
# sysusers and tmpfiles, and procps for /bin/kill (the unit's ExecReload; procps is only
# "important", not essential: a minimal Debian has no /bin/kill and `systemctl reload custos`
# failed there with status 203/EXEC, found by tests/systemd/run).
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
set(CPACK_DEBIAN_PACKAGE_DEPENDS "systemd, procps")
set(CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA
    "${CUSTOS_PKG_DIR}/postinst;${CUSTOS_PKG_DIR}/prerm;${CUSTOS_PKG_DIR}/postrm")
set(CPACK_DEBIAN_PACKAGE_CONTROL_STRICT_PERMISSION TRUE)
# /etc/custos/custos.toml is a conffile: an upgrade keeps the administrator's edits.
file(WRITE "${CMAKE_BINARY_DIR}/conffiles" "/etc/custos/custos.toml\n")
list(APPEND CPACK_DEBIAN_PACKAGE_CONTROL_EXTRA "${CMAKE_BINARY_DIR}/conffiles")
include(CPack)
