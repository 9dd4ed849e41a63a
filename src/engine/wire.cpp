// Versions, request targets and bodies, answer bodies, and the classification of failures.
#include "custos/engine/wire.hpp"

#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include <algorithm>
#include <charconv>

#include "custos/core/plan.hpp"

namespace custos::engine {
namespace json = boost::json;

namespace {

Error failed(std::string ctx) {
  return Error{Errc::engine_failed, std::move(ctx)};
}

// Cuts `s` to `max` bytes (on a UTF-8 boundary, marking the cut) and makes every control
// character a space.
std::string sanitize(std::string_view s, std::size_t max) {
  bool const cut = s.size() > max;
  if (cut) {
    std::size_t n = max;
    // Do not split a UTF-8 sequence: back up over continuation bytes.
    while (n > 0 && (static_cast<unsigned char>(s[n]) & 0xC0U) == 0x80U) --n;
    s = s.substr(0, n);
  }
  std::string out;
  out.reserve(s.size() + 3);
  for (char c : s) {
    auto const u = static_cast<unsigned char>(c);
    out.push_back(u < 0x20 || u == 0x7F ? ' ' : c);
  }
  while (!out.empty() && out.back() == ' ') out.pop_back();
  if (cut) out += "...";
  return out;
}

std::optional<json::value> parse_json(std::string_view body) {
  boost::system::error_code ec;
  json::value v = json::parse(json::string_view{body.data(), body.size()}, ec);
  if (ec) return std::nullopt;
  return v;
}

// Member access that never throws: absent or of another type reads as the fallback.
std::string str_of(json::object const& o, std::string_view key) {
  auto const* v = o.if_contains(json::string_view{key.data(), key.size()});
  if (v == nullptr) return {};
  if (auto const* s = v->if_string()) return std::string{s->data(), s->size()};
  return {};
}

bool bool_of(json::object const& o, std::string_view key) {
  auto const* v = o.if_contains(json::string_view{key.data(), key.size()});
  if (v == nullptr) return false;
  if (auto const* b = v->if_bool()) return *b;
  return false;
}

// An integer member within [lo, hi]; nullopt when absent, null, not an integer or out of range.
std::optional<std::int64_t> int_of(json::object const& o, std::string_view key, std::int64_t lo,
                                   std::int64_t hi) {
  auto const* v = o.if_contains(json::string_view{key.data(), key.size()});
  if (v == nullptr) return std::nullopt;
  std::int64_t n = 0;
  if (auto const* i = v->if_int64()) {
    n = *i;
  } else if (auto const* u = v->if_uint64()) {
    if (*u > static_cast<std::uint64_t>(hi)) return std::nullopt;
    n = static_cast<std::int64_t>(*u);
  } else {
    return std::nullopt;
  }
  if (n < lo || n > hi) return std::nullopt;
  return n;
}

json::object const* obj_of(json::object const& o, std::string_view key) {
  auto const* v = o.if_contains(json::string_view{key.data(), key.size()});
  return v != nullptr ? v->if_object() : nullptr;
}

std::string versioned(ApiVersion v, std::string_view rest) {
  std::string out = "/v" + v.str();
  out.append(rest);
  return out;
}

}  // namespace

std::string_view to_string(EngineKind k) noexcept {
  return k == EngineKind::podman ? "podman" : "docker";
}

std::string ApiVersion::str() const {
  return std::to_string(major) + "." + std::to_string(minor);
}

std::optional<ApiVersion> parse_api_version(std::string_view s) noexcept {
  auto const dot = s.find('.');
  if (dot == std::string_view::npos || dot == 0 || dot + 1 == s.size()) return std::nullopt;
  auto num = [](std::string_view part) -> std::optional<std::uint16_t> {
    if (part.empty() || part.size() > 5) return std::nullopt;
    for (char c : part) {
      if (c < '0' || c > '9') return std::nullopt;
    }
    unsigned value = 0;
    auto const [p, ec] = std::from_chars(part.data(), part.data() + part.size(), value);
    if (ec != std::errc{} || p != part.data() + part.size() || value > 65535) return std::nullopt;
    return static_cast<std::uint16_t>(value);
  };
  auto const major = num(s.substr(0, dot));
  auto const minor = num(s.substr(dot + 1));
  if (!major || !minor) return std::nullopt;
  return ApiVersion{*major, *minor};
}

Result<ApiVersion> negotiate(ApiVersion engine_max, ApiVersion engine_min) {
  ApiVersion const v = std::min(engine_max, kMaxApiVersion);
  if (v < kMinApiVersion || v < engine_min) {
    return failed("no common API version: the engine speaks " + engine_min.str() + " to " +
                  engine_max.str() + ", custos " + kMinApiVersion.str() + " to " +
                  kMaxApiVersion.str());
  }
  return v;
}

std::string_view to_string(Operation op) noexcept {
  switch (op) {
    case Operation::version:
      return "version";
    case Operation::ping:
      return "ping";
    case Operation::container_inspect:
      return "container inspect";
    case Operation::exec_create:
      return "exec create";
    case Operation::exec_start:
      return "exec start";
    case Operation::exec_inspect:
      return "exec inspect";
    case Operation::exec_resize:
      return "exec resize";
  }
  return "call";
}

EngineMessage parse_engine_message(std::string_view body, std::size_t max_bytes) {
  EngineMessage out;
  if (auto v = parse_json(body)) {
    if (auto const* o = v->if_object()) {
      auto const message = str_of(*o, "message");
      if (!message.empty()) {
        out.message = sanitize(message, max_bytes);
        out.cause = sanitize(str_of(*o, "cause"), max_bytes);
        return out;
      }
    }
  }
  out.message = sanitize(body, max_bytes);
  return out;
}

bool is_success(Operation op, unsigned status) noexcept {
  if (status >= 200 && status < 300) return true;
  return op == Operation::exec_start && status == 101;
}

Error classify_failure(EngineKind kind, Operation op, std::string_view subject, unsigned status,
                       std::string_view body, std::size_t max_message_bytes) {
  auto const msg = parse_engine_message(body, max_message_bytes);
  bool const container_op = op == Operation::container_inspect || op == Operation::exec_create;
  bool const starts_exec = op == Operation::exec_create || op == Operation::exec_start;
  Errc code = Errc::engine_failed;
  if (op == Operation::version || op == Operation::ping) {
    code = Errc::engine_unavailable;
  } else if (status == 404) {
    code = container_op || msg.cause == "no such container" ? Errc::engine_container_not_found
                                                            : Errc::engine_failed;
  } else if (starts_exec &&
             (status == 409 || (status == 500 && msg.cause == "container state improper"))) {
    // Docker: 409 for not running, paused, restarting; Podman: 500 with this cause.
    code = Errc::engine_container_not_running;
  }
  std::string ctx{to_string(kind)};
  ctx += ' ';
  ctx += to_string(op);
  if (!subject.empty()) {
    ctx += ' ';
    ctx += subject;
  }
  ctx += ": HTTP " + std::to_string(status);
  if (!msg.message.empty()) ctx += ": " + msg.message;
  return Error{code, std::move(ctx)};
}

bool is_valid_exec_id(std::string_view id) noexcept {
  if (id.empty() || id.size() > 128) return false;
  return std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z');
  });
}

