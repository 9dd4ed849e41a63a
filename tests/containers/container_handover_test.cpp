// Container executions across a handover (docs/containers.md, "Across a handover"): the engine's
// hijacked connection goes to the next image with where its stream stood, so a program in a
// real container writing through the handover loses no byte, input given before and after it
// arrives in order, a terminal goes on, and each ends with one terminal record saying so.
#include "containers.hpp"

namespace custos::e2e {
namespace {

class ContainerHandover : public Containers {
 protected:
  // exec.input on `id`, optionally ending the input.
  void input(LineClient& c, std::string const& id, std::string const& data, bool eof = false) {
    auto r = c.call(next_++, "exec.input",
                    {{"execution_id", id}, {"data_b64", core::base64_encode(data)}, {"eof", eof}});
    ASSERT_TRUE(r && r->contains("result")) << (r ? json::serialize(*r) : "") << daemon_.log();
  }

  // The events of `id` retained by the daemon, from seq 1 to its terminal one.
  std::vector<json::object> events(std::string const& id) {
    auto c = daemon_.client();
    auto s = c.call(next_++, "exec.subscribe", {{"execution_id", id}, {"from_seq", 1}});
    EXPECT_TRUE(s && s->contains("result")) << (s ? json::serialize(*s) : "");
    std::vector<json::object> out;
    for (auto& e : c.events) {  // those that came with the answer
      if (e.contains("method")) out.push_back(e.at("params").as_object());
    }
    if (!out.empty() && out.back().at("kind").as_string() == "terminal") return out;
    auto const deadline = std::chrono::steady_clock::now() + 30s;
    while (std::chrono::steady_clock::now() < deadline) {
      auto v = c.read_json(5s);
      if (!v) break;
      if (!v->is_object() || !v->as_object().contains("method")) continue;
      out.push_back(v->at("params").as_object());
      if (out.back().at("kind").as_string() == "terminal") break;
    }
    return out;
  }
};

TEST_P(ContainerHandover, OutputInputAndATerminalGoOnWithNothingLost) {
  auto c = daemon_.client();
  constexpr int kBatches = 25;
  constexpr int kLines = 400;
  // Batches of numbers on stdout and a line on stderr, with pauses: writing while the images
  // change (a frame can be cut anywhere by the release).
  auto const writer = start(
      c,
      params({"/bin/sh", "-c",
              "i=0; while [ $i -lt " + std::to_string(kBatches) + " ]; do seq $((i*" +
                  std::to_string(kLines) + ")) $((i*" + std::to_string(kLines) + "+" +
                  std::to_string(kLines - 1) + ")); echo e$i >&2; sleep 0.1; i=$((i+1)); done"}));
  auto const echo = start(c, params({"/bin/cat"}));
  auto const tty =
      start(c, params({"/bin/sh", "-c", "for i in $(seq 1 30); do echo tty$i; sleep 0.05; done"},
                      {}, {}, {{"mode", "pty"}}));
  ASSERT_FALSE(writer.empty() || echo.empty() || tty.empty());
  input(c, echo, "before\n");
  std::this_thread::sleep_for(700ms);  // some batches before the handover

  auto const before = started_ns(daemon_);
  ASSERT_TRUE(daemon_.signal(SIGHUP));
  ASSERT_TRUE(await_handover(daemon_, before)) << daemon_.log();

  auto c2 = daemon_.client();
  input(c2, echo, "after\n", true);
  std::string want_out;
  std::string want_err;
  for (int i = 0; i < kBatches * kLines; ++i) want_out += std::to_string(i) + "\n";
  for (int i = 0; i < kBatches; ++i) want_err += "e" + std::to_string(i) + "\n";
  std::string want_tty;
  for (int i = 1; i <= 30; ++i) want_tty += "tty" + std::to_string(i) + "\r\n";

  for (auto const& id : {writer, echo, tty}) {
    auto const t = wait(c2, id);
    ASSERT_FALSE(t.empty());
    EXPECT_EQ(t.at("classification").as_string(), "exited") << json::serialize(t);
    EXPECT_EQ(t.at("exit").at("code").as_int64(), 0) << json::serialize(t);
    EXPECT_EQ(t.at("recovery").as_string(), "live_owned") << json::serialize(t);
    for (auto const& [stream, acc] : t.at("output").as_object()) {
      EXPECT_TRUE(acc.at("complete").as_bool()) << id << " " << stream << json::serialize(t);
    }
    // The facts of the exec went across too; nothing says the output was lost.
    auto const& obs = t.at("observations").as_object();
    EXPECT_TRUE(obs.contains("exec")) << json::serialize(t);
    EXPECT_TRUE(obs.contains("container")) << json::serialize(t);
    EXPECT_FALSE(obs.contains("output_handover")) << json::serialize(t);
    EXPECT_EQ(obs.at("output").as_string(), "kept") << json::serialize(t);
    EXPECT_EQ(obs.at("root").as_string(), "handed_over") << json::serialize(t);
    // One `adopted` event, saying the output was kept, and one numbered log across both images.
    auto const evs = events(id);
    int adopted = 0;
    for (std::size_t i = 0; i < evs.size(); ++i) {
      EXPECT_EQ(evs[i].at("seq").to_number<std::uint64_t>(), i + 1) << json::serialize(evs[i]);
      if (evs[i].at("kind").as_string() == "adopted") {
        ++adopted;
        EXPECT_EQ(evs[i].at("output").as_string(), "kept") << json::serialize(evs[i]);
      }
    }
    std::string kinds;
    for (auto const& e : evs) kinds += std::string{e.at("kind").as_string()} + " ";
    EXPECT_EQ(adopted, 1) << id << ": " << kinds;
  }
  bool complete = false;
  auto const out = output_of(c2, writer, "stdout", &complete);
  EXPECT_EQ(out.size(), want_out.size());
  EXPECT_EQ(out, want_out) << "every byte once, in order";
  EXPECT_TRUE(complete);
  EXPECT_EQ(output_of(c2, writer, "stderr"), want_err);
  EXPECT_EQ(output_of(c2, echo, "stdout"), "before\nafter\n");
  EXPECT_EQ(output_of(c2, tty, "pty"), want_tty);
  expect_container_running(engine_.running);
}

// A cancel after the handover still ends the exec's whole tree in the container: the tree half
// was adopted by identity, and the container's init re-identified.
TEST_P(ContainerHandover, ACancelAfterTheHandoverEndsTheWholeTree) {
  auto c = daemon_.client();
  std::string const n = unique_sleep();
  auto const id = start(c, params({"/bin/sh", "-c", "setsid sleep " + n + " & exec sleep " + n}));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(n, 2));
  auto const before = started_ns(daemon_);
  ASSERT_TRUE(daemon_.signal(SIGHUP));
  ASSERT_TRUE(await_handover(daemon_, before)) << daemon_.log();
  auto c2 = daemon_.client();
  auto r = c2.call(next_++, "exec.cancel", {{"execution_id", id}});
  ASSERT_TRUE(r && r->contains("result")) << (r ? json::serialize(*r) : "") << daemon_.log();
  auto const t = wait(c2, id);
  EXPECT_EQ(t.at("classification").as_string(), "cancelled") << json::serialize(t);
  EXPECT_FALSE(t.at("observations").as_object().contains("container_stopped"))
      << json::serialize(t);
  EXPECT_TRUE(host_sleeps(n).empty()) << "survivors: " << host_sleeps(n).size();
  expect_container_running(engine_.running);
}

// The container's init went across by its identity: a container stopped after the handover is
// still the backend's failure, never the exec's own exit.
TEST_P(ContainerHandover, AContainerStoppedAfterTheHandoverIsABackendFailure) {
  StoppableContainer stoppable{engine_};
  ASSERT_TRUE(stoppable.ok());
  std::string const& name = stoppable.name;
  auto c = daemon_.client();
  std::string const n = unique_sleep();
  auto const id = start(c, params({"/bin/sh", "-c", "exec sleep " + n}, name));
  ASSERT_FALSE(id.empty());
  ASSERT_TRUE(await_sleeps(n, 1));
  auto const before = started_ns(daemon_);
  ASSERT_TRUE(daemon_.signal(SIGHUP));
  ASSERT_TRUE(await_handover(daemon_, before)) << daemon_.log();
  ASSERT_EQ(engine_cli(engine_, "stop -t 5 " + name), 0);
  auto c2 = daemon_.client();
  auto const t = wait(c2, id);
  EXPECT_EQ(t.at("classification").as_string(), "supervisor_failed") << json::serialize(t);
  EXPECT_EQ(t.at("trigger").as_string(), "backend_failure") << json::serialize(t);
  EXPECT_EQ(t.at("observations").at("container_stopped").as_string(), "true") << json::serialize(t);
  EXPECT_TRUE(host_sleeps(n).empty());
}

INSTANTIATE_TEST_SUITE_P(Engines, ContainerHandover,
                         ::testing::Values(EngineKind::docker, EngineKind::podman),
                         [](auto const& p) { return std::string{engine::to_string(p.param)}; });

}  // namespace
}  // namespace custos::e2e
