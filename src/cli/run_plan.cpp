// The plan `custos run` sends, built from its flags (run_plan.hpp).
#include "run_plan.hpp"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <random>
#include <sys/stat.h>
#include <unistd.h>

namespace custos::cli {

namespace json = boost::json;
namespace fs = std::filesystem;

namespace {

// Names inherited by default so ordinary programs find their tools and locale.
constexpr char const* kDefaultInherit[] = {"PATH", "HOME", "USER", "LOGNAME", "LANG", "TERM"};

bool is_executable_file(fs::path const& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0 && S_ISREG(st.st_mode) && ::access(p.c_str(), X_OK) == 0;
}

// A bare name is looked up in the caller's PATH like execvp would; a name with '/' is taken
// relative to the current directory. argv[0] stays what the user typed.
Result<std::string> resolve_executable(std::string const& name) {
  if (name.empty()) return Error{Errc::plan_invalid_executable, "empty command"};
  if (name.find('/') != std::string::npos) {
    fs::path p = fs::absolute(name).lexically_normal();
    if (!is_executable_file(p)) {
      return Error{Errc::plan_invalid_executable, p.native() + " is not an executable file"};
    }
    return p.native();
  }
  char const* path_env = std::getenv("PATH");
  std::string const path = path_env != nullptr ? path_env : "/usr/local/bin:/usr/bin:/bin";
  std::size_t start = 0;
  while (start <= path.size()) {
    auto const end = path.find(':', start);
    std::string dir =
        path.substr(start, end == std::string::npos ? std::string::npos : end - start);
    if (dir.empty()) dir = ".";
    fs::path candidate = fs::absolute(fs::path{dir} / name).lexically_normal();
    if (is_executable_file(candidate)) return candidate.native();
    if (end == std::string::npos) break;
    start = end + 1;
  }
  return Error{Errc::plan_invalid_executable, name + ": not found in PATH"};
}

std::string random_hex(std::size_t n) {
  std::random_device rd;
  std::string out;
  static constexpr char kHex[] = "0123456789abcdef";
  for (std::size_t i = 0; i < n; ++i) out.push_back(kHex[rd() & 15U]);
  return out;
}

// The plan's environment: the default names inherited (unless --clean-env), the names --env
// gave without a value inherited, and --env NAME=VALUE literals. A literal wins over a default
// inheritance of the same name; the daemon supplies inherited values, none travels from here.
// Under a sandbox the defaults are only those its environment.allow names, and `extra` (the
// profile's TMPDIR) is added unless --env gave the name.
json::array plan_env(RunFlags const& f, std::optional<json::object> const& sandbox,
                     std::vector<std::pair<std::string, std::string>> const& extra) {
  json::array env;
  std::map<std::string, bool> seen;
  auto inherit = [&](std::string const& name) {
    if (seen.count(name) != 0) return;
    seen[name] = true;
    // The daemon supplies the value from its own environment; no value travels from here.
    env.push_back(json::object{{"name", name}, {"inherit", true}});
  };
  std::vector<std::pair<std::string, std::string>> literals;
  for (auto const& e : f.env) {
    auto const eq = e.find('=');
    if (eq == std::string::npos) continue;
    literals.emplace_back(e.substr(0, eq), e.substr(eq + 1));
  }
  auto literal_named = [&](std::string const& n) {
    for (auto const& [k, v] : literals)
      if (k == n) return true;
    return false;
  };
  // A container has its own environment (the engine applies it): nothing is inherited from the
  // daemon's unless named.
  std::vector<std::string> const allowed =
      sandbox ? sandbox_env_allow(*sandbox) : std::vector<std::string>{};
  auto defaulted = [&](std::string const& name) {
    return !sandbox || std::find(allowed.begin(), allowed.end(), name) != allowed.end();
  };
  if (!f.clean_env && !f.in_container()) {
    for (char const* name : kDefaultInherit) {
      if (std::getenv(name) != nullptr && !literal_named(name) && defaulted(name)) inherit(name);
    }
  }
  for (auto const& kv : extra) {
    std::string const& k = kv.first;
    bool const given = std::any_of(f.env.begin(), f.env.end(), [&](std::string const& e) {
      return e == k || e.starts_with(k + "=");
    });
    if (!given && defaulted(k)) literals.emplace_back(k, kv.second);
  }
  for (auto const& e : f.env) {
    if (e.find('=') == std::string::npos) inherit(e);
  }
  for (auto const& [k, v] : literals) {
    if (seen.count(k) != 0) continue;
    seen[k] = true;
    env.push_back(json::object{{"name", k}, {"value", v}});
  }
  return env;
}

// Where and what a container run executes: paths are the container's, so nothing is resolved
// against this host (the executable must be absolute; the workspace defaults to "/").
Result<std::string> container_executable(std::string const& name) {
  if (!name.starts_with('/')) {
    return Error{
        Errc::plan_invalid_executable,
        name + ": inside a container give the executable's absolute path (e.g. /bin/" + name + ")"};
  }
  return name;
}

}  // namespace

Result<json::object> build_params(RunFlags const& f, std::optional<winsize> ws) {
  json::object params;
  bool const contained = f.in_container();
  if (f.ungated && !contained) {
    return Error{Errc::plan_invalid_backend, "--ungated applies to --docker and --podman only"};
  }
  auto const exe = CUSTOS_TRY(contained ? container_executable(f.command.front())
                                        : resolve_executable(f.command.front()));
  fs::path const here = contained ? fs::path{"/"} : fs::current_path();
  fs::path const workspace =
      (f.workspace.empty() ? here : fs::absolute(f.workspace)).lexically_normal();
  fs::path cwd = f.cwd.empty() ? workspace : fs::absolute(f.cwd).lexically_normal();
  if (!contained && f.cwd.empty()) cwd = here;
  std::string rel = cwd.lexically_relative(workspace).native();
  if (rel.empty()) rel = ".";
  std::string ws_root = workspace.native();
  if (ws_root.size() > 1 && ws_root.back() == '/') ws_root.pop_back();

  std::string const run = "run-" + random_hex(16);
  json::object identity{
      {"project_id", f.project_id},
      {"session_id", f.session.empty() ? "cli-" + std::to_string(::getuid()) : f.session},
      {"run_id", run},
      {"attempt_id", "a1"},
      {"turn_id", "t1"},
      {"action_id", "act-" + random_hex(16)},
      {"process_id", "proc-1"},
      {"workspace_id", f.workspace_id},
      {"resource_id", f.resource_id},
      {"environment_id", f.environment_id},
      {"generation", f.generation},
      {"revision", 0}};

  json::array argv;
  for (auto const& a : f.command) argv.emplace_back(a);
  auto sandbox = CUSTOS_TRY(build_sandbox(f.sandbox, ws_root, f.read_only));
  // The build profile's temporary files go to the workspace, the one place it may write.
  std::vector<std::pair<std::string, std::string>> extra;
  if (!f.sandbox.profile.empty()) extra.emplace_back("TMPDIR", ws_root);
  json::array env = plan_env(f, sandbox, extra);

  json::object io{{"mode", f.pty ? "pty" : "pipes"}};
  if (f.pty) {
    io["rows"] = ws && ws->ws_row > 0 ? ws->ws_row : 24;
    io["cols"] = ws && ws->ws_col > 0 ? ws->ws_col : 80;
    io["resize"] = true;
  }
  json::object plan{{"command", json::object{{"executable", exe}, {"argv", std::move(argv)}}},
                    {"workspace", json::object{{"root", ws_root},
                                               {"access", f.read_only ? "read_only" : "writable"}}},
                    {"cwd", rel},
                    {"env", std::move(env)},
                    {"io", std::move(io)}};
  if (contained) {
    bool const docker = !f.docker.empty();
    json::object backend{{"kind", docker ? "docker" : "podman"},
                         {"container", docker ? f.docker : f.podman}};
    std::string const& socket = docker ? f.docker_socket : f.podman_socket;
    if (!socket.empty()) backend["socket"] = fs::absolute(socket).lexically_normal().native();
    if (f.ungated) backend["gate"] = "optional";
    plan["backend"] = std::move(backend);
  }
  if (sandbox) plan["sandbox"] = std::move(*sandbox);
  if (f.grace_s) {
    plan["escalation"] =
        json::object{{"grace_ms", static_cast<std::uint64_t>(std::max(0.0, *f.grace_s) * 1000.0)}};
  }
  if (f.timeout_s > 0) {
    auto const ms = static_cast<std::uint64_t>(f.timeout_s * 1000.0);
    plan["limits"] = json::object{{"wall_ms", ms == 0 ? 1 : ms}};
  }
  params["identity"] = std::move(identity);
  params["plan"] = std::move(plan);
  params["authority"] =
      json::object{{"epoch", 0},
                   {"grant_id", f.grant.empty() ? json::value(nullptr) : json::value(f.grant)},
                   {"lease_id", f.lease.empty() ? json::value(nullptr) : json::value(f.lease)}};
  return params;
}

}  // namespace custos::cli
