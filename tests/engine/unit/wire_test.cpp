// The pure wire half of the engine client: versions, answer bodies of both engines (captured),
// request bodies and targets, and the classification of every refusal into its engine.* code.
#include "custos/engine/wire.hpp"

#include <boost/json/parse.hpp>
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <string>

#include "captured.hpp"

namespace custos::engine {
namespace {

ExecConfig argv(std::vector<std::string> a) {
  ExecConfig c;
  c.cmd = std::move(a);
  return c;
}

using testing::captured_response;

TEST(ApiVersionTest, ParsesOnlyMajorDotMinor) {
  EXPECT_EQ(parse_api_version("1.41"), (ApiVersion{1, 41}));
  EXPECT_EQ(parse_api_version("1.0"), (ApiVersion{1, 0}));
  EXPECT_EQ(parse_api_version("65535.65535"), (ApiVersion{65535, 65535}));
  for (char const* bad : {"", "1", "1.", ".4", "1.41.2", "v1.41", "1.-1", "+1.4", " 1.4", "1.4 ",
                          "65536.1", "1.000041", "1,41", "a.b"}) {
    EXPECT_FALSE(parse_api_version(bad)) << bad;
  }
  EXPECT_EQ((ApiVersion{1, 41}).str(), "1.41");
  EXPECT_LT((ApiVersion{1, 9}), (ApiVersion{1, 10}));
  EXPECT_LT((ApiVersion{1, 99}), (ApiVersion{2, 0}));
}

RC_GTEST_PROP(ApiVersionTest, StrRoundTrips, (std::uint16_t major, std::uint16_t minor)) {
  ApiVersion const v{major, minor};
  RC_ASSERT(parse_api_version(v.str()) == v);
}

TEST(Negotiate, SpeaksTheOlderOfTheTwoNewest) {
  EXPECT_EQ(negotiate({1, 41}, {1, 12}).value(), (ApiVersion{1, 41}));
  EXPECT_EQ(negotiate({1, 47}, {1, 24}).value(), kMaxApiVersion);
  EXPECT_EQ(negotiate(kMinApiVersion, kMinApiVersion).value(), kMinApiVersion);
}

TEST(Negotiate, RefusesWithoutACommonVersion) {
  auto too_old = negotiate({1, 30}, {1, 12});
  ASSERT_FALSE(too_old);
  EXPECT_EQ(too_old.error().code, Errc::engine_failed);
  EXPECT_NE(too_old.error().context.find("1.12 to 1.30"), std::string::npos);
  // An engine that no longer serves anything custos speaks.
  auto too_new = negotiate({2, 10}, {2, 0});
  ASSERT_FALSE(too_new);
  EXPECT_EQ(too_new.error().code, Errc::engine_failed);
}

TEST(ParseVersion, DockerAndPodmanAsTheyAnswer) {
  auto d = parse_version(captured_response("docker-version.http").body);
  ASSERT_TRUE(d) << d.error().message();
  EXPECT_EQ(d->kind, EngineKind::docker);
  EXPECT_EQ(d->product, "Engine");
  EXPECT_EQ(d->version, "20.10.24+dfsg1");
  EXPECT_EQ(d->api, (ApiVersion{1, 41}));
  EXPECT_EQ(d->min_api, (ApiVersion{1, 12}));
  EXPECT_EQ(d->negotiated, (ApiVersion{1, 41}));
  EXPECT_EQ(d->os, "linux");

  auto p = parse_version(captured_response("podman-version.http").body);
  ASSERT_TRUE(p) << p.error().message();
  EXPECT_EQ(p->kind, EngineKind::podman);
  EXPECT_EQ(p->product, "Podman Engine");
  EXPECT_EQ(p->version, "4.3.1");
  EXPECT_EQ(p->api, (ApiVersion{1, 41}));
  EXPECT_EQ(p->min_api, (ApiVersion{1, 24}));
  EXPECT_EQ(p->negotiated, (ApiVersion{1, 41}));
}

TEST(ParseVersion, RefusesWhatIsNotAVersion) {
  for (char const* bad :
       {"", "OK", "[]", "{}", R"({"ApiVersion": 1.41})", R"({"ApiVersion": "one"})",
        R"({"ApiVersion": "1.20", "MinAPIVersion": "1.12"})"}) {
    auto r = parse_version(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, Errc::engine_failed) << bad;
  }
  // Without MinAPIVersion the engine speaks only its own version.
  auto only = parse_version(R"({"ApiVersion": "1.40"})");
  ASSERT_TRUE(only);
  EXPECT_EQ(only->min_api, (ApiVersion{1, 40}));
  EXPECT_EQ(only->negotiated, (ApiVersion{1, 40}));
}

TEST(ParseContainerInspect, RunningContainersOfBothEngines) {
  for (char const* name : {"docker-inspect-running.http", "podman-inspect-running.http"}) {
    SCOPED_TRACE(name);
    auto c = parse_container_inspect(captured_response(name).body);
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_EQ(c->id.size(), 64U);
    EXPECT_EQ(c->name, "custos-engines-run");
    EXPECT_EQ(c->status, ContainerStatus::running);
    EXPECT_EQ(c->status_text, "running");
    EXPECT_TRUE(c->running);
    EXPECT_FALSE(c->paused);
    EXPECT_GT(c->pid, 0);
    EXPECT_TRUE(c->accepts_exec());
    EXPECT_FALSE(c->started_at.empty());
  }
}

TEST(ParseContainerInspect, ExitedContainersOfBothEngines) {
  for (char const* name : {"docker-inspect-exited.http", "podman-inspect-exited.http"}) {
    SCOPED_TRACE(name);
    auto c = parse_container_inspect(captured_response(name).body);
    ASSERT_TRUE(c) << c.error().message();
    EXPECT_EQ(c->name, "custos-engines-stopped");
    EXPECT_EQ(c->status, ContainerStatus::exited);
    EXPECT_FALSE(c->running);
    EXPECT_EQ(c->pid, 0);
    EXPECT_FALSE(c->accepts_exec());
  }
}

TEST(ParseContainerInspect, StatesAndMalformedBodies) {
  auto paused = parse_container_inspect(
      R"({"Id":"abc","Name":"/x","State":{"Status":"paused","Running":true,"Paused":true,"Pid":7}})");
  ASSERT_TRUE(paused);
  EXPECT_EQ(paused->status, ContainerStatus::paused);
  EXPECT_EQ(paused->name, "x");
  EXPECT_FALSE(paused->accepts_exec());
  auto odd = parse_container_inspect(R"({"Id":"abc","State":{"Status":"hibernating"}})");
  ASSERT_TRUE(odd);
  EXPECT_EQ(odd->status, ContainerStatus::unknown);
  EXPECT_EQ(odd->status_text, "hibernating");
  // A pid of the wrong type or range is not a pid.
  auto bad_pid = parse_container_inspect(R"({"Id":"abc","State":{"Running":true,"Pid":-5}})");
  ASSERT_TRUE(bad_pid);
  EXPECT_EQ(bad_pid->pid, 0);
  for (char const* bad : {"", "null", "[]", R"({"Id":"abc"})", R"({"State":{}})",
                          R"({"Id":7,"State":{}})", R"({"Id":"abc","State":[]})"}) {
    auto r = parse_container_inspect(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, Errc::engine_failed);
  }
}

TEST(ParseExecInspect, DockerReportsNullWhileRunningPodmanZero) {
  for (char const* name :
       {"docker-exec-inspect-running.http", "podman-exec-inspect-running.http"}) {
    SCOPED_TRACE(name);
    auto e = parse_exec_inspect(captured_response(name).body);
    ASSERT_TRUE(e) << e.error().message();
    EXPECT_TRUE(e->running);
    EXPECT_FALSE(e->exit_code);  // neither engine's placeholder reads as an exit code
    EXPECT_GT(e->pid, 0);
    EXPECT_EQ(e->container_id.size(), 64U);
    EXPECT_FALSE(e->tty);
  }
  for (char const* name : {"docker-exec-inspect-exited.http", "podman-exec-inspect-exited.http"}) {
    SCOPED_TRACE(name);
    auto e = parse_exec_inspect(captured_response(name).body);
    ASSERT_TRUE(e) << e.error().message();
    EXPECT_FALSE(e->running);
    EXPECT_EQ(e->exit_code, 0);
  }
  auto code = parse_exec_inspect(R"({"ID":"ab","Running":false,"ExitCode":137,"Pid":0})");
  ASSERT_TRUE(code);
  EXPECT_EQ(code->exit_code, 137);
  auto no_id = parse_exec_inspect(R"({"Running":false})");
  ASSERT_FALSE(no_id);
  EXPECT_EQ(no_id.error().code, Errc::engine_failed);
}

TEST(ExecCreate, BodyCarriesEveryField) {
  ExecConfig c;
  c.cmd = {"sh", "-c", "echo \"$X\""};
  c.env = {"X=1", "Y=a b"};
  c.user = "65534:65534";
  c.working_dir = "/tmp";
  c.tty = true;
  c.attach_stdin = true;
  c.console_size = std::pair<std::uint16_t, std::uint16_t>{24, 80};
  auto const v = boost::json::parse(exec_create_body(c, {1, 41})).as_object();
  EXPECT_EQ(v.at("Cmd"), (boost::json::array{"sh", "-c", "echo \"$X\""}));
  EXPECT_EQ(v.at("Env"), (boost::json::array{"X=1", "Y=a b"}));
  EXPECT_EQ(v.at("User"), "65534:65534");
  EXPECT_EQ(v.at("WorkingDir"), "/tmp");
  EXPECT_EQ(v.at("Tty"), true);
  EXPECT_EQ(v.at("AttachStdin"), true);
  EXPECT_EQ(v.at("AttachStdout"), true);
  EXPECT_EQ(v.at("AttachStderr"), true);
  // ConsoleSize exists from API 1.42 on only.
  EXPECT_FALSE(v.contains("ConsoleSize"));
  auto const v42 = boost::json::parse(exec_create_body(c, {1, 42})).as_object();
  EXPECT_EQ(v42.at("ConsoleSize"), (boost::json::array{24, 80}));
  // Empty optional fields are left to the container.
  auto const bare = boost::json::parse(exec_create_body(argv({"true"}), {1, 41}));
  EXPECT_FALSE(bare.as_object().contains("User"));
  EXPECT_FALSE(bare.as_object().contains("WorkingDir"));
  EXPECT_FALSE(bare.as_object().contains("Env"));
}

TEST(ExecCreate, AnswerMustCarryAValidId) {
  for (char const* name : {"docker-exec-create.http", "podman-exec-create.http"}) {
    auto id = parse_exec_create(captured_response(name).body);
    ASSERT_TRUE(id) << name;
    EXPECT_EQ(id->size(), 64U);
  }
  for (char const* bad : {"", "{}", R"({"Id":""})", R"({"Id":"../../containers/x"})",
                          R"({"Id":"abc?x=1"})", R"({"Id":5})"}) {
    auto r = parse_exec_create(bad);
    ASSERT_FALSE(r) << bad;
    EXPECT_EQ(r.error().code, Errc::engine_failed);
  }
}

TEST(Targets, AreVersionedPaths) {
  ApiVersion const v{1, 41};
  EXPECT_EQ(container_inspect_target(v, "ci"), "/v1.41/containers/ci/json");
  EXPECT_EQ(exec_create_target(v, "ci"), "/v1.41/containers/ci/exec");
  EXPECT_EQ(exec_start_target(v, "ab12"), "/v1.41/exec/ab12/start");
  EXPECT_EQ(exec_inspect_target(v, "ab12"), "/v1.41/exec/ab12/json");
  EXPECT_EQ(exec_resize_target(v, "ab12", 24, 80), "/v1.41/exec/ab12/resize?h=24&w=80");
  EXPECT_EQ(exec_start_body(false), R"({"Detach":false,"Tty":false})");
  EXPECT_EQ(exec_start_body(true), R"({"Detach":false,"Tty":true})");
}

TEST(Targets, ExecIdsAreAlphanumeric) {
  EXPECT_TRUE(is_valid_exec_id(std::string(64, 'a')));
  EXPECT_TRUE(is_valid_exec_id("A1"));
  EXPECT_FALSE(is_valid_exec_id(""));
  EXPECT_FALSE(is_valid_exec_id(std::string(129, 'a')));
  for (char const* bad : {"a/b", "..", "a b", "a?b", "a%2f", "a\nb"}) {
    EXPECT_FALSE(is_valid_exec_id(bad)) << bad;
  }
}

struct ClassifyCase {
  char const* capture;  // a captured refusal, or nullptr for `status` + `body`
  Operation op;
  unsigned status;
  char const* body;
  Errc want;
  char const* message;  // a part of the engine's message that must be kept
};

TEST(ClassifyFailure, EveryRefusalHasItsCode) {
  ClassifyCase const cases[] = {
      {"docker-inspect-404.http", Operation::container_inspect, 0, nullptr,
       Errc::engine_container_not_found, "No such container: nope"},
      {"podman-inspect-404.http", Operation::container_inspect, 0, nullptr,
       Errc::engine_container_not_found, "no container with name or ID"},
      {"docker-exec-create-409.http", Operation::exec_create, 0, nullptr,
       Errc::engine_container_not_running, "is not running"},
      {"podman-exec-create-500.http", Operation::exec_create, 0, nullptr,
       Errc::engine_container_not_running, "can only create exec sessions on running containers"},
      {"docker-exec-inspect-404.http", Operation::exec_inspect, 0, nullptr, Errc::engine_failed,
       "No such exec instance"},
      {"podman-exec-inspect-404.http", Operation::exec_inspect, 0, nullptr, Errc::engine_failed,
       "no exec session with ID"},
      {"podman-exec-resize-notty.http", Operation::exec_resize, 0, nullptr, Errc::engine_failed,
       "cannot resize session"},
      {nullptr, Operation::exec_create, 404, R"({"message":"No such container: x"})",
       Errc::engine_container_not_found, "No such container"},
      {nullptr, Operation::exec_start, 409, R"({"message":"Container x is paused"})",
       Errc::engine_container_not_running, "is paused"},
      {nullptr, Operation::exec_start, 404,
       R"({"cause":"no such container","message":"gone","response":404})",
       Errc::engine_container_not_found, "gone"},
      {nullptr, Operation::exec_start, 500,
       R"({"cause":"container state improper","message":"stopped","response":500})",
       Errc::engine_container_not_running, "stopped"},
      // A 500 about something else is not a container state.
      {nullptr, Operation::exec_create, 500, R"({"message":"runc: oh no"})", Errc::engine_failed,
       "runc: oh no"},
      {nullptr, Operation::exec_create, 400, R"({"message":"bad parameter"})", Errc::engine_failed,
       "bad parameter"},
      {nullptr, Operation::container_inspect, 500, "plain text failure", Errc::engine_failed,
       "plain text failure"},
      {nullptr, Operation::container_inspect, 409, R"({"message":"x"})", Errc::engine_failed, "x"},
      {nullptr, Operation::ping, 500, "", Errc::engine_unavailable, ""},
      {nullptr, Operation::version, 404, "page not found", Errc::engine_unavailable,
       "page not found"},
  };
  for (auto const& c : cases) {
    std::string body = c.body != nullptr ? c.body : "";
    unsigned status = c.status;
    if (c.capture != nullptr) {
      auto r = captured_response(c.capture);
      body = r.body;
      status = r.status;
    }
    SCOPED_TRACE(c.capture != nullptr ? c.capture : body);
    EXPECT_FALSE(is_success(c.op, status));
    auto e = classify_failure(EngineKind::podman, c.op, "subj", status, body, 2048);
    EXPECT_EQ(e.code, c.want) << e.message();
    EXPECT_NE(e.context.find(c.message), std::string::npos) << e.context;
    EXPECT_EQ(
        e.context.rfind(
            "podman " + std::string{to_string(c.op)} + " subj: HTTP " + std::to_string(status), 0),
        0U)
        << e.context;
  }
}

TEST(ClassifyFailure, SuccessStatuses) {
  EXPECT_TRUE(is_success(Operation::exec_start, 101));
  EXPECT_TRUE(is_success(Operation::exec_start, 200));
  EXPECT_TRUE(is_success(Operation::exec_resize, 201));  // Podman answers resize with 201
  EXPECT_TRUE(is_success(Operation::container_inspect, 200));
  EXPECT_FALSE(is_success(Operation::container_inspect, 101));
  EXPECT_FALSE(is_success(Operation::exec_create, 304));
  EXPECT_FALSE(is_success(Operation::ping, 199));
}

TEST(EngineMessage, KeptBoundedAndPrintable) {
  auto m = parse_engine_message(R"({"message":"line1\nline2\u0007","cause":"c"})", 100);
  EXPECT_EQ(m.message, "line1 line2");
  EXPECT_EQ(m.cause, "c");
  auto cut = parse_engine_message(std::string(5000, 'x'), 16);
  EXPECT_EQ(cut.message, std::string(16, 'x') + "...");
  // A cut never splits a UTF-8 sequence.
  auto utf = parse_engine_message("\xc3\xa9\xc3\xa9\xc3\xa9", 3);
  EXPECT_EQ(utf.message, "\xc3\xa9...");
  // JSON without a message is kept as text.
  auto other = parse_engine_message(R"({"error":"x"})", 100);
  EXPECT_EQ(other.message, R"({"error":"x"})");
  EXPECT_TRUE(parse_engine_message("", 100).message.empty());
}

TEST(CgroupOwnership, OnlyACgroupNamingTheContainerIsItsOwn) {
  std::string const id(64, 'c');
  EXPECT_TRUE(cgroup_names_container("/docker/" + id, id));
  EXPECT_TRUE(cgroup_names_container("/system.slice/docker-" + id + ".scope", id));
  EXPECT_TRUE(cgroup_names_container("/user.slice/libpod-" + id + ".scope/container", id));
  EXPECT_FALSE(cgroup_names_container("/", id));
  EXPECT_FALSE(cgroup_names_container("/user.slice/user-1000.slice", id));
  EXPECT_FALSE(cgroup_names_container("/docker/" + std::string(64, 'd'), id));
  EXPECT_FALSE(cgroup_names_container("/docker/" + id.substr(0, 12), id));
  EXPECT_FALSE(cgroup_names_container("/docker/x", "short"));
  EXPECT_FALSE(cgroup_names_container("", id));
}

}  // namespace
}  // namespace custos::engine
