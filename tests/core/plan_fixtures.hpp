// Shared fixtures for the identity/plan tests: the docs/api.md example request and generators.
#pragma once

#include <boost/json.hpp>
#include <rapidcheck.h>

#include <algorithm>
#include <string>
#include <vector>

#include "custos/core/identity.hpp"
#include "custos/core/plan.hpp"

namespace custos::core::testing {

// The exec.start example of docs/api.md (identity + plan), without its sandbox member (core's
// parser refuses one: the sandbox layer compiles it, tests/sandbox).
inline boost::json::object example_request() {
  return boost::json::parse(R"({
    "identity": {"project_id": "p1", "session_id": "s1", "run_id": "r1", "attempt_id": "a1",
                 "turn_id": "t1", "action_id": "act-42", "process_id": "proc-1",
                 "workspace_id": "w1", "resource_id": "res1", "environment_id": "env1",
                 "generation": 3, "revision": 17},
    "plan": {
      "command": {"executable": "/usr/bin/make", "argv": ["make", "test"]},
      "workspace": {"root": "/srv/work/w1", "access": "read_only"},
      "cwd": "src",
      "env": [{"name": "PATH", "inherit": true}, {"name": "CI", "value": "1"}],
      "io": {"mode": "pipes"},
      "limits": {"wall_ms": 600000, "cpu_ms": 300000, "memory_bytes": 1073741824,
                 "processes": 256, "open_files": 1024, "disk_bytes": 1073741824,
                 "output_bytes": 67108864, "stdin_bytes": 1048576},
      "output": {"chunk_bytes": 65536, "retained_bytes": 1048576, "spool_bytes": 67108864,
                 "max_events": 100000, "on_limit": "truncate"},
      "escalation": {"signal": "SIGTERM", "grace_ms": 2000, "kill_after_ms": 5000},
      "backend": {"kind": "native"}
    }
  })")
      .as_object();
}

// A plan in which every member is meaningful (pty, user, engine backend, both env kinds), so
// that changing any single member is observable.
inline ExecutionPlan full_plan() {
  ExecutionPlan p;
  p.command = {"/usr/bin/env", {"env", "-i", "caf\xc3\xa9"}};
  p.workspace = {"/srv/work/w1", WorkspaceAccess::writable};
  p.cwd = "src/lib";
  p.env = {{"PATH", std::nullopt}, {"LANG", std::string{"C.UTF-8"}}};
  p.io = {IoMode::pty, 40, 120, true};
  p.limits = {1000, 2000, 3000, 4000, 5000, 6000, 7000, 8000};
  p.output = {4096, 8192, 16384, 32, OnLimit::cancel};
  p.escalation = {2, 100, 200};
  p.user = UserSpec{1000, 1001, {4, 27, 1002}};
  p.backend = {BackendKind::podman, std::string{"c0ffee"},
               std::string{"/run/user/1000/podman.sock"}, std::nullopt};
  return p;
}

// A reference script with every step kind, every Use member set, ending with a signal.
inline ReferenceScript full_script() {
  ReferenceScript s;
  s.steps = {script::Write{ScriptStream::stdout_stream, {'h', 'i', '\n'}},
             script::Write{ScriptStream::stderr_stream, {0x00, 0xff, 0x80}},
             script::Sleep{250},
             script::Spawn{3},
             script::Ignore{15},
             script::Use{100, 1U << 20U, 4096, 12},
             script::ReadStdin{64},
             script::Signal{11}};
  return s;
}

// full_plan() on the reference backend, with full_script().
inline ExecutionPlan full_reference_plan() {
  ExecutionPlan p = full_plan();
  p.backend = Backend{BackendKind::reference, std::nullopt, std::nullopt, full_script()};
  return p;
}

inline ExecutionIdentity full_identity() {
  return {"p1", "s1", "r1", "a1", "t1", "act-42", "proc-1", "w1", "res1", "env1", 3, 17};
}

// ---------------------------------------------------------------------------- generators

inline rc::Gen<std::string> gen_id() {
  static const std::string kFirst =
      "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_:";
  static const std::string kRest = kFirst + ".-";
  return rc::gen::apply(
      [](char first, std::vector<char> rest) {
        std::string s(1, first);
        s.append(rest.begin(), rest.end());
        return s;
      },
      rc::gen::elementOf(kFirst),  // never '.' or '-' first
      rc::gen::container<std::vector<char>>(*rc::gen::inRange<std::size_t>(0, 20),
                                            rc::gen::elementOf(kRest)));
}

