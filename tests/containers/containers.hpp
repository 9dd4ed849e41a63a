// The fixture of the container suites: a real daemon and a real engine (scripts/engines), with
// the host-side helpers that find an exec's processes by a distinctive `sleep N`.
#pragma once

#include <boost/beast/core/detail/base64.hpp>

#include <dirent.h>
#include <set>
#include <sys/wait.h>

#include "custos/backend/container.hpp"
#include "custos/engine/sync.hpp"

#include "e2e/harness.hpp"
#include "engine/harness.hpp"

namespace custos::e2e {

using engine::EngineKind;
using engine::testing::RealEngine;

// /proc/<pid>/cmdline, empty when the process is gone (a read can fail with ESRCH mid-way).
inline std::string read_cmdline(char const* pid) {
  try {
    std::ifstream in(std::string{"/proc/"} + pid + "/cmdline");
    return std::string{std::istreambuf_iterator<char>{in}, std::istreambuf_iterator<char>{}};
  } catch (std::exception const&) {
    return {};
  }
}

// The host pids of processes whose command line is exactly `sleep <n>` (in any namespace).
inline std::vector<int> host_sleeps(std::string const& n) {
  std::vector<int> out;
  std::string const want = std::string{"sleep"} + '\0' + n;
  DIR* d = ::opendir("/proc");
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    int const pid = std::atoi(e->d_name);
    if (pid <= 0) continue;
    std::string cmd = read_cmdline(e->d_name);
    if (!cmd.empty() && cmd.back() == '\0') cmd.pop_back();
    if (cmd == want) out.push_back(pid);
  }
  ::closedir(d);
  return out;
}

// Waits until `count` such processes exist (true) or the timeout passes.
inline bool await_sleeps(std::string const& n, std::size_t count,
                         std::chrono::milliseconds t = 20s) {
  auto const until = std::chrono::steady_clock::now() + t;
  while (std::chrono::steady_clock::now() < until) {
    if (host_sleeps(n).size() >= count) return true;
    std::this_thread::sleep_for(20ms);
  }
  return false;
}

// A unique sleep duration per test, so concurrent runs never see each other's processes.
inline std::string unique_sleep() {
  static std::atomic<int> k{0};
  return std::to_string(100000 + (::getpid() % 50000) * 16 + k++);
}

// Runs the docker CLI against the harness's socket of `e` (Podman's speaks the same API).
inline int engine_cli(RealEngine const& e, std::string const& args) {
  std::string const cmd = "/usr/bin/docker -H unix://" + e.socket + " " + args + " >/dev/null 2>&1";
  return std::system(cmd.c_str());
}

// A container of its own for a test that stops it (`custos-test-stop-<unique>`, exiting 0 on
// SIGTERM), removed when the test ends. ok() says whether the engine started it.
struct StoppableContainer {
  RealEngine engine;
  std::string name = "custos-test-stop-" + unique_suffix();
  int started = engine_cli(engine, "run -d --network none --name " + name +
                                       " custos-test:latest sh -c 'trap \"exit 0\" TERM; while "
                                       ":; do sleep 1; done'");
  explicit StoppableContainer(RealEngine e) : engine(std::move(e)) {}
  StoppableContainer(StoppableContainer const&) = delete;
  StoppableContainer& operator=(StoppableContainer const&) = delete;
  ~StoppableContainer() { (void)engine_cli(engine, "rm -f " + name); }
  [[nodiscard]] bool ok() const { return started == 0; }
};

class Containers : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    std::string why;
    auto e = engine::testing::real_engine(GetParam(), why);
    ASSERT_TRUE(e) << why;
    engine_ = *e;
    ASSERT_TRUE(daemon_.ready()) << daemon_.log();
  }

  // exec.start params for `argv` inside container `name` of this engine.
  json::object params(std::vector<std::string> const& argv, std::string const& name = {},
                      json::object limits = {}, json::object io = {{"mode", "pipes"}}) {
    auto p = start_params(argv, std::move(limits), std::move(io));
    auto& plan = p["plan"].as_object();
    plan["workspace"] = json::object{{"root", "/"}, {"access", "read_only"}};
    plan["backend"] = json::object{{"kind", engine::to_string(GetParam())},
                                   {"container", name.empty() ? engine_.running : name},
                                   {"socket", engine_.socket}};
    return p;
  }

  std::string start(LineClient& c, json::object p) {
    auto r = c.call(next_++, "exec.start", std::move(p));
    if (!r || !r->contains("result")) {
      ADD_FAILURE() << (r ? json::serialize(*r) : "no reply") << "\n" << daemon_.log();
      return {};
    }
    return std::string{r->at("result").at("execution_id").as_string()};
  }

  json::object wait(LineClient& c, std::string const& id) {
    // The client waits as long as the daemon's wait may (not the call's default 10 s): the
    // tests' own bounds on a teardown are assertions of their own.
    auto w = c.call(next_++, "exec.wait", {{"execution_id", id}, {"timeout_ms", 60000}}, 65s);
    if (!w || !w->contains("result")) {
      ADD_FAILURE() << (w ? json::serialize(*w) : "no reply") << "\n" << daemon_.log();
      return {};
    }
    return w->at("result").as_object();
  }

  std::string output(LineClient& c, std::string const& id, std::string const& stream) {
    auto o = c.call(next_++, "exec.output",
                    {{"execution_id", id}, {"stream", stream}, {"max_bytes", 1 << 20}});
    if (!o || !o->contains("result")) return "<no output: " + (o ? json::serialize(*o) : "") + ">";
    std::string const b64{o->at("result").at("data_b64").as_string()};
    std::string out;
    out.resize(boost::beast::detail::base64::decoded_size(b64.size()));
    auto const n = boost::beast::detail::base64::decode(out.data(), b64.data(), b64.size());
    out.resize(n.first);
    return out;
  }

  // The container still runs after the execution (the engine's own word).
  void expect_container_running(std::string const& name) {
    engine::SyncClient client(engine::Endpoint{GetParam(), engine_.socket});
    auto info = client.inspect_container(name, 10s);
    ASSERT_TRUE(info) << info.error().message();
    EXPECT_TRUE(info->inspect.accepts_exec()) << info->inspect.status_text;
  }

  RealEngine engine_;
  Daemon daemon_;
  std::int64_t next_ = 1;
};

}  // namespace custos::e2e
