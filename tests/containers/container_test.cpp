// Executions inside real Docker and rootless Podman containers, through a real daemon: the
// engines of scripts/engines (ctest fixture `engines`). Every test runs on both engines. What a
// test leaves on the host is checked from the host: a process of the exec's tree is found by a
// distinctive `sleep N` in the container's PID namespace, never by trusting the engine.
#include "containers.hpp"

namespace custos::e2e {
namespace {

TEST_P(Containers, ExactOutputExitCodeAndACgroupBoundary) {
  auto c = daemon_.client();
  auto const id = start(c, params({"/bin/sh", "-c", "printf out; printf 'e r r' >&2; exit 4"}));
  ASSERT_FALSE(id.empty());
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
  EXPECT_EQ(t.at("exit").at("code").as_int64(), 4);
  EXPECT_EQ(t.at("tree").at("boundary").as_string(), "cgroup");
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed");
  EXPECT_EQ(output(c, id, "stdout"), "out");
  EXPECT_EQ(output(c, id, "stderr"), "e r r");
  auto const& obs = t.at("observations").as_object();
  EXPECT_EQ(obs.at("container").as_string(), engine_.running_id);
  // Docker's containers have their own v2 cgroup here; rootless Podman's do not, so the exec's
  // cgroup is made beneath the daemon's subtree.
  EXPECT_EQ(obs.at("cgroup_placement").as_string(),
            GetParam() == EngineKind::docker ? "container" : "daemon");
  expect_container_running(engine_.running);
}

TEST_P(Containers, ArgumentsEnvironmentAndWorkingDirectoryAreTheContainers) {
  auto c = daemon_.client();
  auto p = params(
      {"/bin/sh", "-c", "printf '%s|%s|%s|' \"$1\" \"$X\" \"$(pwd)\"; id -u", "zero", "one two"});
  auto& plan = p["plan"].as_object();
  plan["env"] = json::array{json::object{{"name", "X"}, {"value", "x y"}}};
  plan["cwd"] = "etc";
  // The admin's implicit authority runs as the caller only (root here): user 0:0 inside.
  plan["user"] = json::object{{"uid", 0}, {"gid", 0}, {"groups", json::array{}}};
  auto const id = start(c, std::move(p));
  ASSERT_FALSE(id.empty());
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
  EXPECT_EQ(output(c, id, "stdout"), "one two|x y|/etc|0\n");
}

TEST_P(Containers, AMissingExecutableIsASpawnFailureAtExecve) {
  auto c = daemon_.client();
  auto const id = start(c, params({"/no/such/program"}));
  ASSERT_FALSE(id.empty());
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "spawn_failed") << json::serialize(t);
  EXPECT_EQ(t.at("spawn_error").at("code").as_string(), "execve");
  expect_container_running(engine_.running);
}

TEST_P(Containers, AMissingWorkingDirectoryIsASpawnFailureNotTheGatesVerdict) {
  auto c = daemon_.client();
  auto p = params({"/bin/true"});
  p["plan"].as_object()["cwd"] = "no/such/dir";
  auto const id = start(c, std::move(p));
  ASSERT_FALSE(id.empty());
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "spawn_failed") << json::serialize(t);
  // The engine could not start the exec at all (its runtime's own status, or a refused start):
  // never mistaken for the gate's "no executable" or "no limit".
  std::string const step{t.at("spawn_error").at("code").as_string()};
  EXPECT_TRUE(step == "exec_start" || step == "engine") << json::serialize(t);
  expect_container_running(engine_.running);
}

TEST_P(Containers, EscapeesAreGoneAfterCancelAndTheContainerRuns) {
  auto c = daemon_.client();
  std::string const n = unique_sleep();
  auto const id = start(c, params({"/bin/sh", "-c",
                                   "setsid sleep " + n + " & (sleep " + n + " &); sleep " + n +
                                       " & exec sleep " + n}));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(n, 4)) << host_sleeps(n).size();
  auto r = c.call(next_++, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(r && r->contains("result")) << (r ? json::serialize(*r) : "");
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed");
  EXPECT_TRUE(host_sleeps(n).empty()) << "survivors: " << host_sleeps(n).size();
  expect_container_running(engine_.running);
}

