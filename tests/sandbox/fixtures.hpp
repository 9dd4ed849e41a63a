// Shared fixtures of the sandbox tests: JSON helpers, a plan every requirement fits, and
// rapidcheck generators of valid requirements.
#pragma once

#include <boost/json.hpp>
#include <gtest/gtest.h>
#include <rapidcheck.h>

#include <algorithm>
#include <string>
#include <vector>

#include "custos/core/plan.hpp"
#include "custos/sandbox/compile.hpp"
#include "custos/sandbox/json.hpp"
#include "custos/sandbox/types.hpp"

namespace custos::sandbox::testing {

namespace json = boost::json;

inline json::value js(std::string_view text) {
  return json::parse(text);
}

// Requirements from JSON text; the test fails when they do not parse.
inline SandboxRequirements req(std::string_view text) {
  auto r = parse_requirements(js(text), "/plan/sandbox");
  EXPECT_TRUE(r) << text << ": " << r.error().message();
  return r ? *r : SandboxRequirements{};
}

// A plan that every generated requirement fits: writable workspace, pipes, no env, every limit
// finite, enough descriptors for every secret fd.
inline core::ExecutionPlan roomy_plan() {
  core::ExecutionPlan p;
  p.command = {"/bin/true", {"true"}};
  p.workspace = {"/w", core::WorkspaceAccess::writable};
  p.limits = {60000, 60000, 1U << 30U, 64, 4096, 1U << 30U, 1U << 20U, 1U << 20U};
  return p;
}

// ---------------------------------------------------------------------------- generators
// Valid requirements with lists in any order and with repeats (what set invariance is about).

inline rc::Gen<std::string> gen_path() {
  static std::vector<std::string> const kComponents = {"usr", "bin",  "lib", "srv",        "w",
                                                       "etc", ".git", "x y", "caf\xc3\xa9"};
  return rc::gen::map(rc::gen::container<std::vector<std::string>>(
                          *rc::gen::inRange<std::size_t>(0, 4), rc::gen::elementOf(kComponents)),
                      [](std::vector<std::string> const& parts) {
                        std::string p;
                        for (auto const& c : parts) p += "/" + c;
                        return p.empty() ? std::string{"/"} : p;
                      });
}

// A list of `values` members, in any order, each possibly repeated, at least `min` distinct.
template <class T>
rc::Gen<std::vector<T>> gen_list_of(std::vector<T> values, std::size_t min = 0) {
  return rc::gen::exec([values, min] {
    auto chosen = *rc::gen::suchThat(
        rc::gen::container<std::vector<T>>(*rc::gen::inRange<std::size_t>(0, values.size() + 1),
                                           rc::gen::elementOf(values)),
        [min](std::vector<T> const& v) {
          std::vector<T> distinct;
          for (auto const& x : v) {
            if (std::find(distinct.begin(), distinct.end(), x) == distinct.end()) {
              distinct.push_back(x);
            }
          }
          return distinct.size() >= min;
        });
    auto const extra = *rc::gen::inRange<std::size_t>(0, 3);
    for (std::size_t i = 0; i < extra && !chosen.empty(); ++i) {
      chosen.push_back(chosen[*rc::gen::inRange<std::size_t>(0, chosen.size())]);
    }
    return chosen;
  });
}

inline rc::Gen<std::vector<Right>> gen_rights() {
  return rc::gen::exec([] {
    auto rights = *gen_list_of<Right>(
        {Right::discover, Right::read, Right::execute, Right::create, Right::write, Right::remove});
    // Every right but metadata needs metadata: add it (somewhere) unless nothing is granted.
    bool const none = rights.empty() && *rc::gen::arbitrary<bool>();
    if (!none) {
      auto const at = *rc::gen::inRange<std::size_t>(0, rights.size() + 1);
      rights.insert(rights.begin() + static_cast<std::ptrdiff_t>(at), Right::metadata);
    }
    return rights;
  });
}

inline rc::Gen<SandboxRequirements> gen_requirements() {
  return rc::gen::exec([] {
    SandboxRequirements r;
    if (*rc::gen::arbitrary<bool>()) {
      auto paths = *rc::gen::container<std::vector<std::string>>(
          *rc::gen::inRange<std::size_t>(0, 5), gen_path());
      std::sort(paths.begin(), paths.end());
      paths.erase(std::unique(paths.begin(), paths.end()), paths.end());
      std::vector<PathRequirement> fs;
      for (auto const& p : paths) fs.push_back({p, *gen_rights()});
      // Shuffle the entries (their order must not matter).
      for (std::size_t i = fs.size(); i > 1; --i) {
        std::swap(fs[i - 1], fs[*rc::gen::inRange<std::size_t>(0, i)]);
      }
      r.filesystem = std::move(fs);
    }
    if (*rc::gen::arbitrary<bool>()) {
      ProcessRequirement p;
      if (*rc::gen::arbitrary<bool>()) p.descendants = *rc::gen::arbitrary<bool>();
      if (p.descendants.value_or(false)) {
        p.max_processes = *rc::gen::inRange<std::uint64_t>(1, 500);
      } else if (*rc::gen::arbitrary<bool>()) {
        p.max_processes = 1;
      }
      if (*rc::gen::arbitrary<bool>()) p.signal_scope = SignalScope::own_tree;
      if (*rc::gen::arbitrary<bool>()) p.run_as_root = *rc::gen::arbitrary<bool>();
      r.process = p;
    }
    if (*rc::gen::arbitrary<bool>()) {
      EnvironmentRequirement e;
      if (*rc::gen::arbitrary<bool>()) {
        e.allow = *gen_list_of<std::string>({"PATH", "HOME", "LANG", "CI", "_X1"});
      }
      r.environment = e;
    }
    if (*rc::gen::arbitrary<bool>()) {
      NetworkRequirement n;
      switch (*rc::gen::inRange(0, 4)) {
        case 1:
          n.outbound = Outbound::none;
          break;
        case 2:
          n.outbound = Outbound::any;
          break;
        case 3:
          n.outbound = Outbound::tcp_connect;
          n.tcp_connect = *gen_list_of<std::uint32_t>({22, 80, 443, 5432, 65535}, 1);
          break;
        default:
          break;
      }
      r.network = n;
    }
    if (*rc::gen::arbitrary<bool>()) {
      // Distinct destinations (a destination receives one secret).
      static std::vector<SecretRequirement> const kPool = {
          {"db-password", SecretChannel::env, "DB_PASSWORD", 0},
          {"db-password", SecretChannel::file, "db.pw", 0},
          {"tls.key", SecretChannel::file, "tls.key", 0},
          {"api_token", SecretChannel::fd, "", 3},
          {"api_token", SecretChannel::env, "API_TOKEN", 0},
          {"x", SecretChannel::fd, "", 1023}};
      r.secrets = *gen_list_of<SecretRequirement>(kPool);
    }
    if (*rc::gen::arbitrary<bool>()) {
      ResourcesRequirement res;
      if (*rc::gen::arbitrary<bool>()) {
        res.enforce = *gen_list_of<core::ResourceDim>(
            {core::ResourceDim::wall, core::ResourceDim::cpu, core::ResourceDim::memory,
             core::ResourceDim::disk, core::ResourceDim::output, core::ResourceDim::descriptors,
             core::ResourceDim::processes});
      }
      r.resources = res;
    }
    if (*rc::gen::arbitrary<bool>()) {
      TerminalRequirement t;
      if (*rc::gen::arbitrary<bool>()) {
        t.modes = *gen_list_of<core::IoMode>({core::IoMode::pipes, core::IoMode::pty}, 1);
        // The roomy plan runs with pipes.
        if (std::find(t.modes->begin(), t.modes->end(), core::IoMode::pipes) == t.modes->end()) {
          t.modes->push_back(core::IoMode::pipes);
        }
      }
      if (*rc::gen::arbitrary<bool>()) t.input = *rc::gen::arbitrary<bool>();
      if (*rc::gen::arbitrary<bool>()) t.resize = *rc::gen::arbitrary<bool>();
      r.terminal = t;
    }
    return r;
  });
}

// The same requirements with every list reordered and some items repeated: they mean the same.
inline SandboxRequirements shuffled(SandboxRequirements r) {
  auto shuffle = [](auto& v) {
    for (std::size_t i = v.size(); i > 1; --i) {
      std::swap(v[i - 1], v[*rc::gen::inRange<std::size_t>(0, i)]);
    }
    if (!v.empty() && *rc::gen::arbitrary<bool>()) {
      v.push_back(v[*rc::gen::inRange<std::size_t>(0, v.size())]);
    }
  };
  if (r.filesystem) {
    shuffle(*r.filesystem);
    for (auto& e : *r.filesystem) shuffle(e.allow);
  }
  if (r.environment && r.environment->allow) shuffle(*r.environment->allow);
  if (r.network) shuffle(r.network->tcp_connect);
  if (r.secrets) shuffle(*r.secrets);
  if (r.resources && r.resources->enforce) shuffle(*r.resources->enforce);
  if (r.terminal && r.terminal->modes) shuffle(*r.terminal->modes);
  return r;
}

}  // namespace custos::sandbox::testing
