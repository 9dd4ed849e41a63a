# Compiler flags shared by every target of the project.
add_library(custos_flags INTERFACE)
target_compile_options(custos_flags INTERFACE -Wall -Wextra -Wshadow -Wnon-virtual-dtor
  -Wold-style-cast -Wcast-align -Woverloaded-virtual -Wformat=2)
if(CUSTOS_WERROR)
  target_compile_options(custos_flags INTERFACE -Werror)
endif()
if(CUSTOS_SANITIZE)
  target_compile_options(custos_flags INTERFACE -fsanitize=address,undefined
    -fno-sanitize-recover=undefined -fno-omit-frame-pointer)
  target_link_options(custos_flags INTERFACE -fsanitize=address,undefined)
endif()
if(CUSTOS_FAILPOINTS)
  target_compile_definitions(custos_flags INTERFACE CUSTOS_FAILPOINTS=1)
endif()
if(CUSTOS_FUZZ)
  if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang")
    message(FATAL_ERROR "CUSTOS_FUZZ needs clang (libFuzzer)")
  endif()
  target_compile_options(custos_flags INTERFACE -fsanitize=fuzzer-no-link,address,undefined)
  target_link_options(custos_flags INTERFACE -fsanitize=address,undefined)
endif()

# custos_layer(NAME DEPS...): the static library custos_NAME from every .cpp in src/NAME.
# Sources are globbed so that a new file in a layer needs no CMake edit; the dependency list is
# the one place that states the layer's allowed dependencies (docs/architecture.md, Layers).
function(custos_layer name)
  file(GLOB_RECURSE srcs CONFIGURE_DEPENDS "${PROJECT_SOURCE_DIR}/src/${name}/*.cpp")
  add_library(custos_${name} STATIC ${srcs} "${PROJECT_SOURCE_DIR}/cmake/empty.cpp")
  target_include_directories(custos_${name} PUBLIC "${PROJECT_SOURCE_DIR}/include")
  target_link_libraries(custos_${name} PUBLIC ${ARGN} PRIVATE custos_flags)
endfunction()