TEST_P(Containers, EscapeesAreGoneWhenTheRootExits) {
  auto c = daemon_.client();
  std::string const n = unique_sleep();
  // The root waits for one line of input, after the host saw its escapees, then exits 0.
  auto const id = start(c, params({"/bin/sh", "-c",
                                   "setsid sleep " + n + " >/dev/null 2>&1 & (sleep " + n +
                                       " >/dev/null 2>&1 &); read x; exit 0"}));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(n, 2)) << host_sleeps(n).size();
  auto in = c.call(next_++, "exec.input", {{"execution_id", id}, {"data_b64", "Cg=="}});
  ASSERT_TRUE(in && in->contains("result")) << (in ? json::serialize(*in) : "");
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
  EXPECT_EQ(t.at("exit").at("code").as_int64(), 0);
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed");
  EXPECT_TRUE(host_sleeps(n).empty()) << "survivors: " << host_sleeps(n).size();
  expect_container_running(engine_.running);
}

TEST_P(Containers, TheMarkerBoundaryEndsTheTreeWithoutACgroup) {
  // No cgroup at all: the exec's tree is found by its marker in the container's PID namespace.
  Daemon marker{DaemonOptions{{"--boundary", "marker"}, false, {}, {}, {}}};
  ASSERT_TRUE(marker.ready()) << marker.log();
  auto c = marker.client();
  std::string const n = unique_sleep();
  auto const id = start(
      c,
      params({"/bin/sh", "-c", "setsid sleep " + n + " & (sleep " + n + " &); exec sleep " + n}));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(n, 3)) << host_sleeps(n).size();
  auto r = c.call(next_++, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(r && r->contains("result"));
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_EQ(t.at("tree").at("boundary").as_string(), "marker");
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed") << json::serialize(t);
  EXPECT_EQ(t.at("observations").at("cgroup_placement").as_string(), "none");
  EXPECT_TRUE(host_sleeps(n).empty()) << "survivors: " << host_sleeps(n).size();
  expect_container_running(engine_.running);
}

// A process's state letter from /proc/PID/stat ('?' when unreadable).
char proc_state(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string line{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  auto const close = line.rfind(')');
  return close == std::string::npos || close + 2 >= line.size() ? '?' : line[close + 2];
}

bool await_state(int pid, char state) {
  auto const until = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < until) {
    if (proc_state(pid) == state) return true;
    std::this_thread::sleep_for(5ms);
  }
  return false;
}

