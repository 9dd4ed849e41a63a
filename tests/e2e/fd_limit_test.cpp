// The daemon raises its soft descriptor limit to the hard one at start-up: every execution kept
// in the terminal history still holds descriptors (its pidfd and cgroup directory), so with a
// soft limit of a few hundred the daemon would run out after a few hundred launches.
#include <fstream>
#include <sys/resource.h>

#include "harness.hpp"

namespace custos::e2e {
namespace {

// Soft and hard "Max open files" of a process, from /proc/<pid>/limits.
std::pair<std::string, std::string> open_files_limits(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/limits");
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("Max open files", 0) != 0) continue;
    std::istringstream ss(line.substr(std::string{"Max open files"}.size()));
    std::string soft, hard;
    ss >> soft >> hard;
    return {soft, hard};
  }
  return {};
}

// Lowers this process's soft RLIMIT_NOFILE for the scope (the daemon inherits it at fork).
class LowSoftLimit {
 public:
  explicit LowSoftLimit(rlim_t soft) {
    ::getrlimit(RLIMIT_NOFILE, &saved_);
    rlimit low = saved_;
    low.rlim_cur = std::min<rlim_t>(soft, saved_.rlim_max);
    ok_ = ::setrlimit(RLIMIT_NOFILE, &low) == 0 && saved_.rlim_max > soft;
  }
  LowSoftLimit(LowSoftLimit const&) = delete;
  LowSoftLimit& operator=(LowSoftLimit const&) = delete;
  ~LowSoftLimit() { ::setrlimit(RLIMIT_NOFILE, &saved_); }
  [[nodiscard]] bool ok() const { return ok_; }

 private:
  rlimit saved_{};
  bool ok_ = false;
};

TEST(FdLimit, DaemonRaisesItsSoftLimitAndOutlivesTheOldOne) {
  std::optional<Daemon> d;
  {
    LowSoftLimit low{160};
    if (!low.ok()) GTEST_SKIP() << "the hard descriptor limit is too low to test this";
    d.emplace();
  }
  ASSERT_TRUE(d->ready()) << d->log();
  auto [soft, hard] = open_files_limits(d->pid());
  ASSERT_FALSE(soft.empty());
  EXPECT_EQ(soft, hard) << "the daemon kept a soft limit below its hard limit";
  EXPECT_NE(soft, "160");
  // More executions than the old soft limit could hold descriptors for: each one kept in the
  // terminal history holds two, so 120 of them need ~240 on top of the daemon's own.
  auto c = d->client();
  int done = 0;
  for (int i = 0; i < 120; ++i) {
    auto r = c.call(1000 + i * 2, "exec.start", start_params({"/bin/true"}));
    if (!r || !r->contains("result")) {
      ADD_FAILURE() << "launch " << i << ": " << (r ? json::serialize(*r) : "no reply");
      break;
    }
    std::string const id{r->at("result").at("execution_id").as_string()};
    auto w = c.call(1001 + i * 2, "exec.wait", {{"execution_id", id}});
    // Out of descriptors, a launch is still answered, as a spawn_failed terminal (EMFILE).
    if (!w || !w->contains("result") ||
        w->at("result").at("classification").as_string() != "exited") {
      ADD_FAILURE() << "launch " << i << ": " << (w ? json::serialize(*w) : "no reply");
      break;
    }
    ++done;
  }
  EXPECT_EQ(done, 120);
}

}  // namespace
}  // namespace custos::e2e
