// The asynchronous client against a scripted socket: deadlines on an engine that never
// answers, typed errors for garbage and oversized answers, version negotiation, the hijacked
// stream's framing and ends, cancel(), and that nothing completes inside the call that started
// it. Every test runs once as Docker and once as Podman (the client differs only in names).
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <thread>

#include "custos/engine/client.hpp"
#include "custos/engine/sync.hpp"

#include "fake_engine.hpp"

namespace custos::engine {
namespace {

ExecConfig argv(std::vector<std::string> a) {
  ExecConfig c;
  c.cmd = std::move(a);
  return c;
}

using namespace std::chrono_literals;
using testing::answer;
using testing::FakeEngine;
using testing::kVersionBody;
using Clock = std::chrono::steady_clock;

constexpr std::string_view kExecId =
    "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

class ClientFake : public ::testing::TestWithParam<EngineKind> {
 protected:
  // Runs the loop until `done` holds a value (at most `cap`).
  template <class T>
  void run_until(std::optional<T> const& done, std::chrono::milliseconds cap = 10s) {
    auto const until = Clock::now() + cap;
    while (!done && Clock::now() < until) {
      io_.restart();
      io_.run_for(10ms);
    }
    ASSERT_TRUE(done) << "no completion within " << cap.count() << " ms";
  }

  Client make(std::string const& path, Limits limits = {}) {
    return Client{io_, Endpoint{GetParam(), path}, limits};
  }

