// `custos manpage custos|custos-daemon|custos.toml`: the man pages custos(1), custos-daemon(8)
// and custos.toml(5) in roff (man macros, no preprocessor). Every command and option comes from
// CommandDoc; the prose around them follows docs/cli.md and docs/configuration.md.
#include <fmt/core.h>

#include <cstring>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "custos/daemon/version.hpp"

#include "common.hpp"
#include "exit_codes.hpp"
#include "shell_doc.hpp"

namespace custos::cli {

namespace {

// Text for a roff line: backslashes and minus signs escaped, anything beyond ASCII as a
// \[uXXXX] glyph, a leading control character defused.
std::string roff(std::string_view s) {
  std::string out;
  for (std::size_t i = 0; i < s.size(); ++i) {
    auto const c = static_cast<unsigned char>(s[i]);
    if (c == '\\') {
      out += "\\e";
    } else if (c == '-') {
      out += "\\-";
    } else if (c < 0x80) {
      out += static_cast<char>(c);
    } else {
      // One UTF-8 sequence (the sources are UTF-8) → its code point.
      int const len = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
      unsigned cp = c & (len == 4 ? 0x07U : len == 3 ? 0x0FU : 0x1FU);
      for (int k = 1; k < len && i + 1 < s.size(); ++k) {
        cp = (cp << 6U) | (static_cast<unsigned char>(s[++i]) & 0x3FU);
      }
      out += fmt::format("\\[u{:04X}]", cp);
    }
  }
  if (!out.empty() && (out.front() == '.' || out.front() == '\'')) out.insert(0, "\\&");
  return out;
}

std::string bold(std::string_view s) {
  return "\\fB" + roff(s) + "\\fR";
}
std::string italic(std::string_view s) {
  return "\\fI" + roff(s) + "\\fR";
}

std::string header(std::string_view title, int section, std::string_view manual) {
  // No hyphenation, ragged right: paths and option names stay whole.
  return fmt::format(".TH {} {} \"\" \"custos {}\" \"{}\"\n.nh\n.ad l\n", title, section,
                     daemon::kVersion, manual);
}

std::string section(std::string_view name) {
  return fmt::format(".SH {}\n", name);
}

std::string paragraph(std::string_view text) {
  return ".PP\n" + roff(text) + "\n";
}

// One .TP entry: a tag line and its body.
std::string item(std::string const& tag, std::string_view body) {
  return ".TP\n" + tag + "\n" + roff(body) + "\n";
}

std::string value_of(OptionDoc const& o) {
  if (o.flag()) return {};
  if (o.choices.empty()) return " " + italic(o.value);
  std::string out;
  for (auto const& c : o.choices) out += (out.empty() ? " " : "|") + bold(c);
  return out;
}

// The facts CLI11 knows about an option beyond its help text.
std::string option_notes(OptionDoc const& o) {
  std::string out;
  if (!o.choices.empty()) {
    std::string list;
    for (auto const& c : o.choices) list += (list.empty() ? "" : ", ") + c;
    out += " One of: " + list + ".";
  }
  if (!o.default_value.empty()) out += " Default: " + o.default_value + ".";
  if (o.repeatable) out += " Repeatable.";
  if (o.required) out += " Required.";
  if (!o.env.empty()) out += " Environment: $" + o.env + ".";
  return out;
}

std::string sentence(std::string s) {
  if (!s.empty() && s.back() != '.') s += '.';
  return s;
}

std::string options_list(std::vector<OptionDoc> const& options) {
  std::string out;
  for (auto const& o : options) {
    std::string tag;
    for (auto const& n : o.names()) tag += (tag.empty() ? "" : ", ") + bold(n);
    out += item(tag + value_of(o), sentence(o.help) + option_notes(o));
  }
  return out;
}

std::string synopsis_of(CommandDoc const& c) {
  std::string out = bold("custos " + c.joined());
  if (!c.options.empty()) out += " [" + italic("options") + "]";
  if (!c.subcommands.empty()) out += " " + italic("command");
  for (auto const& p : c.positionals) {
    std::string const name = italic(p.name) + (p.many ? roff(" ...") : "");
    out += " " + (p.required ? name : "[" + name + "]");
  }
  return out;
}

// Paragraphs docs/cli.md gives a command beyond its one-line description.
std::vector<std::string> prose_of(std::string const& path) {
  static std::vector<std::pair<std::string, std::vector<std::string>>> const kProse = {
      {"run",
       {"EXE is resolved like a shell would: a bare name through the caller's PATH, a name with "
        "a / relative to the current directory; the plan gets the absolute path, argv[0] stays "
        "as typed. The workspace is --workspace (default: the current directory); --cwd must be "
        "inside it. The workspace is declared writable unless --read-only.",
        "The environment is built from nothing: PATH HOME USER LOGNAME LANG TERM are inherited "
        "unless --clean-env; --env NAME inherits NAME, --env NAME=VALUE sets a literal. An "
        "inherited name gets the daemon's value, never the caller's.",
        "Output of the child goes to stdout and stderr live; stdin is forwarded, EOF included. "
        "In pipe mode SIGINT, SIGTERM, SIGHUP and SIGQUIT cancel the execution. With --pty the "
        "child gets a pseudo-terminal of our window size, the local terminal goes raw and "
        "Ctrl-C is a byte for the child's terminal. With --json the terminal result is printed "
        "as JSON after the output.",
        "Without --grant the run uses the admin's implicit authority (admins only). The exit "
        "code is the child's (EXIT STATUS)."}},
      {"logs",
       {"Without -f the output comes from the spool files. -f subscribes to the execution's "
        "events and prints its output as it is produced, returning at the terminal event; "
        "every byte is printed once, in order."}},
      {"doctor",
       {"From the daemon's host.info, or, when no daemon answers, probed locally by this "
        "process, and it says which. With a daemon it also prints the registry findings of its "
        "start-up recovery and each backend with what this host enforces of it."}},
      {"quiescence",
       {"Exits 0 with the evidence when the holder is quiescent, 65 with the blocking "
        "executions otherwise."}},
      {"secret set",
       {"Piped or redirected, the value is exactly the bytes up to end of file (a trailing "
        "newline is part of it); from a terminal, one line typed without echo, without its "
        "newline. More than 64 KiB is refused before anything is sent."}},
      {"secret list",
       {"Names, source (store or credentials) and when each was set; never a value."}},
  };
  std::vector<std::string> out;
  for (auto const& [p, text] : kProse) {
    if (p == path) out = text;
  }
  // The commands that ride out a daemon handover (docs/cli.md, "Reconnecting").
  if (path == "run" || path == "logs" || path == "wait") out.push_back(reconnect_help());
  return out;
}

std::string exit_status() {
  struct Row {
    std::string code;
    std::string_view meaning;
  };
  std::vector<Row> const rows = {
      {"0..255", "run/wait: the child's exit code (classification exited)."},
      {"128+N", "run/wait: the child was killed by signal N (signaled)."},
      {std::to_string(kExitTimedOut), "The execution hit its deadline (timed_out)."},
      {std::to_string(kExitCancelled),
       "The execution was cancelled (cancelled: Ctrl-C, custos cancel, daemon shutdown)."},
      {std::to_string(kExitAbnormal),
       "No trustworthy exit code: output_limit, resource_limit, sandbox_denied, "
       "supervisor_failed, recovery_indeterminate."},
      {std::to_string(kExitSpawnFailed), "The executable could not be started (spawn_failed)."},
      {std::to_string(kExitDaemonFailed),
       "custos daemon could not start (the log says which step and why)."},
      {std::to_string(kExitUsage), "Usage error (bad flags)."},
      {std::to_string(kExitRefused),
       "The daemon (or the CLI before sending) refused the request: invalid plan, unknown id, "
       "auth.denied, ..."},
      {std::to_string(kExitInternal), "Protocol or internal error."},
      {std::to_string(kExitUnreachable), "No daemon answers on the socket (rpc.unavailable)."},
  };
  std::string out = section("EXIT STATUS");
  for (auto const& r : rows) out += item(bold(r.code), r.meaning);
  out += paragraph(
      "Codes 124 to 127 and 128+N overlap with what a child can itself return; --json gives the "
      "classification when the difference matters.");
  return out;
}

CommandDoc const& daemon_of(CommandDoc const& root) {
  static CommandDoc const kNone{};
  auto const* d = root.find({"daemon"});
  return d != nullptr ? *d : kNone;
}

}  // namespace

std::string manpage_custos(CommandDoc const& root) {
  std::string out = header("CUSTOS", 1, "User Commands");
  // "custos — owns every process ...": what follows the dash.
  auto const dash = root.description.find(" — ");
  out += section("NAME") + "custos \\- " +
         roff(dash == std::string::npos ? root.description
                                        : root.description.substr(dash + std::strlen(" — "))) +
         "\n";
  out += section("SYNOPSIS") + ".B custos\n[" + italic("options") + "] " + italic("command") +
         " [" + italic("options") + "] [" + italic("arguments") + "]\n";
  out += section("DESCRIPTION");
  out += paragraph(
      "One binary: custos daemon is the daemon (custos-daemon(8)), every other command is a "
      "client of it over its Unix socket (newline-framed JSON-RPC 2.0).");
  out += paragraph(
      "--socket PATH (or $CUSTOS_SOCKET) selects the daemon; the default is "
      "./.custos/custos.sock when it exists, else /run/custos/custos.sock. --json (before or "
      "after the command) prints machine-readable JSON. Errors print one line, "
      "custos: <stable.code>: <detail> (validation errors add one indented line per "
      "diagnostic).");
  out += section("OPTIONS");
  out += paragraph("Accepted before or after the command.");
  out += options_list(root.options);
  out += section("COMMANDS");
  for (auto const* c : all_commands(root)) {
    if (c->path.empty()) continue;
    out += ".SS \"" + c->joined() + "\"\n" + synopsis_of(*c) + "\n.PP\n" +
           roff(sentence(c->description)) + "\n";
    if (c->path.front() == "daemon") {
      out += paragraph("Its options and configuration: custos-daemon(8), custos.toml(5).");
      continue;
    }
    for (auto const& p : prose_of(c->joined())) out += paragraph(p);
    for (auto const& p : c->positionals) {
      out += item(italic(p.name) + (p.many ? roff(" ...") : ""), sentence(p.help));
    }
    out += options_list(c->options);
  }
  out += exit_status();
  out += section("ENVIRONMENT");
  for (auto const* c : all_commands(root)) {
    for (auto const& o : c->options) {
      if (!o.env.empty()) out += item(bold(o.env), "Like " + o.name() + ": " + sentence(o.help));
    }
  }
  out += section("FILES");
  out += item(italic("./.custos/custos.sock"),
              "The socket of a daemon started by an unprivileged user in this directory.");
  out += item(italic("/run/custos/custos.sock"), "The socket of the system daemon.");
  out += section("SEE ALSO");
  out += ".BR custos\\-daemon (8),\n.BR custos.toml (5);\n" +
         roff("/usr/share/doc/custos/cli.md, api.md") + "\n";
  return out;
}

std::string manpage_daemon(CommandDoc const& root) {
  auto const& d = daemon_of(root);
  std::vector<OptionDoc> options;
  for (auto const& o : root.options) {
    if (o.name() == "--config") options.push_back(o);
  }
  options.insert(options.end(), d.options.begin(), d.options.end());

  std::string out = header("CUSTOS\\-DAEMON", 8, "System Administration");
  out += section("NAME") + "custos\\-daemon \\- the custos supervisor daemon (custos daemon)\n";
  out += section("SYNOPSIS") + synopsis_of(d) + "\n";
  out += section("DESCRIPTION") + paragraph(sentence(d.description));
  out += paragraph(
      "custos daemon owns every process it launches, from authorization to one terminal "
      "record, and serves the clients (custos(1)) newline-framed JSON-RPC 2.0 on a Unix socket.");
  out += paragraph(
      "Every option is also a key of the configuration file given with --config, under its "
      "[daemon] table, named like the option without the dashes (custos.toml(5)); the command "
      "line overrides the file.");
  out += paragraph(
      "Without configuration: root without --state-dir (the packaged service) uses "
      "/var/lib/custos and /run/custos/custos.sock; anyone else without --state-dir uses "
      "$XDG_STATE_HOME/custos (else ~/.local/state/custos) and ./.custos/custos.sock; with "
      "--state-dir D the socket is D/custos.sock. The cgroup subtree defaults to "
      "<cgroup v2 mount>/<own cgroup>/custos; when the daemon cannot write there it logs why "
      "and uses the marker boundary.");
  out += paragraph(
      "Start-up: load config, lock state dir, open registry, recover, create subtree, probe "
      "host, start execution manager, adopt recovered executions, register methods, listen, "
      "READY=1. A failing step is logged with its stable error code and the daemon exits 1.");
  out += section("OPTIONS") + options_list(options);
  out += section("SIGNALS");
  out += item(bold("SIGTERM") + ", " + bold("SIGINT"),
              "Stop accepting connections, remove the socket, apply the shutdown policy "
              "(--shutdown), exit 0.");
  out += item(bold("SIGHUP"), "Reopen the log file (logrotate; systemctl reload custos).");
  out += item(bold("SIGCHLD"), "Reap orphans reparented to the daemon (it is a child subreaper).");
  out += section("EXIT STATUS");
  out += item(bold("0"), "Stopped by SIGTERM or SIGINT after applying the shutdown policy.");
  out += item(bold(std::to_string(kExitDaemonFailed)),
              "Could not start: an invalid value (daemon.config_invalid), a locked state "
              "directory (registry.locked), or another failed start-up step; the log says which.");
  out += item(bold(std::to_string(kExitUsage)),
              "Usage error: an unknown option, or a value outside an option's choices.");
  out += section("FILES");
  out += item(italic("/etc/custos/custos.toml"), "The packaged configuration (custos.toml(5)).");
  out += item(italic("/var/lib/custos"),
              "The state directory: registry.db (SQLite WAL), spool files, custos.lock.");
  out +=
      item(italic("/run/custos/custos.sock"), "The socket; <socket>.lock is held while serving.");
  out += item(italic("/var/log/custos"), "For --log-file; the journal is the default target.");
  out += item(italic("/usr/lib/sysusers.d/custos.conf"),
              "The group custos: members may use the socket, and call every method when it is "
              "the admin group.");
  out += item(italic("/usr/lib/tmpfiles.d/custos.conf"),
              "/run/custos, /var/lib/custos (0700) and /var/log/custos.");
  out += section("SYSTEMD UNITS");
  out += item(bold("custos.service"),
              "Type=notify: READY=1 only after the registry was opened and recovered, the cgroup "
              "subtree exists and the socket is served; STOPPING=1 at shutdown. Delegate=yes "
              "gives the daemon the service's cgroup for per-execution cgroups. KillMode=mixed: "
              "SIGTERM goes to the daemon alone, which applies its shutdown policy. "
              "ExecReload sends SIGHUP.");
  out += item(bold("custos.socket"),
              "Socket activation on /run/custos/custos.sock, mode 0660, group custos: clients may "
              "connect before the daemon serves. --no-socket-activation ignores it.");
  out += section("SEE ALSO");
  out +=
      ".BR custos (1),\n.BR custos.toml (5),\n.BR systemd.service (5),\n"
      ".BR systemd.socket (5);\n" +
      roff("/usr/share/doc/custos/operations.md, configuration.md") + "\n";
  return out;
}

std::string manpage_toml(CommandDoc const& root) {
  auto const& d = daemon_of(root);
  std::string out = header("CUSTOS.TOML", 5, "File Formats");
  out += section("NAME") + "custos.toml \\- configuration file of the custos daemon\n";
  out += section("SYNOPSIS") + italic("/etc/custos/custos.toml") + "\n";
  out += section("DESCRIPTION");
  out += paragraph(
      "The configuration of custos daemon (custos-daemon(8)), read from the file given with "
      "--config; the packaged custos.service passes /etc/custos/custos.toml, a conffile that "
      "package upgrades keep. The file is TOML. Every key lives under a [daemon] table and is "
      "named like the daemon's command-line option without the dashes; an option given on the "
      "command line overrides the key.");
  out += ".PP\n.RS 4\n.nf\n";
  out += roff(
      "[daemon]\nstate-dir = \"/var/lib/custos\"\nsocket = \"/run/custos/custos.sock\"\n"
      "admin-group = \"custos\"\nshutdown = \"cancel\"\n");
  out += ".fi\n.RE\n";
  out += section("KEYS");
  for (auto const& o : d.options) {
    if (o.longs.empty() || o.name() == "--help" || !o.configurable) continue;
    std::string type = "string";
    if (o.flag()) {
      type = "boolean";
    } else if (o.value == "INT" || o.value == "UINT") {
      type = "integer";
    } else if (o.value == "FLOAT") {
      type = "float";
    }
    std::string const def =
        o.flag() ? "false" : (o.default_value.empty() ? "unset" : o.default_value);
    OptionDoc shown = o;
    shown.default_value.clear();
    std::string const tag = bold(o.name().substr(2)) + " = " + italic(type);
    out += item(tag, sentence(o.help) + option_notes(shown) + " Default: " + def +
                         ". Option: " + o.name() + ".");
  }
  out += paragraph(
      "An invalid value stops the start: a value outside a key's choices is a usage error "
      "(exit 64), any other is daemon.config_invalid (exit 1).");
  out += section("FILES");
  out += item(italic("/etc/custos/custos.toml"), "The configuration of the packaged service.");
  out += section("SEE ALSO");
  out += ".BR custos\\-daemon (8),\n.BR custos (1);\n" +
         roff("/usr/share/doc/custos/configuration.md") + "\n";
  return out;
}

}  // namespace custos::cli