std::string container_inspect_target(ApiVersion v, std::string_view ref) {
  return versioned(v, "/containers/" + std::string{ref} + "/json");
}

std::string exec_create_target(ApiVersion v, std::string_view ref) {
  return versioned(v, "/containers/" + std::string{ref} + "/exec");
}

std::string exec_start_target(ApiVersion v, std::string_view id) {
  return versioned(v, "/exec/" + std::string{id} + "/start");
}

std::string exec_inspect_target(ApiVersion v, std::string_view id) {
  return versioned(v, "/exec/" + std::string{id} + "/json");
}

std::string exec_resize_target(ApiVersion v, std::string_view id, std::uint16_t rows,
                               std::uint16_t cols) {
  return versioned(v, "/exec/" + std::string{id} + "/resize?h=" + std::to_string(rows) +
                          "&w=" + std::to_string(cols));
}

Result<EngineVersion> parse_version(std::string_view body) {
  auto v = parse_json(body);
  if (!v || !v->is_object()) return failed("version: the answer is not a JSON object");
  auto const& o = v->get_object();
  EngineVersion out;
  auto const api = parse_api_version(str_of(o, "ApiVersion"));
  auto const min_api = parse_api_version(str_of(o, "MinAPIVersion"));
  if (!api) return failed("version: no valid ApiVersion in the answer");
  out.api = *api;
  // An engine that does not say how old it goes is taken to speak only its own version.
  out.min_api = min_api ? *min_api : *api;
  out.version = str_of(o, "Version");
  out.os = str_of(o, "Os");
  out.arch = str_of(o, "Arch");
  out.kernel = str_of(o, "KernelVersion");
  if (auto const* comps = o.if_contains("Components"); comps != nullptr && comps->is_array()) {
    for (auto const& c : comps->get_array()) {
      auto const* co = c.if_object();
      if (co == nullptr) continue;
      auto const name = str_of(*co, "Name");
      if (name == "Podman Engine") {
        out.kind = EngineKind::podman;
        out.product = name;
        break;
      }
      if (name == "Engine" && out.product.empty()) out.product = name;
    }
  }
  auto const negotiated = negotiate(out.api, out.min_api);
  if (!negotiated) return negotiated.error();
  out.negotiated = *negotiated;
  return out;
}

std::string_view to_string(ContainerStatus s) noexcept {
  switch (s) {
    case ContainerStatus::created:
      return "created";
    case ContainerStatus::running:
      return "running";
    case ContainerStatus::paused:
      return "paused";
    case ContainerStatus::restarting:
      return "restarting";
    case ContainerStatus::removing:
      return "removing";
    case ContainerStatus::exited:
      return "exited";
    case ContainerStatus::dead:
      return "dead";
    case ContainerStatus::unknown:
      return "unknown";
  }
  return "unknown";
}

