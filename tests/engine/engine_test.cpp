// The engine client against the real Docker and rootless Podman of scripts/engines: version
// negotiation, ping, container inspect with the init's host facts, the typed not-found and
// not-running errors, and execs with exact output, exit codes, environment, user, working
// directory, stdin with a half-close, a TTY with resize, and the exec's host pid.
#include <gtest/gtest.h>

#include <chrono>
#include <fstream>
#include <iterator>
#include <optional>
#include <random>
#include <string>
#include <sys/stat.h>
#include <thread>

#include "custos/engine/client.hpp"
#include "custos/sys/pidfd.hpp"

#include "harness.hpp"

namespace custos::engine {
namespace {

ExecConfig argv(std::vector<std::string> a) {
  ExecConfig c;
  c.cmd = std::move(a);
  return c;
}

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

constexpr auto kCall = 20s;  // generous: the engines share two cores with everything else

struct ExecRun {
  std::string id;
  std::string out;
  std::string err;
  std::optional<StreamEnd> end;
  std::optional<ExecInspect> inspect;
};

class RealEngineTest : public ::testing::TestWithParam<EngineKind> {
 protected:
  void SetUp() override {
    std::string why;
    engine_ = testing::real_engine(GetParam(), why);
    if (!engine_) GTEST_FAIL() << why;
    client_.emplace(io_, Endpoint{GetParam(), engine_->socket});
  }

  // Runs `start` and the loop until its handler ran.
  template <class T>
  Result<T> await(std::function<void(Client::Handler<T>)> const& start) {
    std::optional<Result<T>> out;
    start([&out](Result<T> r) { out.emplace(std::move(r)); });
    auto const until = Clock::now() + 60s;
    while (!out && Clock::now() < until) {
      io_.restart();
      io_.run_for(10ms);
    }
    if (!out) return Error{Errc::internal, "the call never completed"};
    return std::move(*out);
  }

  Result<std::string> create(ExecConfig config, std::string const& ref = {}) {
    return await<std::string>([&](auto done) {
      client_->create_exec(ref.empty() ? engine_->running : ref, config, kCall, done);
    });
  }

  // create + start + (stdin) + stream to its end + inspect until the exec ended.
  ExecRun run_exec(ExecConfig config, std::string const& input = {},
                   std::function<void(ExecRun&, ExecStream&)> while_running = nullptr) {
    ExecRun run;
    bool const tty = config.tty;
    auto id = create(std::move(config));
    EXPECT_TRUE(id) << id.error().message();
    if (!id) return run;
    run.id = *id;
    auto stream = await<std::shared_ptr<ExecStream>>(
        [&](auto done) { client_->start_exec(run.id, tty, kCall, done); });
    EXPECT_TRUE(stream) << stream.error().message();
    if (!stream) return run;
    (*stream)->start(
        [&run](StdStream s, std::span<std::uint8_t const> b) {
          (s == StdStream::err ? run.err : run.out).append(b.begin(), b.end());
        },
        [&run](StreamEnd e) { run.end = std::move(e); });
    if (while_running) while_running(run, **stream);
    if (!input.empty()) write_all(**stream, input);
    auto const until = Clock::now() + 60s;
    while (!run.end && Clock::now() < until) {
      io_.restart();
      io_.run_for(10ms);
    }
    EXPECT_TRUE(run.end) << "the stream did not end";
    auto inspected =
        await<ExecInspect>([&](auto done) { client_->wait_exec(run.id, kCall, done); });
    EXPECT_TRUE(inspected) << inspected.error().message();
    if (inspected) run.inspect = *inspected;
    return run;
  }

  // Writes all of `data` without blocking the loop, then half-closes.
  void write_all(ExecStream& s, std::string const& data) {
    std::size_t off = 0;
    auto const until = Clock::now() + 60s;
    while (off < data.size() && Clock::now() < until) {
      auto const w = s.try_write(
          {reinterpret_cast<std::uint8_t const*>(data.data()) + off, data.size() - off});
      ASSERT_FALSE(w.closed) << "input closed after " << off << " bytes";
      off += w.written;
      if (w.would_block) {
        std::optional<Result<>> writable;
        s.await_writable([&](Result<> r) { writable = r; });
        while (!writable && Clock::now() < until) {
          io_.restart();
          io_.run_for(5ms);
        }
        ASSERT_TRUE(writable && *writable);
      }
    }
    ASSERT_EQ(off, data.size());
    ASSERT_TRUE(s.close_input());
  }