// Text made of whole UTF-8 pieces (ASCII, escapes, 2-, 3- and 4-byte sequences), never NUL.
inline rc::Gen<std::string> gen_text(std::size_t max_pieces = 12) {
  static const std::vector<std::string> kPieces = {"a",
                                                   "Z",
                                                   "0",
                                                   " ",
                                                   "-",
                                                   "_",
                                                   "/",
                                                   ".",
                                                   "=",
                                                   "\"",
                                                   "\\",
                                                   "\n",
                                                   "\t",
                                                   "\x01",
                                                   "\xc3\xa9",
                                                   "\xe6\x97\xa5\xe6\x9c\xac",
                                                   "\xf0\x9f\x9a\x80",
                                                   "~",
                                                   "$HOME",
                                                   "'"};
  return rc::gen::map(
      rc::gen::container<std::vector<std::string>>(*rc::gen::inRange<std::size_t>(0, max_pieces),
                                                   rc::gen::elementOf(kPieces)),
      [](std::vector<std::string> const& parts) {
        std::string s;
        for (auto const& p : parts) s += p;
        return s;
      });
}

inline rc::Gen<std::string> gen_component() {
  static const std::string kChars = "abcdefghijklmnopqrstuvwxyz0123456789_.-";
  return rc::gen::suchThat(rc::gen::container<std::string>(*rc::gen::inRange<std::size_t>(1, 8),
                                                           rc::gen::elementOf(kChars)),
                           [](std::string const& c) { return c != "." && c != ".."; });
}

inline rc::Gen<std::string> gen_rel_path(std::size_t min_parts) {
  return rc::gen::map(rc::gen::container<std::vector<std::string>>(
                          *rc::gen::inRange<std::size_t>(min_parts, 4), gen_component()),
                      [](std::vector<std::string> const& parts) {
                        std::string s;
                        for (auto const& p : parts) s += (s.empty() ? "" : "/") + p;
                        return s;
                      });
}

inline rc::Gen<std::string> gen_abs_path(std::size_t min_parts) {
  return rc::gen::map(gen_rel_path(min_parts), [](std::string const& r) { return "/" + r; });
}

inline rc::Gen<Limit> gen_limit() {
  return rc::gen::oneOf(rc::gen::just(Limit{}),
                        rc::gen::map(rc::gen::inRange<std::uint64_t>(1, kMaxPlanNumber + 1),
                                     [](std::uint64_t v) { return Limit{v}; }));
}

inline ExecutionIdentity generate_identity() {
  ExecutionIdentity id;
  for (auto* s : identity_ids(id)) *s = *gen_id();
  id.generation = *rc::gen::arbitrary<std::uint64_t>();
  id.revision = *rc::gen::arbitrary<std::uint64_t>();
  return id;
}

// A valid reference script: up to a dozen steps of every kind, then (or not) an exit or a signal.
inline ReferenceScript generate_script() {
  ReferenceScript s;
  auto const n = *rc::gen::inRange<std::size_t>(0, 12);
  for (std::size_t i = 0; i < n; ++i) {
    switch (*rc::gen::inRange(0, 6)) {
      case 0: {
        script::Write w;
        w.stream = *rc::gen::element(ScriptStream::stdout_stream, ScriptStream::stderr_stream);
        w.data = *rc::gen::container<std::vector<std::uint8_t>>(
            *rc::gen::inRange<std::size_t>(1, 40), rc::gen::arbitrary<std::uint8_t>());
        s.steps.emplace_back(std::move(w));
        break;
      }
      case 1:
        s.steps.emplace_back(script::Sleep{*rc::gen::inRange<std::uint64_t>(1, 100000)});
        break;
      case 2:
        s.steps.emplace_back(script::Spawn{*rc::gen::inRange<std::uint64_t>(1, 300)});
        break;
      case 3:
        s.steps.emplace_back(script::Ignore{*rc::gen::element<std::uint32_t>(1, 2, 3, 10, 12, 15)});
        break;
      case 4: {
        script::Use u;
        auto const value = [] { return *rc::gen::inRange<std::uint64_t>(0, kMaxPlanNumber + 1); };
        do {
          if (*rc::gen::arbitrary<bool>()) u.cpu_ms = value();
          if (*rc::gen::arbitrary<bool>()) u.memory_bytes = value();
          if (*rc::gen::arbitrary<bool>()) u.disk_bytes = value();
          if (*rc::gen::arbitrary<bool>()) u.descriptors = value();
        } while (u == script::Use{});
        s.steps.emplace_back(u);
        break;
      }
      default:
        s.steps.emplace_back(script::ReadStdin{*rc::gen::inRange<std::uint64_t>(1, 1U << 20U)});
        break;
    }
  }
  switch (*rc::gen::inRange(0, 3)) {
    case 0:
      s.steps.emplace_back(script::Exit{*rc::gen::arbitrary<std::uint8_t>()});
      break;
    case 1:
      s.steps.emplace_back(script::Signal{*rc::gen::element<std::uint32_t>(
          1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 24, 25, 26, 27, 29, 30, 31)});
      break;
    default:
      break;  // ends with exit 0 after its last step
  }
  return s;
}

