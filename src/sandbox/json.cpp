// JSON structure → sandbox requirements, and back (json.hpp). This file knows the JSON shapes
// and the rules of the requirements alone; the rules against a plan are compile.cpp's.
#include "custos/sandbox/json.hpp"

#include <boost/json/array.hpp>

#include <algorithm>
#include <map>
#include <tuple>
#include <utility>

#include "custos/core/json_pointer.hpp"

namespace custos::sandbox {
namespace json = boost::json;

namespace {

using core::FieldReader;
using core::pointer_append;

constexpr Errc kInvalid = Errc::sandbox_invalid;

// An array of at most `max` items, or nullptr after reporting it (wrong type, too large).
json::array const* bounded_array(FieldReader& r, json::value const& v, std::string const& ptr,
                                 std::size_t max) {
  auto const* a = r.array(v, ptr);
  if (a == nullptr) return nullptr;
  if (a->size() > max) {
    r.add(Errc::plan_too_large, ptr, "more than " + std::to_string(max) + " items");
    return nullptr;
  }
  return a;
}

// A list of names from a closed set, each turned into its value by `from`. Unknown names are
// reported (sandbox.invalid) and skipped. nullopt when the list itself is unusable.
template <class E, class From>
std::optional<std::vector<E>> name_list(FieldReader& r, json::value const& v,
                                        std::string const& ptr, From&& from, char const* what) {
  auto const* a = bounded_array(r, v, ptr, kMaxSetListItems);
  if (a == nullptr) return std::nullopt;
  std::vector<E> out;
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string const iptr = pointer_append(ptr, i);
    std::string s;
    if (!r.string((*a)[i], iptr, s)) continue;
    if (auto e = from(s)) {
      out.push_back(*e);
    } else {
      r.add(kInvalid, iptr, "\"" + s + "\" is not " + what);
    }
  }
  return out;
}

std::optional<bool> opt_bool(FieldReader& r, json::object const& o, std::string const& ptr,
                             std::string_view key) {
  auto const* v = FieldReader::optional(o, key);
  bool b = false;
  if (v == nullptr || !r.boolean(*v, pointer_append(ptr, key), b)) return std::nullopt;
  return b;
}

// ------------------------------------------------------------------------------ filesystem

std::optional<std::string> read_path(FieldReader& r, json::value const& v, std::string const& ptr) {
  std::string raw;
  if (!r.string(v, ptr, raw)) return std::nullopt;
  if (raw.find('\0') != std::string::npos) {
    r.add(Errc::plan_nul_byte, ptr, "contains a NUL byte");
    return std::nullopt;
  }
  if (raw.size() > kMaxPathBytes) {
    r.add(Errc::plan_too_large, ptr, "longer than " + std::to_string(kMaxPathBytes) + " bytes");
    return std::nullopt;
  }
  std::string why;
  auto norm = normalize_path(raw, &why);
  if (!norm) r.add(kInvalid, ptr, why);
  return norm;
}

// Every right but metadata needs metadata: a process that may open, list or run a file can
// always fstat what it holds, so no host could enforce the right without metadata.
void check_metadata(FieldReader& r, std::vector<Right> const& allow, std::string const& ptr) {
  RightSet rights;
  for (Right x : allow) rights.add(x);
  if (rights.empty() || rights.has(Right::metadata)) return;
  std::string names;
  for (Right x : rights.members())
    names += (names.empty() ? "" : ", ") + std::string{right_wire(x)};
  r.add(kInvalid, ptr, names + " without metadata: every right but metadata needs metadata");
}

void read_filesystem(FieldReader& r, json::value const& v, std::string const& ptr,
                     std::vector<PathRequirement>& out) {
  auto const* a = bounded_array(r, v, ptr, kMaxFilesystemEntries);
  if (a == nullptr) return;
  std::map<std::string, std::pair<RightSet, std::size_t>> seen;  // path -> rights, first index
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string const eptr = pointer_append(ptr, i);
    auto const* o = r.object((*a)[i], eptr);
    if (o == nullptr) continue;
    std::size_t const before = r.count();
    r.only(*o, eptr, {"path", "allow"});
    PathRequirement entry;
    std::string const pptr = pointer_append(eptr, "path");
    std::string const aptr = pointer_append(eptr, "allow");
    if (auto const* p = r.required(*o, eptr, "path")) {
      if (auto path = read_path(r, *p, pptr)) entry.path = std::move(*path);
    }
    if (auto const* al = r.required(*o, eptr, "allow")) {
      if (auto rights = name_list<Right>(r, *al, aptr, right_from_wire, "a filesystem right")) {
        entry.allow = std::move(*rights);
      }
    }
    if (r.count() != before) continue;
    check_metadata(r, entry.allow, aptr);
    RightSet rights;
    for (Right x : entry.allow) rights.add(x);
    auto [it, fresh] = seen.emplace(entry.path, std::pair{rights, i});
    if (!fresh && it->second.first != rights) {
      r.add(kInvalid, pptr,
            "is also listed at " + pointer_append(ptr, it->second.second) +
                " with other rights; a path has one set of rights");
    }
    out.push_back(std::move(entry));
  }
}