TEST_P(Containers, TheIdentityCheckRefusesEveryProcessButTheGate) {
  // The check the daemon runs on the process an engine names before it signals it: real
  // processes that are not the gate in each way an engine (or a race) could present one.
  engine::SyncClient client(engine::Endpoint{GetParam(), engine_.socket});
  auto info = client.inspect_container(engine_.running, 10s);
  ASSERT_TRUE(info && info->init) << (info ? "no init" : info.error().message());
  std::uint64_t const ns = info->init->pid_namespace;
  auto marker = sys::Marker::generate();
  ASSERT_TRUE(marker);
  auto check = [&](int pid) {
    auto fd = sys::Pidfd::open(pid);
    EXPECT_TRUE(fd) << fd.error().message();
    return fd ? backend::check_gate_identity(*fd, *marker, ns)
              : Result<backend::GateCheck>{fd.error()};
  };

  // 1. A host process with the marker, stopped: outside the container's namespace, never the gate.
  std::string const entry = marker->env_entry();
  pid_t const host = ::fork();
  ASSERT_GE(host, 0);
  if (host == 0) {
    char* const argv[] = {const_cast<char*>("sleep"), const_cast<char*>("1000"), nullptr};
    char* const envp[] = {const_cast<char*>(entry.c_str()), nullptr};
    ::execve("/bin/sleep", argv, envp);
    ::_exit(127);
  }
  // Stopped only once it runs `sleep` (before its execve it carries this test's environment).
  auto const exec_until = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < exec_until &&
         std::filesystem::read_symlink("/proc/" + std::to_string(host) + "/exe").filename() !=
             "sleep") {
    std::this_thread::sleep_for(1ms);
  }
  ASSERT_EQ(::kill(host, SIGSTOP), 0);
  int status = 0;
  ASSERT_EQ(::waitpid(host, &status, WUNTRACED), host);
  auto outside = check(host);
  ASSERT_FALSE(outside);
  EXPECT_EQ(outside.error().code, Errc::identity_mismatch) << outside.error().message();
  ::kill(host, SIGKILL);
  ::waitpid(host, &status, 0);

  // 2. The container's init: in the namespace, no marker.
  auto init = check(info->init->pid);
  ASSERT_TRUE(init) << init.error().message();
  EXPECT_EQ(*init, backend::GateCheck::not_yet);

  // 3. A process in the container with another exec's marker, stopped: not this gate.
  auto other = sys::Marker::generate();
  ASSERT_TRUE(other);
  std::string const n_other = unique_sleep();
  ASSERT_EQ(engine_cli(engine_, "exec -d -e " + other->env_entry() + " " + engine_.running +
                                    " sleep " + n_other),
            0);
  ASSERT_TRUE(await_sleeps(n_other, 1));
  int const foreign = host_sleeps(n_other).at(0);
  ASSERT_EQ(::kill(foreign, SIGSTOP), 0);
  ASSERT_TRUE(await_state(foreign, 'T'));
  auto not_ours = check(foreign);
  ASSERT_TRUE(not_ours) << not_ours.error().message();
  EXPECT_EQ(*not_ours, backend::GateCheck::not_yet);
  ::kill(foreign, SIGKILL);

  // 4. This exec's marker in the container, running: not at the gate yet; once stopped: the gate.
  std::string const n = unique_sleep();
  ASSERT_EQ(engine_cli(engine_, "exec -d -e " + entry + " " + engine_.running + " sleep " + n), 0);
  ASSERT_TRUE(await_sleeps(n, 1));
  int const pid = host_sleeps(n).at(0);
  ASSERT_TRUE(await_state(pid, 'S'));
  auto running = check(pid);
  ASSERT_TRUE(running) << running.error().message();
  EXPECT_EQ(*running, backend::GateCheck::not_yet);
  ASSERT_EQ(::kill(pid, SIGSTOP), 0);
  ASSERT_TRUE(await_state(pid, 'T'));
  auto gate = check(pid);
  ASSERT_TRUE(gate) << gate.error().message();
  EXPECT_EQ(*gate, backend::GateCheck::gate);
  ::kill(pid, SIGKILL);
  auto const until = std::chrono::steady_clock::now() + 20s;
  while (!(host_sleeps(n).empty() && host_sleeps(n_other).empty()) &&
         std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  EXPECT_TRUE(host_sleeps(n).empty() && host_sleeps(n_other).empty());
}

// The host pids of processes whose command line contains every one of `parts`.
std::vector<int> host_processes_with(std::vector<std::string> const& parts) {
  std::vector<int> out;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    int const pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::string const cmd = read_cmdline(e->d_name);
    bool all = !cmd.empty();
    for (auto const& p : parts) all = all && cmd.find(p) != std::string::npos;
    if (all) out.push_back(pid);
  }
  ::closedir(d);
  return out;
}