  boost::asio::io_context io_;
  std::optional<testing::RealEngine> engine_;
  std::optional<Client> client_;
};

INSTANTIATE_TEST_SUITE_P(Engines, RealEngineTest,
                         ::testing::Values(EngineKind::docker, EngineKind::podman),
                         [](auto const& p) { return std::string{to_string(p.param)}; });

std::string random_marker() {
  std::random_device rd;
  std::uniform_int_distribution<std::uint64_t> d;
  return "CUSTOS_ENGINE_TEST_MARKER=" + std::to_string(d(rd)) + std::to_string(d(rd));
}

TEST_P(RealEngineTest, NegotiatesTheApiVersion) {
  auto v = await<EngineVersion>([&](auto done) { client_->version(kCall, done); });
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(v->kind, GetParam());  // Podman says so in its components, Docker does not
  EXPECT_FALSE(v->version.empty());
  EXPECT_GE(v->negotiated, kMinApiVersion);
  EXPECT_LE(v->negotiated, kMaxApiVersion);
  EXPECT_LE(v->negotiated, v->api);
  EXPECT_GE(v->negotiated, v->min_api);
  EXPECT_EQ(v->negotiated, std::min(v->api, kMaxApiVersion));
  ASSERT_TRUE(client_->negotiated());
  EXPECT_EQ(*client_->negotiated(), v->negotiated);
  // A fresh client negotiates with _ping's Api-Version header and gets the same version.
  Client fresh{io_, Endpoint{GetParam(), engine_->socket}};
  auto p =
      await<void>([&](auto done) { fresh.resize_exec(std::string(64, 'f'), 1, 1, kCall, done); });
  ASSERT_FALSE(p);  // no such exec: but the call was made at the negotiated version
  ASSERT_TRUE(fresh.negotiated());
  EXPECT_EQ(*fresh.negotiated(), v->negotiated);
}

TEST_P(RealEngineTest, Pings) {
  auto p = await<void>([&](auto done) { client_->ping(kCall, done); });
  EXPECT_TRUE(p) << p.error().message();
}

TEST_P(RealEngineTest, InspectsTheRunningContainerAndItsInitOnTheHost) {
  for (auto const& ref : {engine_->running, engine_->running_id}) {
    auto info =
        await<ContainerInfo>([&](auto done) { client_->inspect_container(ref, kCall, done); });
    ASSERT_TRUE(info) << info.error().message();
    auto const& c = info->inspect;
    EXPECT_EQ(c.id, engine_->running_id);
    EXPECT_EQ(c.name, engine_->running);
    EXPECT_EQ(c.status, ContainerStatus::running);
    EXPECT_TRUE(c.accepts_exec());
    ASSERT_GT(c.pid, 0);
    ASSERT_TRUE(info->init) << (info->init_error ? info->init_error->message() : "");
    auto const& init = *info->init;
    EXPECT_EQ(init.pid, c.pid);
    EXPECT_EQ(init.identity.pid, c.pid);
    EXPECT_NE(init.identity.pidfs_ino, 0U);
    // The pid is a live host process: a pidfd opens on it and it is alive.
    auto pidfd = sys::Pidfd::open(c.pid);
    ASSERT_TRUE(pidfd) << pidfd.error().message();
    EXPECT_TRUE(pidfd->alive());
    // Its PID namespace is the container's, not ours.
    struct stat own {};
    ASSERT_EQ(::stat("/proc/self/ns/pid", &own), 0);
    EXPECT_NE(init.pid_namespace, own.st_ino);
    // The cgroup path exists on the host.
    ASSERT_FALSE(init.cgroup.empty());
    ASSERT_FALSE(init.cgroup_dir.empty());
    struct stat st {};
    EXPECT_EQ(::stat(init.cgroup_dir.c_str(), &st), 0) << init.cgroup_dir;
    EXPECT_TRUE(S_ISDIR(st.st_mode));
    if (GetParam() == EngineKind::docker) {
      // Docker on these hosts: /docker/<id> under the v2 mount, the container's own.
      EXPECT_EQ(init.cgroup, "/docker/" + c.id);
      EXPECT_TRUE(init.cgroup_own);
    } else {
      // Rootless Podman without cgroup delegation: the container has no cgroup of its own,
      // and the client says so rather than offering the service's cgroup as the container's.
      EXPECT_EQ(init.cgroup_own, cgroup_names_container(init.cgroup, c.id));
    }
  }
}

TEST_P(RealEngineTest, AMissingContainerIsNotFound) {
  auto info = await<ContainerInfo>([&](auto done) {
    client_->inspect_container("custos-engines-no-such-container", kCall, done);
  });
  ASSERT_FALSE(info);
  EXPECT_EQ(info.error().code, Errc::engine_container_not_found) << info.error().message();
  // The engine's own words are kept.
  EXPECT_NE(info.error().context.find("custos-engines-no-such-container"), std::string::npos)
      << info.error().context;
  auto exec = create(argv({"true"}), "custos-engines-no-such-container");
  ASSERT_FALSE(exec);
  EXPECT_EQ(exec.error().code, Errc::engine_container_not_found) << exec.error().message();
}

TEST_P(RealEngineTest, AStoppedContainerIsNotRunning) {
  auto info = await<ContainerInfo>(
      [&](auto done) { client_->inspect_container(engine_->stopped, kCall, done); });
  ASSERT_TRUE(info) << info.error().message();
  EXPECT_EQ(info->inspect.status, ContainerStatus::exited);
  EXPECT_FALSE(info->inspect.running);
  EXPECT_FALSE(info->inspect.accepts_exec());
  EXPECT_FALSE(info->init);
  auto exec = create(argv({"true"}), engine_->stopped);
  ASSERT_FALSE(exec);
  EXPECT_EQ(exec.error().code, Errc::engine_container_not_running) << exec.error().message();
  // Docker answers 409 "... is not running", Podman 500 "container state improper": both kept.
  auto const& ctx = exec.error().context;
  EXPECT_TRUE(ctx.find("not running") != std::string::npos ||
              ctx.find("running containers") != std::string::npos)
      << ctx;
}

TEST_P(RealEngineTest, ExecGivesExactOutputAndExitCode) {
  ExecConfig c;
  c.cmd = {"sh", "-c", "printf 'out\\001\\000x'; printf 'err line\\n' >&2; exit 7"};
  auto const run = run_exec(c);
  ASSERT_TRUE(run.end);
  EXPECT_EQ(run.end->kind, StreamEnd::Kind::eof)
      << (run.end->error ? run.end->error->message() : "");
  EXPECT_EQ(run.out, std::string("out\1\0x", 6));
  EXPECT_EQ(run.err, "err line\n");
  ASSERT_TRUE(run.inspect);
  EXPECT_FALSE(run.inspect->running);
  EXPECT_EQ(run.inspect->exit_code, 7);
  EXPECT_EQ(run.inspect->id, run.id);
  EXPECT_EQ(run.inspect->container_id, engine_->running_id);
}

TEST_P(RealEngineTest, ExecOutputAcrossManyFramesIsExact) {
  ExecConfig c;
  c.cmd = {"sh", "-c", "yes 0123456789abcdef | head -c 300000; yes E | head -c 70000 >&2"};
  auto const run = run_exec(c);
  ASSERT_TRUE(run.end);
  EXPECT_EQ(run.end->kind, StreamEnd::Kind::eof);
  ASSERT_EQ(run.out.size(), 300000U);
  std::string want;
  while (want.size() < 300000) want += "0123456789abcdef\n";
  want.resize(300000);
  EXPECT_EQ(run.out, want);
  std::string want_err;
  while (want_err.size() < 70000) want_err += "E\n";
  EXPECT_EQ(run.err, want_err);
  ASSERT_TRUE(run.inspect);
  EXPECT_EQ(run.inspect->exit_code, 0);
}

TEST_P(RealEngineTest, ExecTakesEnvUserAndWorkingDir) {
  ExecConfig c;
  c.cmd = {"sh", "-c", "echo \"$GREETING|$SPACED\"; id -u; id -g; pwd"};
  c.env = {"GREETING=hello", "SPACED=a  b"};
  c.user = "65534:65534";
  c.working_dir = "/tmp";
  auto const run = run_exec(c);
  EXPECT_EQ(run.out, "hello|a  b\n65534\n65534\n/tmp\n");
  EXPECT_EQ(run.err, "");
  ASSERT_TRUE(run.inspect);
  EXPECT_EQ(run.inspect->exit_code, 0);
}

TEST_P(RealEngineTest, AMissingProgramIsAnExitCodeNotAHang) {
  ExecConfig c;
  c.cmd = {"/no/such/program"};
  auto const run = run_exec(c);
  ASSERT_TRUE(run.end);
  ASSERT_TRUE(run.inspect);
  EXPECT_FALSE(run.inspect->running);
  // runc reports the failed execve as 126/127 (engines differ); never success.
  ASSERT_TRUE(run.inspect->exit_code);
  EXPECT_NE(*run.inspect->exit_code, 0);
}

TEST_P(RealEngineTest, StdinReachesCatAndItsEndIsEof) {
  std::string input;
  for (int i = 0; input.size() < 200000; ++i) input += "line " + std::to_string(i) + "\n";
  input += std::string("\0\1\2\377", 4);
  ExecConfig c;
  c.cmd = {"cat"};
  c.attach_stdin = true;
  auto const run = run_exec(c, input);
  ASSERT_TRUE(run.end);
  EXPECT_EQ(run.end->kind, StreamEnd::Kind::eof);
  EXPECT_EQ(run.out.size(), input.size());
  EXPECT_TRUE(run.out == input);
  ASSERT_TRUE(run.inspect);
  EXPECT_EQ(run.inspect->exit_code, 0);
}

TEST_P(RealEngineTest, TtyExecWithResizeAndItsHostPid) {
  auto const marker = random_marker();
  ExecConfig c;
  c.cmd = {"sh", "-c", "read line; stty size; echo \"got:$line\"; exit 3"};
  c.env = {marker};
  c.tty = true;
  c.attach_stdin = true;
  std::optional<ExecInspect> running;
  bool marker_seen = false;
  auto const run = run_exec(c, "", [&](ExecRun& r, ExecStream& s) {
    EXPECT_TRUE(s.tty());
    // The exec's first process, as the engine reports it, is a host pid: its environment
    // (read from the host's /proc) carries the marker this exec was given.
    auto const until = Clock::now() + 30s;
    while (Clock::now() < until) {
      auto i = await<ExecInspect>([&](auto done) { client_->inspect_exec(r.id, kCall, done); });
      ASSERT_TRUE(i) << i.error().message();
      if (i->running && i->pid > 0) {
        running = *i;
        break;
      }
      std::this_thread::sleep_for(10ms);
    }
    ASSERT_TRUE(running);
    EXPECT_TRUE(running->tty);
    EXPECT_FALSE(running->exit_code);
    std::ifstream env("/proc/" + std::to_string(running->pid) + "/environ", std::ios::binary);
    std::string const environ{std::istreambuf_iterator<char>{env},
                              std::istreambuf_iterator<char>{}};
    marker_seen = environ.find(marker + std::string(1, '\0')) != std::string::npos;
    auto resized =
        await<void>([&](auto done) { client_->resize_exec(r.id, 33, 101, kCall, done); });
    ASSERT_TRUE(resized) << resized.error().message();
    std::string_view const line = "hello\n";
    auto const w = s.try_write({reinterpret_cast<std::uint8_t const*>(line.data()), line.size()});
    EXPECT_EQ(w.written, line.size());
  });
  EXPECT_TRUE(marker_seen);
  ASSERT_TRUE(run.end);
  EXPECT_EQ(run.end->kind, StreamEnd::Kind::eof);
  // A terminal: everything on one raw stream, CRLF line ends, the input echoed.
  EXPECT_TRUE(run.err.empty());
  EXPECT_NE(run.out.find("hello\r\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("33 101\r\n"), std::string::npos) << run.out;
  EXPECT_NE(run.out.find("got:hello\r\n"), std::string::npos) << run.out;
  ASSERT_TRUE(run.inspect);
  EXPECT_EQ(run.inspect->exit_code, 3);
}

TEST_P(RealEngineTest, AnUnknownExecIsAFailureWithTheEnginesMessage) {
  std::string const id(64, 'f');
  auto i = await<ExecInspect>([&](auto done) { client_->inspect_exec(id, kCall, done); });
  ASSERT_FALSE(i);
  EXPECT_EQ(i.error().code, Errc::engine_failed);
  EXPECT_NE(i.error().context.find("HTTP 404"), std::string::npos) << i.error().context;
  EXPECT_NE(i.error().context.find(id), std::string::npos) << i.error().context;
  auto s = await<std::shared_ptr<ExecStream>>(
      [&](auto done) { client_->start_exec(id, false, kCall, done); });
  ASSERT_FALSE(s);
  EXPECT_EQ(s.error().code, Errc::engine_failed) << s.error().message();
  auto r = await<void>([&](auto done) { client_->resize_exec(id, 10, 10, kCall, done); });
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::engine_failed) << r.error().message();
}

TEST_P(RealEngineTest, ClosingTheStreamLeavesTheExecToItsOwner) {
  ExecConfig c;
  c.cmd = {"cat"};
  c.attach_stdin = true;
  auto id = create(c);
  ASSERT_TRUE(id) << id.error().message();
  auto stream = await<std::shared_ptr<ExecStream>>(
      [&](auto done) { client_->start_exec(*id, false, kCall, done); });
  ASSERT_TRUE(stream) << stream.error().message();
  std::optional<StreamEnd> end;
  (*stream)->start([](StdStream, std::span<std::uint8_t const>) {}, [&](StreamEnd e) { end = e; });
  io_.run_for(50ms);
  (*stream)->close();
  auto const until = Clock::now() + 10s;
  while (!end && Clock::now() < until) {
    io_.restart();
    io_.run_for(10ms);
  }
  ASSERT_TRUE(end);
  EXPECT_EQ(end->kind, StreamEnd::Kind::closed);
  // The engines end an exec whose attached stdin connection went away (cat reads EOF).
  auto done = await<ExecInspect>([&](auto d) { client_->wait_exec(*id, kCall, d); });
  ASSERT_TRUE(done) << done.error().message();
  EXPECT_FALSE(done->running);
}

}  // namespace
}  // namespace custos::engine