// ------------------------------------------------------------------------------ process

void read_process(FieldReader& r, json::value const& v, std::string const& ptr,
                  ProcessRequirement& out) {
  auto const* o = r.object(v, ptr);
  if (o == nullptr) return;
  std::size_t const before = r.count();
  r.only(*o, ptr, {"descendants", "max_processes", "signal_scope", "run_as_root"});
  out.descendants = opt_bool(r, *o, ptr, "descendants");
  out.run_as_root = opt_bool(r, *o, ptr, "run_as_root");
  std::string const mptr = pointer_append(ptr, "max_processes");
  if (auto const* m = FieldReader::optional(*o, "max_processes")) {
    std::uint64_t n = 0;
    if (r.unsigned_int(*m, mptr, core::kMaxPlanNumber, kInvalid, n)) {
      if (n == 0) {
        r.add(kInvalid, mptr, "must be at least 1 (the root)");
      } else {
        out.max_processes = n;
      }
    }
  }
  if (auto const* s = FieldReader::optional(*o, "signal_scope")) {
    std::string name;
    std::string const sptr = pointer_append(ptr, "signal_scope");
    if (r.string(*s, sptr, name)) {
      if (auto sc = signal_scope_from_wire(name)) {
        out.signal_scope = *sc;
      } else {
        r.add(kInvalid, sptr, "must be own_tree");
      }
    }
  }
  if (r.count() != before) return;
  bool const descendants = out.descendants.value_or(false);
  if (descendants && !out.max_processes) {
    r.add(kInvalid, mptr, "is required when descendants is true (it bounds the whole tree)");
  } else if (!descendants && out.max_processes && *out.max_processes > 1) {
    r.add(kInvalid, mptr, "must be 1 when descendants is false: the tree is the root alone");
  }
}

// ------------------------------------------------------------------------------ environment

void read_environment(FieldReader& r, json::value const& v, std::string const& ptr,
                      EnvironmentRequirement& out) {
  auto const* o = r.object(v, ptr);
  if (o == nullptr) return;
  r.only(*o, ptr, {"allow"});
  auto const* al = FieldReader::optional(*o, "allow");
  if (al == nullptr) return;
  std::string const aptr = pointer_append(ptr, "allow");
  auto const* a = bounded_array(r, *al, aptr, kMaxEnvAllow);
  if (a == nullptr) return;
  std::vector<std::string> names;
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string const iptr = pointer_append(aptr, i);
    std::string name;
    if (!r.string((*a)[i], iptr, name)) continue;
    if (!core::is_valid_env_name(name)) {
      r.add(kInvalid, iptr, "\"" + name + "\" is not an environment variable name");
      continue;
    }
    names.push_back(std::move(name));
  }
  out.allow = std::move(names);
}

// ------------------------------------------------------------------------------ network

void read_tcp_connect(FieldReader& r, json::value const& v, std::string const& ptr,
                      NetworkRequirement& out) {
  auto const* a = bounded_array(r, v, ptr, kMaxTcpPorts);
  if (a == nullptr) return;
  if (a->empty()) {
    r.add(kInvalid, ptr, "lists no port; outbound \"none\" allows no connection");
    return;
  }
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::uint64_t port = 0;
    std::string const iptr = pointer_append(ptr, i);
    if (!r.unsigned_int((*a)[i], iptr, 65535, kInvalid, port)) continue;
    if (port == 0) {
      r.add(kInvalid, iptr, "port 0 is no port");
      continue;
    }
    out.tcp_connect.push_back(static_cast<std::uint32_t>(port));
  }
  out.outbound = Outbound::tcp_connect;
}

