// What a restarted daemon shows about the previous daemon's executions: exec.list merges the
// registry's records, exec.get decodes them fully, a quarantined record is a typed error, and
// the restart policy, the adopted executions and the registry findings are visible in host.info
// and `custos doctor`.
#include <set>
#include <string>
#include <sys/syscall.h>

#include "harness.hpp"

namespace custos::e2e {
namespace {

std::string start_and_finish(LineClient& c, std::int64_t rid, std::vector<std::string> argv) {
  auto r = c.call(rid, "exec.start", start_params(argv));
  if (!r || !r->contains("result")) {
    ADD_FAILURE() << (r ? json::serialize(*r) : "no reply");
    return {};
  }
  std::string id{r->at("result").at("execution_id").as_string()};
  auto w = c.call(rid + 1, "exec.wait", {{"execution_id", id}, {"timeout_ms", 20000}});
  if (!w || !w->contains("result")) ADD_FAILURE() << (w ? json::serialize(*w) : "no wait reply");
  return id;
}

TEST(RestartView, ListMergesRegistryRecordsAndCorruptRecordIsTyped) {
  if (!fs::exists("/usr/bin/sqlite3")) GTEST_SKIP() << "needs /usr/bin/sqlite3 to corrupt a record";
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  std::vector<std::string> ids;
  {
    auto c = d.client();
    for (int i = 0; i < 3; ++i)
      ids.push_back(start_and_finish(c, 10 * (i + 1), {"/bin/echo", "hi"}));
  }
  for (auto const& id : ids) ASSERT_FALSE(id.empty());
  ASSERT_TRUE(d.signal(SIGTERM));
  ASSERT_TRUE(d.wait_exit(30s));

  // Change one durable field of the third record behind the registry's back: its checksum no
  // longer matches, so the next open quarantines it.
  std::string const sql =
      "UPDATE executions SET out_observed = out_observed + 7 WHERE execution_id = '" + ids[2] +
      "';";
  pid_t pid = Daemon::spawn({"/usr/bin/sqlite3", (d.state() / "registry.db").native(), sql});
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);

  d.start();
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();

  // Page through exec.list one at a time: the two intact records are there, from the registry.
  std::set<std::string> seen;
  json::value cursor = nullptr;
  for (int i = 0; i < 10; ++i) {
    json::object params{{"limit", 1}};
    if (!cursor.is_null()) params["cursor"] = cursor;
    auto l = c.call(100 + i, "exec.list", params);
    ASSERT_TRUE(l && l->contains("result")) << (l ? json::serialize(*l) : "");
    auto const& res = l->at("result").as_object();
    for (auto const& e : res.at("executions").as_array()) {
      auto const& x = e.as_object();
      seen.insert(std::string{x.at("execution_id").as_string()});
      EXPECT_EQ(x.at("source").as_string(), "registry");
      EXPECT_TRUE(x.at("identity").is_object());
      EXPECT_TRUE(x.at("accounting").at("stdout").is_object()) << json::serialize(x);
    }
    cursor = res.at("next_cursor");
    if (cursor.is_null()) break;
  }
  EXPECT_EQ(seen.count(ids[0]), 1U);
  EXPECT_EQ(seen.count(ids[1]), 1U);
  EXPECT_EQ(seen.count(ids[2]), 0U) << "a quarantined record is not listed";

  auto g = c.call(200, "exec.get", {{"execution_id", ids[0]}});
  ASSERT_TRUE(g && g->contains("result")) << (g ? json::serialize(*g) : "");
  auto const& rec = g->at("result").as_object();
  EXPECT_EQ(rec.at("identity").at("process_id").as_string(), "proc-1");
  EXPECT_EQ(rec.at("accounting").at("stdout").at("observed").as_int64(), 3);  // "hi\n"
  EXPECT_EQ(rec.at("terminal").at("classification").as_string(), "exited");

  auto bad = c.call(201, "exec.get", {{"execution_id", ids[2]}});
  ASSERT_TRUE(bad);
  EXPECT_EQ(error_code_of(*bad), "registry.corrupt_record") << json::serialize(*bad);

  auto h = c.call(202, "host.info");
  ASSERT_TRUE(h && h->contains("result"));
  auto const& reg = h->at("result").at("registry").as_object();
  ASSERT_EQ(reg.at("quarantined").as_array().size(), 1U) << json::serialize(reg);
  EXPECT_EQ(reg.at("quarantined").as_array()[0].at("execution_id").as_string(), ids[2]);
  EXPECT_EQ(h->at("result").at("restart_policy").as_string(), "adopt");

  auto doc = run_cli({"--socket", d.socket().native(), "doctor"});
  EXPECT_EQ(doc.status, 0) << doc.err;
  EXPECT_NE(doc.out.find("quarantined " + ids[2]), std::string::npos) << doc.out;
}

// `keep_running`, the name of the policy adoption replaced, still starts a daemon: it adopts.
// The adopted execution shows in host.info and `custos doctor`, stays alive, and is supervised
// by the new daemon (exec.get from the manager, not the registry).
TEST(RestartView, TheFormerKeepRunningPolicyAdoptsAndDoctorShowsIt) {
  DaemonOptions o;
  o.extra_args = {"--shutdown", "detach", "--restart-policy", "keep_running"};
  Daemon d{o};
  ASSERT_TRUE(d.ready()) << d.log();
  std::string id;
  int pidfd = -1;
  {
    auto c = d.client();
    auto started = start_execution(c, {"/bin/sleep", "60"}, true);
    id = started.id;
    pidfd = started.pidfd;
    ASSERT_GE(pidfd, 0);
  }
  ASSERT_TRUE(d.signal(SIGTERM));
  ASSERT_TRUE(d.wait_exit(30s));
  d.start();
  ASSERT_TRUE(d.ready()) << d.log();
  std::this_thread::sleep_for(500ms);
  EXPECT_TRUE(pid_alive(pidfd)) << "adoption must not cancel the re-acquired process";
  auto c = d.client();
  auto h = c.call(1, "host.info");
  ASSERT_TRUE(h && h->contains("result"));
  EXPECT_EQ(h->at("result").at("restart_policy").as_string(), "adopt");
  auto const& adopted = h->at("result").at("registry").at("adopted").as_array();
  ASSERT_EQ(adopted.size(), 1U) << json::serialize(h->at("result").at("registry"));
  EXPECT_EQ(adopted[0].as_string(), id);
  auto g = c.call(2, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(g && g->contains("result"));
  EXPECT_EQ(g->at("result").at("phase").as_string(), "running");
  auto doc = run_cli({"--socket", d.socket().native(), "doctor"});
  EXPECT_NE(doc.out.find("adopted after the restart (output not kept): " + id), std::string::npos)
      << doc.out;
  // Our own process: ended through its pidfd; the adopter records how.
  (void)::syscall(SYS_pidfd_send_signal, pidfd, SIGKILL, nullptr, 0);
  pollfd p{pidfd, POLLIN, 0};
  EXPECT_EQ(::poll(&p, 1, 5000), 1);
  ::close(pidfd);
  auto w = c.call(3, "exec.wait", {{"execution_id", id}, {"timeout_ms", 15000}}, 20000ms);
  ASSERT_TRUE(w && w->contains("result")) << (w ? json::serialize(*w) : "");
  EXPECT_EQ(w->at("result").at("recovery").as_string(), "live_owned");
}

}  // namespace
}  // namespace custos::e2e
