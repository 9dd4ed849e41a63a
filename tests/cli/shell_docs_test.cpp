// The completions and man pages against the app they are generated from: this walks the
// CLI::App with CLI11's own accessors (not the generator's CommandDoc) and looks for every
// subcommand and option, per command, in what `custos completion` and `custos manpage` print,
// and in the files the build generated from it (cmake/CustosShellDocs.cmake).
#include <CLI/CLI.hpp>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <fstream>
#include <memory>
#include <regex>
#include <sstream>
#include <string>
#include <sys/wait.h>
#include <vector>

#include "custos/cli/app.hpp"

namespace {

struct Cmd {
  std::string path;  // "" for custos, "grant add"
  CLI::App const* app;
};

void walk(CLI::App const* a, std::string const& path, std::vector<Cmd>& out) {
  out.push_back({path, a});
  for (auto const* s :
       a->get_subcommands([](CLI::App const* x) { return !x->get_group().empty(); })) {
    walk(s, path.empty() ? s->get_name() : path + " " + s->get_name(), out);
  }
}

std::vector<Cmd> commands(CLI::App const& app) {
  std::vector<Cmd> out;
  walk(&app, "", out);
  return out;
}

// Every name of every option --help shows ("--follow", "-f"), positionals left out.
std::vector<std::string> option_names(CLI::App const* a) {
  std::vector<std::string> out;
  for (auto const* o : a->get_options()) {
    if (o->get_group().empty() || !o->nonpositional()) continue;
    for (auto const& n : o->get_lnames()) out.push_back("--" + n);
    for (auto const& n : o->get_snames()) out.push_back("-" + n);
  }
  return out;
}

std::vector<std::string> sub_names(CLI::App const* a) {
  std::vector<std::string> out;
  for (auto const* s :
       a->get_subcommands([](CLI::App const* x) { return !x->get_group().empty(); })) {
    out.push_back(s->get_name());
  }
  return out;
}

struct Output {
  int status = -1;
  std::string text;
};

Output run(std::string const& args) {
  Output r;
  std::string const cmd = "ASAN_OPTIONS=detect_leaks=0 '" CUSTOS_BINARY "' " + args;
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen(cmd.c_str(), "r"), ::pclose);
  if (!p) return r;
  std::array<char, 4096> buf{};
  std::size_t n = 0;
  while ((n = std::fread(buf.data(), 1, buf.size(), p.get())) > 0) r.text.append(buf.data(), n);
  int const st = ::pclose(p.release());
  r.status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
  return r;
}

std::string generated(std::string const& args) {
  auto r = run(args);
  EXPECT_EQ(r.status, 0) << args;
  EXPECT_FALSE(r.text.empty()) << args;
  return r.text;
}

