// One row per validation rule: a change to the docs/api.md example request and the exact code
// and JSON pointer it must produce (and nothing else).
#include <gtest/gtest.h>

#include <functional>
#include <string>
#include <string_view>

#include "custos/core/plan_json.hpp"

#include "core/plan_fixtures.hpp"

namespace custos::core {
namespace {

namespace json = boost::json;
using testing::example_request;

struct Case {
  std::string name;
  std::function<void(json::object& identity, json::object& plan)> change;
  Errc code;
  std::string pointer;
};

std::string big(std::size_t n) {
  return std::string(n, 'x');
}

json::object& sub(json::object& o, char const* key) {
  return o[key].as_object();
}

// A reference backend whose script has these steps (JSON text of the array).
json::object reference(std::string_view steps) {
  return json::object{{"kind", "reference"},
                      {"script", json::object{{"steps", json::parse(steps)}}}};
}

// `n` copies of one step, as a JSON array.
std::string repeated(std::string_view step, std::size_t n) {
  std::string out = "[";
  for (std::size_t i = 0; i < n; ++i) {
    if (i > 0) out += ",";
    out += step;
  }
  return out + "]";
}

// A write step of `n` zero bytes on stdout.
std::string write_zeros(std::size_t n) {
  std::string b64((n + 2) / 3 * 4, 'A');
  if (n % 3 == 1) b64.replace(b64.size() - 2, 2, "==");
  if (n % 3 == 2) b64.back() = '=';
  return R"({"write": "stdout", "data_b64": ")" + b64 + R"("})";
}

std::vector<Case> const& cases() {
  using I = json::object;
  using P = json::object;
  static std::vector<Case> const kCases = {
      // --- identity
      {"IdBadChar", [](I& i, P&) { i["run_id"] = "r 1"; }, Errc::plan_invalid_id, "/identity/run_id"},
      {"IdEmpty", [](I& i, P&) { i["turn_id"] = ""; }, Errc::plan_invalid_id, "/identity/turn_id"},
      {"IdTooLong", [](I& i, P&) { i["action_id"] = big(129); }, Errc::plan_invalid_id, "/identity/action_id"},
      {"IdLeadingDot", [](I& i, P&) { i["project_id"] = ".p"; }, Errc::plan_invalid_id, "/identity/project_id"},
      {"IdLeadingDash", [](I& i, P&) { i["session_id"] = "-s"; }, Errc::plan_invalid_id, "/identity/session_id"},
      {"IdNul", [](I& i, P&) { i["process_id"] = std::string("p\0q", 3); }, Errc::plan_nul_byte, "/identity/process_id"},
      {"IdNotString", [](I& i, P&) { i["workspace_id"] = 7; }, Errc::plan_wrong_type, "/identity/workspace_id"},
      {"IdMissing", [](I& i, P&) { i.erase("resource_id"); }, Errc::plan_missing_field, "/identity/resource_id"},
      {"IdUnknown", [](I& i, P&) { i["tenant_id"] = "t"; }, Errc::plan_unknown_field, "/identity/tenant_id"},
      {"GenerationNegative", [](I& i, P&) { i["generation"] = -1; }, Errc::plan_invalid_value, "/identity/generation"},
      {"RevisionDouble", [](I& i, P&) { i["revision"] = 1.0; }, Errc::plan_wrong_type, "/identity/revision"},
      // --- plan top level
      {"PlanUnknown", [](I&, P& p) { p["shell"] = "sh -c"; }, Errc::plan_unknown_field, "/plan/shell"},
      {"PlanUnknownEscaped", [](I&, P& p) { p["a/b~c"] = 1; }, Errc::plan_unknown_field, "/plan/a~1b~0c"},
      {"CommandMissing", [](I&, P& p) { p.erase("command"); }, Errc::plan_missing_field, "/plan/command"},
      {"CommandNotObject", [](I&, P& p) { p["command"] = "make test"; }, Errc::plan_wrong_type, "/plan/command"},
      // --- command
      {"ExecutableRelative", [](I&, P& p) { sub(p, "command")["executable"] = "make"; }, Errc::plan_invalid_executable, "/plan/command/executable"},
      {"ExecutableDotDot", [](I&, P& p) { sub(p, "command")["executable"] = "/usr/../bin/make"; }, Errc::plan_invalid_executable, "/plan/command/executable"},
      {"ExecutableDoubleSlash", [](I&, P& p) { sub(p, "command")["executable"] = "/usr//bin/make"; }, Errc::plan_invalid_executable, "/plan/command/executable"},
      {"ExecutableRoot", [](I&, P& p) { sub(p, "command")["executable"] = "/"; }, Errc::plan_invalid_executable, "/plan/command/executable"},
      {"ExecutableNul", [](I&, P& p) { sub(p, "command")["executable"] = std::string("/bin/\0sh", 8); }, Errc::plan_nul_byte, "/plan/command/executable"},
      {"ExecutableTooLong", [](I&, P& p) { sub(p, "command")["executable"] = "/" + big(4095); }, Errc::plan_too_large, "/plan/command/executable"},
      {"ExecutableMissing", [](I&, P& p) { sub(p, "command").erase("executable"); }, Errc::plan_missing_field, "/plan/command/executable"},
      {"ArgvEmpty", [](I&, P& p) { sub(p, "command")["argv"] = json::array{}; }, Errc::plan_empty_argv, "/plan/command/argv"},
      {"ArgvNotArray", [](I&, P& p) { sub(p, "command")["argv"] = "make test"; }, Errc::plan_wrong_type, "/plan/command/argv"},
      {"ArgvElementNotString", [](I&, P& p) { sub(p, "command")["argv"] = json::array{"make", 1}; }, Errc::plan_wrong_type, "/plan/command/argv/1"},
      {"ArgvNul", [](I&, P& p) { sub(p, "command")["argv"] = json::array{"make", std::string("a\0b", 3)}; }, Errc::plan_nul_byte, "/plan/command/argv/1"},
      {"ArgvElementTooLong", [](I&, P& p) { sub(p, "command")["argv"] = json::array{"make", big(kMaxArgBytes + 1)}; }, Errc::plan_too_large, "/plan/command/argv/1"},
      {"ArgvTooMany", [](I&, P& p) {
         json::array a;
         for (std::size_t i = 0; i <= kMaxArgvCount; ++i) a.emplace_back("x");
         sub(p, "command")["argv"] = std::move(a);
       }, Errc::plan_too_large, "/plan/command/argv"},
      {"ArgvTotalTooLarge", [](I&, P& p) {
         json::array a;
         for (int i = 0; i < 9; ++i) a.emplace_back(big(kMaxArgBytes));
         sub(p, "command")["argv"] = std::move(a);
       }, Errc::plan_too_large, "/plan/command/argv"},
      {"CommandUnknown", [](I&, P& p) { sub(p, "command")["shell"] = true; }, Errc::plan_unknown_field, "/plan/command/shell"},
      // --- workspace
      {"RootRelative", [](I&, P& p) { sub(p, "workspace")["root"] = "srv/w"; }, Errc::plan_invalid_workspace, "/plan/workspace/root"},
      {"RootTrailingSlash", [](I&, P& p) { sub(p, "workspace")["root"] = "/srv/w/"; }, Errc::plan_invalid_workspace, "/plan/workspace/root"},
      {"RootDot", [](I&, P& p) { sub(p, "workspace")["root"] = "/srv/./w"; }, Errc::plan_invalid_workspace, "/plan/workspace/root"},
      {"AccessUnknown", [](I&, P& p) { sub(p, "workspace")["access"] = "rw"; }, Errc::plan_invalid_workspace, "/plan/workspace/access"},
      {"WorkspaceMissing", [](I&, P& p) { p.erase("workspace"); }, Errc::plan_missing_field, "/plan/workspace"},
      // --- cwd
      {"CwdParent", [](I&, P& p) { p["cwd"] = "../x"; }, Errc::plan_invalid_cwd, "/plan/cwd"},
      {"CwdHiddenParent", [](I&, P& p) { p["cwd"] = "a/b/../../../etc"; }, Errc::plan_invalid_cwd, "/plan/cwd"},
      {"CwdAbsolute", [](I&, P& p) { p["cwd"] = "/etc"; }, Errc::plan_invalid_cwd, "/plan/cwd"},
      {"CwdNul", [](I&, P& p) { p["cwd"] = std::string("a\0", 2); }, Errc::plan_nul_byte, "/plan/cwd"},
      {"CwdTooLong", [](I&, P& p) { p["cwd"] = big(4096); }, Errc::plan_too_large, "/plan/cwd"},
      {"CwdNotString", [](I&, P& p) { p["cwd"] = nullptr; }, Errc::plan_wrong_type, "/plan/cwd"},
      // --- env
      {"EnvNameDigitFirst", [](I&, P& p) { p["env"].as_array()[1].as_object()["name"] = "1CI"; }, Errc::plan_invalid_env_name, "/plan/env/1/name"},
      {"EnvNameEquals", [](I&, P& p) { p["env"].as_array()[1].as_object()["name"] = "A=B"; }, Errc::plan_invalid_env_name, "/plan/env/1/name"},
      {"EnvNameEmpty", [](I&, P& p) { p["env"].as_array()[0].as_object()["name"] = ""; }, Errc::plan_invalid_env_name, "/plan/env/0/name"},
      {"EnvDuplicate", [](I&, P& p) { p["env"].as_array()[1].as_object()["name"] = "PATH"; }, Errc::plan_duplicate_env, "/plan/env/1/name"},
      {"EnvBoth", [](I&, P& p) { p["env"].as_array()[0].as_object()["value"] = "/bin"; }, Errc::plan_env_conflict, "/plan/env/0"},
      {"EnvNeither", [](I&, P& p) { p["env"].as_array()[0].as_object().erase("inherit"); }, Errc::plan_env_conflict, "/plan/env/0"},
      {"EnvInheritFalse", [](I&, P& p) { p["env"].as_array()[0].as_object()["inherit"] = false; }, Errc::plan_env_conflict, "/plan/env/0/inherit"},
      {"EnvValueNul", [](I&, P& p) { p["env"].as_array()[1].as_object()["value"] = std::string("1\0", 2); }, Errc::plan_nul_byte, "/plan/env/1/value"},
      {"EnvValueTooLong", [](I&, P& p) { p["env"].as_array()[1].as_object()["value"] = big(kMaxEnvValueBytes + 1); }, Errc::plan_too_large, "/plan/env/1/value"},
      {"EnvValueNotString", [](I&, P& p) { p["env"].as_array()[1].as_object()["value"] = 1; }, Errc::plan_wrong_type, "/plan/env/1/value"},
      {"EnvUnknownMember", [](I&, P& p) { p["env"].as_array()[0].as_object()["default"] = "x"; }, Errc::plan_unknown_field, "/plan/env/0/default"},
      {"EnvTooMany", [](I&, P& p) {
         json::array a;
         for (std::size_t i = 0; i <= kMaxEnvCount; ++i) a.emplace_back(json::object{{"name", "V" + std::to_string(i)}, {"value", ""}});
         p["env"] = std::move(a);
       }, Errc::plan_too_large, "/plan/env"},
      {"EnvTotalTooLarge", [](I&, P& p) {
         json::array a;
         for (int i = 0; i < 9; ++i) a.emplace_back(json::object{{"name", "V" + std::to_string(i)}, {"value", big(kMaxEnvValueBytes)}});
         p["env"] = std::move(a);
       }, Errc::plan_too_large, "/plan/env"},
      // --- io
      {"IoModeUnknown", [](I&, P& p) { p["io"] = json::object{{"mode", "tty"}}; }, Errc::plan_invalid_io, "/plan/io/mode"},
      {"IoModeMissing", [](I&, P& p) { p["io"] = json::object{}; }, Errc::plan_missing_field, "/plan/io/mode"},
      {"IoPipesWithRows", [](I&, P& p) { p["io"] = json::object{{"mode", "pipes"}, {"rows", 24}}; }, Errc::plan_invalid_io, "/plan/io/rows"},
      {"IoPtyZeroRows", [](I&, P& p) { p["io"] = json::object{{"mode", "pty"}, {"rows", 0}}; }, Errc::plan_invalid_io, "/plan/io/rows"},
      {"IoPtyHugeCols", [](I&, P& p) { p["io"] = json::object{{"mode", "pty"}, {"cols", 70000}}; }, Errc::plan_invalid_io, "/plan/io/cols"},
      {"IoPtyResizeNotBool", [](I&, P& p) { p["io"] = json::object{{"mode", "pty"}, {"resize", "yes"}}; }, Errc::plan_wrong_type, "/plan/io/resize"},
      // --- limits
      {"LimitZero", [](I&, P& p) { sub(p, "limits")["wall_ms"] = 0; }, Errc::plan_invalid_limit, "/plan/limits/wall_ms"},
      {"LimitNegative", [](I&, P& p) { sub(p, "limits")["cpu_ms"] = -5; }, Errc::plan_invalid_limit, "/plan/limits/cpu_ms"},
      {"LimitWord", [](I&, P& p) { sub(p, "limits")["memory_bytes"] = "infinite"; }, Errc::plan_invalid_limit, "/plan/limits/memory_bytes"},
      {"LimitDouble", [](I&, P& p) { sub(p, "limits")["processes"] = 1.5; }, Errc::plan_wrong_type, "/plan/limits/processes"},
      {"LimitBeyond53Bits", [](I&, P& p) { sub(p, "limits")["disk_bytes"] = kMaxPlanNumber + 1; }, Errc::plan_invalid_limit, "/plan/limits/disk_bytes"},
      {"LimitNull", [](I&, P& p) { sub(p, "limits")["open_files"] = nullptr; }, Errc::plan_wrong_type, "/plan/limits/open_files"},
      {"LimitUnknown", [](I&, P& p) { sub(p, "limits")["gpu_ms"] = 1; }, Errc::plan_unknown_field, "/plan/limits/gpu_ms"},
      // --- output
      {"ChunkZero", [](I&, P& p) { sub(p, "output")["chunk_bytes"] = 0; }, Errc::plan_invalid_output_policy, "/plan/output/chunk_bytes"},
      {"ChunkHuge", [](I&, P& p) { sub(p, "output")["chunk_bytes"] = kMaxChunkBytes + 1; }, Errc::plan_invalid_output_policy, "/plan/output/chunk_bytes"},
      {"RetainedHuge", [](I&, P& p) { sub(p, "output")["retained_bytes"] = kMaxRetainedBytes + 1; }, Errc::plan_invalid_output_policy, "/plan/output/retained_bytes"},
      {"MaxEventsZero", [](I&, P& p) { sub(p, "output")["max_events"] = 0; }, Errc::plan_invalid_output_policy, "/plan/output/max_events"},
      {"OnLimitUnknown", [](I&, P& p) { sub(p, "output")["on_limit"] = "drop"; }, Errc::plan_invalid_output_policy, "/plan/output/on_limit"},
      // --- escalation
      {"SignalKill", [](I&, P& p) { sub(p, "escalation")["signal"] = "SIGKILL"; }, Errc::plan_invalid_escalation, "/plan/escalation/signal"},
      {"SignalNumber", [](I&, P& p) { sub(p, "escalation")["signal"] = 15; }, Errc::plan_wrong_type, "/plan/escalation/signal"},
      {"GraceTooLong", [](I&, P& p) { sub(p, "escalation")["grace_ms"] = kMaxEscalationMs + 1; }, Errc::plan_invalid_escalation, "/plan/escalation/grace_ms"},
      {"KillAfterZero", [](I&, P& p) { sub(p, "escalation")["kill_after_ms"] = 0; }, Errc::plan_invalid_escalation, "/plan/escalation/kill_after_ms"},
      // --- user
      {"UidNegative", [](I&, P& p) { p["user"] = json::object{{"uid", -1}, {"gid", 0}}; }, Errc::plan_invalid_user, "/plan/user/uid"},
      {"UidUnchangedSentinel", [](I&, P& p) { p["user"] = json::object{{"uid", 4294967295U}, {"gid", 0}}; }, Errc::plan_invalid_user, "/plan/user/uid"},
      {"GidMissing", [](I&, P& p) { p["user"] = json::object{{"uid", 1000}}; }, Errc::plan_missing_field, "/plan/user/gid"},
      {"GroupsDuplicate", [](I&, P& p) { p["user"] = json::object{{"uid", 1}, {"gid", 1}, {"groups", json::array{5, 3, 5}}}; }, Errc::plan_invalid_user, "/plan/user/groups"},
      {"GroupsTooMany", [](I&, P& p) {
         json::array g;
         for (std::size_t i = 0; i <= kMaxGroups; ++i) g.emplace_back(i);
         p["user"] = json::object{{"uid", 1}, {"gid", 1}, {"groups", std::move(g)}};
       }, Errc::plan_too_large, "/plan/user/groups"},
      // --- sandbox
      {"SandboxRequirement", [](I&, P& p) { p["sandbox"] = json::object{{"filesystem", json::object{}}}; }, Errc::sandbox_unsupported, "/plan/sandbox"},
      {"SandboxEmpty", [](I&, P& p) { p["sandbox"] = json::object{}; }, Errc::sandbox_unsupported, "/plan/sandbox"},
      {"SandboxNotObject", [](I&, P& p) { p["sandbox"] = "strict"; }, Errc::sandbox_unsupported, "/plan/sandbox"},
      // --- backend
      {"BackendUnknownKind", [](I&, P& p) { p["backend"] = json::object{{"kind", "lxc"}}; }, Errc::plan_invalid_backend, "/plan/backend/kind"},
      {"BackendKindMissing", [](I&, P& p) { p["backend"] = json::object{}; }, Errc::plan_missing_field, "/plan/backend/kind"},
      {"DockerNoContainer", [](I&, P& p) { p["backend"] = json::object{{"kind", "docker"}}; }, Errc::plan_missing_field, "/plan/backend/container"},
      {"NativeWithContainer", [](I&, P& p) { p["backend"] = json::object{{"kind", "native"}, {"container", "c1"}}; }, Errc::plan_invalid_backend, "/plan/backend/container"},
      {"ReferenceWithSocket", [](I&, P& p) { p["backend"] = reference("[]"); sub(p, "backend")["socket"] = "/run/d.sock"; }, Errc::plan_invalid_backend, "/plan/backend/socket"},
      {"ContainerBadName", [](I&, P& p) { p["backend"] = json::object{{"kind", "podman"}, {"container", "-rm"}}; }, Errc::plan_invalid_backend, "/plan/backend/container"},
      {"SocketRelative", [](I&, P& p) { p["backend"] = json::object{{"kind", "docker"}, {"container", "c1"}, {"socket", "docker.sock"}}; }, Errc::plan_invalid_backend, "/plan/backend/socket"},
      {"SocketTooLong", [](I&, P& p) { p["backend"] = json::object{{"kind", "docker"}, {"container", "c1"}, {"socket", "/" + big(107)}}; }, Errc::plan_too_large, "/plan/backend/socket"},
      // --- backend: the reference script
      {"ReferenceWithoutScript", [](I&, P& p) { p["backend"] = json::object{{"kind", "reference"}}; }, Errc::plan_missing_field, "/plan/backend/script"},
      {"ScriptOnNative", [](I&, P& p) { p["backend"] = json::object{{"kind", "native"}, {"script", json::object{{"steps", json::array{}}}}}; }, Errc::plan_invalid_backend, "/plan/backend/script"},
      {"ScriptOnDocker", [](I&, P& p) { p["backend"] = json::object{{"kind", "docker"}, {"container", "c1"}, {"script", 1}}; }, Errc::plan_invalid_backend, "/plan/backend/script"},
      {"ScriptNotObject", [](I&, P& p) { p["backend"] = json::object{{"kind", "reference"}, {"script", json::array{}}}; }, Errc::plan_wrong_type, "/plan/backend/script"},
      {"ScriptStepsMissing", [](I&, P& p) { p["backend"] = json::object{{"kind", "reference"}, {"script", json::object{}}}; }, Errc::plan_missing_field, "/plan/backend/script/steps"},
      {"ScriptUnknownMember", [](I&, P& p) { p["backend"] = reference("[]"); sub(sub(p, "backend"), "script")["loop"] = true; }, Errc::plan_unknown_field, "/plan/backend/script/loop"},
      {"ScriptStepsNotArray", [](I&, P& p) { p["backend"] = reference("{}"); }, Errc::plan_wrong_type, "/plan/backend/script/steps"},
      {"ScriptTooManySteps", [](I&, P& p) { p["backend"] = reference(repeated(R"({"sleep_ms": 1})", 1025)); }, Errc::plan_too_large, "/plan/backend/script/steps"},
      {"StepNotObject", [](I&, P& p) { p["backend"] = reference("[1]"); }, Errc::plan_wrong_type, "/plan/backend/script/steps/0"},
      {"StepNamesNothing", [](I&, P& p) { p["backend"] = reference("[{}]"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0"},
      {"StepNamesTwo", [](I&, P& p) { p["backend"] = reference(R"([{"sleep_ms": 1, "spawn": 1}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0"},
      {"StepUnknown", [](I&, P& p) { p["backend"] = reference(R"([{"fork": 1}])"); }, Errc::plan_unknown_field, "/plan/backend/script/steps/0/fork"},
      {"WriteBadStream", [](I&, P& p) { p["backend"] = reference(R"([{"write": "stdin", "data_b64": "QQ=="}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/write"},
      {"WriteNoData", [](I&, P& p) { p["backend"] = reference(R"([{"write": "stdout"}])"); }, Errc::plan_missing_field, "/plan/backend/script/steps/0/data_b64"},
      {"WriteBadBase64", [](I&, P& p) { p["backend"] = reference(R"([{"write": "stdout", "data_b64": "QQ="}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/data_b64"},
      {"WriteNothing", [](I&, P& p) { p["backend"] = reference(R"([{"write": "stderr", "data_b64": ""}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/data_b64"},
      {"WriteTooLarge", [](I&, P& p) { p["backend"] = reference("[" + write_zeros((1U << 20U) + 1) + "]"); }, Errc::plan_too_large, "/plan/backend/script/steps/0/data_b64"},
      {"WritesTooLargeInAll", [](I&, P& p) { p["backend"] = reference("[" + write_zeros(1U << 19U) + "," + write_zeros(1U << 19U) + "," + write_zeros(1) + "]"); }, Errc::plan_too_large, "/plan/backend/script/steps/2/data_b64"},
      {"DataOnSleep", [](I&, P& p) { p["backend"] = reference(R"([{"sleep_ms": 1, "data_b64": "QQ=="}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/data_b64"},
      {"SleepZero", [](I&, P& p) { p["backend"] = reference(R"([{"sleep_ms": 0}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/sleep_ms"},
      {"SleepNegative", [](I&, P& p) { p["backend"] = reference(R"([{"sleep_ms": -5}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/sleep_ms"},
      {"SleepDouble", [](I&, P& p) { p["backend"] = reference(R"([{"sleep_ms": 1.5}])"); }, Errc::plan_wrong_type, "/plan/backend/script/steps/0/sleep_ms"},
      {"SleepOverTheBound", [](I&, P& p) { p["backend"] = reference(R"([{"sleep_ms": 3599999}, {"sleep_ms": 2}])"); }, Errc::plan_too_large, "/plan/backend/script/steps/1/sleep_ms"},
      {"SpawnZero", [](I&, P& p) { p["backend"] = reference(R"([{"spawn": 0}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/spawn"},
      {"SpawnTooMany", [](I&, P& p) { p["backend"] = reference(R"([{"spawn": 4000}, {"spawn": 97}])"); }, Errc::plan_too_large, "/plan/backend/script/steps/1/spawn"},
      {"IgnoreSigkill", [](I&, P& p) { p["backend"] = reference(R"([{"ignore": "SIGKILL"}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/ignore"},
      {"IgnoreNumber", [](I&, P& p) { p["backend"] = reference(R"([{"ignore": 15}])"); }, Errc::plan_wrong_type, "/plan/backend/script/steps/0/ignore"},
      {"UseNothing", [](I&, P& p) { p["backend"] = reference(R"([{"use": {}}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/use"},
      {"UseUnknown", [](I&, P& p) { p["backend"] = reference(R"([{"use": {"gpu_ms": 1}}])"); }, Errc::plan_unknown_field, "/plan/backend/script/steps/0/use/gpu_ms"},
      {"UseTooBig", [](I&, P& p) { p["backend"] = reference(R"([{"use": {"cpu_ms": 1, "descriptors": 9007199254740992}}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/use/descriptors"},
      {"UseNotObject", [](I&, P& p) { p["backend"] = reference(R"([{"use": 5}])"); }, Errc::plan_wrong_type, "/plan/backend/script/steps/0/use"},
      {"ReadStdinZero", [](I&, P& p) { p["backend"] = reference(R"([{"read_stdin": 0}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/read_stdin"},
      {"ExitTooBig", [](I&, P& p) { p["backend"] = reference(R"([{"exit": 256}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/exit"},
      {"ExitNegative", [](I&, P& p) { p["backend"] = reference(R"([{"exit": -1}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/exit"},
      {"SignalNotTerminating", [](I&, P& p) { p["backend"] = reference(R"([{"signal": "SIGCHLD"}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/0/signal"},
      {"StepAfterExit", [](I&, P& p) { p["backend"] = reference(R"([{"exit": 0}, {"write": "stdout", "data_b64": "QQ=="}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/1"},
      {"SignalAfterSignal", [](I&, P& p) { p["backend"] = reference(R"([{"signal": "SIGSEGV"}, {"signal": "SIGABRT"}])"); }, Errc::plan_invalid_backend, "/plan/backend/script/steps/1"},
  };
  return kCases;
}

// Printed by name only in failure messages.
void PrintTo(Case const& c, std::ostream* os) {
  *os << c.name;
}

class PlanRule : public ::testing::TestWithParam<Case> {};

TEST_P(PlanRule, ReportsExactlyThisDiagnostic) {
  auto const& c = GetParam();
  auto req = example_request();
  c.change(req["identity"].as_object(), req["plan"].as_object());
  auto id = parse_identity(req["identity"], "/identity");
  auto plan = parse_plan(req["plan"], "/plan");
  std::vector<Diagnostic> all;
  if (!id) all = id.error().diagnostics;
  if (!plan) {
    // error() returns a copy: take it once.
    auto const perr = plan.error();
    all.insert(all.end(), perr.diagnostics.begin(), perr.diagnostics.end());
  }
  std::string seen;
  for (auto const& d : all) seen += std::string{errc_wire(d.code)} + " " + d.pointer + "; ";
  ASSERT_EQ(all.size(), 1U) << "diagnostics: " << seen;
  EXPECT_EQ(all[0].code, c.code) << errc_wire(all[0].code) << " " << all[0].message;
  EXPECT_EQ(all[0].pointer, c.pointer);
  EXPECT_FALSE(all[0].message.empty());
  // The pointer names a member that exists in the request (a missing one: its parent exists).
  std::string target = all[0].pointer;
  if (all[0].code == Errc::plan_missing_field) target.erase(target.rfind('/'));
  json::value const whole = req;
  boost::system::error_code ec;
  EXPECT_NE(whole.find_pointer(target, ec), nullptr) << target;
  // A single diagnostic keeps its own code at the top of the error.
  auto const& err = id ? plan.error() : id.error();
  EXPECT_EQ(err.code, c.code);
}

INSTANTIATE_TEST_SUITE_P(Table, PlanRule, ::testing::ValuesIn(cases()),
                         [](auto const& row) { return row.param.name; });

TEST(PlanParse, ExampleRequestIsValid) {
  auto req = example_request();
  auto id = parse_identity(req["identity"], "/identity");
  ASSERT_TRUE(id) << id.error().message();
  EXPECT_EQ(id->action_id, "act-42");
  EXPECT_EQ(id->generation, 3U);
  auto plan = parse_plan(req["plan"], "/plan");
  ASSERT_TRUE(plan) << plan.error().message();
  EXPECT_EQ(plan->command.executable, "/usr/bin/make");
  EXPECT_EQ(plan->cwd, "src");
  ASSERT_EQ(plan->env.size(), 2U);
  EXPECT_TRUE(plan->env[0].inherits());
  EXPECT_EQ(plan->env[1].value, std::optional<std::string>{"1"});
  EXPECT_EQ(plan->limits.cpu_ms, Limit{300000});
}

TEST(PlanParse, MinimalPlanGetsEveryDefault) {
  auto v = json::parse(R"({"command": {"executable": "/bin/true", "argv": ["true"]},
                           "workspace": {"root": "/w"}})");
  auto plan = parse_plan(v);
  ASSERT_TRUE(plan) << plan.error().message();
  EXPECT_EQ(plan->workspace.access, WorkspaceAccess::read_only);
  EXPECT_EQ(plan->cwd, ".");
  EXPECT_TRUE(plan->env.empty());
  EXPECT_EQ(plan->io, IoPolicy{});
  EXPECT_EQ(plan->limits, Limits{});
  EXPECT_EQ(plan->limits.wall_ms, Limit{3'600'000});
  EXPECT_EQ(plan->limits.memory_bytes, Limit{});
  EXPECT_EQ(plan->output, OutputPolicy{});
  EXPECT_EQ(plan->escalation.signal, 15U);
  EXPECT_FALSE(plan->user.has_value());
  EXPECT_EQ(plan->backend.kind, BackendKind::native);
}

TEST(PlanParse, PtyDefaultsAndUnlimited) {
  auto v = json::parse(R"({"command": {"executable": "/bin/sh", "argv": ["sh"]},
                           "workspace": {"root": "/"}, "io": {"mode": "pty"},
                           "limits": {"wall_ms": "unlimited"}})");
  auto plan = parse_plan(v);
  ASSERT_TRUE(plan) << plan.error().message();
  EXPECT_EQ(plan->io, (IoPolicy{IoMode::pty, 24, 80, false}));
  EXPECT_EQ(plan->limits.wall_ms, Limit{});
}

TEST(PlanParse, CwdIsNormalized) {
  for (auto [in, out] : std::vector<std::pair<std::string, std::string>>{
           {"", "."}, {".", "."}, {"./", "."}, {"a//b/./", "a/b"}, {"./src", "src"}}) {
    auto req = example_request();
    req["plan"].as_object()["cwd"] = in;
    auto plan = parse_plan(req["plan"]);
    ASSERT_TRUE(plan) << in;
    EXPECT_EQ(plan->cwd, out) << in;
  }
}

TEST(PlanParse, GroupsAreSorted) {
  auto req = example_request();
  req["plan"].as_object()["user"] =
      json::object{{"uid", 1}, {"gid", 2}, {"groups", json::array{30, 10, 20}}};
  auto plan = parse_plan(req["plan"]);
  ASSERT_TRUE(plan) << plan.error().message();
  EXPECT_EQ(plan->user->groups, (std::vector<std::uint32_t>{10, 20, 30}));
}

TEST(PlanParse, CollectsEveryDiagnostic) {
  auto req = example_request();
  auto& p = req["plan"].as_object();
  p["command"].as_object()["executable"] = "make";
  p["cwd"] = "../up";
  p["env"].as_array()[1].as_object()["name"] = "PATH";
  p["limits"].as_object()["wall_ms"] = 0;
  p["bogus"] = 1;
  auto plan = parse_plan(req["plan"], "/plan");
  ASSERT_FALSE(plan);
  EXPECT_EQ(plan.error().code, Errc::plan_invalid);
  std::vector<std::pair<Errc, std::string>> got;
  for (auto const& d : plan.error().diagnostics) got.emplace_back(d.code, d.pointer);
  std::vector<std::pair<Errc, std::string>> const want = {
      {Errc::plan_unknown_field, "/plan/bogus"},
      {Errc::plan_invalid_executable, "/plan/command/executable"},
      {Errc::plan_invalid_cwd, "/plan/cwd"},
      {Errc::plan_duplicate_env, "/plan/env/1/name"},
      {Errc::plan_invalid_limit, "/plan/limits/wall_ms"},
  };
  EXPECT_EQ(got, want);
}

TEST(PlanParse, NotAnObject) {
  auto plan = parse_plan(json::value(42), "/plan");
  ASSERT_FALSE(plan);
  EXPECT_EQ(plan.error().code, Errc::plan_wrong_type);
  EXPECT_EQ(plan.error().diagnostics.at(0).pointer, "/plan");
}

TEST(PlanParse, InvalidJsonText) {
  EXPECT_EQ(parse_json_text("{\"a\": ").error().code, Errc::plan_invalid_json);
  EXPECT_EQ(parse_json_text("\"\xff\"").error().code, Errc::plan_invalid_json);  // not UTF-8
  EXPECT_TRUE(parse_json_text("{\"a\": [1, 2]}"));
}

TEST(PlanParse, DuplicateMembersAreRefusedWithTheirPointer) {
  struct Row {
    std::string text;
    std::string context;
  };
  std::vector<Row> const rows = {
      {R"({"a": 1, "a": 2})", "duplicate member /a"},
      {R"({"plan": {"env": [{"name": "X", "value": "1", "name": "Y"}]}})",
       "duplicate member /plan/env/0/name"},
      {R"([0, {"k": [1, 2]}, {"k": 1, "j": {}, "k": 3}])", "duplicate member /2/k"},
      {R"({"a/b": {}, "a~1b": {}, "a/b": 1})", "duplicate member /a~1b"},
  };
  for (auto const& r : rows) {
    auto v = parse_json_text(r.text);
    ASSERT_FALSE(v) << r.text;
    EXPECT_EQ(v.error().code, Errc::plan_invalid_json);
    EXPECT_EQ(v.error().context, r.context);
  }
  // The same name in different objects is fine.
  EXPECT_TRUE(parse_json_text(R"({"a": {"a": 1}, "b": [{"a": 1}, {"a": 2}]})"));
}

TEST(PlanRules, ValidatePlanOnStructs) {
  auto p = testing::full_plan();
  EXPECT_TRUE(validate_plan(p).empty());
  p.cwd = "a/./b";  // not normalized: a struct must already be in normal form
  auto d = validate_plan(p, "/plan");
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].code, Errc::plan_invalid_cwd);
  p = testing::full_plan();
  p.user->groups = {5, 4};
  d = validate_plan(p);
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].code, Errc::plan_invalid_user);
  EXPECT_EQ(d[0].pointer, "/user/groups/1");
  p = testing::full_plan();
  p.io = {IoMode::pipes, 24, 80, false};
  d = validate_plan(p);
  ASSERT_EQ(d.size(), 1U);
  EXPECT_EQ(d[0].code, Errc::plan_invalid_io);
}

TEST(PlanRules, SignalNames) {
  for (auto name : {"SIGHUP", "SIGINT", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGTERM"}) {
    auto n = signal_from_name(name);
    ASSERT_TRUE(n) << name;
    EXPECT_EQ(signal_name(*n), std::optional<std::string_view>{name});
  }
  EXPECT_EQ(signal_from_name("SIGKILL"), std::nullopt);
  EXPECT_EQ(signal_from_name("sigterm"), std::nullopt);
  EXPECT_EQ(signal_name(9), std::nullopt);
}

}  // namespace
}  // namespace custos::core