inline ExecutionPlan generate_plan() {
  ExecutionPlan p;
  p.command.executable = *gen_abs_path(1);
  p.command.argv = *rc::gen::container<std::vector<std::string>>(
      *rc::gen::inRange<std::size_t>(1, 6), gen_text());
  p.workspace.root = *gen_abs_path(0);
  p.workspace.access = *rc::gen::element(WorkspaceAccess::read_only, WorkspaceAccess::writable);
  p.cwd = *rc::gen::oneOf(rc::gen::just(std::string{"."}), gen_rel_path(1));
  auto const n_env = *rc::gen::inRange<std::size_t>(0, 6);
  for (std::size_t i = 0; i < n_env; ++i) {
    EnvEntry e;
    // Unique by construction: the index is part of the name.
    e.name =
        *rc::gen::element<std::string>("PATH", "HOME", "X", "_v", "LANG") + "_" + std::to_string(i);
    if (*rc::gen::arbitrary<bool>()) e.value = *gen_text();
    p.env.push_back(std::move(e));
  }
  if (*rc::gen::arbitrary<bool>()) {
    p.io = {IoMode::pty, *rc::gen::inRange<std::uint32_t>(1, kMaxPtyDimension + 1),
            *rc::gen::inRange<std::uint32_t>(1, kMaxPtyDimension + 1), *rc::gen::arbitrary<bool>()};
  }
  for (Limit* l : limit_members(p.limits)) *l = *gen_limit();
  p.output.chunk_bytes = *rc::gen::inRange<std::uint64_t>(1, kMaxChunkBytes + 1);
  p.output.retained_bytes = *rc::gen::inRange<std::uint64_t>(0, kMaxRetainedBytes + 1);
  p.output.spool_bytes = *rc::gen::inRange<std::uint64_t>(0, kMaxPlanNumber + 1);
  p.output.max_events = *rc::gen::inRange<std::uint64_t>(1, kMaxPlanNumber + 1);
  p.output.on_limit = *rc::gen::element(OnLimit::truncate, OnLimit::cancel);
  p.escalation.signal = *rc::gen::element<std::uint32_t>(1, 2, 3, 10, 12, 15);
  p.escalation.grace_ms = *rc::gen::inRange<std::uint64_t>(0, kMaxEscalationMs + 1);
  p.escalation.kill_after_ms = *rc::gen::inRange<std::uint64_t>(1, kMaxEscalationMs + 1);
  if (*rc::gen::arbitrary<bool>()) {
    UserSpec u;
    u.uid = *rc::gen::inRange<std::uint32_t>(0, 4294967295U);
    u.gid = *rc::gen::inRange<std::uint32_t>(0, 4294967295U);
    auto groups = *rc::gen::container<std::vector<std::uint32_t>>(
        *rc::gen::inRange<std::size_t>(0, 6), rc::gen::inRange<std::uint32_t>(0, 100000));
    std::sort(groups.begin(), groups.end());
    groups.erase(std::unique(groups.begin(), groups.end()), groups.end());
    u.groups = std::move(groups);
    p.user = std::move(u);
  }
  p.backend.kind = *rc::gen::element(BackendKind::native, BackendKind::reference,
                                     BackendKind::docker, BackendKind::podman);
  if (p.backend.kind == BackendKind::docker || p.backend.kind == BackendKind::podman) {
    p.backend.container = "c" + *gen_component();
    if (*rc::gen::arbitrary<bool>()) p.backend.socket = "/run/" + *gen_component() + ".sock";
  }
  if (p.backend.kind == BackendKind::reference) p.backend.script = generate_script();
  return p;
}

}  // namespace custos::core::testing
