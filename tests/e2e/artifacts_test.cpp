// Durable output and artifact publication against a real daemon: a terminal execution's spools
// become content-addressed artifacts (digest = the bytes), zero output publishes no artifact,
// truncated output is published as incomplete evidence, exec.output serves the output after a
// restart, a full disk leaves the terminal result standing with publication_retry guidance, a
// crash between streams is resumed for the missing stream only, and retention (host.gc, the
// CLI's gc) removes only what it should.
#include <sys/stat.h>
#include <utime.h>

#include "custos/core/base64.hpp"
#include "custos/core/digest.hpp"

#include "harness.hpp"

namespace custos::e2e {
namespace {

std::string sha256_hex(std::string const& bytes) {
  auto d = core::sha256(std::span<std::uint8_t const>(
      reinterpret_cast<std::uint8_t const*>(bytes.data()), bytes.size()));
  return d ? d->to_string() : std::string{};
}

std::string read_all(fs::path const& p) {
  std::ifstream f(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(f), {});
}

fs::path artifact_path(Daemon const& d, std::string_view digest) {
  return d.state() / "artifacts" / "sha256" / std::string{digest.substr(7)};
}

std::size_t artifact_count(Daemon const& d) {
  std::error_code ec;
  std::size_t n = 0;
  for (auto const& e : fs::directory_iterator(d.state() / "artifacts" / "sha256", ec)) {
    (void)e;
    ++n;
  }
  return n;
}

std::string start(LineClient& c, json::object params) {
  static std::int64_t rid = 1000;
  auto r = c.call(rid++, "exec.start", params);
  if (!r || !r->contains("result")) {
    ADD_FAILURE() << (r ? json::serialize(*r) : "no reply");
    return {};
  }
  return std::string{r->at("result").at("execution_id").as_string()};
}

std::optional<json::object> wait_terminal(LineClient& c, std::string const& id) {
  static std::int64_t rid = 2000;
  auto w = c.call(rid++, "exec.wait", {{"execution_id", id}, {"timeout_ms", 30000}}, 35000ms);
  if (!w || !w->contains("result")) return std::nullopt;
  return w->at("result").as_object();
}

json::object sh(std::string const& script) {
  return start_params({"/bin/sh", "-c", script});
}

// The publication view once no stream of it is pending.
std::optional<json::object> publication_settled(LineClient& c, std::string const& id) {
  auto rec = wait_record(c, id, [](json::object const& r) {
    auto const* p = r.if_contains("publication");
    if (p == nullptr || !p->is_object()) return false;
    for (auto const& [name, s] : p->as_object()) {
      if (s.at("state").as_string() == "pending") return false;
    }
    return true;
  });
  if (!rec) return std::nullopt;
  return rec->at("publication").as_object();
}

TEST(Artifacts, CompletedStreamsArePublishedAndServedAfterARestart) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  std::string id;
  std::string const expected = "published bytes\n";
  {
    auto c = d.client();
    id = start(c, sh("printf 'published bytes\\n'"));
    ASSERT_FALSE(id.empty());
    ASSERT_TRUE(wait_terminal(c, id));
    auto pub = publication_settled(c, id);
    ASSERT_TRUE(pub) << "publication never settled";
    auto const& out = pub->at("stdout").as_object();
    EXPECT_EQ(out.at("state").as_string(), "published") << json::serialize(*pub);
    EXPECT_EQ(out.at("bytes").as_int64(), static_cast<std::int64_t>(expected.size()));
    EXPECT_TRUE(out.at("complete").as_bool());
    std::string const digest{out.at("artifact").as_string()};
    EXPECT_EQ(digest, sha256_hex(expected));
    // The artifact's name is the digest of what it holds; the spool it came from is gone.
    EXPECT_EQ(read_all(artifact_path(d, digest)), expected);
    EXPECT_EQ(sha256_hex(read_all(artifact_path(d, digest))), digest);
    EXPECT_FALSE(fs::exists(d.state() / "spool" / id / "stdout"));
    // No retained output: publication is done without an artifact.
    auto const& err = pub->at("stderr").as_object();
    EXPECT_EQ(err.at("state").as_string(), "empty");
    EXPECT_TRUE(err.at("artifact").is_null());
    EXPECT_EQ(artifact_count(d), 1U);
    bool complete = false;
    EXPECT_EQ(output_of(c, id, "stdout", &complete), expected);
    EXPECT_TRUE(complete);
  }
  ASSERT_TRUE(d.signal(SIGTERM));
  ASSERT_TRUE(d.wait_exit(30s));
  d.start();
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  bool complete = false;
  EXPECT_EQ(output_of(c, id, "stdout", &complete), expected) << "served from the artifact";
  EXPECT_TRUE(complete);
  EXPECT_EQ(output_of(c, id, "stderr"), "");
  auto g = c.call(9, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(g && g->contains("result"));
  EXPECT_EQ(g->at("result").at("source").as_string(), "registry");
  EXPECT_EQ(g->at("result").at("publication").at("stdout").at("state").as_string(), "published");
}

TEST(Artifacts, ZeroOutputInventsNoArtifactAndTruncatedOutputStaysIncomplete) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  auto const quiet = start(c, start_params({"/bin/true"}));
  ASSERT_TRUE(wait_terminal(c, quiet));
  auto pub = publication_settled(c, quiet);
  ASSERT_TRUE(pub);
  for (char const* s : {"stdout", "stderr"}) {
    EXPECT_EQ(pub->at(s).at("state").as_string(), "empty") << json::serialize(*pub);
    EXPECT_TRUE(pub->at(s).at("artifact").is_null());
  }
  EXPECT_EQ(artifact_count(d), 0U);