  boost::asio::io_context io_;
};

INSTANTIATE_TEST_SUITE_P(BothEngines, ClientFake,
                         ::testing::Values(EngineKind::docker, EngineKind::podman),
                         [](auto const& p) { return std::string{to_string(p.param)}; });

// Every operation of the client, each with `timeout`: the error of each.
std::vector<Error> every_call_fails(boost::asio::io_context& io, Client& c,
                                    std::chrono::milliseconds timeout) {
  std::vector<std::optional<Error>> got(7);
  auto keep = [&got](std::size_t i) {
    return [&got, i](auto r) {
      ASSERT_FALSE(r);
      got[i] = r.error();
    };
  };
  c.version(timeout, keep(0));
  c.ping(timeout, keep(1));
  c.inspect_container("ci", timeout, keep(2));
  c.create_exec("ci", argv({"true"}), timeout, keep(3));
  c.start_exec(std::string{kExecId}, false, timeout, keep(4));
  c.inspect_exec(std::string{kExecId}, timeout, keep(5));
  c.resize_exec(std::string{kExecId}, 24, 80, timeout, keep(6));
  auto const until = Clock::now() + timeout + 10s;
  auto all = [&got] {
    return std::all_of(got.begin(), got.end(), [](auto const& e) { return e.has_value(); });
  };
  while (!all() && Clock::now() < until) {
    io.restart();
    io.run_for(10ms);
  }
  std::vector<Error> out;
  for (auto& e : got) {
    EXPECT_TRUE(e);
    if (e) out.push_back(*e);
  }
  return out;
}

TEST_P(ClientFake, NoSocketIsUnavailable) {
  auto c = make("/nonexistent/custos/engine.sock");
  auto const errors = every_call_fails(io_, c, 2s);
  ASSERT_EQ(errors.size(), 7U);
  for (auto const& e : errors) {
    EXPECT_EQ(e.code, Errc::engine_unavailable) << e.message();
    EXPECT_EQ(e.sys_errno, ENOENT) << e.message();
    EXPECT_EQ(e.context.rfind(std::string{to_string(GetParam())}, 0), 0U) << e.context;
  }
}

TEST_P(ClientFake, UnusableSocketPathIsUnavailable) {
  for (std::string const& path : {std::string{}, "/tmp/" + std::string(200, 'x')}) {
    auto c = make(path);
    for (auto const& e : every_call_fails(io_, c, 2s)) {
      EXPECT_EQ(e.code, Errc::engine_unavailable) << e.message();
      EXPECT_NE(e.context.find("not a usable socket path"), std::string::npos) << e.context;
    }
  }
}

// A listener that never accepts: connect succeeds (the backlog), the request is written into
// the socket buffer, and no answer ever comes. Each call must end at its own deadline.
TEST_P(ClientFake, DeadlineOnAnEngineThatNeverAnswers) {
  FakeEngine silent{nullptr, /*accept=*/false};
  auto c = make(silent.path());
  auto const t0 = Clock::now();
  auto const errors = every_call_fails(io_, c, 300ms);
  auto const took = Clock::now() - t0;
  ASSERT_EQ(errors.size(), 7U);
  for (auto const& e : errors) {
    EXPECT_EQ(e.code, Errc::engine_unavailable) << e.message();
    EXPECT_NE(e.context.find("no answer within 300 ms"), std::string::npos) << e.context;
  }
  EXPECT_GE(took, 300ms);
  EXPECT_LT(took, 3s);
}

// A server that accepts and reads the request but never answers (a hung engine).
TEST_P(ClientFake, DeadlineOnAnEngineThatAcceptsButHangs) {
  FakeEngine hung{[](int fd, std::string const&) { FakeEngine::peer_closed_within(fd, 20000); }};
  auto c = make(hung.path());
  auto const t0 = Clock::now();
  for (auto const& e : every_call_fails(io_, c, 250ms)) {
    EXPECT_EQ(e.code, Errc::engine_unavailable) << e.message();
    EXPECT_NE(e.context.find("no answer within 250 ms"), std::string::npos) << e.context;
  }
  EXPECT_LT(Clock::now() - t0, 3s);
}

TEST_P(ClientFake, GarbageIsAFailureNotACrash) {
  FakeEngine garbage{[](int fd, std::string const&) {
    FakeEngine::send_all(fd, "SSH-2.0-OpenSSH_9.2\r\n\r\n\x01\x02\x03 garbage");
  }};
  auto c = make(garbage.path());
  for (auto const& e : every_call_fails(io_, c, 5s)) {
    EXPECT_EQ(e.code, Errc::engine_failed) << e.message();
    EXPECT_NE(e.context.find("malformed HTTP response"), std::string::npos) << e.context;
  }
}

TEST_P(ClientFake, EndlessHeaderStopsAtTheLimit) {
  std::atomic<bool> cut_off{false};
  FakeEngine endless{[&cut_off](int fd, std::string const&) {
    FakeEngine::send_all(fd, "HTTP/1.1 200 OK\r\n");
    // Header lines until the client hangs up (a write then fails).
    for (int i = 0; i < 1000000; ++i) {
      if (!FakeEngine::send_all(
              fd, "X-Padding-" + std::to_string(i) + ": " + std::string(100, 'p') + "\r\n")) {
        cut_off = true;
        return;
      }
    }
  }};
  Limits limits;
  limits.header_bytes = 8192;
  auto c = make(endless.path(), limits);
  for (auto const& e : every_call_fails(io_, c, 5s)) {
    EXPECT_EQ(e.code, Errc::engine_failed) << e.message();
    EXPECT_NE(e.context.find("header exceeds 8192 bytes"), std::string::npos) << e.context;
  }
  // The client hung up: the server's writes failed (it did not fill memory on our side).
  auto const until = Clock::now() + 5s;
  while (!cut_off && Clock::now() < until) std::this_thread::sleep_for(10ms);
  EXPECT_TRUE(cut_off);
}

TEST_P(ClientFake, OversizedBodyStopsAtTheLimit) {
  FakeEngine big{[](int fd, std::string const&) {
    FakeEngine::send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 100000000\r\n\r\n");
    std::string const block(65536, '{');
    for (int i = 0; i < 2000 && FakeEngine::send_all(fd, block); ++i) {
    }
  }};
  Limits limits;
  limits.body_bytes = 100000;
  auto c = make(big.path(), limits);
  std::optional<Result<ContainerInfo>> got;
  c.inspect_container("ci", 5s, [&](Result<ContainerInfo> r) { got = std::move(r); });
  // The version call answers with the same oversized body, so the negotiation fails first.
  run_until(got);
  ASSERT_FALSE(*got);
  EXPECT_EQ(got->error().code, Errc::engine_failed);
  EXPECT_NE(got->error().context.find("body exceeds 100000 bytes"), std::string::npos)
      << got->error().context;
}

TEST_P(ClientFake, ClosedWithoutAnswerIsUnavailableTruncatedIsFailed) {
  FakeEngine closer{[](int, std::string const&) {}};
  auto c = make(closer.path());
  for (auto const& e : every_call_fails(io_, c, 5s)) {
    EXPECT_EQ(e.code, Errc::engine_unavailable) << e.message();
    EXPECT_NE(e.context.find("closed the connection without answering"), std::string::npos)
        << e.context;
  }
  FakeEngine truncated{[](int fd, std::string const&) {
    FakeEngine::send_all(fd, "HTTP/1.1 200 OK\r\nContent-Length: 50\r\n\r\n{\"Id\":");
  }};
  auto t = make(truncated.path());
  for (auto const& e : every_call_fails(io_, t, 5s)) {
    EXPECT_EQ(e.code, Errc::engine_failed) << e.message();
  }
}

// An engine answering _ping (with `ping_api` as its Api-Version header, none when empty) and
// /version, and the rest with `rest` (a function of the request line).
FakeEngine versioned_engine(std::string ping_api, std::string version_body,
                            std::function<std::string(std::string const&)> rest) {
  return FakeEngine{[ping_api = std::move(ping_api), version_body = std::move(version_body),
                     rest = std::move(rest)](int fd, std::string const& req) {
    auto const line = req.substr(0, req.find("\r\n"));
    if (line.rfind("GET /_ping ", 0) == 0) {
      FakeEngine::send_all(
          fd, answer(200, "OK", "OK", ping_api.empty() ? "" : "Api-Version: " + ping_api + "\r\n"));
      return;
    }
    if (line.rfind("GET /version ", 0) == 0) {
      FakeEngine::send_all(fd, answer(200, "OK", version_body));
      return;
    }
    FakeEngine::send_all(fd, rest(line));
  }};
}

FakeEngine ok_engine(std::function<std::string(std::string const&)> rest) {
  return versioned_engine("1.41", std::string{kVersionBody}, std::move(rest));
}

TEST_P(ClientFake, NegotiatesOnceWithPingAndSpeaksTheCommonVersion) {
  auto engine = versioned_engine("1.45", std::string{kVersionBody}, [](std::string const&) {
    return answer(200, "OK", R"({"Id":"abc","Name":"/ci","State":{}})");
  });
  auto c = make(engine.path());
  std::optional<Result<ContainerInfo>> a;
  std::optional<Result<ContainerInfo>> b;
  c.inspect_container("ci", 5s, [&](Result<ContainerInfo> r) { a = std::move(r); });
  c.inspect_container("ci", 5s, [&](Result<ContainerInfo> r) { b = std::move(r); });
  run_until(a);
  run_until(b);
  ASSERT_TRUE(*a) << a->error().message();
  ASSERT_TRUE(*b) << b->error().message();
  ASSERT_TRUE(c.negotiated());
  EXPECT_EQ(*c.negotiated(), kMaxApiVersion);
  int pings = 0;
  int versions = 0;
  int inspects = 0;
  for (auto const& r : engine.requests()) {
    if (r.rfind("GET /_ping HTTP/1.1\r\n", 0) == 0) ++pings;
    if (r.rfind("GET /version HTTP/1.1\r\n", 0) == 0) ++versions;
    if (r.rfind("GET /v" + kMaxApiVersion.str() + "/containers/ci/json HTTP/1.1\r\n", 0) == 0) {
      ++inspects;
    }
    // Every request names a host, and the plain calls close their connection.
    EXPECT_NE(r.find("Host: localhost\r\n"), std::string::npos) << r;
    EXPECT_NE(r.find("Connection: close\r\n"), std::string::npos) << r;
  }
  EXPECT_EQ(pings, 1);
  EXPECT_EQ(versions, 0);
  EXPECT_EQ(inspects, 2);
}

TEST_P(ClientFake, AnEngineWithoutThePingHeaderIsAskedItsVersion) {
  auto engine =
      versioned_engine("", R"({"ApiVersion":"1.40","MinAPIVersion":"1.24"})",
                       [](std::string const&) { return answer(200, "OK", R"({"Id":"ab"})"); });
  auto c = make(engine.path());
  std::optional<Result<std::string>> got;
  c.create_exec("ci", argv({"true"}), 5s, [&](Result<std::string> r) { got = std::move(r); });
  run_until(got);
  ASSERT_TRUE(*got) << got->error().message();
  EXPECT_EQ(**got, "ab");
  auto const reqs = engine.requests();
  ASSERT_EQ(reqs.size(), 3U);
  EXPECT_EQ(reqs[0].rfind("GET /_ping ", 0), 0U);
  EXPECT_EQ(reqs[1].rfind("GET /version ", 0), 0U);
  EXPECT_EQ(reqs[2].rfind("POST /v1.40/containers/ci/exec ", 0), 0U) << reqs[2];
  EXPECT_NE(reqs[2].find("Content-Type: application/json\r\n"), std::string::npos);
  EXPECT_NE(reqs[2].find(R"({"Cmd":["true"])"), std::string::npos) << reqs[2];
}

TEST_P(ClientFake, AnEngineTooOldIsRefusedAndAskedAgainLater) {
  auto engine = versioned_engine("1.30", R"({"ApiVersion":"1.30","MinAPIVersion":"1.12"})",
                                 [](std::string const&) { return answer(500, "No", "{}"); });
  auto c = make(engine.path());
  for (int round = 0; round < 2; ++round) {
    std::optional<Result<std::string>> got;
    c.create_exec("ci", argv({"true"}), 5s, [&](Result<std::string> r) { got = std::move(r); });
    run_until(got);
    ASSERT_FALSE(*got);
    EXPECT_EQ(got->error().code, Errc::engine_failed);
    EXPECT_NE(got->error().context.find("no common API version"), std::string::npos)
        << got->error().context;
    EXPECT_NE(got->error().context.find("up to 1.30"), std::string::npos) << got->error().context;
  }
  EXPECT_EQ(engine.requests().size(), 2U);  // two pings, no exec create
  // GET /version says the same.
  std::optional<Result<EngineVersion>> v;
  c.version(5s, [&](Result<EngineVersion> r) { v = std::move(r); });
  run_until(v);
  ASSERT_FALSE(*v);
  EXPECT_NE(v->error().context.find("1.12 to 1.30"), std::string::npos) << v->error().context;
}

TEST_P(ClientFake, InvalidNamesNeverReachTheEngine) {
  auto engine = ok_engine([](std::string const&) { return answer(200, "OK", "{}"); });
  auto c = make(engine.path());
  std::optional<Result<ContainerInfo>> a;
  c.inspect_container("../../version", 5s, [&](Result<ContainerInfo> r) { a = std::move(r); });
  std::optional<Result<std::string>> b;
  c.create_exec("ci?x=1", argv({"true"}), 5s, [&](Result<std::string> r) { b = std::move(r); });
  std::optional<Result<ExecInspect>> d;
  c.inspect_exec("../containers/ci", 5s, [&](Result<ExecInspect> r) { d = std::move(r); });
  run_until(a);
  run_until(b);
  run_until(d);
  EXPECT_EQ(a->error().code, Errc::engine_container_not_found);
  EXPECT_EQ(b->error().code, Errc::engine_container_not_found);
  EXPECT_EQ(d->error().code, Errc::engine_failed);
  EXPECT_EQ(engine.connections(), 0);
}

TEST_P(ClientFake, NothingCompletesInsideTheCallThatStartedIt) {
  auto engine = ok_engine([](std::string const&) { return answer(200, "OK", "OK"); });
  auto c = make(engine.path());
  bool inside = true;
  std::optional<bool> completed_inside;
  c.inspect_container("not a name", 5s, [&](auto) { completed_inside = inside; });
  inside = false;
  run_until(completed_inside);
  EXPECT_FALSE(*completed_inside);
  // Also once the version is known (the call then needs no I/O before its request).
  std::optional<Result<EngineVersion>> v;
  c.version(5s, [&](Result<EngineVersion> r) { v = std::move(r); });
  run_until(v);
  ASSERT_TRUE(*v);
  inside = true;
  completed_inside.reset();
  c.resize_exec(std::string{kExecId}, 1, 1, 5s, [&](auto) { completed_inside = inside; });
  inside = false;
  run_until(completed_inside);
  EXPECT_FALSE(*completed_inside);
}

TEST_P(ClientFake, CancelEndsEveryCallInFlight) {
  FakeEngine hung{[](int fd, std::string const&) { FakeEngine::peer_closed_within(fd, 20000); }};
  auto c = make(hung.path());
  std::optional<Error> v;
  std::optional<Error> i;
  c.version(30s, [&](auto r) { v = r.error(); });
  c.inspect_container("ci", 30s, [&](auto r) { i = r.error(); });
  io_.run_for(100ms);
  EXPECT_FALSE(v);
  auto const t0 = Clock::now();
  c.cancel();
  run_until(v);
  run_until(i);
  EXPECT_LT(Clock::now() - t0, 2s);
  EXPECT_EQ(v->code, Errc::engine_unavailable);
  EXPECT_NE(v->context.find("cancelled"), std::string::npos) << v->context;
  EXPECT_EQ(i->code, Errc::engine_unavailable);
}

// ---- the hijacked stream ------------------------------------------------------------------

constexpr std::string_view kUpgraded =
    "HTTP/1.1 101 UPGRADED\r\nContent-Type: application/vnd.docker.raw-stream\r\n"
    "Connection: Upgrade\r\nUpgrade: tcp\r\n\r\n";

std::string frame(StdStream s, std::string_view payload) {
  auto f =
      encode_frame(s, std::span<std::uint8_t const>{
                          reinterpret_cast<std::uint8_t const*>(payload.data()), payload.size()});
  return std::string(f.begin(), f.end());
}

struct Collected {
  std::string out;
  std::string err;
  std::optional<StreamEnd> end;
  int ends = 0;
};

// Starts `stream`, collecting what it delivers (and its end) into `col`.
void collect(ExecStream& stream, Collected& col) {
  stream.start(
      [&col](StdStream s, std::span<std::uint8_t const> b) {
        (s == StdStream::err ? col.err : col.out).append(b.begin(), b.end());
      },
      [&col](StreamEnd e) {
        col.end = std::move(e);
        ++col.ends;
      });
}

// Starts exec `kExecId` on `engine` and collects its stream until it ends.
Collected run_stream(boost::asio::io_context& io, Client& c, bool tty,
                     std::function<void(ExecStream&)> after_start = nullptr) {
  Collected col;
  std::optional<Result<std::shared_ptr<ExecStream>>> started;
  c.start_exec(std::string{kExecId}, tty, 5s,
               [&](Result<std::shared_ptr<ExecStream>> r) { started = std::move(r); });
  auto const until = Clock::now() + 10s;
  while (!started && Clock::now() < until) {
    io.restart();
    io.run_for(10ms);
  }
  EXPECT_TRUE(started && *started) << (started && !*started ? started->error().message() : "");
  if (!started || !*started) return col;
  auto stream = **started;
  collect(*stream, col);
  if (after_start) after_start(*stream);
  while (!col.end && Clock::now() < until) {
    io.restart();
    io.run_for(10ms);
  }
  // Nothing more may come after the end.
  io.restart();
  io.run_for(20ms);
  return col;
}

FakeEngine streaming_engine(std::function<void(int)> stream) {
  return FakeEngine{[stream = std::move(stream)](int fd, std::string const& req) {
    if (req.rfind("GET /_ping ", 0) == 0) {
      FakeEngine::send_all(fd, answer(200, "OK", "OK", "Api-Version: 1.41\r\n"));
      return;
    }
    EXPECT_EQ(req.rfind("POST /v1.41/exec/" + std::string{kExecId} + "/start HTTP/1.1\r\n", 0), 0U)
        << req;
    EXPECT_NE(req.find("Upgrade: tcp\r\n"), std::string::npos);
    EXPECT_NE(req.find("Connection: Upgrade\r\n"), std::string::npos);
    stream(fd);
  }};
}

TEST_P(ClientFake, StreamDemuxesBytesThatCameWithTheHeaderAndAfter) {
  auto engine = streaming_engine([](int fd) {
    // The first frames in the same write as the header: they reach the client as "early" bytes.
    FakeEngine::send_all(fd, std::string{kUpgraded} + frame(StdStream::out, "first ") +
                                 frame(StdStream::err, "warn"));
    std::this_thread::sleep_for(20ms);
    auto const tail = frame(StdStream::out, "second") + frame(StdStream::err, "!");
    for (char ch : tail) {  // byte by byte: every split of headers and payloads
      FakeEngine::send_all(fd, std::string_view{&ch, 1});
    }
  });
  auto c = make(engine.path());
  auto const col = run_stream(io_, c, false);
  ASSERT_TRUE(col.end);
  EXPECT_EQ(col.end->kind, StreamEnd::Kind::eof);
  EXPECT_EQ(col.out, "first second");
  EXPECT_EQ(col.err, "warn!");
  EXPECT_EQ(col.ends, 1);
}

TEST_P(ClientFake, TtyStreamIsRawBytes) {
  static std::string const raw("raw \x01\x00 bytes\r\n", 14);
  auto engine =
      streaming_engine([](int fd) { FakeEngine::send_all(fd, std::string{kUpgraded} + raw); });
  auto c = make(engine.path());
  auto const col = run_stream(io_, c, true);
  ASSERT_TRUE(col.end);
  EXPECT_EQ(col.end->kind, StreamEnd::Kind::eof);
  EXPECT_EQ(col.out, raw);
  EXPECT_TRUE(col.err.empty());
}

TEST_P(ClientFake, MalformedStreamsEndFailed) {
  struct Case {
    std::string wire;
    std::string want;
  };
  Case const cases[] = {
      {"plain text instead of frames", "not a multiplexed stream"},
      {frame(StdStream::out, "ok") + frame(StdStream::out, "cut").substr(0, 9),
       "ended inside a frame"},
      {frame(StdStream::out, "x") + frame(StdStream::system, "exec failed: no such file"),
       "the engine reported in the stream: exec failed: no such file"},
      {std::string("\x01\x00\x00\x00\x7f\xff\xff\xff", 8), "exceeds the limit"},
  };
  for (auto const& k : cases) {
    auto engine = streaming_engine(
        [&k](int fd) { FakeEngine::send_all(fd, std::string{kUpgraded} + k.wire); });
    auto c = make(engine.path());
    auto const col = run_stream(io_, c, false);
    ASSERT_TRUE(col.end);
    EXPECT_EQ(col.end->kind, StreamEnd::Kind::failed) << k.want;
    ASSERT_TRUE(col.end->error);
    EXPECT_EQ(col.end->error->code, Errc::engine_failed);
    EXPECT_NE(col.end->error->context.find(k.want), std::string::npos) << col.end->error->context;
    EXPECT_EQ(col.ends, 1);
  }
}

TEST_P(ClientFake, RefusedStartsKeepTheEngineMessage) {
  struct Case {
    std::string answer;
    Errc want;
    std::string message;
  };
  Case const cases[] = {
      {answer(404, "Not Found", R"({"message":"No such exec instance: x"})"), Errc::engine_failed,
       "No such exec instance: x"},
      {answer(409, "Conflict", R"({"message":"Container ci is not running"})"),
       Errc::engine_container_not_running, "Container ci is not running"},
      {answer(500, "Internal",
              R"({"cause":"container state improper","message":"stopped","response":500})"),
       Errc::engine_container_not_running, "stopped"},
  };
  for (auto const& k : cases) {
    auto engine = streaming_engine([&k](int fd) { FakeEngine::send_all(fd, k.answer); });
    auto c = make(engine.path());
    std::optional<Result<std::shared_ptr<ExecStream>>> started;
    c.start_exec(std::string{kExecId}, false, 5s,
                 [&](Result<std::shared_ptr<ExecStream>> r) { started = std::move(r); });
    run_until(started);
    ASSERT_FALSE(*started);
    EXPECT_EQ(started->error().code, k.want);
    EXPECT_NE(started->error().context.find(k.message), std::string::npos)
        << started->error().context;
  }
}

TEST_P(ClientFake, InputIsWrittenAndHalfClosedWhileOutputFlows) {
  std::atomic<bool> saw_input_eof{false};
  auto engine = streaming_engine([&](int fd) {
    FakeEngine::send_all(fd, kUpgraded);
    // Read the input up to its end (the client's half-close), then answer on the same
    // connection: the output side is still open.
    std::string got;
    char buf[256];
    while (true) {
      ssize_t const n = ::read(fd, buf, sizeof buf);
      if (n <= 0) break;
      got.append(buf, static_cast<std::size_t>(n));
    }
    saw_input_eof = true;
    FakeEngine::send_all(fd, frame(StdStream::out, "got:" + got));
  });
  auto c = make(engine.path());
  auto const col = run_stream(io_, c, false, [](ExecStream& s) {
    std::string_view const msg = "ping";
    auto const w = s.try_write({reinterpret_cast<std::uint8_t const*>(msg.data()), msg.size()});
    EXPECT_EQ(w.written, 4U);
    EXPECT_FALSE(w.would_block);
    EXPECT_TRUE(s.close_input());
    EXPECT_TRUE(s.close_input());  // idempotent
    EXPECT_TRUE(s.try_write({reinterpret_cast<std::uint8_t const*>(msg.data()), 1}).closed);
  });
  EXPECT_TRUE(saw_input_eof);
  ASSERT_TRUE(col.end);
  EXPECT_EQ(col.end->kind, StreamEnd::Kind::eof);
  EXPECT_EQ(col.out, "got:ping");
}

// A handover: the stream is released mid-frame (in a payload, or in a header) and resumed on
// the same connection from its state by another client; every byte arrives once, in order, and
// input written through the resumed stream reaches the engine.
TEST_P(ClientFake, AReleasedStreamGoesOnExactlyWhereItStood) {
  auto const whole = frame(StdStream::out, "first second");
  auto const warn = frame(StdStream::err, "warn");
  struct Cut {
    std::string before;  // sent before the release
    std::string after;   // sent once the engine read the input of the resumed stream
  };
  Cut const cuts[] = {
      {whole.substr(0, 8 + 6), whole.substr(8 + 6) + warn},  // inside a payload
      {frame(StdStream::out, "first ") + warn.substr(0, 3),  // inside a header
       warn.substr(3) + frame(StdStream::out, "second")},
  };
  for (auto const& cut : cuts) {
    auto engine = streaming_engine([&cut](int fd) {
      FakeEngine::send_all(fd, std::string{kUpgraded} + cut.before);
      std::string got;
      char buf[64];
      timeval tv{0, 20000};
      ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      auto const until = Clock::now() + 10s;
      while (got.size() < 4 && Clock::now() < until) {
        ssize_t const n = ::read(fd, buf, sizeof buf);
        if (n == 0) return;
        if (n > 0) got.append(buf, static_cast<std::size_t>(n));
      }
      FakeEngine::send_all(fd, cut.after + frame(StdStream::out, "got:" + got));
    });
    auto c = make(engine.path());
    std::optional<Result<std::shared_ptr<ExecStream>>> started;
    c.start_exec(std::string{kExecId}, false, 5s,
                 [&](Result<std::shared_ptr<ExecStream>> r) { started = std::move(r); });
    run_until(started);
    ASSERT_TRUE(*started);
    auto first = **started;
    Collected col;
    std::optional<StreamEnd> first_end;  // the first stream's (its output goes on in `col`)
    first->start(
        [&col](StdStream st, std::span<std::uint8_t const> b) {
          (st == StdStream::err ? col.err : col.out).append(b.begin(), b.end());
        },
        [&first_end](StreamEnd e) { first_end = std::move(e); });
    auto const until = Clock::now() + 5s;
    while (col.out != "first " && Clock::now() < until) {
      io_.restart();
      io_.run_for(10ms);
    }
    ASSERT_EQ(col.out, "first ");
    io_.restart();
    io_.run_for(50ms);  // anything else sent before the release is read now
    auto released = first->release();
    ASSERT_TRUE(released) << released.error().message();
    EXPECT_FALSE(first->release()) << "a stream is released once";
    EXPECT_TRUE(released->connection.valid());
    EXPECT_FALSE(released->state.tty);
    EXPECT_FALSE(released->state.input_closed);
    run_until(first_end);
    EXPECT_EQ(first_end->kind, StreamEnd::Kind::closed);

    Client other{io_, Endpoint{GetParam(), engine.path()}};
    auto resumed = other.resume_stream(std::string{kExecId}, std::move(released->connection),
                                       std::move(released->state));
    ASSERT_TRUE(resumed) << resumed.error().message();
    auto second = *resumed;
    collect(*second, col);
    std::string_view const msg = "ping";
    EXPECT_EQ(
        second->try_write({reinterpret_cast<std::uint8_t const*>(msg.data()), msg.size()}).written,
        4U);
    run_until(col.end);
    EXPECT_EQ(col.end->kind, StreamEnd::Kind::eof);
    EXPECT_EQ(col.out, "first secondgot:ping");
    EXPECT_EQ(col.err, "warn");
    EXPECT_EQ(col.ends, 1);
  }
}

TEST_P(ClientFake, AResumedStreamRefusesAStateNoDemuxerCanBeAt) {
  int sv[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv), 0);
  sys::UniqueFd keep{sv[1]};
  ExecStreamState bad;
  bad.position.header = std::vector<std::uint8_t>(8, 0);
  Client c{io_, Endpoint{GetParam(), "/nonexistent"}};
  auto r = c.resume_stream(std::string{kExecId}, sys::UniqueFd{sv[0]}, bad);
  ASSERT_FALSE(r);
  EXPECT_EQ(r.error().code, Errc::engine_failed);
  auto r2 = c.resume_stream("not-an-exec", sys::UniqueFd{::dup(sv[1])}, ExecStreamState{});
  ASSERT_FALSE(r2);
  EXPECT_EQ(r2.error().code, Errc::engine_failed);
}

TEST_P(ClientFake, CloseEndsTheStreamOnceAndCancelsAWait) {
  auto engine = streaming_engine([](int fd) {
    FakeEngine::send_all(fd, std::string{kUpgraded} + frame(StdStream::out, "hello"));
    FakeEngine::peer_closed_within(fd, 10000);  // hold the stream open
  });
  auto c = make(engine.path());
  std::optional<Result<std::shared_ptr<ExecStream>>> started;
  c.start_exec(std::string{kExecId}, false, 5s,
               [&](Result<std::shared_ptr<ExecStream>> r) { started = std::move(r); });
  run_until(started);
  ASSERT_TRUE(*started);
  auto stream = **started;
  std::string out;
  std::optional<StreamEnd> end;
  int ends = 0;
  stream->start([&](StdStream, std::span<std::uint8_t const> b) { out.append(b.begin(), b.end()); },
                [&](StreamEnd e) {
                  end = e;
                  ++ends;
                });
  auto const until = Clock::now() + 5s;
  while (out != "hello" && Clock::now() < until) {
    io_.restart();
    io_.run_for(10ms);
  }
  EXPECT_EQ(out, "hello");
  std::optional<Result<>> wait;
  // The socket is writable at once; fill nothing, just check a wait after close() fails.
  stream->close();
  stream->close();
  EXPECT_FALSE(end) << "close() must not call back from inside itself";
  stream->await_writable([&](Result<> r) { wait = r; });
  run_until(end);
  run_until(wait);
  io_.restart();
  io_.run_for(20ms);
  EXPECT_EQ(end->kind, StreamEnd::Kind::closed);
  EXPECT_EQ(ends, 1);
  EXPECT_FALSE(*wait);
  EXPECT_TRUE(stream->try_write({}).closed);
  EXPECT_FALSE(stream->close_input());
}

TEST_P(ClientFake, SyncClientRunsEachCallToItsEnd) {
  auto engine = ok_engine([](std::string const&) {
    return answer(404, "Not Found", R"({"message":"No such container: ci"})");
  });
  SyncClient s{Endpoint{GetParam(), engine.path()}};
  auto v = s.version(5s);
  ASSERT_TRUE(v) << v.error().message();
  EXPECT_EQ(v->version, "99.0");
  EXPECT_TRUE(s.ping(5s));
  auto i = s.inspect_container("ci", 5s);
  ASSERT_FALSE(i);
  EXPECT_EQ(i.error().code, Errc::engine_container_not_found);
  EXPECT_NE(i.error().context.find("No such container: ci"), std::string::npos);
  FakeEngine silent{nullptr, false};
  SyncClient quiet{Endpoint{GetParam(), silent.path()}};
  auto const t0 = Clock::now();
  auto p = quiet.ping(200ms);
  ASSERT_FALSE(p);
  EXPECT_EQ(p.error().code, Errc::engine_unavailable);
  EXPECT_LT(Clock::now() - t0, 2s);
}

}  // namespace
}  // namespace custos::engine
