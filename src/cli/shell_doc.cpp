// Reads the CLI::App into CommandDoc. An option's choices are the "{a,b,c}" part of its CLI11
// type name, which CLI::IsMember and one_of() (below) both produce.
#include "shell_doc.hpp"

#include <algorithm>
#include <memory>

#include "commands.hpp"

namespace custos::cli {

namespace {

std::vector<std::string> split(std::string const& s, char sep) {
  std::vector<std::string> out;
  std::size_t start = 0;
  for (;;) {
    auto const end = s.find(sep, start);
    out.push_back(s.substr(start, end == std::string::npos ? std::string::npos : end - start));
    if (end == std::string::npos) return out;
    start = end + 1;
  }
}

std::string braced(std::vector<std::string> const& names) {
  std::string out = "{";
  for (auto const& n : names) out += (out.size() > 1 ? "," : "") + n;
  return out + "}";
}

OptionDoc option_doc(CLI::Option const& o) {
  OptionDoc d;
  for (auto const& n : o.get_lnames()) d.longs.push_back("--" + n);
  for (auto const& n : o.get_snames()) d.shorts.push_back("-" + n);
  d.help = o.get_description();
  d.env = o.get_envname();
  d.required = o.get_required();
  d.configurable = o.get_configurable();
  d.default_value = o.get_default_str();
  if (o.get_items_expected_max() > 0) {  // a flag expects no value
    // "TEXT:{auto,cgroup,marker}": the type, then one part per check that describes itself.
    auto parts = split(o.get_type_name(), ':');
    // An option made without a typed variable (--config) has no type name: text.
    d.value = parts.front().empty() ? "TEXT" : parts.front();
    for (auto const& p : parts) {
      if (p.size() >= 2 && p.front() == '{' && p.back() == '}') {
        d.choices = split(p.substr(1, p.size() - 2), ',');
      }
    }
    d.repeatable = o.get_expected_max() > 1;
  } else {
    d.default_value.clear();  // a flag's default is "off"
    d.repeatable = o.get_multi_option_policy() == CLI::MultiOptionPolicy::TakeAll;
  }
  return d;
}

CommandDoc command_doc(CLI::App const& app, std::vector<std::string> path) {
  CommandDoc d;
  d.path = std::move(path);
  d.description = app.get_description();
  d.needs_subcommand = app.get_require_subcommand_min() > 0;
  for (auto const* o : app.get_options()) {
    if (o->get_group().empty()) continue;
    if (o->get_positional() && !o->nonpositional()) {
      d.positionals.push_back(PositionalDoc{o->get_name(), o->get_description(), o->get_required(),
                                            o->get_expected_max() > 1});
    } else {
      d.options.push_back(option_doc(*o));
    }
  }
  for (auto const* sub : app.get_subcommands([](CLI::App const*) { return true; })) {
    if (sub->get_group().empty()) continue;
    auto sub_path = d.path;
    sub_path.push_back(sub->get_name());
    d.subcommands.push_back(command_doc(*sub, std::move(sub_path)));
  }
  return d;
}

void collect(CommandDoc const& c, std::vector<CommandDoc const*>& out) {
  out.push_back(&c);
  for (auto const& s : c.subcommands) collect(s, out);
}

}  // namespace

std::string const& OptionDoc::name() const {
  return longs.empty() ? shorts.front() : longs.front();
}

std::vector<std::string> OptionDoc::names() const {
  auto out = longs;
  out.insert(out.end(), shorts.begin(), shorts.end());
  return out;
}

std::string CommandDoc::joined() const {
  std::string out;
  for (auto const& p : path) out += (out.empty() ? "" : " ") + p;
  return out;
}

CommandDoc const* CommandDoc::find(std::vector<std::string> const& sub) const {
  CommandDoc const* at = this;
  for (auto const& name : sub) {
    auto it = std::find_if(at->subcommands.begin(), at->subcommands.end(),
                           [&](CommandDoc const& c) { return c.path.back() == name; });
    if (it == at->subcommands.end()) return nullptr;
    at = &*it;
  }
  return at;
}

CommandDoc describe(CLI::App const& app) {
  return command_doc(app, {});
}

std::vector<OptionDoc> inherited_options(CommandDoc const& root) {
  std::vector<OptionDoc> out;
  for (auto const& o : root.options) {
    if (o.name() != "--help" && o.name() != "--version") out.push_back(o);
  }
  return out;
}

std::vector<CommandDoc const*> all_commands(CommandDoc const& root) {
  std::vector<CommandDoc const*> out;
  collect(root, out);
  return out;
}

CLI::Validator one_of(std::vector<std::string> names, std::vector<std::string> aliases) {
  auto shown = braced(names);
  auto accepted = std::make_shared<std::vector<std::string>>(std::move(names));
  accepted->insert(accepted->end(), aliases.begin(), aliases.end());
  return CLI::Validator{[accepted, shown](std::string& in) -> std::string {
                          if (std::find(accepted->begin(), accepted->end(), in) != accepted->end())
                            return {};
                          return in + " not in " + shown;
                        },
                        shown};
}

}  // namespace custos::cli