  // 5000 bytes, of which the spool keeps 1000: a zero exit, and incomplete evidence.
  auto params = sh("head -c 5000 /dev/zero | tr '\\0' q");
  params["plan"].as_object()["output"] = json::object{{"spool_bytes", 1000}};
  auto const cut = start(c, params);
  ASSERT_FALSE(cut.empty());
  auto t = wait_terminal(c, cut);
  ASSERT_TRUE(t);
  EXPECT_EQ(t->at("exit").at("code").as_int64(), 0);
  auto cut_pub = publication_settled(c, cut);
  ASSERT_TRUE(cut_pub);
  auto const& out = cut_pub->at("stdout").as_object();
  EXPECT_EQ(out.at("state").as_string(), "published") << json::serialize(*cut_pub);
  EXPECT_EQ(out.at("bytes").as_int64(), 1000);
  EXPECT_FALSE(out.at("complete").as_bool()) << "truncated output is never complete evidence";
  EXPECT_EQ(std::string{out.at("artifact").as_string()}, sha256_hex(std::string(1000, 'q')));
  bool complete = true;
  EXPECT_EQ(output_of(c, cut, "stdout", &complete), std::string(1000, 'q'));
  EXPECT_FALSE(complete);
}

TEST(Artifacts, AFullDiskLeavesTheResultStandingAndARetryPublishes) {
  Daemon d{DaemonOptions{}, "40m"};
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  fs::path const filler = d.state().parent_path() / "filler";
  // 6 MiB of output, then (once the daemon spooled it) the file system filled to 512 KiB.
  std::string const script =
      "yes custos | head -c 6291456; sleep 1; "
      "free=$(( $(stat -f -c '%a*%S' " +
      d.state().native() +
      ") )); "
      "head -c $(( free - 524288 )) /dev/zero > " +
      filler.native() + "; exit 0";
  auto const id = start(c, sh(script));
  ASSERT_FALSE(id.empty());
  auto t = wait_terminal(c, id);
  ASSERT_TRUE(t) << d.log();
  EXPECT_EQ(t->at("classification").as_string(), "exited");
  auto pub = publication_settled(c, id);
  ASSERT_TRUE(pub);
  auto const& out = pub->at("stdout").as_object();
  ASSERT_EQ(out.at("state").as_string(), "failed") << json::serialize(*pub);
  EXPECT_EQ(out.at("error").at("code").as_string(), "artifact.no_space");
  EXPECT_EQ(out.at("error").at("recovery").as_string(), "publication_retry");
  EXPECT_TRUE(out.at("artifact").is_null());
  EXPECT_TRUE(fs::is_empty(d.state() / "artifacts" / "tmp")) << "a failed write leaves nothing";
  // The spool is kept for the retry, and still serves the output.
  std::string expected;
  while (expected.size() < 6291456) expected += "custos\n";
  expected.resize(6291456);
  EXPECT_EQ(output_of(c, id, "stdout"), expected);

  fs::remove(filler);
  auto gc = c.call(50, "host.gc", json::object{}, 60000ms);
  ASSERT_TRUE(gc && gc->contains("result")) << (gc ? json::serialize(*gc) : "");
  EXPECT_EQ(gc->at("result").at("streams_published").as_int64(), 1);
  auto again = publication_settled(c, id);
  ASSERT_TRUE(again);
  auto const& retried = again->at("stdout").as_object();
  EXPECT_EQ(retried.at("state").as_string(), "published") << json::serialize(*again);
  EXPECT_FALSE(retried.contains("error"));
  std::string const digest{retried.at("artifact").as_string()};
  EXPECT_EQ(digest, sha256_hex(expected));
  EXPECT_EQ(sha256_hex(read_all(artifact_path(d, digest))), digest);
}

TEST(Artifacts, ACrashBetweenStreamsIsResumedForTheMissingStreamOnly) {
  DaemonOptions o;
  o.env = {"CUSTOS_FAILPOINT=between_streams"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  std::string id;
  {
    auto c = d.client();
    id = start(c, sh("printf first; printf second >&2"));
    ASSERT_FALSE(id.empty());
    (void)wait_terminal(c, id);  // the daemon may die before or after it answers
  }
  auto status = d.wait_exit(30s);
  ASSERT_TRUE(status) << "the failpoint did not fire";
  ASSERT_TRUE(WIFSIGNALED(*status) && WTERMSIG(*status) == SIGKILL);
  // stdout was published (and its spool removed), stderr was not reached.
  auto const first = artifact_path(d, sha256_hex("first"));
  ASSERT_TRUE(fs::exists(first));
  EXPECT_EQ(artifact_count(d), 1U);
  EXPECT_FALSE(fs::exists(d.state() / "spool" / id / "stdout"));
  EXPECT_TRUE(fs::exists(d.state() / "spool" / id / "stderr"));
  struct stat before {};
  ASSERT_EQ(::stat(first.c_str(), &before), 0);
  // Make any rewrite or refresh of the first artifact visible.
  utimbuf past{before.st_mtime - 1000, before.st_mtime - 1000};
  ASSERT_EQ(::utime(first.c_str(), &past), 0);

  d.set_env({});
  d.start();
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  auto pub = publication_settled(c, id);
  ASSERT_TRUE(pub);
  EXPECT_EQ(pub->at("stdout").at("state").as_string(), "published") << json::serialize(*pub);
  EXPECT_EQ(pub->at("stderr").at("state").as_string(), "published");
  EXPECT_EQ(std::string{pub->at("stderr").at("artifact").as_string()}, sha256_hex("second"));
  struct stat after {};
  ASSERT_EQ(::stat(first.c_str(), &after), 0);
  EXPECT_EQ(after.st_ino, before.st_ino);
  EXPECT_EQ(after.st_mtime, before.st_mtime - 1000) << "stdout was published again";
  EXPECT_EQ(artifact_count(d), 2U);
  EXPECT_FALSE(fs::exists(d.state() / "spool" / id));
  EXPECT_EQ(output_of(c, id, "stdout"), "first");
  EXPECT_EQ(output_of(c, id, "stderr"), "second");
}

TEST(Artifacts, RetentionRemovesOldOutputOnlyAndGcReportsIt) {
  Daemon d;  // default retention: 7 days, 4 GiB
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  auto const old_id = start(c, sh("printf old-output"));
  auto const new_id = start(c, sh("printf new-output"));
  ASSERT_TRUE(wait_terminal(c, old_id));
  ASSERT_TRUE(wait_terminal(c, new_id));
  ASSERT_TRUE(publication_settled(c, old_id));
  ASSERT_TRUE(publication_settled(c, new_id));
  auto const live = start(c, sh("printf live-output; sleep 30"));
  ASSERT_TRUE(wait_record(c, live, [](json::object const& r) {
    return r.at("accounting").at("stdout").at("retained").as_int64() > 0;
  }));
  auto const old_path = artifact_path(d, sha256_hex("old-output"));
  std::time_t const month_ago = std::time(nullptr) - 30 * 86400;
  utimbuf past{month_ago, month_ago};
  ASSERT_EQ(::utime(old_path.c_str(), &past), 0);

  auto gc = run_cli({"--socket", d.socket().native(), "--json", "gc"});
  ASSERT_EQ(gc.status, 0) << gc.err;
  auto report = json::parse(gc.out).as_object();
  EXPECT_EQ(report.at("artifacts_removed").as_int64(), 1) << gc.out;
  EXPECT_EQ(report.at("store").at("artifacts").as_int64(), 1);
  EXPECT_FALSE(fs::exists(old_path));
  EXPECT_TRUE(fs::exists(artifact_path(d, sha256_hex("new-output"))));
  EXPECT_TRUE(fs::exists(d.state() / "spool" / live / "stdout")) << "a live spool is kept";

  std::string error;
  (void)output_of(c, old_id, "stdout", nullptr, &error);
  EXPECT_EQ(error, "output.removed");
  EXPECT_EQ(output_of(c, new_id, "stdout"), "new-output");
  EXPECT_EQ(output_of(c, live, "stdout").substr(0, 11), "live-output");
  auto h = c.call(60, "host.info");
  ASSERT_TRUE(h && h->contains("result"));
  auto const& fig = h->at("result").at("output").as_object();
  EXPECT_EQ(fig.at("artifacts").as_int64(), 1) << json::serialize(fig);
  EXPECT_EQ(fig.at("retention").at("age_s").as_int64(), 7 * 24 * 3600);
  auto text = run_cli({"--socket", d.socket().native(), "gc"});
  EXPECT_EQ(text.status, 0) << text.err;
  EXPECT_NE(text.out.find("retention: 0 artifact(s)"), std::string::npos) << text.out;
  (void)c.call(61, "exec.cancel", {{"execution_id", live}});
  (void)wait_terminal(c, live);
}

}  // namespace
}  // namespace custos::e2e
