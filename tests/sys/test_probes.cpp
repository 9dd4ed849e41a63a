// probe_host on the real machine (its scratch cgroup placed in this test's own cgroup), and the
// engine socket discovery against a fake run directory.
#include <boost/json/serialize.hpp>
#include <seccomp.h>

#include <dirent.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>

#include "custos/sys/probes.hpp"

#include "sys/cgroup_fixture.hpp"

namespace custos::sys {
namespace {

using testing::CgroupTest;
using testing::FdLeakTest;
using testing::TempDir;
using testing::write_text;

class ProbeHostTest : public CgroupTest {};
class ProbeEnginesTest : public FdLeakTest {};

std::size_t child_cgroups(std::string const& dir) {
  std::size_t n = 0;
  if (DIR* d = ::opendir(dir.c_str())) {
    while (dirent const* e = ::readdir(d)) {
      if (e->d_type == DT_DIR && e->d_name[0] != '.') ++n;
    }
    ::closedir(d);
  }
  return n;
}

TEST_F(ProbeHostTest, ReportsWhatThisHostCanDo) {
  ProbeOptions o;
  o.scratch_cgroup_parent = cg_.path();
  auto caps = probe_host(o);
  ASSERT_TRUE(caps) << caps.error().message();
  EXPECT_EQ(child_cgroups(cg_.path()), 0u) << "the scratch cgroup was removed";

  auto mount = find_cgroup2_mount().value();
  EXPECT_TRUE(caps->pidfd);
  ASSERT_TRUE(caps->cgroup.path.has_value());
  EXPECT_EQ(*caps->cgroup.path, mount.path);
  EXPECT_EQ(caps->cgroup.nsdelegate, mount.nsdelegate);
  EXPECT_TRUE(caps->cgroup.writable);
  EXPECT_TRUE(caps->clone3_into_cgroup);
  EXPECT_TRUE(caps->cgroup.kill);
  EXPECT_TRUE(caps->subreaper);
  EXPECT_GE(caps->landlock_abi, 1);
  EXPECT_TRUE(caps->seccomp);
  EXPECT_GE(caps->seccomp_api_level, 1);
  EXPECT_TRUE(caps->pidfd_get_info);
  EXPECT_TRUE(caps->so_peerpidfd);
  if (::geteuid() == 0) {
    EXPECT_TRUE(caps->user_namespaces);
    EXPECT_TRUE(caps->pid_namespaces);
    EXPECT_TRUE(caps->net_namespaces);
  }
  // The facts of the build machines (docs/architecture.md, "The build and test hosts");
  // elsewhere they may differ.
  if (mount.path == "/sys/fs/cgroup/unified") {
    EXPECT_FALSE(caps->cgroup.nsdelegate);
    EXPECT_FALSE(caps->cgroup.controllers.contains("memory"));
  }

  // One check per capability, each with what its absence means.
  std::set<std::string> names;
  for (auto const& c : caps->checks) {
    EXPECT_TRUE(names.insert(c.name).second) << "duplicate check " << c.name;
    EXPECT_FALSE(c.missing_means.empty()) << c.name;
    EXPECT_FALSE(c.detail.empty()) << c.name;
    EXPECT_EQ(c.missing_means, missing_meaning(c.name));
  }
  for (char const* n : {"pidfd", "pidfd_get_info", "so_peerpidfd", "cgroup", "cgroup_writable",
                        "cgroup_controllers", "nsdelegate", "cgroup_kill", "clone3_into_cgroup",
                        "subreaper", "landlock", "seccomp", "user_namespaces", "pid_namespaces",
                        "net_namespaces", "docker", "podman"}) {
    EXPECT_TRUE(names.contains(n)) << n;
  }
  EXPECT_EQ(missing_meaning("no-such-capability"), "");

  boost::json::value const j = to_json(*caps);
  auto const& obj = j.as_object();
  for (char const* k : {"pidfd", "clone3_into_cgroup", "cgroup", "subreaper", "landlock_abi",
                        "seccomp", "user_namespaces", "pid_namespaces", "net_namespaces", "engines",
                        "pidfd_get_info", "so_peerpidfd", "checks"}) {
    EXPECT_TRUE(obj.contains(k)) << k;
  }
  EXPECT_EQ(obj.at("cgroup").as_object().at("path").as_string(), mount.path);
  EXPECT_EQ(obj.at("cgroup").as_object().at("writable").as_bool(), true);
  EXPECT_EQ(obj.at("landlock_abi").as_int64(), caps->landlock_abi);
  EXPECT_EQ(obj.at("checks").as_array().size(), caps->checks.size());
}

// The facility-absent paths for real: a forked child loads a seccomp filter that makes
// pidfd_open, clone3, landlock_create_ruleset and unshare fail with ENOSYS, then probes. Every
// one of them must be reported unavailable (with its reason), and nothing may be left behind.
TEST_F(ProbeHostTest, MissingFacilitiesAreReportedNotAssumed) {
  auto pipe = make_pipe();
  ASSERT_TRUE(pipe);
  std::string const scratch = cg_.path();
  pid_t const child = ::fork();
  if (child == 0) {
    pipe->first.reset();
    unsigned char out[8] = {};
    scmp_filter_ctx ctx = seccomp_init(SCMP_ACT_ALLOW);
    int rc = ctx == nullptr ? -1 : 0;
    for (int const nr : {SCMP_SYS(pidfd_open), SCMP_SYS(clone3), SCMP_SYS(landlock_create_ruleset),
                         SCMP_SYS(unshare)}) {
      if (rc == 0) rc = seccomp_rule_add(ctx, SCMP_ACT_ERRNO(ENOSYS), nr, 0);
    }
    if (rc == 0 && ::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0 && seccomp_load(ctx) == 0) {
      ProbeOptions o;
      o.scratch_cgroup_parent = scratch;
      auto caps = probe_host(o);
      if (caps) {
        out[0] = 1;
        out[1] = caps->pidfd;
        out[2] = caps->clone3_into_cgroup;
        out[3] = static_cast<unsigned char>(caps->landlock_abi);
        out[4] = caps->user_namespaces || caps->pid_namespaces || caps->net_namespaces;
        out[5] = caps->cgroup.writable;
        out[6] = caps->pidfd_get_info;
        bool details = true;
        for (auto const& c : caps->checks) {
          if (c.name == "pidfd" || c.name == "clone3_into_cgroup" || c.name == "landlock") {
            details =
                details && !c.available && c.detail.find("38") != std::string::npos;  // ENOSYS
          }
        }
        out[7] = details;
      }
    }
    (void)!::write(pipe->second.get(), out, sizeof out);
    ::_exit(0);
  }
  ASSERT_GT(child, 0);
  pipe->second.reset();
  auto waiter = Pidfd::open(child);
  ASSERT_TRUE(waiter);
  unsigned char got[8] = {};
  ASSERT_EQ(::read(pipe->first.get(), got, sizeof got), 8);
  ASSERT_TRUE(waiter->wait());
  EXPECT_EQ(got[0], 1) << "probe_host itself must not fail";
  EXPECT_EQ(got[1], 0) << "pidfd";
  EXPECT_EQ(got[2], 0) << "clone3_into_cgroup";
  EXPECT_EQ(got[3], 0) << "landlock_abi";
  EXPECT_EQ(got[4], 0) << "namespaces";
  EXPECT_EQ(got[5], 1) << "mkdir still works: the cgroup is writable";
  EXPECT_EQ(got[6], 0) << "no pidfd, so no PIDFD_GET_INFO";
  EXPECT_EQ(got[7], 1) << "each unavailable check names the errno";
  EXPECT_EQ(child_cgroups(cg_.path()), 0u) << "the scratch cgroup was removed";
}

TEST_F(ProbeEnginesTest, NoCgroupMountMeansNothingCgroupIsClaimed) {
  TempDir t;
  write_text(t.path() + "/mountinfo",
             "32 31 0:29 / /sys/fs/cgroup/cpu rw - cgroup cgroup rw,cpu\n");
  ProbeOptions o;
  o.mountinfo_path = t.path() + "/mountinfo";
  o.try_namespaces = false;
  auto caps = probe_host(o);
  ASSERT_TRUE(caps) << caps.error().message();
  EXPECT_FALSE(caps->cgroup.path.has_value());
  EXPECT_FALSE(caps->cgroup.writable);
  EXPECT_FALSE(caps->clone3_into_cgroup);
  EXPECT_TRUE(caps->pidfd) << "the other probes still run";
  EXPECT_FALSE(caps->user_namespaces) << "not tried is not available";
}

// Binds a Unix socket at `path` and returns its fd (kept open for the test's duration).
UniqueFd bind_socket(std::string const& path) {
  UniqueFd s(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  std::snprintf(addr.sun_path, sizeof addr.sun_path, "%s", path.c_str());
  EXPECT_EQ(::bind(s.get(), reinterpret_cast<sockaddr const*>(&addr), sizeof addr), 0) << path;
  return s;
}

TEST_F(ProbeEnginesTest, FindsOnlyRealSocketsAtTheKnownPaths) {
  TempDir t;
  std::string const run = t.path();
  for (char const* d : {"/podman", "/user", "/user/1000", "/user/1000/podman", "/user/1001"}) {
    ASSERT_EQ(::mkdir((run + d).c_str(), 0755), 0) << d;
  }
  write_text(run + "/podman/podman.sock", "not a socket");
  UniqueFd const a = bind_socket(run + "/user/1000/podman/podman.sock");
  UniqueFd const b = bind_socket(run + "/user/1001/podman.sock");
  UniqueFd const d = bind_socket(run + "/docker.sock");
  write_text(run + "/fake-docker.sock", "regular file");

  ProbeOptions o;
  o.run_root = run;
  o.docker_socket = run + "/docker.sock";
  o.mountinfo_path = run + "/none";  // the engine probe does not need cgroups
  o.try_namespaces = false;
  auto caps = probe_host(o);
  ASSERT_TRUE(caps) << caps.error().message();
  EXPECT_EQ(caps->engines.docker, run + "/docker.sock");
  EXPECT_EQ(caps->engines.podman, (std::vector<std::string>{run + "/user/1000/podman/podman.sock",
                                                            run + "/user/1001/podman.sock"}));

  o.docker_socket = run + "/fake-docker.sock";
  auto none = probe_host(o);
  ASSERT_TRUE(none);
  EXPECT_FALSE(none->engines.docker.has_value());
}

}  // namespace
}  // namespace custos::sys
