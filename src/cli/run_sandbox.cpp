// The sandbox of `custos run`: a file given as is, and the built-in profiles.
#include "run_sandbox.hpp"

#include <cerrno>
#include <fstream>
#include <sstream>
#include <sys/stat.h>
#include <unistd.h>

namespace custos::cli {

namespace json = boost::json;

namespace {

json::array rights(std::initializer_list<char const*> names) {
  json::array a;
  for (char const* n : names) a.emplace_back(n);
  return a;
}

json::object rule(std::string const& path, json::array allow) {
  return json::object{{"path", path}, {"allow", std::move(allow)}};
}

bool exists(char const* path) {
  struct stat st {};
  return ::lstat(path, &st) == 0;
}

// `build`: common tools (compilers, make, scripts) on the workspace and nothing else. System
// directories readable and executable, /etc readable (not executable), three devices, the
// workspace writable (read-only with --read-only), any number of processes up to 256, no
// network, a terminal or pipes with input and resize. Temporary files go to the workspace
// (TMPDIR, set by the CLI): the host's /tmp is shared with everyone and is not listed.
json::object build_profile(std::string const& workspace_root, bool read_only) {
  json::array fs;
  // Listed only where this host has them (on a merged-/usr system /bin, /sbin, /lib, /lib64
  // are symlinks into /usr: listed as the symlinks they are).
  for (char const* sys : {"/usr", "/bin", "/sbin", "/lib", "/lib64"}) {
    if (exists(sys)) fs.push_back(rule(sys, rights({"discover", "metadata", "read", "execute"})));
  }
  if (exists("/etc")) fs.push_back(rule("/etc", rights({"discover", "metadata", "read"})));
  if (exists("/dev/null")) fs.push_back(rule("/dev/null", rights({"metadata", "read", "write"})));
  for (char const* dev : {"/dev/zero", "/dev/urandom"}) {
    if (exists(dev)) fs.push_back(rule(dev, rights({"metadata", "read"})));
  }
  fs.push_back(rule(workspace_root, read_only ? rights({"discover", "metadata", "read", "execute"})
                                              : rights({"discover", "metadata", "read", "execute",
                                                        "create", "write", "remove"})));
  // A root caller's execution runs as root (the plan names no other user): the profile says so
  // rather than have every root run refused at /plan/sandbox/process/run_as_root.
  json::object process{{"descendants", true},
                       {"max_processes", 256},
                       {"signal_scope", "own_tree"},
                       {"run_as_root", ::geteuid() == 0}};
  return json::object{
      {"filesystem", std::move(fs)},
      {"process", std::move(process)},
      {"environment", json::object{{"allow", rights({"HOME", "LANG", "PATH", "TERM", "TMPDIR"})}}},
      {"network", json::object{{"outbound", "none"}}},
      {"terminal",
       json::object{{"modes", rights({"pipes", "pty"})}, {"input", true}, {"resize", true}}}};
}

Error invalid(std::string const& message) {
  Error e{Errc::sandbox_invalid, message};
  e.diagnostics.push_back(Diagnostic{Errc::sandbox_invalid, "/plan/sandbox", message});
  return e;
}

Result<json::object> read_file(std::string const& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Error{Errc::sys_error, "--sandbox: cannot read " + path, errno};
  std::stringstream ss;
  ss << in.rdbuf();
  if (in.bad()) return Error{Errc::sys_error, "--sandbox: cannot read " + path, errno};
  boost::system::error_code ec;
  json::value v = json::parse(ss.str(), ec);
  if (ec) return invalid("--sandbox " + path + ": not JSON: " + ec.message());
  if (!v.is_object()) {
    return invalid("--sandbox " + path + ": must hold a JSON object (the plan's sandbox)");
  }
  return std::move(v.as_object());
}

}  // namespace

std::vector<std::string> sandbox_profiles() {
  return {"build"};
}

Result<std::optional<json::object>> build_sandbox(SandboxFlags const& f,
                                                  std::string const& workspace_root,
                                                  bool read_only) {
  if (!f.any()) return std::optional<json::object>{};
  json::object out;
  if (!f.profile.empty()) {
    if (f.profile != "build") return invalid("--sandbox-profile: unknown profile " + f.profile);
    out = build_profile(workspace_root, read_only);
  }
  if (!f.file.empty()) {
    json::object file = CUSTOS_TRY(read_file(f.file));
    for (auto& kv : file) out[kv.key()] = std::move(kv.value());
  }
  return std::optional<json::object>{std::move(out)};
}

std::vector<std::string> sandbox_env_allow(json::object const& sandbox) {
  std::vector<std::string> names;
  auto const* env = sandbox.if_contains("environment");
  if (env == nullptr || !env->is_object()) return names;
  auto const* allow = env->get_object().if_contains("allow");
  if (allow == nullptr || !allow->is_array()) return names;
  for (auto const& n : allow->get_array()) {
    if (n.is_string()) names.emplace_back(n.get_string());
  }
  return names;
}

}  // namespace custos::cli
