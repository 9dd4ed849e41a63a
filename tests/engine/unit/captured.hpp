// Answers captured from the real engines of the harness (Docker 20.10, Podman 4.3 rootless),
// byte for byte as they came off the socket: the seed corpus of fuzz_engine_response, read
// here so unit tests and the fuzzer share them.
#pragma once

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <string>

#include "custos/engine/wire.hpp"

namespace custos::engine::testing {

inline std::string captured(std::string const& name) {
  std::ifstream in(std::string{CUSTOS_SOURCE_DIR} + "/fuzz/corpus/fuzz_engine_response/" + name,
                   std::ios::binary);
  EXPECT_TRUE(in.good()) << "missing capture " << name;
  return std::string{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
}

// The parsed response of a capture (fails the test when it does not parse).
inline Response captured_response(std::string const& name) {
  auto r = parse_response(captured(name), Limits{});
  EXPECT_TRUE(r) << name << ": " << (r ? "" : r.error().message());
  return r ? *r : Response{};
}

}  // namespace custos::engine::testing