std::string read_file(std::string const& path) {
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// `name` as a whole word: not the prefix of a longer option (--sandbox vs --sandbox-profile).
bool has_word(std::string const& text, std::string const& name) {
  std::string escaped;
  for (char c : name) {
    if (std::string{"\\^$.|?*+()[]{}"}.find(c) != std::string::npos) escaped += '\\';
    escaped += c;
  }
  return std::regex_search(text, std::regex{"(^|[^-A-Za-z0-9_])" + escaped + "($|[^-A-Za-z0-9_])"});
}

// The text from `start` to the first `end` after it; "" when `start` is absent.
std::string between(std::string const& text, std::string const& start, std::string const& end) {
  auto const a = text.find(start);
  if (a == std::string::npos) return {};
  auto const b = text.find(end, a + start.size());
  return text.substr(a, b == std::string::npos ? std::string::npos : b - a);
}

std::string roff_bold(std::string const& name) {
  std::string out = "\\fB";
  for (char c : name) out += c == '-' ? std::string{"\\-"} : std::string(1, c);
  return out + "\\fR";
}

class ShellDocs : public ::testing::Test {
 protected:
  custos::cli::CommandLine cli_;
  std::vector<Cmd> cmds_ = commands(cli_.app());
};

TEST_F(ShellDocs, WalkSeesNestedCommandsAndNoGenerators) {
  std::vector<std::string> paths;
  for (auto const& c : cmds_) paths.push_back(c.path);
  for (char const* p :
       {"daemon", "run", "grant add", "grant revoke", "lease acquire", "secret set"})
    EXPECT_NE(std::find(paths.begin(), paths.end(), p), paths.end()) << p;
  for (char const* p : {"completion", "manpage"})
    EXPECT_EQ(std::find(paths.begin(), paths.end(), p), paths.end()) << p;
}

TEST_F(ShellDocs, BashKnowsEveryCommandAndOption) {
  auto const script = generated("completion bash");
  for (auto const& c : cmds_) {
    auto const line = between(script, "\n  '" + c.path + "') _custos_subs=", "\n");
    ASSERT_FALSE(line.empty()) << "no entry for '" << c.path << "'";
    auto const opts = between(line, "_custos_opts='", "' ");
    for (auto const& n : option_names(c.app)) EXPECT_TRUE(has_word(opts, n)) << c.path << " " << n;
    // An option that takes a value consumes the next word; a flag does not.
    auto const vopts = between(line, "_custos_vopts='", "' ");
    for (auto const* o : c.app->get_options()) {
      if (o->get_group().empty() || !o->nonpositional()) continue;
      for (auto const& n : o->get_lnames()) {
        EXPECT_EQ(has_word(vopts, "--" + n), o->get_items_expected_max() > 0)
            << c.path << " --" << n;
      }
    }
    auto const subs = between(line, "_custos_subs='", "' ");
    for (auto const& s : sub_names(c.app)) EXPECT_TRUE(has_word(subs, s)) << c.path << " " << s;
  }
}

TEST_F(ShellDocs, BashCompletesEveryChoiceCliKnows) {
  auto const script = generated("completion bash");
  int seen = 0;
  for (auto const& c : cmds_) {
    for (auto const* o : c.app->get_options()) {
      auto const type = o->get_type_name();
      auto const brace = type.find(":{");
      if (o->get_group().empty() || !o->nonpositional() || brace == std::string::npos) continue;
      std::string choices = type.substr(brace + 2, type.size() - brace - 3);
      std::replace(choices.begin(), choices.end(), ',', ' ');
      std::string const key = (c.path.empty() ? "" : c.path + " ") + "--" + o->get_lnames().front();
      EXPECT_NE(script.find("'" + key + "') _custos_words='" + choices + "'"), std::string::npos)
          << key << ": " << choices;
      ++seen;
    }
  }
  EXPECT_GE(seen, 6);  // --sandbox-profile and the daemon's enumerations at least
}

TEST_F(ShellDocs, ZshHasAFunctionPerCommandWithItsOptions) {
  auto const script = generated("completion zsh");
  for (auto const& c : cmds_) {
    std::string fn = "_custos";
    std::istringstream words(c.path);
    for (std::string w; words >> w;) fn += "_" + w;
    auto const body = between(script, "\n" + fn + "() {\n", "\n}\n");
    ASSERT_FALSE(body.empty()) << fn;
    for (auto const& n : option_names(c.app)) EXPECT_TRUE(has_word(body, n)) << fn << " " << n;
    for (auto const& s : sub_names(c.app))
      EXPECT_NE(body.find("'" + s + ":"), std::string::npos) << fn << " " << s;
  }
}

TEST_F(ShellDocs, FishCompletesEveryCommandAndOption) {
  auto const script = generated("completion fish");
  for (auto const& c : cmds_) {
    std::string const at = "__custos_at \"" + c.path + "\"'";
    std::string lines;
    std::istringstream in(script);
    for (std::string l; std::getline(in, l);) {
      if (l.find(at) != std::string::npos) lines += l + "\n";
    }
    for (auto const& n : option_names(c.app)) {
      std::string const want =
          n.rfind("--", 0) == 0 ? "-l '" + n.substr(2) + "'" : "-s '" + n.substr(1) + "'";
      EXPECT_NE(lines.find(want), std::string::npos) << c.path << " " << n;
    }
    for (auto const& s : sub_names(c.app))
      EXPECT_NE(lines.find("-a '" + s + "'"), std::string::npos) << c.path << " " << s;
  }
}

TEST_F(ShellDocs, ManPagesDocumentEveryCommandOptionAndKey) {
  auto const custos1 = generated("manpage custos");
  auto const daemon8 = generated("manpage custos-daemon");
  auto const toml5 = generated("manpage custos.toml");
  for (auto const& c : cmds_) {
    if (c.path == "daemon") {
      auto const options = between(daemon8, "\n.SH OPTIONS\n", "\n.SH ");
      auto const keys = between(toml5, "\n.SH KEYS\n", "\n.SH ");
      for (auto const& n : option_names(c.app)) {
        EXPECT_NE(options.find(roff_bold(n)), std::string::npos) << "custos-daemon(8) " << n;
        if (n == "--help" || n == "-h") continue;
        // --check-config and --reexec are not keys of the file (configurable(false)).
        bool const key = c.app->get_option(n)->get_configurable();
        EXPECT_EQ(keys.find(".TP\n" + roff_bold(n.substr(2)) + " = ") != std::string::npos, key)
            << "custos.toml(5) " << n;
      }
      EXPECT_NE(options.find(roff_bold("--config")), std::string::npos);
      continue;
    }
    auto const sec = c.path.empty() ? between(custos1, "\n.SH OPTIONS\n", "\n.SH ")
                                    : between(custos1, "\n.SS \"" + c.path + "\"\n", "\n.S");
    ASSERT_FALSE(sec.empty()) << "custos(1) has no section for '" << c.path << "'";
    for (auto const& n : option_names(c.app))
      EXPECT_NE(sec.find(roff_bold(n)), std::string::npos) << "custos(1) " << c.path << " " << n;
  }
}

// docs/cli.md is the prose source of custos(1): every exit code of its table is in the page.
TEST_F(ShellDocs, ManPageHasTheExitCodesOfCliMd) {
  auto const page = generated("manpage custos");
  auto const status = between(page, "\n.SH EXIT STATUS\n", "\n.SH ");
  auto const table = between(read_file(CUSTOS_SOURCE_DIR "/docs/cli.md"), "## Exit codes", "\n## ");
  std::regex const row{R"(\n\| ([0-9.+N]+) \|)"};
  int rows = 0;
  for (std::sregex_iterator it(table.begin(), table.end(), row), end; it != end; ++it, ++rows)
    EXPECT_NE(status.find(".TP\n" + roff_bold((*it)[1].str()) + "\n"), std::string::npos)
        << (*it)[1].str();
  EXPECT_GE(rows, 10);
}

// docs/configuration.md lists every key the daemon takes.
TEST_F(ShellDocs, ConfigurationMdListsEveryDaemonKey) {
  auto const doc = read_file(CUSTOS_SOURCE_DIR "/docs/configuration.md");
  auto const* daemon = cli_.app().get_subcommand("daemon");
  for (auto const* o : daemon->get_options()) {
    // Flags that make `custos daemon` do something else than run (--check-config, --reexec)
    // are not keys of the file.
    if (o->get_group().empty() || !o->nonpositional() || !o->get_configurable()) continue;
    for (auto const& l : o->get_lnames()) {
      if (l == "help") continue;
      EXPECT_NE(doc.find("\n| `" + l + "` |"), std::string::npos) << l;
    }
  }
}

TEST_F(ShellDocs, HelpIsUnchangedByTheHiddenGenerators) {
  auto const help = run("--help");
  EXPECT_EQ(help.status, 0);
  EXPECT_TRUE(has_word(help.text, "grant"));
  EXPECT_FALSE(has_word(help.text, "completion"));
  EXPECT_FALSE(has_word(help.text, "manpage"));
  EXPECT_EQ(run("completion tcsh 2>/dev/null").status, 64);
  EXPECT_EQ(run("manpage nope 2>/dev/null").status, 64);
}

TEST_F(ShellDocs, TheBuildsFilesAreWhatTheBinaryPrints) {
  std::string const dir = CUSTOS_SHELL_DOCS_DIR "/share/";
  EXPECT_EQ(read_file(dir + "bash-completion/completions/custos"), generated("completion bash"));
  EXPECT_EQ(read_file(dir + "zsh/vendor-completions/_custos"), generated("completion zsh"));
  EXPECT_EQ(read_file(dir + "fish/vendor_completions.d/custos.fish"), generated("completion fish"));
  EXPECT_EQ(read_file(dir + "man/man1/custos.1"), generated("manpage custos"));
  EXPECT_EQ(read_file(dir + "man/man8/custos-daemon.8"), generated("manpage custos-daemon"));
  EXPECT_EQ(read_file(dir + "man/man5/custos.toml.5"), generated("manpage custos.toml"));
}

}  // namespace