TEST_P(Containers, AnUnreadableProcessNeverGivesAConfirmedCleanup) {
  // A daemon without CAP_SYS_PTRACE (a hardened unit's bounding set) cannot read the /proc
  // entries of a process of another uid. Under the marker boundary (no cgroup) it cannot tell
  // whether such a process is the exec's, so it never claims the cleanup confirmed.
  Daemon restricted{DaemonOptions{
      {"--boundary", "marker"},
      false,
      {},
      {"/usr/bin/setpriv", "--bounding-set", "-sys_ptrace", "--inh-caps", "-sys_ptrace", "--"},
      {}}};
  ASSERT_TRUE(restricted.ready()) << restricted.log();
  auto c = restricted.client();
  std::string const root = unique_sleep();
  std::string const other_uid = unique_sleep();
  auto p = params({"/bin/sh", "-c",
                   "su -s /bin/sh nobody -c 'exec sleep " + other_uid + "' & exec sleep " + root});
  if (GetParam() == EngineKind::podman) {
    // Rootless Podman runs the whole container under the service user's uids: the daemon cannot
    // read even the container's init, so the start is refused before any claim or process.
    for (int attempt = 0; attempt < 2; ++attempt) {
      // The same action twice: the first refusal consumed nothing, so the second is refused
      // for the same reason, not as a replay.
      auto r = c.call(next_++, "exec.start", p);
      ASSERT_TRUE(r && r->contains("error")) << (r ? json::serialize(*r) : "no reply");
      EXPECT_EQ(error_code_of(*r), "procfs.failed") << json::serialize(*r);
    }
    EXPECT_TRUE(host_processes_with({"custos-gate", root}).empty());
    return;
  }
  // Docker runs the exec as the container's root, which the daemon may read (the same uid with
  // fewer capabilities); its descendant runs as nobody, which it may not.
  auto const id = start(c, std::move(p));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(root, 1) && await_sleeps(other_uid, 1));
  auto r = c.call(next_++, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(r && r->contains("result"));
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_EQ(t.at("tree").at("boundary").as_string(), "marker");
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "unconfirmed") << json::serialize(t);
  EXPECT_TRUE(host_sleeps(root).empty());
  // What the daemon could not end, the test does (found by its unique command line).
  for (int pid : host_sleeps(other_uid)) ::kill(pid, SIGKILL);
  expect_container_running(engine_.running);
}

// `/bin/busybox sleep <n>` run directly (an ungated exec has no shell to exec `sleep`): its
// command line is the busybox path, then `sleep <n>`.
std::vector<int> busybox_sleeps(std::string const& n) {
  return host_processes_with({std::string{"/bin/busybox"} + '\0' + "sleep" + '\0' + n});
}