Result<ContainerInspect> parse_container_inspect(std::string_view body) {
  auto v = parse_json(body);
  if (!v || !v->is_object()) return failed("container inspect: the answer is not a JSON object");
  auto const& o = v->get_object();
  ContainerInspect out;
  out.id = str_of(o, "Id");
  auto const* state = obj_of(o, "State");
  if (out.id.empty() || state == nullptr) {
    return failed("container inspect: the answer has no Id or State");
  }
  out.name = str_of(o, "Name");
  if (!out.name.empty() && out.name.front() == '/') out.name.erase(0, 1);
  out.status_text = str_of(*state, "Status");
  static constexpr std::pair<std::string_view, ContainerStatus> kStatuses[] = {
      {"created", ContainerStatus::created},
      {"running", ContainerStatus::running},
      {"paused", ContainerStatus::paused},
      {"restarting", ContainerStatus::restarting},
      {"removing", ContainerStatus::removing},
      {"exited", ContainerStatus::exited},
      {"dead", ContainerStatus::dead},
      // Podman's own names for states the Docker API has no word for.
      {"configured", ContainerStatus::created},
      {"initialized", ContainerStatus::created},
      {"stopped", ContainerStatus::exited},
  };
  for (auto const& [text, status] : kStatuses) {
    if (out.status_text == text) out.status = status;
  }
  out.running = bool_of(*state, "Running");
  out.paused = bool_of(*state, "Paused");
  out.restarting = bool_of(*state, "Restarting");
  out.pid = static_cast<std::int32_t>(int_of(*state, "Pid", 0, 0x7FFFFFFF).value_or(0));
  out.started_at = str_of(*state, "StartedAt");
  out.image = str_of(o, "Image");
  if (auto const* config = obj_of(o, "Config")) out.user = str_of(*config, "User");
  if (auto const* host = obj_of(o, "HostConfig")) {
    out.cgroup_parent = str_of(*host, "CgroupParent");
    out.cgroupns_mode = str_of(*host, "CgroupnsMode");
  }
  return out;
}

std::string exec_create_body(ExecConfig const& config, ApiVersion v) {
  json::object o;
  json::array cmd;
  for (auto const& a : config.cmd) cmd.emplace_back(a);
  o["Cmd"] = std::move(cmd);
  if (!config.env.empty()) {
    json::array env;
    for (auto const& e : config.env) env.emplace_back(e);
    o["Env"] = std::move(env);
  }
  if (!config.user.empty()) o["User"] = config.user;
  if (!config.working_dir.empty()) o["WorkingDir"] = config.working_dir;
  o["Tty"] = config.tty;
  o["AttachStdin"] = config.attach_stdin;
  o["AttachStdout"] = config.attach_stdout;
  o["AttachStderr"] = config.attach_stderr;
  if (config.console_size && v >= ApiVersion{1, 42}) {
    o["ConsoleSize"] = json::array{config.console_size->first, config.console_size->second};
  }
  return json::serialize(o);
}

Result<std::string> parse_exec_create(std::string_view body) {
  auto v = parse_json(body);
  if (!v || !v->is_object()) return failed("exec create: the answer is not a JSON object");
  auto id = str_of(v->get_object(), "Id");
  if (!is_valid_exec_id(id)) return failed("exec create: the answer has no valid exec Id");
  return id;
}

std::string exec_start_body(bool tty) {
  return tty ? R"({"Detach":false,"Tty":true})" : R"({"Detach":false,"Tty":false})";
}

Result<ExecInspect> parse_exec_inspect(std::string_view body) {
  auto v = parse_json(body);
  if (!v || !v->is_object()) return failed("exec inspect: the answer is not a JSON object");
  auto const& o = v->get_object();
  ExecInspect out;
  out.id = str_of(o, "ID");
  if (out.id.empty()) return failed("exec inspect: the answer has no ID");
  out.container_id = str_of(o, "ContainerID");
  out.running = bool_of(o, "Running");
  if (!out.running) {
    auto const code = int_of(o, "ExitCode", -0x80000000LL, 0x7FFFFFFF);
    if (code) out.exit_code = static_cast<int>(*code);
  }
  out.pid = static_cast<std::int32_t>(int_of(o, "Pid", 0, 0x7FFFFFFF).value_or(0));
  out.open_stdin = bool_of(o, "OpenStdin");
  if (auto const* pc = obj_of(o, "ProcessConfig")) out.tty = bool_of(*pc, "tty");
  return out;
}

bool cgroup_names_container(std::string_view cgroup, std::string_view id) noexcept {
  if (id.size() < 12 || cgroup.empty()) return false;
  std::size_t pos = 0;
  while (pos < cgroup.size()) {
    auto const end = std::min(cgroup.find('/', pos), cgroup.size());
    if (cgroup.substr(pos, end - pos).find(id) != std::string_view::npos) return true;
    pos = end + 1;
  }
  return false;
}

}  // namespace custos::engine
