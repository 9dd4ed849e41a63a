// The secret store through the real daemon over its real socket (docs/api.md, "Secrets"):
// secret.set / list / delete for admins, auth.denied for everyone else, exec.check and exec.start
// knowing the refs the store holds, $CREDENTIALS_DIRECTORY as a read-only source, a store with
// the wrong mode refused at start, and `custos secret`. Every answer, the daemon's log and the
// registry's files are searched for the value (and its base64): it must be nowhere.
#include <random>

#include "custos/core/base64.hpp"

#include "harness.hpp"

namespace custos::e2e {
namespace {

std::string slurp(fs::path const& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// A value no daemon could produce by accident, fresh per test.
std::string distinctive_value() {
  std::random_device rd;
  std::string v = "s3cr3t-";
  for (int i = 0; i < 4; ++i) v += std::to_string(rd());
  return v;
}

unsigned mode_of(fs::path const& p) {
  struct stat st {};
  EXPECT_EQ(::lstat(p.c_str(), &st), 0) << p;
  return st.st_mode & 07777;
}

class DaemonSecrets : public ::testing::Test {
 protected:
  void SetUp() override { start(); }

  void start(std::vector<std::string> env = {}) {
    env.emplace_back("ASAN_OPTIONS=quarantine_size_mb=8");
    daemon_ = std::make_unique<Daemon>(
        DaemonOptions{{"--socket-mode", "0666"}, true, std::move(env), {}, {}});
    ASSERT_TRUE(daemon_->ready()) << daemon_->log();
    // A non-admin must reach the socket (the state dir is 0700 by default).
    ::chmod(daemon_->tmp().c_str(), 0755);
    ::chmod(daemon_->state().c_str(), 0711);
  }

  // One call; its whole answer is kept for the final search.
  json::object call(LineClient& c, std::string_view method, json::object params = {}) {
    auto r = c.call(next_id_++, method, std::move(params));
    EXPECT_TRUE(r.has_value()) << method;
    if (!r) return {};
    transcript_ += json::serialize(*r) + "\n";
    return *r;
  }
  json::object result(LineClient& c, std::string_view method, json::object params = {}) {
    auto r = call(c, method, std::move(params));
    EXPECT_TRUE(r.contains("result")) << method << ": " << json::serialize(r);
    return r.contains("result") ? r.at("result").as_object() : json::object{};
  }
  std::string error(LineClient& c, std::string_view method, json::object params = {}) {
    auto r = call(c, method, std::move(params));
    EXPECT_TRUE(r.contains("error")) << method << ": " << json::serialize(r);
    return r.contains("error") ? error_code_of(r) : std::string{};
  }

  // Nothing the daemon said or wrote shows the value, in clear or in base64.
  void expect_value_nowhere(std::string const& value) {
    std::string const b64 = core::base64_encode(value);
    std::vector<std::pair<std::string, std::string>> places = {
        {"the answers", transcript_}, {"the daemon's log", daemon_->log()}};
    for (auto const& e : fs::directory_iterator(daemon_->state())) {
      auto const name = e.path().filename().native();
      if (name.starts_with("registry.db")) places.emplace_back(name, slurp(e.path()));
    }
    EXPECT_GE(places.size(), 3U) << "the registry's files were searched";
    for (auto const& [where, text] : places) {
      EXPECT_EQ(text.find(value), std::string::npos) << "the value is in " << where;
      EXPECT_EQ(text.find(b64), std::string::npos) << "the value's base64 is in " << where;
    }
  }

  json::object set_params(std::string const& name, std::string const& value) {
    return {{"name", name}, {"value_b64", core::base64_encode(value)}};
  }

  // exec.check / exec.start params on the reference backend, with one secret delivered to env.
  static json::object with_secret(std::string const& ref) {
    auto p = start_params({"/bin/true"});
    auto& plan = p.at("plan").as_object();
    plan["env"] = json::array{};
    plan["sandbox"] = json::object{
        {"process", json::object{{"run_as_root", true}}},
        {"secrets",
         json::array{json::object{{"ref", ref}, {"to", json::object{{"env", "DB_PASSWORD"}}}}}}};
    plan["backend"] =
        json::object{{"kind", "reference"}, {"script", json::object{{"steps", json::array{}}}}};
    return p;
  }

  std::unique_ptr<Daemon> daemon_;
  std::string transcript_;
  std::int64_t next_id_ = 1;
};

TEST_F(DaemonSecrets, SetListDeleteAnswerNamesNeverValues) {
  auto c = daemon_->client();
  std::string const value = distinctive_value();
  fs::path const dir = daemon_->state() / "secrets";
  EXPECT_EQ(mode_of(dir), 0700U);

  auto set = result(c, "secret.set", set_params("db-password", value));
  EXPECT_EQ(set.at("name").as_string(), "db-password");
  EXPECT_EQ(mode_of(dir / "db-password"), 0600U);
  EXPECT_EQ(slurp(dir / "db-password"), value) << "exactly the bytes sent";

  auto listed = result(c, "secret.list");
  auto const& secrets = listed.at("secrets").as_array();
  ASSERT_EQ(secrets.size(), 1U);
  auto const& entry = secrets[0].as_object();
  EXPECT_EQ(entry.at("name").as_string(), "db-password");
  EXPECT_GT(entry.at("created_ns").as_int64(), 0);
  EXPECT_EQ(entry.at("source").as_string(), "store");
  EXPECT_EQ(entry.size(), 3U) << "name, created_ns, source: nothing about the value";

  // Replaced in place of the old one; still one name.
  std::string const rotated = distinctive_value();
  result(c, "secret.set", set_params("db-password", rotated));
  EXPECT_EQ(slurp(dir / "db-password"), rotated);
  EXPECT_EQ(result(c, "secret.list").at("secrets").as_array().size(), 1U);

  result(c, "secret.delete", {{"name", "db-password"}});
  EXPECT_FALSE(fs::exists(dir / "db-password"));
  EXPECT_TRUE(result(c, "secret.list").at("secrets").as_array().empty());
  EXPECT_EQ(error(c, "secret.delete", {{"name", "db-password"}}), "sandbox.secret_unknown");

  // Refusals: each names the secret at most, never the value.
  EXPECT_EQ(error(c, "secret.set", set_params("../etc/passwd", value)), "secret.invalid_name");
  EXPECT_EQ(error(c, "secret.set", set_params(".hidden", value)), "secret.invalid_name");
  EXPECT_EQ(error(c, "secret.set", set_params("big", std::string(64 * 1024 + 1, 'x'))),
            "secret.too_large");
  EXPECT_EQ(error(c, "secret.set", {{"name", "b64"}, {"value_b64", value + "!"}}),
            "rpc.invalid_params");
  EXPECT_EQ(error(c, "secret.set", {{"name", "missing-value"}}), "rpc.invalid_params");
  EXPECT_EQ(error(c, "secret.set", {{"name", "x"}, {"value_b64", "eA=="}, {"value", value}}),
            "rpc.invalid_params");
  EXPECT_EQ(error(c, "secret.delete", {{"name", "a/b"}}), "secret.invalid_name");
  EXPECT_TRUE(result(c, "secret.list").at("secrets").as_array().empty());
  // The largest value is accepted.
  result(c, "secret.set", set_params("big", std::string(64 * 1024, 'x')));

  expect_value_nowhere(value);
  expect_value_nowhere(rotated);
}

TEST_F(DaemonSecrets, NonAdminsAreRefusedEveryMethod) {
  {
    auto admin = daemon_->client();
    result(admin, "secret.set", set_params("held", distinctive_value()));
  }
  fs::path const sock = daemon_->socket();
  auto [rc, why] = as_user_output(4311, 4311, {}, [&](std::string& out) {
    LineClient c{sock};
    if (!c.connected()) return 10;
    std::int64_t id = 1;
    std::vector<std::pair<std::string, json::object>> const calls = {
        {"secret.set", {{"name", "planted"}, {"value_b64", "eA=="}}},
        {"secret.list", {}},
        {"secret.delete", {{"name", "held"}}},
        // Not even a parameter check answers a non-admin.
        {"secret.set", {{"name", "../bad"}}},
    };
    for (auto const& [method, params] : calls) {
      auto r = c.call(id++, method, params);
      if (!r || error_code_of(*r) != "auth.denied") {
        out = method + ": " + (r ? json::serialize(*r) : "no answer");
        return 20;
      }
    }
    return 0;
  });
  EXPECT_EQ(rc, 0) << why;
  auto admin = daemon_->client();
  auto const listed = result(admin, "secret.list").at("secrets").as_array();
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_EQ(listed[0].at("name").as_string(), "held");
}

TEST_F(DaemonSecrets, ExecCheckAndStartKnowTheRefsTheStoreHolds) {
  auto c = daemon_->client();
  std::string const value = distinctive_value();
  for (char const* method : {"exec.check", "exec.start"}) {
    EXPECT_EQ(error(c, method, with_secret("db-password")), "sandbox.secret_unknown") << method;
  }
  result(c, "secret.set", set_params("db-password", value));

  auto chk = result(c, "exec.check", with_secret("db-password"));
  EXPECT_TRUE(chk.contains("sandbox_digest"));
  EXPECT_EQ(error(c, "exec.check", with_secret("other-ref")), "sandbox.secret_unknown");
  EXPECT_EQ(error(c, "exec.start", with_secret("other-ref")), "sandbox.secret_unknown");

  // The reference backend admits every control: the execution runs to its terminal record,
  // whose sandbox digest covers the ref, never the value.
  auto started = result(c, "exec.start", with_secret("db-password"));
  ASSERT_TRUE(started.contains("execution_id"));
  std::string const id{started.at("execution_id").as_string()};
  auto waited = result(c, "exec.wait", {{"execution_id", id}, {"timeout_ms", 10000}});
  EXPECT_EQ(waited.at("classification").as_string(), "exited") << json::serialize(waited);
  auto record = result(c, "exec.get", {{"execution_id", id}});
  EXPECT_EQ(record.at("sandbox_digest"), chk.at("sandbox_digest")) << json::serialize(record);
  result(c, "exec.output",
         {{"execution_id", id}, {"stream", "stdout"}, {"offset", 0}, {"max_bytes", 65536}});

  // Deleted, the ref is unknown again.
  result(c, "secret.delete", {{"name", "db-password"}});
  EXPECT_EQ(error(c, "exec.check", with_secret("db-password")), "sandbox.secret_unknown");
  expect_value_nowhere(value);
}

TEST_F(DaemonSecrets, CredentialsDirectoryIsAReadOnlySource) {
  TempDir creds;
  std::string const value = distinctive_value();
  { std::ofstream(creds.path() / "cred-token", std::ios::binary) << value; }
  ::chmod((creds.path() / "cred-token").c_str(), 0400);
  start({"CREDENTIALS_DIRECTORY=" + creds.path().native()});
  auto c = daemon_->client();

  auto listed = result(c, "secret.list").at("secrets").as_array();
  ASSERT_EQ(listed.size(), 1U);
  EXPECT_EQ(listed[0].at("name").as_string(), "cred-token");
  EXPECT_EQ(listed[0].at("source").as_string(), "credentials");
  result(c, "exec.check", with_secret("cred-token"));
  EXPECT_EQ(error(c, "secret.delete", {{"name", "cred-token"}}), "secret.read_only");
  EXPECT_TRUE(fs::exists(creds.path() / "cred-token"));
  expect_value_nowhere(value);
}

TEST_F(DaemonSecrets, AStoreWithAWiderModeStopsTheStart) {
  ASSERT_TRUE(daemon_->signal(SIGTERM));
  ASSERT_TRUE(daemon_->wait_exit(20s).has_value());
  fs::path const dir = daemon_->state() / "secrets";
  ASSERT_EQ(::chmod(dir.c_str(), 0755), 0);
  daemon_->start();
  EXPECT_FALSE(daemon_->ready());
  auto const status = daemon_->wait_exit(20s);
  ASSERT_TRUE(status.has_value());
  EXPECT_TRUE(WIFEXITED(*status) && WEXITSTATUS(*status) != 0);
  EXPECT_NE(daemon_->log().find("secret.store_unsafe"), std::string::npos) << daemon_->log();
  EXPECT_EQ(mode_of(dir), 0755U) << "refused, not repaired";
}

TEST_F(DaemonSecrets, CliSetListDelete) {
  auto cli = [&](std::vector<std::string> args, std::string const& input = {}) {
    args.insert(args.begin(), {"--socket", daemon_->socket().native()});
    auto r = run_cli(args, input);
    transcript_ += r.out + r.err;
    return r;
  };
  std::string const value = distinctive_value() + "\n";  // piped: the newline is part of it
  auto set = cli({"secret", "set", "api-token"}, value);
  ASSERT_EQ(set.status, 0) << set.err;
  EXPECT_EQ(slurp(daemon_->state() / "secrets" / "api-token"), value);
  auto list = cli({"secret", "list"});
  EXPECT_EQ(list.status, 0) << list.err;
  EXPECT_NE(list.out.find("api-token"), std::string::npos) << list.out;
  auto json_list = cli({"--json", "secret", "list"});
  ASSERT_EQ(json_list.status, 0) << json_list.err;
  auto const v = json::parse(json_list.out);
  EXPECT_EQ(v.at("secrets").as_array().at(0).at("name").as_string(), "api-token");
  auto big = cli({"secret", "set", "big"}, std::string(64 * 1024 + 1, 'b'));
  EXPECT_EQ(big.status, 65) << big.err;
  EXPECT_NE(big.err.find("secret.too_large"), std::string::npos) << big.err;
  auto del = cli({"secret", "delete", "api-token"});
  EXPECT_EQ(del.status, 0) << del.err;
  auto again = cli({"secret", "delete", "api-token"});
  EXPECT_EQ(again.status, 65);
  EXPECT_NE(again.err.find("sandbox.secret_unknown"), std::string::npos) << again.err;
  auto usage = cli({"secret", "set"});
  EXPECT_EQ(usage.status, 64);
  expect_value_nowhere(value.substr(0, value.size() - 1));
}

}  // namespace
}  // namespace custos::e2e