bool await_busybox_sleeps(std::string const& n) {
  auto const until = std::chrono::steady_clock::now() + 20s;
  while (std::chrono::steady_clock::now() < until) {
    if (!busybox_sleeps(n).empty()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

TEST_P(Containers, AContainerWithoutAShellRunsOnlyWhereThePlanAcceptsTheMarker) {
  auto c = daemon_.client();
  auto p = params({"/bin/busybox", "echo", "hi"}, engine_.noshell);
  // The default (gate required): refused before any claim.
  auto r = c.call(next_++, "exec.start", p);
  ASSERT_TRUE(r && r->contains("error")) << (r ? json::serialize(*r) : "no reply");
  EXPECT_EQ(error_code_of(*r), "engine.gate_unavailable") << json::serialize(*r);
  // Accepted: it runs, ungated, under the marker boundary — with the same action id, since the
  // refusal consumed nothing.
  p["plan"].as_object()["backend"].as_object()["gate"] = "optional";
  auto const id = start(c, p);
  ASSERT_FALSE(id.empty());
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
  EXPECT_EQ(t.at("exit").at("code").as_int64(), 0) << json::serialize(t);
  EXPECT_EQ(t.at("tree").at("boundary").as_string(), "marker");
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed") << json::serialize(t);
  EXPECT_NE(t.at("observations").at("launch").as_string().find("ungated"), std::string::npos);
  EXPECT_EQ(output(c, id, "stdout"), "hi\n");
  // Only the gate sets the descriptor limit: the container's own applied, and the record says so.
  EXPECT_NE(t.at("resources").at("descriptors").at("fidelity").as_string(), "hard")
      << json::serialize(t);
  auto got = c.call(next_++, "exec.get", {{"execution_id", id}});
  ASSERT_TRUE(got && got->contains("result"));
  EXPECT_EQ(got->at("result").at("boundary").as_string(), "marker");
  expect_container_running(engine_.noshell);
}

TEST_P(Containers, AnUngatedExecsTreeEndsByItsMarker) {
  auto c = daemon_.client();
  auto ungated = [&](std::vector<std::string> const& argv) {
    auto p = params(argv, engine_.noshell);
    p["plan"].as_object()["backend"].as_object()["gate"] = "optional";
    return p;
  };
  // The root exits at once, leaving a daemonized descendant (setsid, reparented in the
  // container): the teardown finds it by its marker in the container's namespace.
  std::string const daemonized = unique_sleep();
  auto const id = start(c, ungated({"/bin/busybox", "start-stop-daemon", "-S", "-b", "-x",
                                    "/bin/busybox", "-a", "sleep", "--", "sleep", daemonized}));
  ASSERT_FALSE(id.empty());
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed") << json::serialize(t);
  EXPECT_TRUE(host_sleeps(daemonized).empty()) << "survivors: " << host_sleeps(daemonized).size();

  // A long root, cancelled: it and its descendants end.
  std::string const n = unique_sleep();
  auto const id2 = start(c, ungated({"/bin/busybox", "sleep", n}));
  ASSERT_FALSE(id2.empty());
  ASSERT_TRUE(await_busybox_sleeps(n));
  auto r = c.call(next_++, "exec.cancel", {{"execution_id", id2}});
  ASSERT_TRUE(r && r->contains("result"));
  auto const t2 = wait(c, id2);
  EXPECT_EQ(t2.at("classification").as_string(), "cancelled") << json::serialize(t2);
  EXPECT_EQ(t2.at("tree").at("boundary").as_string(), "marker");
  EXPECT_EQ(t2.at("tree").at("cleanup").as_string(), "confirmed") << json::serialize(t2);
  EXPECT_TRUE(busybox_sleeps(n).empty());
  expect_container_running(engine_.noshell);
}

TEST_P(Containers, AnUngatedExecIsSweptAfterADaemonCrash) {
  // Nothing of an ungated exec can be adopted (no identity was recorded before it started): a
  // restart sweeps its marker in the recorded namespace, live root included.
  auto c = daemon_.client();
  std::string const n = unique_sleep();
  auto p = params({"/bin/busybox", "sleep", n}, engine_.noshell);
  p["plan"].as_object()["backend"].as_object()["gate"] = "optional";
  auto const id = start(c, std::move(p));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_busybox_sleeps(n));
  ASSERT_TRUE(daemon_.signal(SIGKILL));
  ASSERT_TRUE(daemon_.wait_exit(30s));
  EXPECT_EQ(busybox_sleeps(n).size(), 1U);
  daemon_.start();
  ASSERT_TRUE(daemon_.ready()) << daemon_.log();
  auto c2 = daemon_.client();
  auto const t = wait(c2, id);
  EXPECT_EQ(t.at("recovery").as_string(), "absent_without_terminal") << json::serialize(t);
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed") << json::serialize(t);
  EXPECT_TRUE(busybox_sleeps(n).empty()) << "survivors: " << busybox_sleeps(n).size();
  expect_container_running(engine_.noshell);
}

TEST_P(Containers, AnIgnoredSigtermIsForcedAfterTheGrace) {
  auto c = daemon_.client();
  std::string const n = unique_sleep();
  auto p = params({"/bin/sh", "-c", "trap '' TERM; exec sleep " + n});
  p["plan"].as_object()["escalation"] =
      json::object{{"signal", "SIGTERM"}, {"grace_ms", 300}, {"kill_after_ms", 5000}};
  auto const id = start(c, std::move(p));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(n, 1));
  auto r = c.call(next_++, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(r && r->contains("result"));
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_TRUE(t.at("escalation").at("forced").as_bool()) << json::serialize(t);
  EXPECT_TRUE(host_sleeps(n).empty());
}

TEST_P(Containers, PtyOutputSeesTheInitialSizeAndAResize) {
  auto c = daemon_.client();
  auto const id =
      start(c, params({"/bin/sh", "-c", "stty size; read x; stty size"}, {}, {},
                      {{"mode", "pty"}, {"rows", 31}, {"cols", 101}, {"resize", true}}));
  ASSERT_FALSE(id.empty());
  (void)wait_record(c, id, [&](json::object const&) {
    return output(c, id, "pty").find("31 101") != std::string::npos;
  });
  ASSERT_NE(output(c, id, "pty").find("31 101"), std::string::npos) << output(c, id, "pty");
  auto rs = c.call(next_++, "exec.resize", {{"execution_id", id}, {"rows", 42}, {"cols", 123}});
  ASSERT_TRUE(rs && rs->contains("result")) << (rs ? json::serialize(*rs) : "");
  // The resize call returns before the engine applied it: give it a moment.
  std::this_thread::sleep_for(300ms);
  auto in = c.call(next_++, "exec.input", {{"execution_id", id}, {"data_b64", "DQ=="}});
  ASSERT_TRUE(in && in->contains("result"));
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
  EXPECT_NE(output(c, id, "pty").find("42 123"), std::string::npos) << output(c, id, "pty");
}

TEST_P(Containers, AStalledTerminalInputNeverHoldsTheTeardown) {
  auto c = daemon_.client();
  std::string const n = unique_sleep();
  // The program never reads its terminal: input piles up in the engine's stream and the pty.
  auto const id = start(c, params({"/bin/sh", "-c", "exec sleep " + n}, {}, {},
                                  {{"mode", "pty"}, {"rows", 24}, {"cols", 80}}));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(n, 1));
  std::string const chunk(48 * 1024, 'x');
  std::string b64(boost::beast::detail::base64::encoded_size(chunk.size()), '\0');
  b64.resize(boost::beast::detail::base64::encode(b64.data(), chunk.data(), chunk.size()));
  std::size_t accepted = 0;
  for (int i = 0; i < 12; ++i) {
    auto in = c.call(next_++, "exec.input", {{"execution_id", id}, {"data_b64", b64}});
    if (in && in->contains("result")) ++accepted;
  }
  EXPECT_GT(accepted, 0U);
  auto const t0 = std::chrono::steady_clock::now();
  auto r = c.call(next_++, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(r && r->contains("result"));
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed");
  // Bounded by the escalation (grace 2 s, kill after 5 s), not by the stalled input.
  auto const took = std::chrono::steady_clock::now() - t0;
  EXPECT_LT(took, 30s) << std::chrono::duration_cast<std::chrono::milliseconds>(took).count()
                       << " ms";
  EXPECT_TRUE(host_sleeps(n).empty());
}

TEST_P(Containers, AGrantNamesItsContainersAndARevokeFencesTheExec) {
  Daemon d{DaemonOptions{{"--socket-mode", "0666"}, true, {}, {}, {}}};
  ASSERT_TRUE(d.ready()) << d.log();
  ::chmod(d.state().c_str(), 0711);  // the socket's directory, for the runner's uid
  auto admin = d.client();
  std::string const principal = "uid:" + std::to_string(nobody_uid());
  auto grant = runner_grant(principal, "g-c");
  grant["operations"] = json::array{"exec." + std::string{engine::to_string(GetParam())}};
  grant["workspaces"] =
      json::array{json::object{{"workspace_id", "w1"}, {"root", "/"}, {"max_access", "read_only"}}};
  grant["containers"] = json::array{json::object{{"engine", engine::to_string(GetParam())},
                                                 {"name", engine_.running},
                                                 {"socket", engine_.socket}}};
  auto g = admin.call(next_++, "authority.grant", grant);
  ASSERT_TRUE(g && g->contains("result")) << (g ? json::serialize(*g) : "");
  std::string const n = unique_sleep();
  auto with_grant = [](json::object p, std::uint64_t ep) {
    p["authority"] = json::object{{"epoch", ep}, {"grant_id", "g-c"}, {"lease_id", nullptr}};
    return p;
  };
  auto sleeper = params({"/bin/sh", "-c", "exec sleep " + n});
  auto other = params({"/bin/true"}, engine_.stopped);
  fs::path const sock = d.socket();
  auto [rc, id] = as_user_output(nobody_uid(), 65534, {}, [&](std::string& out) {
    LineClient c{sock};
    auto l = c.call(1, "authority.list");
    if (!l || !l->contains("result")) return 10;
    auto const ep = l->at("result").at("epoch").to_number<std::uint64_t>();
    // A container the grant does not name: refused, nothing consumed.
    auto bad = c.call(2, "exec.start", with_grant(other, ep));
    if (!bad || error_code_of(*bad) != "auth.container") return 11;
    auto ok = c.call(3, "exec.start", with_grant(sleeper, ep));
    if (!ok || !ok->contains("result")) return 12;
    out = std::string{ok->at("result").at("execution_id").as_string()};
    return 0;
  });
  ASSERT_EQ(rc, 0) << d.log();
  ASSERT_TRUE(await_sleeps(n, 1));
  auto rv = admin.call(next_++, "authority.revoke", {{"grant_id", "g-c"}});
  ASSERT_TRUE(rv && rv->contains("result")) << (rv ? json::serialize(*rv) : "");
  auto const& fenced = rv->at("result").at("fenced").as_array();
  ASSERT_EQ(fenced.size(), 1U);
  EXPECT_EQ(fenced[0].as_string(), id);
  auto const t = wait(admin, id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_EQ(t.at("trigger").as_string(), "lease_fence");
  EXPECT_TRUE(host_sleeps(n).empty());
}

TEST_P(Containers, AMissingOrStoppedContainerIsRefusedBeforeAnyClaim) {
  auto c = daemon_.client();
  auto p = params({"/bin/true"}, "custos-no-such-container");
  auto const action = std::string{p["identity"].at("action_id").as_string()};
  auto r = c.call(next_++, "exec.start", p);
  ASSERT_TRUE(r && r->contains("error")) << (r ? json::serialize(*r) : "");
  EXPECT_EQ(error_code_of(*r), "engine.container_not_found") << json::serialize(*r);
  // Nothing was consumed: the same action id starts once the container is right.
  auto again = params({"/bin/true"});
  again["identity"].as_object()["action_id"] = action;
  auto const id = start(c, std::move(again));
  EXPECT_FALSE(id.empty());
  if (!id.empty()) {
    EXPECT_EQ(wait(c, id).at("classification").as_string(), "exited");
  }

  auto s = c.call(next_++, "exec.start", params({"/bin/true"}, engine_.stopped));
  ASSERT_TRUE(s && s->contains("error")) << (s ? json::serialize(*s) : "");
  EXPECT_EQ(error_code_of(*s), "engine.container_not_running");
}

TEST_P(Containers, AContainerStoppedMidExecIsABackendFailure) {
  StoppableContainer stoppable{engine_};
  ASSERT_TRUE(stoppable.ok());
  std::string const& name = stoppable.name;
  auto c = daemon_.client();
  std::string const n = unique_sleep();
  auto const id = start(c, params({"/bin/sh", "-c", "exec sleep " + n}, name));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(n, 1));
  ASSERT_EQ(engine_cli(engine_, "stop -t 5 " + name), 0);
  auto const t = wait(c, id);
  EXPECT_EQ(t.at("classification").as_string(), "supervisor_failed") << json::serialize(t);
  EXPECT_EQ(t.at("trigger").as_string(), "backend_failure");
  // Docker removed the container's cgroup tree, ours inside it, once the kernel had emptied it:
  // a removed cgroup is an empty one.
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed") << json::serialize(t);
  EXPECT_EQ(t.at("observations").at("container_stopped").as_string(), "true");
  EXPECT_TRUE(host_sleeps(n).empty());
}

TEST_P(Containers, ADaemonKilledMidExecRecoversAndEndsTheExec) {
  auto c = daemon_.client();
  std::string const n = unique_sleep();
  auto const id = start(c, params({"/bin/sh", "-c", "sleep " + n + " & exec sleep " + n}));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(n, 2));
  ASSERT_TRUE(daemon_.signal(SIGKILL));
  ASSERT_TRUE(daemon_.wait_exit(30s));
  // The exec outlived the daemon; the restarted daemon re-identifies its root by pidfs identity
  // and adopts it, so a cancel ends the whole tree.
  EXPECT_EQ(host_sleeps(n).size(), 2U);
  daemon_.start();
  ASSERT_TRUE(daemon_.ready()) << daemon_.log();
  auto c2 = daemon_.client();
  auto r = c2.call(next_++, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(r && r->contains("result")) << (r ? json::serialize(*r) : "") << daemon_.log();
  auto const t = wait(c2, id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_EQ(t.at("recovery").as_string(), "live_owned") << json::serialize(t);
  EXPECT_TRUE(host_sleeps(n).empty()) << "survivors: " << host_sleeps(n).size();
  expect_container_running(engine_.running);
}

TEST_P(Containers, AGoneMarkerExecIsSweptInTheContainersNamespaceAfterACrash) {
  // Under the marker boundary the exec's leftovers live in the container's PID namespace, which
  // the record keeps: recovery sweeps there, not in the daemon's own namespace.
  Daemon marker{DaemonOptions{{"--boundary", "marker"}, false, {}, {}, {}}};
  ASSERT_TRUE(marker.ready()) << marker.log();
  auto c = marker.client();
  std::string const root = unique_sleep();
  std::string const escapee = unique_sleep();
  auto const id =
      start(c, params({"/bin/sh", "-c", "setsid sleep " + escapee + " & exec sleep " + root}));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(root, 1) && await_sleeps(escapee, 1));
  ASSERT_TRUE(marker.signal(SIGKILL));
  ASSERT_TRUE(marker.wait_exit(30s));
  // The root ends while no daemon runs (found by its unique command line in the container's
  // namespace); its setsid descendant stays behind.
  auto const roots = host_sleeps(root);
  ASSERT_EQ(roots.size(), 1U);
  ASSERT_EQ(::kill(roots[0], SIGKILL), 0);
  auto const until = std::chrono::steady_clock::now() + 20s;
  while (!host_sleeps(root).empty() && std::chrono::steady_clock::now() < until) {
    std::this_thread::sleep_for(20ms);
  }
  ASSERT_TRUE(host_sleeps(root).empty());
  ASSERT_EQ(host_sleeps(escapee).size(), 1U);
  marker.start();
  ASSERT_TRUE(marker.ready()) << marker.log();
  auto c2 = marker.client();
  auto const t = wait(c2, id);
  EXPECT_EQ(t.at("recovery").as_string(), "absent_without_terminal") << json::serialize(t);
  EXPECT_EQ(t.at("tree").at("boundary").as_string(), "marker");
  EXPECT_EQ(t.at("tree").at("cleanup").as_string(), "confirmed") << json::serialize(t);
  EXPECT_TRUE(host_sleeps(escapee).empty()) << "survivors: " << host_sleeps(escapee).size();
  expect_container_running(engine_.running);
}

INSTANTIATE_TEST_SUITE_P(Engines, Containers,
                         ::testing::Values(EngineKind::docker, EngineKind::podman),
                         [](auto const& p) { return std::string{engine::to_string(p.param)}; });

}  // namespace
}  // namespace custos::e2e