void read_network(FieldReader& r, json::value const& v, std::string const& ptr,
                  NetworkRequirement& out) {
  auto const* o = r.object(v, ptr);
  if (o == nullptr) return;
  r.only(*o, ptr, {"outbound"});
  auto const* ob = FieldReader::optional(*o, "outbound");
  if (ob == nullptr) return;
  std::string const optr = pointer_append(ptr, "outbound");
  if (auto const* s = ob->if_string()) {
    if (*s == "none") {
      out.outbound = Outbound::none;
    } else if (*s == "any") {
      out.outbound = Outbound::any;
    } else {
      r.add(kInvalid, optr, "must be \"none\", \"any\" or {\"tcp_connect\": [ports]}");
    }
    return;
  }
  auto const* oo = ob->if_object();
  if (oo == nullptr) {
    r.wrong_type(*ob, optr, "\"none\", \"any\" or {\"tcp_connect\": [ports]}");
    return;
  }
  std::size_t const before = r.count();
  r.only(*oo, optr, {"tcp_connect"});
  if (r.count() != before) return;  // an unknown kind of outbound: one finding, not two
  if (auto const* tc = r.required(*oo, optr, "tcp_connect")) {
    read_tcp_connect(r, *tc, pointer_append(optr, "tcp_connect"), out);
  }
}

// ------------------------------------------------------------------------------ secrets

// `to`: exactly one of env, file, fd.
void read_secret_to(FieldReader& r, json::value const& v, std::string const& ptr,
                    SecretRequirement& out) {
  auto const* o = r.object(v, ptr);
  if (o == nullptr) return;
  std::size_t const before = r.count();
  r.only(*o, ptr, {"env", "file", "fd"});
  if (r.count() != before) return;
  if (o->size() != 1) {
    r.add(kInvalid, ptr, "must name exactly one of env, file, fd");
    return;
  }
  auto const& [key, value] = *o->begin();
  std::string const kptr = pointer_append(ptr, key);
  out.channel = secret_channel_from_wire(key).value_or(SecretChannel::env);
  if (out.channel == SecretChannel::fd) {
    std::uint64_t fd = 0;
    if (!r.unsigned_int(value, kptr, kMaxSecretFd, kInvalid, fd)) return;
    if (fd < kMinSecretFd) {
      r.add(kInvalid, kptr, "must be at least 3 (0, 1 and 2 are stdio)");
      return;
    }
    out.fd = static_cast<std::uint32_t>(fd);
    return;
  }
  std::string name;
  if (!r.string(value, kptr, name)) return;
  bool const valid = out.channel == SecretChannel::env ? core::is_valid_env_name(name)
                                                       : is_valid_secret_file(name);
  if (!valid) {
    r.add(kInvalid, kptr,
          out.channel == SecretChannel::env
              ? "\"" + name + "\" is not an environment variable name"
              : "must be one file name of [A-Za-z0-9_.-], at most 255 bytes, not . or ..");
    return;
  }
  out.name = std::move(name);
}

void read_secrets(FieldReader& r, json::value const& v, std::string const& ptr,
                  std::vector<SecretRequirement>& out) {
  auto const* a = bounded_array(r, v, ptr, kMaxSecrets);
  if (a == nullptr) return;
  // Where each destination is already delivered to: (channel, name, fd) -> (ref, index).
  std::map<std::tuple<SecretChannel, std::string, std::uint32_t>,
           std::pair<std::string, std::size_t>>
      targets;
  for (std::size_t i = 0; i < a->size(); ++i) {
    std::string const eptr = pointer_append(ptr, i);
    auto const* o = r.object((*a)[i], eptr);
    if (o == nullptr) continue;
    std::size_t const before = r.count();
    r.only(*o, eptr, {"ref", "to"});
    SecretRequirement s;
    if (auto const* ref = r.required(*o, eptr, "ref")) {
      std::string const rptr = pointer_append(eptr, "ref");
      if (r.string(*ref, rptr, s.ref) && !is_valid_secret_ref(s.ref)) {
        r.add(kInvalid, rptr, "a secret ref is 1-128 of [A-Za-z0-9_.-], first alphanumeric");
      }
    }
    if (auto const* to = r.required(*o, eptr, "to")) {
      read_secret_to(r, *to, pointer_append(eptr, "to"), s);
    }
    if (r.count() != before) continue;
    auto [it, fresh] = targets.emplace(std::tuple{s.channel, s.name, s.fd}, std::pair{s.ref, i});
    if (!fresh && it->second.first != s.ref) {
      r.add(kInvalid, pointer_append(pointer_append(eptr, "to"), secret_channel_wire(s.channel)),
            "already receives secret " + it->second.first + " (" +
                pointer_append(ptr, it->second.second) + ")");
    }
    out.push_back(std::move(s));
  }
}

