// The real engines of scripts/engines, as the engine tests see them: read from the harness's
// state file. Missing engines are a failure, never a skip: the test command starts them (ctest
// fixture `engines`, scripts/test), so an absent engine means the harness is broken.
#pragma once

#include <boost/json/parse.hpp>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iterator>
#include <optional>
#include <string>

#include "custos/engine/client.hpp"

namespace custos::engine::testing {

struct RealEngine {
  EngineKind kind = EngineKind::docker;
  std::string socket;
  std::string running;     // name of the running test container
  std::string running_id;  // its full id
  std::string stopped;     // name of the stopped one
  std::string noshell;     // a running one without /bin/sh (it cannot run the exec gate)
};

inline std::string engines_state_path() {
  if (char const* dir = std::getenv("CUSTOS_ENGINES_DIR"); dir != nullptr && *dir != '\0') {
    return std::string{dir} + "/state.json";
  }
  return std::string{CUSTOS_SOURCE_DIR} + "/.engines/state.json";
}

// The engine `kind` of the harness, or a failure message saying why there is none.
inline std::optional<RealEngine> real_engine(EngineKind kind, std::string& why) {
  auto const path = engines_state_path();
  std::ifstream in(path);
  if (!in) {
    why = "the engines are not up (no " + path + "): run scripts/engines up";
    return std::nullopt;
  }
  std::string const text{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  boost::system::error_code ec;
  auto const v = boost::json::parse(text, ec);
  auto const* root = ec ? nullptr : v.if_object();
  auto const* e = root != nullptr ? root->if_contains(to_string(kind)) : nullptr;
  auto const* o = e != nullptr ? e->if_object() : nullptr;
  auto str = [](boost::json::object const* obj, char const* key) -> std::string {
    if (obj == nullptr) return {};
    auto const* s = obj->if_contains(key);
    return s != nullptr && s->is_string() ? std::string{s->get_string()} : std::string{};
  };
  auto obj = [](boost::json::object const* parent, char const* key) -> boost::json::object const* {
    if (parent == nullptr) return nullptr;
    auto const* s = parent->if_contains(key);
    return s != nullptr ? s->if_object() : nullptr;
  };
  RealEngine out;
  out.kind = kind;
  out.socket = str(o, "socket");
  out.running = str(obj(o, "running"), "name");
  out.running_id = str(obj(o, "running"), "id");
  out.stopped = str(obj(o, "stopped"), "name");
  out.noshell = str(obj(o, "noshell"), "name");
  if (out.socket.empty() || out.running.empty() || out.running_id.empty() || out.stopped.empty() ||
      out.noshell.empty()) {
    why = std::string{to_string(kind)} + " is not recorded as up in " + path +
          ": run scripts/engines up (and see scripts/engines status)";
    return std::nullopt;
  }
  return out;
}

}  // namespace custos::engine::testing
