// The daemon is a child subreaper: an execution's double-forked descendant reparents to it, and
// when that orphan exits the daemon's SIGCHLD handling reaps it promptly (no zombie waits for
// the periodic 1 s backstop), also now that the handling skips its /proc pass when nothing is
// waiting to be reaped.
#include <chrono>
#include <fstream>
#include <sstream>

#include "harness.hpp"

namespace custos::e2e {
namespace {

// The state letter of /proc/<pid>/stat ('Z' zombie), or 0 when the process is gone.
char proc_state(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  auto const close = stat.rfind(')');
  if (close == std::string::npos || close + 2 >= stat.size()) return 0;
  return stat[close + 2];
}

// The parent pid from /proc/<pid>/stat, 0 when the process is gone.
int proc_ppid(int pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
  std::string stat;
  if (!std::getline(in, stat)) return 0;
  auto const close = stat.rfind(')');
  if (close == std::string::npos) return 0;
  std::istringstream rest(stat.substr(close + 2));
  char state = 0;
  int ppid = 0;
  rest >> state >> ppid;
  return ppid;
}

TEST(OrphanReap, AnExitedOrphanOfAnExecutionIsReapedPromptly) {
  Daemon d;
  ASSERT_TRUE(d.ready()) << d.log();
  auto c = d.client();
  // The subshell starts `sleep 2` in the background and exits at once: the sleep is orphaned
  // and reparents to the daemon (the nearest subreaper) while the root keeps running.
  auto r =
      c.call(1, "exec.start", start_params({"/bin/sh", "-c", "(sleep 2 & echo $!); exec sleep 8"}));
  ASSERT_TRUE(r && r->contains("result"));
  std::string const id{r->at("result").at("execution_id").as_string()};
  int orphan = 0;
  auto const deadline = std::chrono::steady_clock::now() + 5s;
  while (orphan == 0 && std::chrono::steady_clock::now() < deadline) {
    // The orphan: the only `sleep 2` whose parent is the daemon.
    for (auto const& e : fs::directory_iterator("/proc")) {
      auto const name = e.path().filename().native();
      if (name.find_first_not_of("0123456789") != std::string::npos) continue;
      int const pid = std::stoi(name);
      if (proc_ppid(pid) != d.pid()) continue;
      std::ifstream cmd("/proc/" + name + "/cmdline");
      std::string cmdline;
      std::getline(cmd, cmdline, '\0');
      std::string arg;
      std::getline(cmd, arg, '\0');
      if (cmdline.find("sleep") != std::string::npos && arg == "2") orphan = pid;
    }
    if (orphan == 0) std::this_thread::sleep_for(5ms);
  }
  ASSERT_NE(orphan, 0) << "the orphan never reparented to the daemon";
  // From the moment it exits (a zombie, or already gone) it must be gone well within the 1 s
  // periodic backstop.
  std::optional<std::chrono::steady_clock::time_point> exited;
  auto const limit = std::chrono::steady_clock::now() + 5s;
  bool gone = false;
  while (std::chrono::steady_clock::now() < limit) {
    char const st = proc_state(orphan);
    if (st == 0 || proc_ppid(orphan) != d.pid()) {
      gone = true;
      break;
    }
    if (st == 'Z' && !exited) exited = std::chrono::steady_clock::now();
    std::this_thread::sleep_for(2ms);
  }
  ASSERT_TRUE(gone);
  if (exited) {
    EXPECT_LT(std::chrono::steady_clock::now() - *exited, 500ms)
        << "the exited orphan stayed a zombie until a periodic reap";
  }
  (void)c.call(2, "exec.cancel", {{"execution_id", id}});
  (void)c.call(3, "exec.wait", {{"execution_id", id}});
}

}  // namespace
}  // namespace custos::e2e