// ------------------------------------------------------------------------------ resources

void read_resources(FieldReader& r, json::value const& v, std::string const& ptr,
                    ResourcesRequirement& out) {
  auto const* o = r.object(v, ptr);
  if (o == nullptr) return;
  r.only(*o, ptr, {"enforce"});
  auto const* en = FieldReader::optional(*o, "enforce");
  if (en == nullptr) return;
  std::string const eptr = pointer_append(ptr, "enforce");
  auto dims = name_list<core::ResourceDim>(r, *en, eptr, core::resource_dim_from_wire,
                                           "a resource dimension (wall_ms, cpu_ms, memory_bytes, "
                                           "disk_bytes, output_bytes, descriptors, processes)");
  if (!dims) return;
  auto const& a = en->get_array();  // name_list checked it is one
  for (std::size_t i = 0; i < a.size(); ++i) {
    if (auto const* s = a[i].if_string(); s != nullptr && *s == "concurrency") {
      r.add(kInvalid, pointer_append(eptr, i),
            "no plan limit bounds concurrency, so there is nothing to enforce");
    }
  }
  std::erase(*dims, core::ResourceDim::concurrency);
  out.enforce = std::move(*dims);
}

// ------------------------------------------------------------------------------ terminal

void read_terminal(FieldReader& r, json::value const& v, std::string const& ptr,
                   TerminalRequirement& out) {
  auto const* o = r.object(v, ptr);
  if (o == nullptr) return;
  r.only(*o, ptr, {"modes", "input", "resize"});
  if (auto const* m = FieldReader::optional(*o, "modes")) {
    std::string const mptr = pointer_append(ptr, "modes");
    std::size_t const before = r.count();
    auto modes = name_list<core::IoMode>(r, *m, mptr, core::io_mode_from, "pipes or pty");
    if (modes && r.count() == before && modes->empty()) {
      r.add(kInvalid, mptr, "allows no io mode: the execution could not run");
    }
    if (modes) out.modes = std::move(*modes);
  }
  out.input = opt_bool(r, *o, ptr, "input");
  out.resize = opt_bool(r, *o, ptr, "resize");
}

}  // namespace

void read_requirements(FieldReader& r, json::value const& v, std::string const& ptr,
                       SandboxRequirements& out) {
  auto const* o = r.object(v, ptr);
  if (o == nullptr) return;
  r.only(*o, ptr,
         {"filesystem", "process", "environment", "network", "secrets", "resources", "terminal"});
  auto at = [&ptr](std::string_view key) { return pointer_append(ptr, key); };
  if (auto const* m = FieldReader::optional(*o, "filesystem")) {
    read_filesystem(r, *m, at("filesystem"), out.filesystem.emplace());
  }
  if (auto const* m = FieldReader::optional(*o, "process")) {
    read_process(r, *m, at("process"), out.process.emplace());
  }
  if (auto const* m = FieldReader::optional(*o, "environment")) {
    read_environment(r, *m, at("environment"), out.environment.emplace());
  }
  if (auto const* m = FieldReader::optional(*o, "network")) {
    read_network(r, *m, at("network"), out.network.emplace());
  }
  if (auto const* m = FieldReader::optional(*o, "secrets")) {
    read_secrets(r, *m, at("secrets"), out.secrets.emplace());
  }
  if (auto const* m = FieldReader::optional(*o, "resources")) {
    read_resources(r, *m, at("resources"), out.resources.emplace());
  }
  if (auto const* m = FieldReader::optional(*o, "terminal")) {
    read_terminal(r, *m, at("terminal"), out.terminal.emplace());
  }
}

Result<SandboxRequirements> parse_requirements(json::value const& v, std::string_view ptr) {
  FieldReader r;
  SandboxRequirements out;
  read_requirements(r, v, std::string{ptr}, out);
  if (!r.ok()) return std::move(r).error();
  return out;
}

// ------------------------------------------------------------------------------ to_json

namespace {

json::array rights_json(std::vector<Right> const& rights) {
  json::array a;
  for (Right x : rights) a.emplace_back(right_wire(x));
  return a;
}

json::value outbound_json(Outbound o, std::vector<std::uint32_t> const& ports) {
  if (o != Outbound::tcp_connect) return json::value(outbound_wire(o));
  json::array a;
  for (auto p : ports) a.emplace_back(p);
  return json::object{{"tcp_connect", std::move(a)}};
}

json::object secret_json(std::string const& ref, SecretChannel channel, std::string const& name,
                         std::uint32_t fd) {
  json::object to;
  if (channel == SecretChannel::fd) {
    to["fd"] = fd;
  } else {
    to[secret_channel_wire(channel)] = name;
  }
  return json::object{{"ref", ref}, {"to", std::move(to)}};
}

std::string_view mode_wire(core::IoMode m) {
  return core::to_string(m);
}

template <class E, class Wire>
json::array names_json(std::vector<E> const& values, Wire&& wire) {
  json::array a;
  for (auto const& e : values) a.emplace_back(wire(e));
  return a;
}

json::object process_json(ProcessRequirement const& p) {
  json::object o;
  if (p.descendants) o["descendants"] = *p.descendants;
  if (p.max_processes) o["max_processes"] = *p.max_processes;
  if (p.signal_scope) o["signal_scope"] = signal_scope_wire(*p.signal_scope);
  if (p.run_as_root) o["run_as_root"] = *p.run_as_root;
  return o;
}

json::object terminal_json(TerminalRequirement const& t) {
  json::object o;
  if (t.modes) o["modes"] = names_json(*t.modes, mode_wire);
  if (t.input) o["input"] = *t.input;
  if (t.resize) o["resize"] = *t.resize;
  return o;
}

}  // namespace

json::value to_json(SandboxRequirements const& req) {
  json::object o;
  if (req.filesystem) {
    json::array fs;
    for (auto const& e : *req.filesystem) {
      fs.emplace_back(json::object{{"path", e.path}, {"allow", rights_json(e.allow)}});
    }
    o["filesystem"] = std::move(fs);
  }
  if (req.process) o["process"] = process_json(*req.process);
  if (req.environment) {
    json::object env;
    if (req.environment->allow) {
      env["allow"] = names_json(*req.environment->allow, [](auto const& s) { return s; });
    }
    o["environment"] = std::move(env);
  }
  if (req.network) {
    json::object net;
    if (req.network->outbound) {
      net["outbound"] = outbound_json(*req.network->outbound, req.network->tcp_connect);
    }
    o["network"] = std::move(net);
  }
  if (req.secrets) {
    json::array s;
    for (auto const& x : *req.secrets) s.emplace_back(secret_json(x.ref, x.channel, x.name, x.fd));
    o["secrets"] = std::move(s);
  }
  if (req.resources) {
    json::object res;
    if (req.resources->enforce) {
      res["enforce"] = names_json(*req.resources->enforce, core::resource_dim_wire);
    }
    o["resources"] = std::move(res);
  }
  if (req.terminal) o["terminal"] = terminal_json(*req.terminal);
  return o;
}

json::value to_json(SandboxPolicy const& p) {
  json::array fs;
  for (auto const& rule : p.filesystem) {
    fs.emplace_back(
        json::object{{"path", rule.path}, {"allow", rights_json(rule.rights.members())}});
  }
  json::array secrets;
  for (auto const& s : p.secrets) secrets.emplace_back(secret_json(s.ref, s.channel, s.name, s.fd));
  return json::object{
      {"filesystem", std::move(fs)},
      {"process", json::object{{"descendants", p.process.descendants},
                               {"max_processes", p.process.max_processes},
                               {"signal_scope", signal_scope_wire(p.process.signal_scope)},
                               {"run_as_root", p.process.run_as_root}}},
      {"environment",
       json::object{{"allow", names_json(p.environment.allow, [](auto const& s) { return s; })}}},
      {"network",
       json::object{{"outbound", outbound_json(p.network.outbound, p.network.tcp_ports)}}},
      {"secrets", std::move(secrets)},
      {"resources", json::object{{"enforce", names_json(p.resources.enforce.members(),
                                                        core::resource_dim_wire)}}},
      {"terminal", json::object{{"modes", names_json(p.terminal.modes.members(), mode_wire)},
                                {"input", p.terminal.input},
                                {"resize", p.terminal.resize}}},
  };
}

json::object to_json(CheckedSandboxPlan const& checked) {
  json::object o = to_json(checked.policy).as_object();
  json::array controls;
  for (auto const& c : checked.controls) controls.emplace_back(c);
  o["controls"] = std::move(controls);
  return o;
}

}  // namespace custos::sandbox
